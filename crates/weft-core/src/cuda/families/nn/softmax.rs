//! Softmax and log-softmax over the last dim, and their backward: one block per row.

use cudarc::driver::PushKernelArg;

use super::{kernel, row_threads};
use crate::cuda::copy::{dense, empty, gpu_of, ptr};
use crate::cuda::launch::for_rows;
use crate::error::Result;
use crate::tensor::Tensor;

/// Row length (the last dim; 1 for a 0-d tensor, as the CPU) and row count of `x`.
fn rows_of(x: &Tensor) -> (usize, usize) {
    let len = x.shape().last().copied().unwrap_or(1).max(1);
    (len, x.numel() / len)
}

/// `[softmax(x)]` (or `[log_softmax(x)]`) over the last dim of `x` `[..., C]`: contiguous, of
/// `x`'s shape and dtype.
pub(super) fn forward(x: &Tensor, log: bool) -> Result<Vec<Tensor>> {
    const OP: &str = "softmax";
    let g = gpu_of(x)?;
    let out = empty(&g, OP, x.dtype(), x.shape())?;
    if x.numel() == 0 {
        return Ok(vec![out]);
    }
    let x = dense(x)?;
    let (len, rows) = rows_of(&x);
    let f = kernel(&g, OP, "softmax", x.dtype())?;
    let (xp, yp, rows64, len64, is_log) = (ptr(&x)?, ptr(&out)?, rows as u64, len as u64, log as u32);
    g.bind()?;
    // SAFETY: `x` and `out` hold `rows * len` contiguous elements; each block reads and writes
    // whole rows.
    unsafe {
        g.stream()
            .launch_builder(&f)
            .arg(&xp)
            .arg(&yp)
            .arg(&rows64)
            .arg(&len64)
            .arg(&is_log)
            .launch(for_rows(rows, row_threads(len)))
    }
    .map_err(|e| g.fail(OP, e))?;
    Ok(vec![out])
}

/// `[dx]` of softmax (or log-softmax) from its output `y` and the output gradient `grad` (both
/// `[..., C]`, any views): contiguous, of `y`'s shape and dtype.
pub(super) fn backward(y: &Tensor, grad: &Tensor, log: bool) -> Result<Vec<Tensor>> {
    const OP: &str = "softmax_backward";
    let g = gpu_of(y)?;
    let out = empty(&g, OP, y.dtype(), y.shape())?;
    if y.numel() == 0 {
        return Ok(vec![out]);
    }
    let (y, grad) = (dense(y)?, dense(grad)?);
    let (len, rows) = rows_of(&y);
    let f = kernel(&g, OP, "softmax_backward", y.dtype())?;
    let (yp, gp, dp) = (ptr(&y)?, ptr(&grad)?, ptr(&out)?);
    let (rows64, len64, is_log) = (rows as u64, len as u64, log as u32);
    g.bind()?;
    // SAFETY: `y`, `grad` and `out` hold `rows * len` contiguous elements (the ops layer checked
    // that `grad` has `y`'s shape); each block reads and writes whole rows.
    unsafe {
        g.stream()
            .launch_builder(&f)
            .arg(&yp)
            .arg(&gp)
            .arg(&dp)
            .arg(&rows64)
            .arg(&len64)
            .arg(&is_log)
            .launch(for_rows(rows, row_threads(len)))
    }
    .map_err(|e| g.fail(OP, e))?;
    Ok(vec![out])
}
