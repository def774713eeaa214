//! The op set on a GPU against the CPU: each case builds its inputs on the CPU, runs the same
//! function on the CPU and on `cuda:0`, and compares the outputs and the inputs' gradients
//! (backward of `sum(out * g)` for a fixed random `g`). f32 within 1e-5 relative (TF32 off),
//! bf16 within 1e-2. On a machine without a CUDA device every case says it was skipped.
//!
//! One file per op family beside this one.
#![cfg(feature = "cuda")]

mod attention;
mod conv;
mod copy;
mod elementwise;
mod index;
mod matmul;
mod memory;
mod nn;
mod reduce;

use weft_core::{DType, Device, Generator, Tensor};

/// `cuda:0` when a CUDA device can be used; else writes the skip line for `case` and `None`.
pub fn gpu(case: &str) -> Option<Device> {
    let why = match weft_core::cuda::device_count() {
        Ok(n) if n > 0 => return Some(Device::Cuda(0)),
        Ok(_) => "no CUDA device".to_string(),
        Err(e) => e.to_string(),
    };
    skipped(case, &why);
    None
}

/// One line on the test run's stderr, written past the harness's capture so that it shows.
pub fn skipped(case: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "skipped {case}: {why}");
}

/// Normal random numbers of `shape` (seeded), in `dtype`.
pub fn randn(shape: &[usize], dtype: DType, seed: u64) -> Tensor {
    Tensor::randn(shape, DType::F32, &mut Generator::new(seed))
        .and_then(|t| t.cast(dtype))
        .expect("randn")
}

/// Tolerance of a dtype: relative to the largest magnitude of the expected values.
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 | DType::F16 => 1e-2,
        DType::F64 => 1e-10,
        _ => 1e-5,
    }
}

/// Asserts `got` (any device) matches `want` (CPU) in shape, dtype and values within `tol`
/// relative to `want`'s largest magnitude (at least 1).
pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f64) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    let (g, w) = (got.to_vec_f64(), want.to_vec_f64());
    let scale = w
        .iter()
        .fold(1.0f64, |m, x| if x.is_finite() { m.max(x.abs()) } else { m });
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        let same_special = (a.is_nan() && b.is_nan()) || (a.is_infinite() && a == b);
        assert!(
            same_special || (a - b).abs() <= tol * scale,
            "{what}: element {i}: gpu {a} vs cpu {b} (tolerance {} at scale {scale})",
            tol * scale
        );
    }
}

/// Runs `f` on `inputs` on the CPU and on `device`, compares the outputs, and when
/// `grad` is true also the gradient of every float input, with tolerance `tol`.
pub fn compare(case: &str, device: Device, inputs: &[Tensor], grad: bool, tol: f64, f: impl Fn(&[Tensor]) -> Tensor) {
    let prepare = |on: Device| -> Vec<Tensor> {
        inputs
            .iter()
            .map(|t| {
                let t = t.to(on).expect("to device").detach();
                if grad && t.dtype().is_float() {
                    t.requires_grad_().expect("float input")
                } else {
                    t
                }
            })
            .collect()
    };
    let (cpu_in, gpu_in) = (prepare(Device::Cpu), prepare(device));
    let (want, got) = (f(&cpu_in), f(&gpu_in));
    assert_eq!(got.device(), device, "{case}: the result left the GPU");
    assert_close(&format!("{case}: forward"), &got, &want, tol);
    if !grad {
        return;
    }
    let g = randn(want.shape(), want.dtype(), 99);
    let loss = |out: &Tensor, on: Device| out.mul(&g.to(on).unwrap()).unwrap().sum_all().unwrap();
    loss(&want, Device::Cpu).backward().expect("cpu backward");
    loss(&got, device).backward().expect("gpu backward");
    for (i, (c, d)) in cpu_in.iter().zip(&gpu_in).enumerate() {
        if let (Some(cg), Some(dg)) = (c.grad(), d.grad()) {
            assert_eq!(dg.device(), device, "{case}: gradient {i} left the GPU");
            assert_close(&format!("{case}: gradient of input {i}"), &dg, &cg, tol);
        }
    }
}
