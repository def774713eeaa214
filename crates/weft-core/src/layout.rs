//! Layout: how a tensor's shape maps onto its storage (strides in elements, and an offset).
//! Every view op is a pure function from one layout to another; no data moves.

use crate::error::{invalid, Error, Result};
use crate::shape::{contiguous_strides, numel, resolve_dim, Shape};

/// Shape, strides (in elements) and the offset of element `[0, 0, ...]` in the storage.
/// A stride of 0 is a broadcast dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub shape: Shape,
    pub strides: Vec<usize>,
    pub offset: usize,
}

impl Layout {
    /// A contiguous row-major layout starting at offset 0.
    pub fn contiguous(shape: &[usize]) -> Self {
        Layout {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// Whether every element this layout addresses lies inside a buffer of `len` elements (a
    /// buffer can shrink after a view of it was made: sharded data parallelism releases the
    /// storage of parameters between uses).
    pub fn fits(&self, len: usize) -> bool {
        if self.numel() == 0 {
            return true;
        }
        let last: usize = self.shape.iter().zip(&self.strides).map(|(&d, &s)| (d - 1) * s).sum();
        self.offset + last < len
    }

    /// True when elements are laid out row-major without gaps (size-1 dims may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for i in (0..self.shape.len()).rev() {
            if self.shape[i] != 1 && self.strides[i] != expected {
                return false;
            }
            expected *= self.shape[i];
        }
        true
    }

    /// The same elements under `shape` without copying, when the strides allow it (as
    /// `torch.Tensor.view`): each run of input dims that are contiguous with one another may be
    /// merged or split freely. `None` when a copy is needed. `shape` must have this layout's
    /// element count.
    pub fn reshape_view(&self, shape: &[usize]) -> Option<Layout> {
        debug_assert_eq!(numel(shape), self.numel());
        if self.is_contiguous() || self.numel() == 0 {
            return Some(Layout {
                shape: shape.to_vec(),
                strides: contiguous_strides(shape),
                offset: self.offset,
            });
        }
        // Walk both shapes from the innermost dim, one contiguous chunk of input dims at a time.
        let (old, old_strides) = (&self.shape, &self.strides);
        let mut strides = vec![0usize; shape.len()];
        let mut view_d = shape.len() as isize - 1;
        let mut chunk_stride = *old_strides.last()?;
        let (mut tensor_numel, mut view_numel) = (1usize, 1usize);
        for d in (0..old.len()).rev() {
            tensor_numel *= old[d];
            let chunk_ends = d == 0 || (old[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_stride);
            if chunk_ends {
                while view_d >= 0 && (view_numel < tensor_numel || shape[view_d as usize] == 1) {
                    strides[view_d as usize] = view_numel * chunk_stride;
                    view_numel *= shape[view_d as usize];
                    view_d -= 1;
                }
                if view_numel != tensor_numel {
                    return None;
                }
                if d > 0 {
                    chunk_stride = old_strides[d - 1];
                    tensor_numel = 1;
                    view_numel = 1;
                }
            }
        }
        (view_d == -1).then(|| Layout {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        })
    }

    /// Reorders dims: output dim `i` is input dim `perm[i]`.
    pub fn permute(&self, perm: &[usize]) -> Result<Layout> {
        let rank = self.rank();
        let mut seen = vec![false; rank];
        if perm.len() != rank {
            return Err(invalid(
                "permute",
                format!("{perm:?} is not a permutation of {rank} dims"),
            ));
        }
        for &p in perm {
            if p >= rank || seen[p] {
                return Err(invalid(
                    "permute",
                    format!("{perm:?} is not a permutation of {rank} dims"),
                ));
            }
            seen[p] = true;
        }
        Ok(Layout {
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        })
    }

    /// `len` elements of `dim` starting at `start`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Layout> {
        if dim >= self.rank() {
            return Err(Error::DimOutOfRange {
                op: "narrow",
                dim: dim as isize,
                rank: self.rank(),
            });
        }
        if start + len > self.shape[dim] {
            return Err(invalid(
                "narrow",
                format!(
                    "range {start}..{} exceeds size {} of dim {dim}",
                    start + len,
                    self.shape[dim]
                ),
            ));
        }
        let mut out = self.clone();
        out.shape[dim] = len;
        out.offset += start * self.strides[dim];
        Ok(out)
    }

    /// Broadcasts to `shape` (NumPy rules): size-1 dims and new leading dims get stride 0.
    pub fn expand(&self, shape: &[usize]) -> Result<Layout> {
        let mismatch = || Error::ShapeMismatch {
            op: "expand",
            lhs: self.shape.clone(),
            rhs: shape.to_vec(),
        };
        if shape.len() < self.rank() {
            return Err(mismatch());
        }
        let lead = shape.len() - self.rank();
        let mut strides = vec![0; shape.len()];
        for i in 0..self.rank() {
            let (s, t) = (self.shape[i], shape[lead + i]);
            strides[lead + i] = if s == t {
                self.strides[i]
            } else if s == 1 {
                0
            } else {
                return Err(mismatch());
            };
        }
        Ok(Layout {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        })
    }

    /// Inserts a size-1 dim at `dim` (0..=rank).
    pub fn unsqueeze(&self, dim: isize) -> Result<Layout> {
        let d = resolve_dim("unsqueeze", dim, self.rank() + 1)?;
        let mut out = self.clone();
        let stride = if d < self.rank() {
            self.strides[d] * self.shape[d]
        } else {
            1
        };
        out.shape.insert(d, 1);
        out.strides.insert(d, stride);
        Ok(out)
    }

    /// Removes dim `dim`, which must have size 1.
    pub fn squeeze(&self, dim: isize) -> Result<Layout> {
        let d = resolve_dim("squeeze", dim, self.rank())?;
        if self.shape[d] != 1 {
            return Err(invalid("squeeze", format!("dim {d} has size {}, not 1", self.shape[d])));
        }
        let mut out = self.clone();
        out.shape.remove(d);
        out.strides.remove(d);
        Ok(out)
    }

    /// Calls `f(storage_offset_of_row_start, inner_stride, inner_len)` for every innermost row,
    /// in row-major order. A scalar visits one row of length 1.
    pub fn for_each_row(&self, mut f: impl FnMut(usize, usize, usize)) {
        let rank = self.rank();
        if rank == 0 {
            f(self.offset, 1, 1);
            return;
        }
        if self.numel() == 0 {
            return;
        }
        let inner = self.shape[rank - 1];
        let inner_stride = self.strides[rank - 1];
        let outer = rank - 1;
        let mut idx = vec![0usize; outer];
        let mut off = self.offset;
        loop {
            f(off, inner_stride, inner);
            // advance the odometer over the outer dims
            let mut d = outer;
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                idx[d] += 1;
                off += self.strides[d];
                if idx[d] < self.shape[d] {
                    break;
                }
                off -= self.strides[d] * self.shape[d];
                idx[d] = 0;
            }
        }
    }

    /// Storage offsets of every element in row-major order (a buffer of `usize` per element,
    /// allocated through [`crate::alloc`]: an error naming `op` when it cannot be).
    pub fn offsets(&self, op: &'static str) -> Result<Vec<usize>> {
        let mut out = crate::alloc::with_capacity(op, self.numel())?;
        self.for_each_row(|start, stride, len| {
            out.extend((0..len).map(|i| start + i * stride));
        });
        Ok(out)
    }
}
