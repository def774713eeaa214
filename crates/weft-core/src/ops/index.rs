//! Indexing: index_select, index_add, gather, scatter_add, one_hot, and embedding on top.
//! Index tensors are I64; every index is range-checked (they may come from data files).

use super::{apply, expect_dtype, to_compute};
use crate::dtype::DType;
use crate::error::{invalid, Error, Result};
use crate::op::Op;
use crate::shape::{contiguous_strides, numel, resolve_dim};
use crate::storage::{CpuStorage, StorageElement};
use crate::tensor::Tensor;

impl Tensor {
    /// Entries `index` (1-D I64) of dim `dim`: output dim `dim` has `index.len()` entries.
    pub fn index_select(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        let d = resolve_dim("index_select", dim, self.rank())?;
        expect_dtype("index_select", index, DType::I64)?;
        if index.rank() != 1 {
            return Err(invalid(
                "index_select",
                format!("index must be 1-D, got shape {:?}", index.shape()),
            ));
        }
        apply(Op::IndexSelect { dim: d }, &[self, index])
    }

    /// `self` with `src` added at entries `index` of dim `dim` (repeated indices accumulate).
    pub fn index_add(&self, dim: isize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        let d = resolve_dim("index_add", dim, self.rank())?;
        expect_dtype("index_add", index, DType::I64)?;
        super::expect_float("index_add", self)?;
        let mut want = self.shape().to_vec();
        want[d] = index.numel();
        if index.rank() != 1 || src.shape() != want.as_slice() {
            return Err(Error::ShapeMismatch {
                op: "index_add",
                lhs: want,
                rhs: src.shape().to_vec(),
            });
        }
        apply(Op::IndexAdd { dim: d }, &[self, index, src])
    }

    /// `out[i][j][k] = self[i][index[i][j][k]][k]` for `dim = 1` (as `torch.gather`).
    pub fn gather(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        let d = resolve_dim("gather", dim, self.rank())?;
        expect_dtype("gather", index, DType::I64)?;
        check_scatter_shape("gather", self, index, d)?;
        apply(Op::Gather { dim: d }, &[self, index])
    }

    /// `self` with `src[i][j][k]` added at `[i][index[i][j][k]][k]` for `dim = 1`.
    pub fn scatter_add(&self, dim: isize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        let d = resolve_dim("scatter_add", dim, self.rank())?;
        expect_dtype("scatter_add", index, DType::I64)?;
        super::expect_float("scatter_add", self)?;
        check_scatter_shape("scatter_add", self, index, d)?;
        if src.shape() != index.shape() {
            return Err(Error::ShapeMismatch {
                op: "scatter_add",
                lhs: index.shape().to_vec(),
                rhs: src.shape().to_vec(),
            });
        }
        apply(Op::ScatterAdd { dim: d }, &[self, index, src])
    }

    /// One-hot encoding of I64 class ids: `[...] -> [..., num_classes]` (I64).
    pub fn one_hot(&self, num_classes: usize) -> Result<Tensor> {
        expect_dtype("one_hot", self, DType::I64)?;
        apply(Op::OneHot { num_classes }, &[self])
    }

    /// Rows of `self` (a `[V, D]` table) for I64 ids of any shape: `[...] -> [..., D]`.
    pub fn embedding(&self, ids: &Tensor) -> Result<Tensor> {
        if self.rank() != 2 {
            return Err(invalid(
                "embedding",
                format!("weight must be [V, D], got {:?}", self.shape()),
            ));
        }
        let flat = ids.flatten(0, -1)?;
        let rows = self.index_select(0, &flat)?;
        let mut shape: Vec<isize> = ids.shape().iter().map(|&d| d as isize).collect();
        shape.push(self.shape()[1] as isize);
        rows.reshape(&shape)
    }
}

fn check_scatter_shape(op: &'static str, x: &Tensor, index: &Tensor, dim: usize) -> Result<()> {
    let ok = index.rank() == x.rank() && (0..x.rank()).all(|d| d == dim || index.shape()[d] <= x.shape()[d]);
    if !ok {
        return Err(Error::ShapeMismatch {
            op,
            lhs: x.shape().to_vec(),
            rhs: index.shape().to_vec(),
        });
    }
    Ok(())
}

/// Checked indices as usize.
fn indices(op: &'static str, index: &Tensor, size: usize) -> Result<Vec<usize>> {
    let v = index.contig::<i64>(op)?;
    if let Some(&bad) = v.iter().find(|&&i| i < 0 || i as usize >= size) {
        return Err(Error::IndexOutOfRange { op, index: bad, size });
    }
    crate::alloc::collect(op, v.len(), v.iter().map(|&i| i as usize))
}

/// `(outer, size, inner)` around `dim`.
fn split_at(shape: &[usize], dim: usize) -> (usize, usize, usize) {
    (numel(&shape[..dim]), shape[dim], numel(&shape[dim + 1..]))
}

/// Entries `idx` of dim `dim` of a contiguous `shape` tensor's elements `x`, in a buffer of
/// `n` elements (the output's count).
fn index_select_typed<T: StorageElement>(
    x: &[T],
    shape: &[usize],
    dim: usize,
    idx: &[usize],
    n: usize,
) -> Result<Vec<T>> {
    let (outer, size, inner) = split_at(shape, dim);
    let mut out = crate::alloc::with_capacity("index_select", n)?;
    for o in 0..outer {
        for &i in idx {
            let s = (o * size + i) * inner;
            out.extend_from_slice(&x[s..s + inner]);
        }
    }
    Ok(out)
}

fn add_rows<T: StorageElement + std::ops::AddAssign>(
    out: &mut [T],
    shape: &[usize],
    dim: usize,
    idx: &[usize],
    src: &[T],
) {
    let (outer, size, inner) = split_at(shape, dim);
    for o in 0..outer {
        for (j, &i) in idx.iter().enumerate() {
            let d = (o * size + i) * inner;
            let s = (o * idx.len() + j) * inner;
            // zipped slices: no bounds checks in the loop, which vectorizes
            for (o, &v) in out[d..d + inner].iter_mut().zip(&src[s..s + inner]) {
                *o += v;
            }
        }
    }
}

/// For each element of a contiguous `index_shape` tensor, the flat offset in a contiguous `x_shape`
/// tensor with coordinate `dim` replaced by `idx[element]`.
fn scatter_offsets(
    op: &'static str,
    x_shape: &[usize],
    index_shape: &[usize],
    dim: usize,
    idx: &[usize],
) -> Result<Vec<usize>> {
    let xs = contiguous_strides(x_shape);
    let is = contiguous_strides(index_shape);
    let offsets = (0..idx.len()).map(|flat| {
        let mut off = 0;
        let mut rem = flat;
        for d in 0..index_shape.len() {
            let c = rem / is[d];
            rem %= is[d];
            off += if d == dim { idx[flat] } else { c } * xs[d];
        }
        off
    });
    crate::alloc::collect(op, idx.len(), offsets)
}

pub(super) fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let x = inputs[0];
    let name = op.name();
    let out = match op {
        Op::IndexSelect { dim } => {
            let idx = indices(name, inputs[1], x.shape()[*dim])?;
            let mut shape = x.shape().to_vec();
            shape[*dim] = idx.len();
            let n = crate::shape::checked_numel(name, &shape)?;
            // the table is read in place when contiguous (an embedding's weight is)
            let out = crate::dtype_dispatch!(x.dtype(), T => {
                T::wrap(index_select_typed(&x.contig::<T>(name)?, x.shape(), *dim, &idx, n)?)
            });
            Tensor::from_storage(out, &shape)
        }
        Op::IndexAdd { dim } => {
            let idx = indices(name, inputs[1], x.shape()[*dim])?;
            let xc = to_compute(name, x)?;
            // src converted once, straight to x's compute dtype (an integer source into f64 stays
            // exact), read in place when it already is and is contiguous
            let src = inputs[2];
            let src = if src.dtype() == xc.dtype() {
                src.clone()
            } else {
                Tensor::from_storage(src.cast_storage(name, xc.dtype())?, src.shape())
            };
            let mut data = xc.contiguous_storage(name)?;
            crate::float_dispatch!(xc.dtype(), T => {
                let out = T::slice_mut(&mut data).ok_or(Error::UnsupportedDType { op: "index_add", dtype: xc.dtype() })?;
                add_rows(out, x.shape(), *dim, &idx, &src.contig::<T>("index_add")?);
            });
            super::elementwise::back_to(name, Tensor::from_storage(data, x.shape()), x.dtype())?
        }
        Op::Gather { dim } => {
            let index = inputs[1];
            let idx = indices(name, index, x.shape()[*dim])?;
            let offs = scatter_offsets(name, x.shape(), index.shape(), *dim, &idx)?;
            let out = crate::dtype_dispatch!(x.dtype(), T => {
                let v = x.contig::<T>(name)?;
                T::wrap(crate::alloc::collect(name, offs.len(), offs.iter().map(|&o| v[o]))?)
            });
            Tensor::from_storage(out, index.shape())
        }
        Op::ScatterAdd { dim } => {
            let index = inputs[1];
            let idx = indices(name, index, x.shape()[*dim])?;
            let offs = scatter_offsets(name, x.shape(), index.shape(), *dim, &idx)?;
            let xc = to_compute(name, x)?;
            // src converted once, straight to x's compute dtype (as index_add)
            let src = inputs[2].cast_storage(name, xc.dtype())?;
            let mut data = xc.contiguous_storage(name)?;
            fn add<T: StorageElement + std::ops::AddAssign>(d: &mut CpuStorage, s: &CpuStorage, offs: &[usize]) {
                let (d, s) = (T::slice_mut(d).unwrap(), T::slice(s).unwrap());
                for (&o, &v) in offs.iter().zip(s) {
                    d[o] += v;
                }
            }
            match xc.dtype() {
                DType::F32 => add::<f32>(&mut data, &src, &offs),
                DType::F64 => add::<f64>(&mut data, &src, &offs),
                d => {
                    return Err(Error::UnsupportedDType {
                        op: "scatter_add",
                        dtype: d,
                    })
                }
            }
            super::elementwise::back_to(name, Tensor::from_storage(data, x.shape()), x.dtype())?
        }
        Op::OneHot { num_classes } => {
            let idx = indices(name, x, *num_classes)?;
            let n = idx
                .len()
                .checked_mul(*num_classes)
                .ok_or_else(|| invalid(name, format!("{} ids x {num_classes} classes overflow", idx.len())))?;
            let mut out = crate::alloc::filled(name, n, 0i64)?;
            for (r, &c) in idx.iter().enumerate() {
                out[r * num_classes + c] = 1;
            }
            let mut shape = x.shape().to_vec();
            shape.push(*num_classes);
            Tensor::from_vec(out, &shape)?
        }
        _ => unreachable!("index::forward called with {op:?}"),
    };
    Ok(vec![out])
}

pub(super) fn backward(op: &Op, inputs: &[Tensor], grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let (x, index) = (&inputs[0], &inputs[1]);
    Ok(match op {
        Op::IndexSelect { dim } => {
            let gx = Tensor::zeros_like(x)?.index_add(*dim as isize, index, grad)?;
            vec![Some(gx), None]
        }
        Op::IndexAdd { dim } => vec![Some(grad.clone()), None, Some(grad.index_select(*dim as isize, index)?)],
        Op::Gather { dim } => vec![
            Some(Tensor::zeros_like(x)?.scatter_add(*dim as isize, index, grad)?),
            None,
        ],
        Op::ScatterAdd { dim } => vec![Some(grad.clone()), None, Some(grad.gather(*dim as isize, index)?)],
        _ => unreachable!("index::backward called with {op:?}"),
    })
}
