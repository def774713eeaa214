//! Parameter initialisation with PyTorch's default distributions (drawn from weft's Philox
//! stream, so the numbers differ from PyTorch's; load a state dict for identical weights).

use weft_core::{DType, Generator, Result, Tensor};

/// A new parameter (a leaf that requires grad) with values uniform in `[-bound, bound)`.
pub fn uniform(shape: &[usize], bound: f64, dtype: DType, rng: &mut Generator) -> Result<Tensor> {
    Tensor::rand(shape, dtype, rng)?
        .affine(2.0 * bound, -bound)?
        .detach()
        .requires_grad_()
}

/// A new parameter with values drawn from `N(0, std^2)`.
pub fn normal(shape: &[usize], std: f64, dtype: DType, rng: &mut Generator) -> Result<Tensor> {
    Tensor::randn(shape, dtype, rng)?
        .mul_scalar(std)?
        .detach()
        .requires_grad_()
}

/// A new parameter filled with `value`.
pub fn constant(shape: &[usize], value: f64, dtype: DType) -> Result<Tensor> {
    Tensor::full(shape, value, dtype)?.requires_grad_()
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
