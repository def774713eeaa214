//! Mean cross-entropy of logits `[N, C]` against I64 targets `[N]`, and its backward.
//!
//! The forward reads the targets to the host (one wait for the GPU's queue) to range-check them
//! before any launch, exactly as the CPU does, and counts the rows that are not ignored; then
//! one block per row writes the row's loss and log-sum-exp, and one block sums the losses in
//! f64 (a fixed order, no atomics) and divides by the count. The backward does not wait: the
//! count of rows that are not ignored and the scale `grad_out / count` are computed on the GPU.

use cudarc::driver::PushKernelArg;

use super::{expect_dtype, kernel, row_threads};
use crate::cuda::copy::{dense, empty, gpu_of, ptr};
use crate::cuda::launch::{for_elements, for_rows};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Threads of the one-block reductions (the mean of the losses, the backward's scale).
const REDUCE_THREADS: u32 = 256;

/// The number of targets that are not `ignore_index`, after checking that each of them is in
/// `0..c` (the CPU's error for the first that is not). Reads `targets` to the host.
fn checked_count(targets: &Tensor, c: usize, ignore_index: i64) -> Result<usize> {
    let t = targets.contig::<i64>("cross_entropy")?;
    if let Some(&bad) = t.iter().find(|&&t| t != ignore_index && (t < 0 || t as usize >= c)) {
        return Err(Error::IndexOutOfRange {
            op: "cross_entropy",
            index: bad,
            size: c,
        });
    }
    Ok(t.iter().filter(|&&t| t != ignore_index).count())
}

/// `[loss, lse]`: the mean cross-entropy over the rows whose target is not `ignore_index` (a
/// 0-d tensor of the logits' dtype; NaN when every row is ignored), with PyTorch's label
/// smoothing, and the per-row log-sum-exp `[N]` in the compute dtype.
pub(super) fn forward(logits: &Tensor, targets: &Tensor, ignore_index: i64, smoothing: f64) -> Result<Vec<Tensor>> {
    const OP: &str = "cross_entropy";
    let g = gpu_of(logits)?;
    let dtype = logits.dtype();
    let acc = dtype.compute_float();
    let (n, c) = (logits.shape()[0], logits.shape()[1]);
    let valid = checked_count(targets, c, ignore_index)?;
    let out = empty(&g, OP, dtype, &[])?;
    let lse = empty(&g, OP, acc, &[n])?;
    let loss = empty(&g, OP, acc, &[n])?;
    let (lossp, n64) = (ptr(&loss)?, n as u64);
    if n > 0 {
        let (x, t) = (dense(logits)?, dense(targets)?);
        let f = kernel(&g, OP, "cross_entropy", dtype)?;
        let (xp, tp, lsep) = (ptr(&x)?, ptr(&t)?, ptr(&lse)?);
        let c64 = c as u64;
        g.bind()?;
        // SAFETY: `x` holds `n * c` contiguous elements, `t`, `loss` and `lse` `n`; each block
        // reads whole rows and writes its rows' loss and lse; a target is only used as an index
        // when it lies in `0..c` (checked here too).
        unsafe {
            g.stream()
                .launch_builder(&f)
                .arg(&xp)
                .arg(&tp)
                .arg(&lossp)
                .arg(&lsep)
                .arg(&n64)
                .arg(&c64)
                .arg(&ignore_index)
                .arg(&smoothing)
                .launch(for_rows(n, row_threads(c)))
        }
        .map_err(|e| g.fail(OP, e))?;
    }
    let f = kernel(&g, OP, "cross_entropy_mean", dtype)?;
    let (outp, valid64) = (ptr(&out)?, valid as u64);
    g.bind()?;
    // SAFETY: `loss` holds `n` elements written above; `out` holds one element, written by
    // thread 0 of the one block.
    unsafe {
        g.stream()
            .launch_builder(&f)
            .arg(&lossp)
            .arg(&outp)
            .arg(&n64)
            .arg(&valid64)
            .launch(for_rows(1, REDUCE_THREADS))
    }
    .map_err(|e| g.fail(OP, e))?;
    Ok(vec![out, lse])
}

/// `[dx]` of the mean cross-entropy, `[N, C]` of the logits' dtype: on rows whose target is not
/// ignored, `scale * (softmax - (1 - ε) onehot - ε / C)` with `scale = grad_out / count`; 0 on
/// ignored rows. `lse` is the forward's `[N]` (compute dtype), `grad_out` 0-d of the logits'
/// dtype.
pub(super) fn backward(
    logits: &Tensor,
    targets: &Tensor,
    lse: &Tensor,
    grad_out: &Tensor,
    ignore_index: i64,
    smoothing: f64,
) -> Result<Vec<Tensor>> {
    const OP: &str = "cross_entropy_backward";
    let g = gpu_of(logits)?;
    let dtype = logits.dtype();
    expect_dtype(OP, targets, DType::I64)?;
    expect_dtype(OP, lse, dtype.compute_float())?;
    expect_dtype(OP, grad_out, dtype)?;
    let (n, c) = (logits.shape()[0], logits.shape()[1]);
    let dx = empty(&g, OP, dtype, &[n, c])?;
    let total = n * c;
    if total == 0 {
        return Ok(vec![dx]);
    }
    let (x, t, lse) = (dense(logits)?, dense(targets)?, dense(lse)?);
    let grad_out = dense(grad_out)?;
    let scale = empty(&g, OP, DType::F64, &[1])?;
    let (tp, gp, sp, n64) = (ptr(&t)?, ptr(&grad_out)?, ptr(&scale)?, n as u64);
    let f = kernel(&g, OP, "cross_entropy_scale", dtype)?;
    g.bind()?;
    // SAFETY: `t` holds `n` targets, `grad_out` one element, `scale` one f64, written by thread 0
    // of the one block.
    unsafe {
        g.stream()
            .launch_builder(&f)
            .arg(&tp)
            .arg(&n64)
            .arg(&ignore_index)
            .arg(&gp)
            .arg(&sp)
            .launch(for_rows(1, REDUCE_THREADS))
    }
    .map_err(|e| g.fail(OP, e))?;
    let f = kernel(&g, OP, "cross_entropy_backward", dtype)?;
    let (xp, lsep, dxp, total64, c64) = (ptr(&x)?, ptr(&lse)?, ptr(&dx)?, total as u64, c as u64);
    g.bind()?;
    // SAFETY: `x` and `dx` hold `n * c` contiguous elements, `t` and `lse` `n`, `scale` one
    // (written by the launch before, on the same stream); targets are only compared, never used
    // as addresses.
    unsafe {
        g.stream()
            .launch_builder(&f)
            .arg(&xp)
            .arg(&tp)
            .arg(&lsep)
            .arg(&sp)
            .arg(&dxp)
            .arg(&total64)
            .arg(&c64)
            .arg(&ignore_index)
            .arg(&smoothing)
            .launch(for_elements(total))
    }
    .map_err(|e| g.fail(OP, e))?;
    Ok(vec![dx])
}
