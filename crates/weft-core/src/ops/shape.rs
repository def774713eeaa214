//! Views (reshape, permute, narrow, expand and the helpers built on them), `contiguous`, and `cat`.
//! Views share storage; only `contiguous` (when needed), `cat`, and a reshape of a non-contiguous
//! tensor copy.

use super::apply;
use crate::error::{invalid, Error, Result};
use crate::op::Op;
use crate::shape::{numel, resolve_dim};
use crate::storage::StorageElement;
use crate::tensor::Tensor;

impl Tensor {
    /// Same elements, new shape. One entry may be `-1` (inferred). A view when the strides allow it
    /// (as `torch.reshape`), a copy otherwise.
    pub fn reshape(&self, shape: &[isize]) -> Result<Tensor> {
        let shape = infer_shape(self.shape(), shape)?;
        if shape == self.shape() {
            return Ok(self.clone());
        }
        apply(Op::Reshape(shape), &[self])
    }

    /// Reshape with a `usize` shape.
    pub fn view(&self, shape: &[usize]) -> Result<Tensor> {
        let s: Vec<isize> = shape.iter().map(|&d| d as isize).collect();
        self.reshape(&s)
    }

    /// Output dim `i` is input dim `perm[i]`.
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        self.layout().permute(perm)?;
        apply(Op::Permute(perm.to_vec()), &[self])
    }

    /// Swaps dims `a` and `b`.
    pub fn transpose(&self, a: isize, b: isize) -> Result<Tensor> {
        let a = resolve_dim("transpose", a, self.rank())?;
        let b = resolve_dim("transpose", b, self.rank())?;
        let mut perm: Vec<usize> = (0..self.rank()).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }

    /// Transpose of the last two dims.
    pub fn t(&self) -> Result<Tensor> {
        if self.rank() < 2 {
            return Err(invalid("t", format!("needs rank >= 2, got shape {:?}", self.shape())));
        }
        self.transpose(-2, -1)
    }

    /// `len` entries of `dim` starting at `start`.
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Result<Tensor> {
        let d = resolve_dim("narrow", dim, self.rank())?;
        self.layout().narrow(d, start, len)?;
        apply(Op::Narrow { dim: d, start, len }, &[self])
    }

    /// Broadcasts to `shape` without copying.
    pub fn expand(&self, shape: &[usize]) -> Result<Tensor> {
        if shape == self.shape() {
            return Ok(self.clone());
        }
        self.layout().expand(shape)?;
        crate::shape::checked_numel("expand", shape)?;
        apply(Op::Expand(shape.to_vec()), &[self])
    }

    /// Inserts a size-1 dim at `dim`.
    pub fn unsqueeze(&self, dim: isize) -> Result<Tensor> {
        let l = self.layout().unsqueeze(dim)?;
        self.reshape(&l.shape.iter().map(|&d| d as isize).collect::<Vec<_>>())
    }

    /// Removes size-1 dim `dim`.
    pub fn squeeze(&self, dim: isize) -> Result<Tensor> {
        let l = self.layout().squeeze(dim)?;
        self.reshape(&l.shape.iter().map(|&d| d as isize).collect::<Vec<_>>())
    }

    /// Merges dims `start..=end` into one.
    pub fn flatten(&self, start: isize, end: isize) -> Result<Tensor> {
        if self.rank() == 0 {
            return self.reshape(&[1]);
        }
        let s = resolve_dim("flatten", start, self.rank())?;
        let e = resolve_dim("flatten", end, self.rank())?;
        if s > e {
            return Err(invalid("flatten", format!("start dim {s} after end dim {e}")));
        }
        let mut shape: Vec<isize> = self.shape()[..s].iter().map(|&d| d as isize).collect();
        shape.push(numel(&self.shape()[s..=e]) as isize);
        shape.extend(self.shape()[e + 1..].iter().map(|&d| d as isize));
        self.reshape(&shape)
    }

    /// A row-major copy if this tensor is not already contiguous; otherwise itself.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        apply(Op::Contiguous, &[self])
    }

    /// A row-major copy with its own storage, always (not recorded by autograd).
    pub fn contiguous_copy(&self) -> Result<Tensor> {
        self.contiguous_copy_for("contiguous_copy")
    }

    /// [`Tensor::contiguous_copy`] inside op `op` (named when the copy cannot be allocated).
    pub(crate) fn contiguous_copy_for(&self, op: &'static str) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        let copy = if self.device().is_cuda() {
            crate::cuda::copy::contiguous(self)?
        } else {
            Tensor::from_storage(self.contiguous_storage(op)?, self.shape())
        };
        #[cfg(not(feature = "cuda"))]
        let copy = Tensor::from_storage(self.contiguous_storage(op)?, self.shape());
        // outside the op set, so a capture is told this is the same value
        crate::graph::note_copy(self, &copy);
        Ok(copy)
    }

    /// Concatenates along `dim`; all other dims must agree.
    pub fn cat(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        let first = tensors.first().ok_or_else(|| invalid("cat", "no tensors"))?;
        let d = resolve_dim("cat", dim, first.rank())?;
        for t in &tensors[1..] {
            if t.dtype() != first.dtype() {
                return Err(Error::DTypeMismatch {
                    op: "cat",
                    lhs: first.dtype(),
                    rhs: t.dtype(),
                });
            }
            let same = t.rank() == first.rank() && (0..t.rank()).all(|i| i == d || t.shape()[i] == first.shape()[i]);
            if !same {
                return Err(Error::ShapeMismatch {
                    op: "cat",
                    lhs: first.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                });
            }
        }
        if tensors.len() == 1 {
            return Ok((*first).clone());
        }
        apply(Op::Cat { dim: d }, tensors)
    }

    /// Stacks equal-shaped tensors along a new dim `dim`.
    pub fn stack(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        let first = tensors.first().ok_or_else(|| invalid("stack", "no tensors"))?;
        let d = resolve_dim("stack", dim, first.rank() + 1)? as isize;
        let parts = tensors.iter().map(|t| {
            if t.shape() != first.shape() {
                return Err(Error::ShapeMismatch {
                    op: "stack",
                    lhs: first.shape().to_vec(),
                    rhs: t.shape().to_vec(),
                });
            }
            t.unsqueeze(d)
        });
        let parts = parts.collect::<Result<Vec<_>>>()?;
        Tensor::cat(&parts.iter().collect::<Vec<_>>(), d)
    }

    /// Splits `dim` into pieces of the given sizes (which must add up to the dim's size).
    pub fn split(&self, sizes: &[usize], dim: isize) -> Result<Vec<Tensor>> {
        let d = resolve_dim("split", dim, self.rank())?;
        if sizes.iter().sum::<usize>() != self.shape()[d] {
            return Err(invalid(
                "split",
                format!(
                    "sizes {sizes:?} do not add up to {} (dim {d} of {:?})",
                    self.shape()[d],
                    self.shape()
                ),
            ));
        }
        let mut start = 0;
        let mut out = Vec::with_capacity(sizes.len());
        for &s in sizes {
            out.push(self.narrow(d as isize, start, s)?);
            start += s;
        }
        Ok(out)
    }

    /// Splits `dim` into `n` equal pieces (the dim's size must divide by `n`).
    pub fn chunk(&self, n: usize, dim: isize) -> Result<Vec<Tensor>> {
        let d = resolve_dim("chunk", dim, self.rank())?;
        let size = self.shape()[d];
        if n == 0 || !size.is_multiple_of(n) {
            return Err(invalid(
                "chunk",
                format!("dim {d} of size {size} does not split into {n} equal chunks"),
            ));
        }
        self.split(&vec![size / n; n], d as isize)
    }
}

/// Resolves a shape with at most one `-1`.
fn infer_shape(from: &[usize], to: &[isize]) -> Result<Vec<usize>> {
    let n = numel(from);
    let mut unknown = None;
    let mut known = 1usize;
    for (i, &d) in to.iter().enumerate() {
        match d {
            -1 if unknown.is_none() => unknown = Some(i),
            d if d >= 0 => {
                known = known
                    .checked_mul(d as usize)
                    .ok_or_else(|| invalid("reshape", format!("bad target shape {to:?}")))?
            }
            _ => return Err(invalid("reshape", format!("bad target shape {to:?}"))),
        }
    }
    let mut out: Vec<usize> = to.iter().map(|&d| d.max(0) as usize).collect();
    if let Some(i) = unknown {
        if known == 0 || !n.is_multiple_of(known) {
            return Err(invalid("reshape", format!("cannot reshape {from:?} into {to:?}")));
        }
        out[i] = n / known;
    }
    if crate::shape::checked_numel("reshape", &out)? != n {
        return Err(Error::ShapeMismatch {
            op: "reshape",
            lhs: from.to_vec(),
            rhs: out,
        });
    }
    Ok(out)
}

pub(super) fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let x = inputs[0];
    let out = match op {
        Op::Reshape(shape) => match x.layout().reshape_view(shape) {
            Some(view) => x.with_layout(view),
            None => Tensor::from_storage(x.contiguous_storage("reshape")?, shape),
        },
        Op::Permute(perm) => x.with_layout(x.layout().permute(perm)?),
        Op::Narrow { dim, start, len } => x.with_layout(x.layout().narrow(*dim, *start, *len)?),
        Op::Expand(shape) => x.with_layout(x.layout().expand(shape)?),
        Op::Contiguous => Tensor::from_storage(x.contiguous_storage("contiguous")?, x.shape()),
        Op::Cat { dim } => cat_forward(inputs, *dim)?,
        _ => unreachable!("shape::forward called with {op:?}"),
    };
    Ok(vec![out])
}

/// The inputs side by side along `dim`: each is read in place when contiguous (copied first
/// otherwise) and copied once into the output.
fn cat_forward(inputs: &[&Tensor], dim: usize) -> Result<Tensor> {
    let mut shape = inputs[0].shape().to_vec();
    shape[dim] = inputs.iter().map(|t| t.shape()[dim]).sum();
    let n = crate::shape::checked_numel("cat", &shape)?;
    let outer = numel(&shape[..dim]);
    let chunks: Vec<usize> = inputs.iter().map(|t| numel(&t.shape()[dim..])).collect();
    let data = crate::dtype_dispatch!(inputs[0].dtype(), T => {
        let mut out = crate::alloc::with_capacity("cat", n)?;
        let parts = inputs.iter().map(|t| t.contig::<T>("cat")).collect::<Result<Vec<_>>>()?;
        for o in 0..outer {
            for (s, &c) in parts.iter().zip(&chunks) {
                out.extend_from_slice(&s[o * c..(o + 1) * c]);
            }
        }
        T::wrap(out)
    });
    Ok(Tensor::from_storage(data, &shape))
}

pub(super) fn backward(op: &Op, inputs: &[Tensor], grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let x = &inputs[0];
    Ok(match op {
        Op::Reshape(_) => vec![Some(grad.view(x.shape())?)],
        Op::Permute(perm) => {
            let mut inv = vec![0; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            vec![Some(grad.permute(&inv)?)]
        }
        Op::Narrow { dim, start, len } => {
            if crate::graph::recording() {
                // a captured graph holds ops only: the same values as zeros, the gradient and
                // zeros side by side
                let mut pieces = Vec::with_capacity(3);
                for (at, n) in [(0, *start), (start + len, x.shape()[*dim] - start - len)] {
                    if n > 0 {
                        let mut shape = x.shape().to_vec();
                        shape[*dim] = n;
                        pieces.push((at, Tensor::zeros_on(&shape, grad.dtype(), x.device())?));
                    }
                }
                pieces.push((*start, grad.clone()));
                pieces.sort_by_key(|(at, _)| *at);
                let refs: Vec<&Tensor> = pieces.iter().map(|(_, t)| t).collect();
                return Ok(vec![Some(Tensor::cat(&refs, *dim as isize)?)]);
            }
            // zeros with the gradient written into the narrowed window (one pass, no cat)
            let out = Tensor::zeros_on(x.shape(), grad.dtype(), x.device())?;
            out.with_layout(out.layout().narrow(*dim, *start, *len)?)
                .copy_from(grad)?;
            vec![Some(out)]
        }
        Op::Expand(_) => vec![Some(grad.sum_to_shape(x.shape())?)],
        Op::Contiguous => vec![Some(grad.clone())],
        Op::Cat { dim } => {
            let mut start = 0;
            let mut out = Vec::with_capacity(inputs.len());
            for t in inputs {
                let len = t.shape()[*dim];
                out.push(Some(grad.narrow(*dim as isize, start, len)?));
                start += len;
            }
            out
        }
        _ => unreachable!("shape::backward called with {op:?}"),
    })
}
