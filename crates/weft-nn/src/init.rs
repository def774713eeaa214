//! Parameter initialisation with PyTorch's default distributions (drawn from weft's Philox
//! stream, so the numbers differ from PyTorch's; load a state dict for identical weights).

use std::cell::Cell;

use weft_core::{DType, Device, Generator, Result, Tensor};

thread_local! {
    static DEVICE: Cell<Device> = const { Cell::new(Device::Cpu) };
}

/// Runs `build` with new parameters made on `device` (as PyTorch's `with torch.device(...)`):
/// the values are drawn on the CPU from the same stream, so a model built on a GPU starts with
/// the weights it would have on the CPU. Applies to this thread; restored afterwards.
pub fn with_device<R>(device: Device, build: impl FnOnce() -> R) -> R {
    struct Restore(Device);
    impl Drop for Restore {
        fn drop(&mut self) {
            DEVICE.with(|d| d.set(self.0));
        }
    }
    let _restore = Restore(DEVICE.with(|d| d.replace(device)));
    build()
}

/// The device new parameters are made on ([`with_device`]; the CPU outside it).
pub fn device() -> Device {
    DEVICE.with(|d| d.get())
}

/// `values` as a new parameter (a leaf that requires grad) on [`device`].
fn parameter(values: Tensor) -> Result<Tensor> {
    values.to(device())?.detach().requires_grad_()
}

/// A new parameter (a leaf that requires grad) with values uniform in `[-bound, bound)`.
pub fn uniform(shape: &[usize], bound: f64, dtype: DType, rng: &mut Generator) -> Result<Tensor> {
    parameter(Tensor::rand(shape, dtype, rng)?.affine(2.0 * bound, -bound)?)
}

/// A new parameter with values drawn from `N(0, std^2)`.
pub fn normal(shape: &[usize], std: f64, dtype: DType, rng: &mut Generator) -> Result<Tensor> {
    parameter(Tensor::randn(shape, dtype, rng)?.mul_scalar(std)?)
}

/// A new parameter filled with `value`.
pub fn constant(shape: &[usize], value: f64, dtype: DType) -> Result<Tensor> {
    Tensor::full_on(shape, value, dtype, device())?.requires_grad_()
}

/// PyTorch's Linear/Conv default (`kaiming_uniform_(a=sqrt(5))` for weights and
/// `U(-1/sqrt(fan_in), 1/sqrt(fan_in))` for biases): both reduce to this bound.
pub fn default_bound(fan_in: usize) -> f64 {
    if fan_in == 0 {
        0.0
    } else {
        1.0 / (fan_in as f64).sqrt()
    }
}
