//! Shapes, dimension indices and broadcasting.

use crate::error::{Error, Result};

/// The sizes of a tensor's dimensions, outermost first.
pub type Shape = Vec<usize>;

/// Number of elements of a shape (1 for a scalar).
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// [`numel`], or an error naming `op` when the count does not fit in `usize` (a shape no buffer
/// can hold: `[1 << 40, 1 << 40]`).
pub fn checked_numel(op: &'static str, shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| crate::error::invalid(op, format!("shape {shape:?} has more than {} elements", usize::MAX)))
}

/// Row-major strides (in elements) of a contiguous tensor of this shape.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

/// Resolves a possibly negative dim (`-1` = last) against `rank`.
pub fn resolve_dim(op: &'static str, dim: isize, rank: usize) -> Result<usize> {
    let r = rank as isize;
    let d = if dim < 0 { dim + r } else { dim };
    if d < 0 || d >= r {
        return Err(Error::DimOutOfRange { op, dim, rank });
    }
    Ok(d as usize)
}

/// Resolves a list of dims, sorted, rejecting duplicates. An empty list means all dims.
pub fn resolve_dims(op: &'static str, dims: &[isize], rank: usize) -> Result<Vec<usize>> {
    if dims.is_empty() {
        return Ok((0..rank).collect());
    }
    let mut out = dims
        .iter()
        .map(|&d| resolve_dim(op, d, rank))
        .collect::<Result<Vec<_>>>()?;
    out.sort_unstable();
    if out.windows(2).any(|w| w[0] == w[1]) {
        return Err(crate::error::invalid(op, format!("repeated dim in {dims:?}")));
    }
    Ok(out)
}

/// The shape two shapes broadcast to (NumPy rules: align right, 1 stretches).
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Shape> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank { a[i + a.len() - rank] } else { 1 };
        let db = if i + b.len() >= rank { b[i + b.len() - rank] } else { 1 };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: a.to_vec(),
                    rhs: b.to_vec(),
                });
            }
        };
    }
    checked_numel(op, &out)?;
    Ok(out)
}

/// Shape after reducing `dims` (sorted) with or without keeping them as size 1.
pub fn reduced_shape(shape: &[usize], dims: &[usize], keepdim: bool) -> Shape {
    let mut out = Vec::with_capacity(shape.len());
    for (i, &s) in shape.iter().enumerate() {
        if dims.contains(&i) {
            if keepdim {
                out.push(1);
            }
        } else {
            out.push(s);
        }
    }
    out
}
