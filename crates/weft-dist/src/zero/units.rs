//! How parameters are laid out for sharding: each unit's parameters concatenated into one flat
//! run of elements (in registration order), padded to a multiple of the group size, and cut
//! into equal contiguous shards, rank `r` owning elements `[r·S, (r+1)·S)`.

use weft_core::storage::{CpuStorage, StorageElement};
use weft_core::{DType, Tensor};

use crate::error::{Error, Result};

/// One unit: a group of parameters gathered, reduced and sharded together.
pub(crate) struct Unit {
    /// The unit's name (a parameter-name prefix), `""` for the root unit.
    pub name: String,
    /// Parameter indices, in registration order.
    pub members: Vec<usize>,
    /// Flat element offset of each member.
    pub offsets: Vec<usize>,
    /// Elements of all members together.
    pub numel: usize,
    /// Elements per rank: `ceil(numel / group size)`.
    pub shard: usize,
    pub dtype: DType,
}

/// A run of one parameter's elements inside this rank's shard of its unit.
#[derive(Clone, Debug)]
pub(crate) struct Span {
    /// Parameter index.
    pub param: usize,
    /// First element, in the parameter's own (row-major) numbering.
    pub lo: usize,
    pub len: usize,
    /// Where the run starts inside the shard.
    pub at: usize,
}

impl Unit {
    /// Elements of the padded flat buffer: `shard · ranks`.
    pub fn padded(&self, ranks: usize) -> usize {
        self.shard * ranks
    }

    /// The runs of parameters in rank `rank`'s shard, in flat order.
    pub fn spans(&self, rank: usize, params: &[(String, Tensor)]) -> Vec<Span> {
        let (start, end) = (rank * self.shard, (rank + 1) * self.shard);
        let mut out = Vec::new();
        for (&i, &off) in self.members.iter().zip(&self.offsets) {
            let n = params[i].1.numel();
            let (a, b) = (off.max(start), (off + n).min(end));
            if a < b {
                out.push(Span {
                    param: i,
                    lo: a - off,
                    len: b - a,
                    at: a - start,
                });
            }
        }
        out
    }
}

/// Splits `params` into the named units (parameters named `"{unit}.*"`, in the order given,
/// which is the order their forwards run) followed by the root unit of everything else, when
/// there is anything else. Errors: a unit that holds no parameter, or mixes dtypes; a
/// parameter that is not a contiguous float tensor, or that appears twice.
pub(crate) fn plan(params: &[(String, Tensor)], names: &[String], ranks: usize) -> Result<Vec<Unit>> {
    let invalid = |msg: String| Error::Invalid(format!("zero: {msg}"));
    for (i, (name, p)) in params.iter().enumerate() {
        if !p.is_contiguous() || !matches!(p.dtype(), DType::F32 | DType::F64) {
            return Err(invalid(format!(
                "parameter {name:?} (shape {:?}, {}) must be a contiguous float32 or float64 tensor",
                p.shape(),
                p.dtype().name()
            )));
        }
        if let Some((other, _)) = params[..i].iter().find(|(_, q)| q.same_storage(p)) {
            return Err(invalid(format!(
                "parameters {other:?} and {name:?} are the same tensor; list it once"
            )));
        }
    }
    let mut units: Vec<Unit> = names
        .iter()
        .chain(std::iter::once(&String::new()))
        .map(|name| Unit {
            name: name.clone(),
            members: Vec::new(),
            offsets: Vec::new(),
            numel: 0,
            shard: 0,
            dtype: DType::F32,
        })
        .collect();
    let root = names.len();
    for (i, (name, p)) in params.iter().enumerate() {
        let u = names
            .iter()
            .position(|unit| {
                name.strip_prefix(unit.as_str())
                    .is_some_and(|rest| rest.starts_with('.'))
            })
            .unwrap_or(root);
        let unit = &mut units[u];
        if unit.members.is_empty() {
            unit.dtype = p.dtype();
        } else if unit.dtype != p.dtype() {
            return Err(invalid(format!(
                "unit {:?} mixes dtypes: {name:?} is {}, the parameters before it {}",
                unit.name,
                p.dtype().name(),
                unit.dtype.name()
            )));
        }
        unit.members.push(i);
        unit.offsets.push(unit.numel);
        unit.numel += p.numel();
    }
    if let Some(empty) = units[..root].iter().find(|u| u.members.is_empty()) {
        return Err(invalid(format!(
            "unit {:?} holds no parameter (no parameter name starts with \"{}.\")",
            empty.name, empty.name
        )));
    }
    if units[root].members.is_empty() {
        units.pop();
    }
    for u in &mut units {
        u.shard = u.numel.div_ceil(ranks);
    }
    Ok(units)
}

/// Writes `src[lo..lo + len]` of each span's parameter (read from `source(param)`) into
/// `shard[at..at + len]`.
pub(crate) fn copy_into_shard(spans: &[Span], shard: &Tensor, source: impl Fn(usize) -> Tensor) -> Result<()> {
    weft_core::dtype_dispatch!(shard.dtype(), T => {
        for s in spans {
            let src = source(s.param);
            src.with_data::<T, Result<()>>(|v| {
                shard.with_data_mut::<T, ()>(|d| d[s.at..s.at + s.len].copy_from_slice(&v[s.lo..s.lo + s.len]))?;
                Ok(())
            })??;
        }
    });
    Ok(())
}

/// Writes elements `flat[off..off + numel]` into parameter `p`: in place when its storage is
/// whole, as a new buffer when it was released.
pub(crate) fn fill_param(p: &Tensor, flat: &Tensor, off: usize) -> Result<()> {
    if flat.dtype() != p.dtype() {
        let part = flat.narrow(0, off, p.numel())?.cast(p.dtype())?;
        return fill_param(p, &part, 0);
    }
    fn go<T: StorageElement>(p: &Tensor, flat: &Tensor, off: usize) -> Result<()> {
        let n = p.numel();
        flat.with_data::<T, Result<()>>(|f| {
            let src = &f[off..off + n];
            let whole = p.storage().read().len() == n;
            if whole {
                p.with_data_mut::<T, ()>(|d| d.copy_from_slice(src))?;
            } else {
                *p.storage().write() = T::wrap(src.to_vec());
            }
            Ok(())
        })?
    }
    weft_core::dtype_dispatch!(p.dtype(), T => go::<T>(p, flat, off))
}

/// Frees parameter `p`'s elements (its storage becomes empty) while the tensor, its gradient
/// hooks and every view of it stay valid; [`fill_param`] gives them back.
pub(crate) fn release_param(p: &Tensor) {
    *p.storage().write() = CpuStorage::zeros(p.dtype(), 0);
}

/// Writes each member's gradient into its place in `flat` (padding stays zero). Errors name a
/// member without a gradient, or one whose gradient does not match it.
pub(crate) fn gather_grads(unit: &Unit, params: &[(String, Tensor)], flat: &Tensor) -> Result<()> {
    weft_core::dtype_dispatch!(flat.dtype(), T => {
        for (&i, &off) in unit.members.iter().zip(&unit.offsets) {
            let (name, p) = &params[i];
            let g = p
                .grad()
                .ok_or_else(|| Error::Invalid(format!("zero: parameter {name:?} has no gradient")))?;
            if g.numel() != p.numel() || g.dtype() != p.dtype() {
                return Err(Error::Invalid(format!(
                    "zero: the gradient of {name:?} ({:?}, {}) does not match the parameter ({:?}, {})",
                    g.shape(),
                    g.dtype().name(),
                    p.shape(),
                    p.dtype().name()
                )));
            }
            let g = g.cast(flat.dtype())?;
            g.with_data::<T, Result<()>>(|v| {
                flat.with_data_mut::<T, ()>(|d| d[off..off + v.len()].copy_from_slice(v))?;
                Ok(())
            })??;
        }
    });
    Ok(())
}
