//! Reductions over any set of dims: sum, mean, max, min, var, and argmax over one dim.
//! Float sums accumulate in f64.

use super::{apply, to_compute};
use crate::dtype::{is_nan, DType};
use crate::error::{invalid, Error, Result};
use crate::op::{Op, ReduceOp};
use crate::shape::{numel, reduced_shape, resolve_dim, resolve_dims};
use crate::storage::{CpuStorage, StorageElement};
use crate::tensor::Tensor;

impl Tensor {
    /// Sum over `dims` (empty: all dims).
    pub fn sum(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Sum, dims, keepdim)
    }

    /// Mean over `dims` (empty: all dims); float tensors.
    pub fn mean(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Mean, dims, keepdim)
    }

    /// Max over `dims` (empty: all dims). Gradient splits evenly between tied maxima.
    pub fn max(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, dims, keepdim)
    }

    /// Min over `dims` (empty: all dims).
    pub fn min(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceOp::Min, dims, keepdim)
    }

    /// Sum of all elements, as a 0-d tensor.
    pub fn sum_all(&self) -> Result<Tensor> {
        self.sum(&[], false)
    }

    /// Mean of all elements, as a 0-d tensor.
    pub fn mean_all(&self) -> Result<Tensor> {
        self.mean(&[], false)
    }

    /// One of the [`ReduceOp`]s over `dims`.
    pub fn reduce(&self, op: ReduceOp, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        let dims = resolve_dims("reduce", dims, self.rank())?;
        if self.dtype() == DType::Bool || (op == ReduceOp::Mean && !self.dtype().is_float()) {
            return Err(Error::UnsupportedDType {
                op: "reduce",
                dtype: self.dtype(),
            });
        }
        if matches!(op, ReduceOp::Max | ReduceOp::Min) && dims.iter().any(|&d| self.shape()[d] == 0) {
            return Err(invalid(
                "reduce",
                format!("max/min over an empty dim of {:?}", self.shape()),
            ));
        }
        apply(Op::Reduce { op, dims, keepdim }, &[self])
    }

    /// Index of the largest value along `dim` (first one on ties), as I64.
    pub fn argmax(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        let d = resolve_dim("argmax", dim, self.rank())?;
        if self.shape()[d] == 0 {
            return Err(invalid("argmax", format!("empty dim {d} of {:?}", self.shape())));
        }
        apply(Op::ArgMax { dim: d, keepdim }, &[self])
    }

    /// Variance over `dims` with `correction` (1: unbiased, PyTorch's default; 0: population).
    pub fn var(&self, dims: &[isize], correction: usize, keepdim: bool) -> Result<Tensor> {
        super::expect_float("var", self)?;
        let dims = resolve_dims("var", dims, self.rank())?;
        apply(
            Op::Var {
                dims,
                correction,
                keepdim,
            },
            &[self],
        )
    }

    /// Sums broadcast dims away so the result has `shape` (the adjoint of `expand`).
    pub fn sum_to_shape(&self, shape: &[usize]) -> Result<Tensor> {
        if self.shape() == shape {
            return Ok(self.clone());
        }
        let rank = self.rank();
        if shape.len() > rank {
            return Err(Error::ShapeMismatch {
                op: "sum_to_shape",
                lhs: self.shape().to_vec(),
                rhs: shape.to_vec(),
            });
        }
        let lead = rank - shape.len();
        let mut dims: Vec<isize> = (0..lead as isize).collect();
        for (i, &s) in shape.iter().enumerate() {
            if s == 1 && self.shape()[lead + i] != 1 {
                dims.push((lead + i) as isize);
            } else if s != self.shape()[lead + i] {
                return Err(Error::ShapeMismatch {
                    op: "sum_to_shape",
                    lhs: self.shape().to_vec(),
                    rhs: shape.to_vec(),
                });
            }
        }
        let s = if dims.is_empty() {
            self.clone()
        } else {
            self.sum(&dims, true)?
        };
        s.view(shape)
    }
}

/// Moves the reduced dims last and returns the contiguous data plus (rows, row length).
fn rows_of(name: &'static str, x: &Tensor, dims: &[usize]) -> Result<(CpuStorage, usize, usize)> {
    let keep: Vec<usize> = (0..x.rank()).filter(|d| !dims.contains(d)).collect();
    let mut perm = keep.clone();
    perm.extend_from_slice(dims);
    let l = x.layout().permute(&perm)?;
    let data = x.storage().read().gather(name, &l)?;
    let len = numel(&dims.iter().map(|&d| x.shape()[d]).collect::<Vec<_>>());
    let rows = numel(&keep.iter().map(|&d| x.shape()[d]).collect::<Vec<_>>());
    Ok((data, rows, len))
}

fn reduce_rows<T: StorageElement, U: StorageElement>(
    name: &'static str,
    data: &[T],
    rows: usize,
    len: usize,
    f: impl Fn(&[T]) -> U + Sync,
) -> Result<Vec<U>> {
    let mut out = crate::alloc::filled(name, rows, U::zero())?;
    if len == 0 {
        out.iter_mut().for_each(|o| *o = f(&[]));
        return Ok(out);
    }
    let per_task = (crate::cpu::PARALLEL_THRESHOLD / len).max(1);
    crate::cpu::pool::for_each_chunk(&mut out, per_task, |i, o| {
        for (j, o) in o.iter_mut().enumerate() {
            *o = f(&data[(i * per_task + j) * len..][..len]);
        }
    });
    Ok(out)
}

fn reduce_typed<T: StorageElement>(op: ReduceOp, data: &CpuStorage, rows: usize, len: usize) -> Result<CpuStorage> {
    let v = T::slice(data).expect("dtype matches");
    let name = "reduce";
    let out: Vec<T> = match op {
        ReduceOp::Sum => reduce_rows(name, v, rows, len, |r| T::from_f64(r.iter().map(|x| x.to_f64()).sum()))?,
        ReduceOp::Mean => reduce_rows(name, v, rows, len, |r| {
            T::from_f64(r.iter().map(|x| x.to_f64()).sum::<f64>() / len as f64)
        })?,
        ReduceOp::Max => reduce_rows(name, v, rows, len, |r| {
            r.iter()
                .copied()
                .fold(r[0], |a, b| if b > a || is_nan(b) { b } else { a })
        })?,
        ReduceOp::Min => reduce_rows(name, v, rows, len, |r| {
            r.iter()
                .copied()
                .fold(r[0], |a, b| if b < a || is_nan(b) { b } else { a })
        })?,
    };
    Ok(T::wrap(out))
}

/// Sum/mean/max/min of a contiguous float tensor over trailing dims (row kernel), leading dims
/// (column kernel) or one run of consecutive dims between (the column kernel per outer index),
/// without copying the input. `None` when none applies.
fn fast_float_reduce(x: &Tensor, op: ReduceOp, dims: &[usize]) -> Result<Option<Tensor>> {
    if !x.dtype().is_float() || !x.is_contiguous() || dims.is_empty() || x.numel() == 0 {
        return Ok(None);
    }
    let rank = x.rank();
    let suffix = dims.iter().enumerate().all(|(i, &d)| d == rank - dims.len() + i);
    let prefix = dims.iter().enumerate().all(|(i, &d)| d == i);
    // one run of consecutive dims in the middle: [outer, reduced, inner]
    let block = dims.windows(2).all(|w| w[1] == w[0] + 1);
    if !suffix && !prefix && !block {
        return Ok(None);
    }
    let xc = to_compute("reduce", x)?;
    let reduced = numel(&dims.iter().map(|&d| x.shape()[d]).collect::<Vec<_>>());
    let kept = x.numel() / reduced;
    let inner = numel(&x.shape()[dims[dims.len() - 1] + 1..]);
    let out = crate::float_dispatch!(xc.dtype(), T => {
        let xs = xc.contig::<T>("reduce")?;
        let mut out = crate::alloc::filled("reduce", kept, 0 as T)?;
        if suffix {
            crate::cpu::reduce::reduce_rows(op, &xs, reduced, &mut out);
        } else if prefix {
            crate::cpu::reduce::reduce_columns(op, &xs, reduced, kept, &mut out);
        } else {
            crate::cpu::reduce::reduce_middle(op, &xs, reduced, inner, &mut out);
        }
        Tensor::from_vec(out, &[kept])?
    });
    Ok(Some(out))
}

pub(super) fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let x = inputs[0];
    let name = op.name();
    let out = match op {
        Op::Reduce { op: r, dims, keepdim } => {
            let shape = reduced_shape(x.shape(), dims, *keepdim);
            if let Some(out) = fast_float_reduce(x, *r, dims)? {
                return Ok(vec![super::elementwise::back_to(
                    name,
                    out.reshape_raw(&shape),
                    x.dtype(),
                )?]);
            }
            let (data, rows, len) = rows_of(name, x, dims)?;
            let out = match x.dtype() {
                DType::F32 => reduce_typed::<f32>(*r, &data, rows, len)?,
                DType::F64 => reduce_typed::<f64>(*r, &data, rows, len)?,
                DType::BF16 | DType::F16 => {
                    reduce_typed::<f32>(*r, &data.cast(name, DType::F32)?, rows, len)?.cast(name, x.dtype())?
                }
                DType::I64 => reduce_typed::<i64>(*r, &data, rows, len)?,
                DType::I32 => reduce_typed::<i32>(*r, &data, rows, len)?,
                DType::U8 => reduce_typed::<u8>(*r, &data, rows, len)?,
                DType::Bool => {
                    return Err(Error::UnsupportedDType {
                        op: "reduce",
                        dtype: DType::Bool,
                    })
                }
            };
            Tensor::from_storage(out, &shape)
        }
        Op::ArgMax { dim, keepdim } => {
            let shape = reduced_shape(x.shape(), &[*dim], *keepdim);
            let (data, rows, len) = rows_of(name, x, &[*dim])?;
            let data = data.cast(name, DType::F64)?;
            let v = f64::slice(&data).expect("cast to f64");
            let out: Vec<i64> = reduce_rows(name, v, rows, len, |r| {
                let mut best = 0;
                for (i, &x) in r.iter().enumerate() {
                    if x > r[best] || (x.is_nan() && !r[best].is_nan()) {
                        best = i;
                    }
                }
                best as i64
            })?;
            Tensor::from_vec(out, &shape)?
        }
        Op::Var {
            dims,
            correction,
            keepdim,
        } => {
            let shape = reduced_shape(x.shape(), dims, *keepdim);
            let xc = to_compute(name, x)?;
            let (data, rows, len) = rows_of(name, &xc, dims)?;
            let data = data.cast(name, DType::F64)?;
            let v = f64::slice(&data).expect("cast to f64");
            let denom = len as f64 - *correction as f64;
            let out: Vec<f64> = reduce_rows(name, v, rows, len, |r| {
                let mean = r.iter().sum::<f64>() / len as f64;
                r.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / denom
            })?;
            Tensor::from_storage(CpuStorage::F64(out).cast(name, x.dtype())?, &shape)
        }
        _ => unreachable!("reduce::forward called with {op:?}"),
    };
    Ok(vec![out])
}

pub(super) fn backward(op: &Op, inputs: &[Tensor], output: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let x = &inputs[0];
    let (dims, keepdim) = match op {
        Op::Reduce { dims, keepdim, .. } | Op::Var { dims, keepdim, .. } => (dims, *keepdim),
        _ => unreachable!("reduce::backward called with {op:?}"),
    };
    let kept = reduced_shape(x.shape(), dims, true);
    let g = if keepdim { grad.clone() } else { grad.view(&kept)? };
    let count = numel(&dims.iter().map(|&d| x.shape()[d]).collect::<Vec<_>>()) as f64;
    let gx = match op {
        Op::Reduce { op: ReduceOp::Sum, .. } => g.expand(x.shape())?,
        Op::Reduce { op: ReduceOp::Mean, .. } => g.div_scalar(count)?.expand(x.shape())?,
        Op::Reduce { .. } => {
            let out = if keepdim { output.clone() } else { output.view(&kept)? };
            let mask = x.eq(&out)?.cast(x.dtype())?;
            let ties = mask.sum(&dims.iter().map(|&d| d as isize).collect::<Vec<_>>(), true)?;
            g.div(&ties)?.mul(&mask)?
        }
        Op::Var { correction, .. } => {
            let idims: Vec<isize> = dims.iter().map(|&d| d as isize).collect();
            let centered = x.sub(&x.mean(&idims, true)?)?;
            centered.mul(&g)?.mul_scalar(2.0 / (count - *correction as f64))?
        }
        _ => unreachable!(),
    };
    Ok(vec![Some(gx)])
}
