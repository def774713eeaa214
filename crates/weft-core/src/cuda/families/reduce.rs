//! GPU forward of the reduce family (see `crate::ops::reduce` for the CPU's): sum, mean, max and
//! min over a set of dims, argmax over one dim, variance.
//!
//! Design: the reduced dims are permuted last and the view made contiguous on the GPU (no copy
//! when it already is: a reduction over trailing dims of a contiguous tensor), so the input is
//! `[rows, len]` with one output per row; `kernels/reduce.cu` reduces each row with one block.
//! Sums accumulate in f64 for every dtype, as the CPU does.

use std::sync::Arc;

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::elementwise::{coalesce, dtype_suffix, launch};
use crate::cuda::copy::{dense, empty, gpu_of, ptr};
use crate::cuda::dispatch::not_on_gpu;
use crate::cuda::kernels::REDUCE;
use crate::cuda::launch::for_rows;
use crate::cuda::runtime::Gpu;
use crate::dtype::DType;
use crate::error::{invalid, Error, Result};
use crate::layout::Layout;
use crate::op::{Op, ReduceOp};
use crate::shape::{numel, reduced_shape};
use crate::tensor::Tensor;

/// The kernels of `kernels/reduce.cu` that this family launches (checked by the compile test).
pub const KERNELS: &[&str] = &[
    "sum_f32",
    "sum_f64",
    "sum_bf16",
    "sum_f16",
    "sum_i64",
    "sum_i32",
    "sum_u8",
    "max_f32",
    "max_f64",
    "max_bf16",
    "max_f16",
    "max_i64",
    "max_i32",
    "max_u8",
    "min_f32",
    "min_f64",
    "min_bf16",
    "min_f16",
    "min_i64",
    "min_i32",
    "min_u8",
    "argmax_f32",
    "argmax_f64",
    "argmax_bf16",
    "argmax_f16",
    "argmax_i64",
    "argmax_i32",
    "argmax_u8",
    "argmax_bool",
    "var_f32",
    "var_f64",
    "var_bf16",
    "var_f16",
];

pub fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let x = inputs[0];
    let out = match op {
        Op::Reduce { op: r, dims, keepdim } => reduce(x, *r, dims, *keepdim)?,
        Op::ArgMax { dim, keepdim } => argmax(x, *dim, *keepdim)?,
        Op::Var {
            dims,
            correction,
            keepdim,
        } => {
            if !x.dtype().is_float() {
                // The ops layer accepts float tensors only.
                return Err(not_on_gpu(op, inputs));
            }
            var(x, dims, *correction, *keepdim)?
        }
        _ => unreachable!("reduce::forward called with {op:?}"),
    };
    Ok(vec![out])
}

/// `x` with the (sorted) `dims` moved last, contiguous on the GPU, and its `(rows, len)`: row `r`
/// holds the elements reduced into output element `r` (the kept dims in row-major order), `len`
/// of them.
fn rows_of(x: &Tensor, dims: &[usize]) -> Result<(Tensor, usize, usize)> {
    let keep: Vec<usize> = (0..x.rank()).filter(|d| !dims.contains(d)).collect();
    let mut perm = keep.clone();
    perm.extend_from_slice(dims);
    let permuted = x.layout().permute(&perm)?;
    // The same elements in the same order under fewer dims: the gather is cheaper and stays
    // within the kernels' rank limit.
    let (shape, strides) = coalesce(&permuted);
    let flat = x.with_layout(Layout {
        shape,
        strides,
        offset: permuted.offset,
    });
    let len = numel(&dims.iter().map(|&d| x.shape()[d]).collect::<Vec<_>>());
    let rows = numel(&keep.iter().map(|&d| x.shape()[d]).collect::<Vec<_>>());
    Ok((dense(&flat)?, rows, len))
}

/// One block per row: a multiple of 32 threads up to 256, fewer for short rows.
fn row_config(rows: usize, len: usize) -> LaunchConfig {
    let threads = len.div_ceil(32).clamp(1, 8) as u32 * 32;
    for_rows(rows, threads)
}

fn kernel(g: &Arc<Gpu>, kind: &str, dtype: DType) -> Result<cudarc::driver::CudaFunction> {
    g.function(&REDUCE, &format!("{kind}_{}", dtype_suffix(dtype)))
}

/// Sum, mean, max or min of `x` over `dims` (sorted; every dtype but Bool, mean on floats).
fn reduce(x: &Tensor, r: ReduceOp, dims: &[usize], keepdim: bool) -> Result<Tensor> {
    let dt = x.dtype();
    if dt == DType::Bool {
        return Err(Error::UnsupportedDType {
            op: "reduce",
            dtype: dt,
        });
    }
    let g = gpu_of(x)?;
    let out = empty(&g, "reduce", dt, &reduced_shape(x.shape(), dims, keepdim))?;
    let (data, rows, len) = rows_of(x, dims)?;
    if rows == 0 {
        return Ok(out);
    }
    if len == 0 && matches!(r, ReduceOp::Max | ReduceOp::Min) {
        return Err(invalid(
            "reduce",
            format!("max/min over an empty dim of {:?}", x.shape()),
        ));
    }
    let kind = match r {
        ReduceOp::Sum | ReduceOp::Mean => "sum",
        ReduceOp::Max => "max",
        ReduceOp::Min => "min",
    };
    let f = kernel(&g, kind, dt)?;
    let (o, i, rows64, len64) = (ptr(&out)?, ptr(&data)?, rows as u64, len as u64);
    let cfg = row_config(rows, len);
    let mean = u32::from(r == ReduceOp::Mean);
    match r {
        ReduceOp::Sum | ReduceOp::Mean => launch!(g, f, cfg, "reduce"; o, i, rows64, len64, mean),
        ReduceOp::Max | ReduceOp::Min => launch!(g, f, cfg, "reduce"; o, i, rows64, len64),
    }
    Ok(out)
}

/// The index (I64) of the first largest value of `x` along `dim`, a NaN counting as largest
/// (the first NaN); every dtype.
fn argmax(x: &Tensor, dim: usize, keepdim: bool) -> Result<Tensor> {
    let g = gpu_of(x)?;
    let out = empty(&g, "argmax", DType::I64, &reduced_shape(x.shape(), &[dim], keepdim))?;
    let (data, rows, len) = rows_of(x, &[dim])?;
    if rows == 0 {
        return Ok(out);
    }
    if len == 0 {
        return Err(invalid("argmax", format!("empty dim {dim} of {:?}", x.shape())));
    }
    let f = kernel(&g, "argmax", x.dtype())?;
    let (o, i, rows64, len64) = (ptr(&out)?, ptr(&data)?, rows as u64, len as u64);
    launch!(g, f, row_config(rows, len), "argmax"; o, i, rows64, len64);
    Ok(out)
}

/// The variance of `x` (float) over `dims`: the squared deviations from the mean summed and
/// divided by `len - correction`, in f64, stored in `x`'s dtype.
fn var(x: &Tensor, dims: &[usize], correction: usize, keepdim: bool) -> Result<Tensor> {
    let g = gpu_of(x)?;
    let out = empty(&g, "var", x.dtype(), &reduced_shape(x.shape(), dims, keepdim))?;
    let (data, rows, len) = rows_of(x, dims)?;
    if rows == 0 {
        return Ok(out);
    }
    let f = kernel(&g, "var", x.dtype())?;
    let denom = len as f64 - correction as f64;
    let (o, i, rows64, len64) = (ptr(&out)?, ptr(&data)?, rows as u64, len as u64);
    launch!(g, f, row_config(rows, len), "var"; o, i, rows64, len64, denom);
    Ok(out)
}
