//! Layer norm and RMS norm over the last dim, and their backward.
//!
//! The forward is one block per row; it saves per-row mean (0 for RMS) and rstd in the compute
//! dtype, shape `[rows]`. The backward's dx is one block per row; dweight and dbias, sums over
//! rows, are reduced deterministically without atomics: per block of rows, per column, a partial
//! sum into a `[blocks, C]` scratch of the compute dtype, then a column sum in block order.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{expect_dtype, kernel, row_threads};
use crate::cuda::copy::{dense, empty, gpu_of, ptr};
use crate::cuda::launch::{for_elements, for_rows};
use crate::error::Result;
use crate::tensor::Tensor;

/// Row length (the last dim, at least 1 as on the CPU) and row count (`numel / len`) of `x`.
fn rows_of(x: &Tensor) -> (usize, usize) {
    let len = x.shape().last().copied().unwrap_or(1).max(1);
    (len, x.numel() / len)
}

/// The device address of an optional contiguous input; 0 (null) when absent.
fn opt_ptr(t: Option<&Tensor>) -> Result<u64> {
    t.map(ptr).transpose().map(|p| p.unwrap_or(0))
}

/// `[y, mean, rstd]` of layer norm (`rms` false) or RMS norm of `x` `[..., C]`, with optional
/// `weight` and `bias` `[C]` of `x`'s dtype: y contiguous of `x`'s shape and dtype; mean and
/// rstd `[rows]` in the compute dtype (`rows = numel / max(C, 1)`).
pub(super) fn forward(
    x: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
    rms: bool,
) -> Result<Vec<Tensor>> {
    const OP: &str = "norm";
    let g = gpu_of(x)?;
    let acc = x.dtype().compute_float();
    let (len, rows) = rows_of(x);
    let y = empty(&g, OP, x.dtype(), x.shape())?;
    let mean = empty(&g, OP, acc, &[rows])?;
    let rstd = empty(&g, OP, acc, &[rows])?;
    if rows == 0 {
        return Ok(vec![y, mean, rstd]);
    }
    let x = dense(x)?;
    let weight = weight.map(dense).transpose()?;
    let bias = bias.map(dense).transpose()?;
    let f = kernel(&g, OP, "norm", x.dtype())?;
    let (xp, wp, bp) = (ptr(&x)?, opt_ptr(weight.as_ref())?, opt_ptr(bias.as_ref())?);
    let (yp, mp, rp) = (ptr(&y)?, ptr(&mean)?, ptr(&rstd)?);
    let (rows64, len64, rms32) = (rows as u64, len as u64, rms as u32);
    g.bind()?;
    // SAFETY: `x` and `y` hold `rows * len` contiguous elements, `weight` and `bias` `len` (or
    // are null, and then not read), `mean` and `rstd` `rows`; each block reads and writes whole
    // rows and its rows' statistics.
    unsafe {
        g.stream()
            .launch_builder(&f)
            .arg(&xp)
            .arg(&wp)
            .arg(&bp)
            .arg(&yp)
            .arg(&mp)
            .arg(&rp)
            .arg(&rows64)
            .arg(&len64)
            .arg(&eps)
            .arg(&rms32)
            .launch(for_rows(rows, row_threads(len)))
    }
    .map_err(|e| g.fail(OP, e))?;
    Ok(vec![y, mean, rstd])
}

/// The backward's inputs after `x` and the weight: the output gradient (`x`'s shape and dtype)
/// and the forward's saved mean and rstd (`[rows]`, compute dtype).
pub(super) struct Saved<'a> {
    pub grad: &'a Tensor,
    pub mean: &'a Tensor,
    pub rstd: &'a Tensor,
}

/// Rows summed per block of the dweight/dbias partial sums: at least 64, and few enough that
/// there are at most 512 blocks (the scratch is `blocks * C` elements).
fn rows_per_block(rows: usize) -> usize {
    rows.div_ceil(512).max(64)
}

/// `[dx, dweight?, dbias?]` of the norm: dx of `x`'s shape and dtype, dweight and dbias `[C]` of
/// `x`'s dtype (present when `has_weight` / `has_bias`).
pub(super) fn backward(
    x: &Tensor,
    weight: Option<&Tensor>,
    saved: Saved<'_>,
    rms: bool,
    has_weight: bool,
    has_bias: bool,
) -> Result<Vec<Tensor>> {
    const OP: &str = "norm_backward";
    let g = gpu_of(x)?;
    let dtype = x.dtype();
    let acc = dtype.compute_float();
    expect_dtype(OP, saved.grad, dtype)?;
    expect_dtype(OP, saved.mean, acc)?;
    expect_dtype(OP, saved.rstd, acc)?;
    let (len, rows) = rows_of(x);
    // dweight and dbias have the last dim's length (which may be 0, where `len` is 1).
    let c = x.shape().last().copied().unwrap_or(1);
    let dx = empty(&g, OP, dtype, x.shape())?;
    let dw = has_weight.then(|| empty(&g, OP, dtype, &[c])).transpose()?;
    let db = has_bias.then(|| empty(&g, OP, dtype, &[c])).transpose()?;
    if c == 0 {
        // `[..., 0]`: every output is empty.
        return Ok([Some(dx), dw, db].into_iter().flatten().collect());
    }
    let x = dense(x)?;
    let weight = weight.map(dense).transpose()?;
    let (grad, mean, rstd) = (dense(saved.grad)?, dense(saved.mean)?, dense(saved.rstd)?);
    let (xp, wp, gp, mp, rp) = (
        ptr(&x)?,
        opt_ptr(weight.as_ref())?,
        ptr(&grad)?,
        ptr(&mean)?,
        ptr(&rstd)?,
    );
    let (rows64, len64, rms32) = (rows as u64, len as u64, rms as u32);
    if rows > 0 {
        let f = kernel(&g, OP, "norm_backward", dtype)?;
        let dxp = ptr(&dx)?;
        g.bind()?;
        // SAFETY: `x`, `grad` and `dx` hold `rows * len` contiguous elements, the weight `len`
        // (or is null and not read), `mean` and `rstd` `rows` (the saved statistics of `x`);
        // each block reads and writes whole rows.
        unsafe {
            g.stream()
                .launch_builder(&f)
                .arg(&xp)
                .arg(&wp)
                .arg(&gp)
                .arg(&mp)
                .arg(&rp)
                .arg(&dxp)
                .arg(&rows64)
                .arg(&len64)
                .arg(&rms32)
                .launch(for_rows(rows, row_threads(len)))
        }
        .map_err(|e| g.fail(OP, e))?;
    }
    if dw.is_none() && db.is_none() {
        return Ok(vec![dx]);
    }
    // dweight / dbias: partial sums per block of rows, then a column sum in block order.
    let per_block = rows_per_block(rows);
    let blocks = rows.div_ceil(per_block);
    let pw = empty(&g, OP, acc, &[blocks, len])?;
    let pb = empty(&g, OP, acc, &[blocks, len])?;
    let (pwp, pbp) = (ptr(&pw)?, ptr(&pb)?);
    if blocks > 0 {
        let f = kernel(&g, OP, "norm_partials", dtype)?;
        let per_block64 = per_block as u64;
        const COLS: u32 = 256;
        let cfg = LaunchConfig {
            grid_dim: (len.div_ceil(COLS as usize) as u32, blocks as u32, 1),
            block_dim: (COLS, 1, 1),
            shared_mem_bytes: 0,
        };
        g.bind()?;
        // SAFETY: as for dx; `pw` and `pb` hold `blocks * len` elements of the compute dtype,
        // each written once (block y of the grid covers rows [y * per_block, ...), at most 512
        // blocks; threads past `len` return).
        unsafe {
            g.stream()
                .launch_builder(&f)
                .arg(&xp)
                .arg(&gp)
                .arg(&mp)
                .arg(&rp)
                .arg(&pwp)
                .arg(&pbp)
                .arg(&rows64)
                .arg(&len64)
                .arg(&per_block64)
                .launch(cfg)
        }
        .map_err(|e| g.fail(OP, e))?;
    }
    let f = kernel(&g, OP, "norm_colsum", dtype)?;
    let (dwp, dbp) = (opt_ptr(dw.as_ref())?, opt_ptr(db.as_ref())?);
    let blocks64 = blocks as u64;
    g.bind()?;
    // SAFETY: `pw` and `pb` hold `blocks * len` elements written above; `dw` and `db` hold `len`
    // elements (or are null and not written).
    unsafe {
        g.stream()
            .launch_builder(&f)
            .arg(&pwp)
            .arg(&pbp)
            .arg(&dwp)
            .arg(&dbp)
            .arg(&blocks64)
            .arg(&len64)
            .launch(for_elements(len))
    }
    .map_err(|e| g.fail(OP, e))?;
    Ok([Some(dx), dw, db].into_iter().flatten().collect())
}
