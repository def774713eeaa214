//! Automatic mixed precision, as `torch.autocast`: inside [`autocast`]`(Some(DType::BF16), ..)`
//! the ops that gain from a lower precision take their f32 inputs in it, the ops that need the
//! range of f32 take theirs in f32, and everything else runs in its inputs' dtype. Parameters,
//! gradients of f32 parameters and optimizer state stay f32 (the casts are recorded by
//! autograd, so a gradient comes back to its parameter in the parameter's dtype).
//!
//! The lists follow PyTorch's CUDA autocast ("Autocast Op Reference",
//! pytorch.org/docs/stable/amp.html#autocast-op-reference):
//!
//! - lower precision: `matmul`, `linear` (and its fused activation), attention, `conv2d`;
//! - f32: `softmax`, `log_softmax`, `layer_norm`, `rms_norm`, `cross_entropy`;
//! - widest input type: binary ops whose float inputs differ (a bf16 product added to an f32
//!   residual stream is f32), where outside autocast a dtype mismatch is an error.
//!
//! A linear with a fused residual (`linear_add`) becomes the lower-precision product followed by
//! the f32 add, as PyTorch computes `x + linear(h)` under autocast.
//!
//! Parameters are cast once per region, as PyTorch's autocast cache does: the outermost
//! [`autocast`] call with a dtype keeps the cast, made with gradients on, of each f32 leaf that
//! requires grad and was made before the region began (a parameter), and every later use of
//! that parameter in the region reads the same copy (one autograd node, whose backward adds
//! each use's gradient into the parameter). A pipeline running all its micro-batches in one region so holds one bf16 copy of
//! its weights, not one per micro-batch in flight. The region must not change a parameter in
//! place between uses (as in PyTorch, it wraps forward passes, not optimizer steps). Casts made
//! with gradients off (a recomputation's first forward) or while a graph is being captured
//! (whose replays must cast again) are not kept. [`autocast_with_cache`] turns the cache off for
//! a region (PyTorch's `cache_enabled=False`): a pipeline that recomputes its micro-batches
//! holds only the copies of the one it rebuilds, and a cache would keep every chunk's.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use crate::error::Result;
use crate::tensor::{Tensor, TensorId};
use crate::DType;

/// The casts a region keeps: a parameter's id and the dtype it was cast to, and the cast; and
/// the first id of a tensor made in the region (only tensors made before it are kept: the
/// parameters, not a pipeline's received activations).
struct Casts {
    made: HashMap<(TensorId, DType), Tensor>,
    region_start: TensorId,
}

thread_local! {
    static DTYPE: Cell<Option<DType>> = const { Cell::new(None) };
    /// The outermost region with a dtype running on this thread: `Some(Some(casts))` keeping
    /// the parameters' casts, `Some(None)` with the cache off, `None` outside any.
    static CASTS: RefCell<Option<Option<Casts>>> = const { RefCell::new(None) };
}

/// Runs `f` with autocast to `dtype` (`Some(BF16)` or `Some(F16)`; `None` turns it off) on this
/// thread, restoring the previous setting afterwards. The outermost call with a dtype keeps the
/// parameters' casts until it returns (see the module's documentation).
pub fn autocast<R>(dtype: Option<DType>, f: impl FnOnce() -> R) -> R {
    autocast_with_cache(dtype, true, f)
}

/// [`autocast`], with the parameters' casts kept for the region (`cache_enabled`, as
/// `torch.autocast(cache_enabled=...)`) or made at every use. Only the outermost region with a
/// dtype decides.
pub fn autocast_with_cache<R>(dtype: Option<DType>, cache_enabled: bool, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<DType>, bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            DTYPE.with(|d| d.set(self.0));
            if self.1 {
                CASTS.with(|c| c.borrow_mut().take());
            }
        }
    }
    let outermost = dtype.is_some() && CASTS.with(|c| c.borrow().is_none());
    if outermost {
        let casts = cache_enabled.then(|| Casts {
            made: HashMap::new(),
            region_start: crate::tensor::next_tensor_id(),
        });
        CASTS.with(|c| *c.borrow_mut() = Some(casts));
    }
    let _restore = Restore(DTYPE.with(|d| d.replace(dtype)), outermost);
    f()
}

/// The parameters' casts the region running on this thread keeps (none outside a region or
/// with its cache off): memory a pipeline counts as its step's.
pub fn autocast_cached_casts() -> Vec<Tensor> {
    CASTS.with(|c| match c.borrow().as_ref() {
        Some(Some(casts)) => casts.made.values().cloned().collect(),
        _ => Vec::new(),
    })
}

/// The autocast dtype in effect on this thread, if any.
pub fn autocast_dtype() -> Option<DType> {
    DTYPE.with(|d| d.get())
}

/// For a lower-precision op: `t` in the autocast dtype when autocast is on and `t` is f32 (a
/// parameter's cast made once per region).
pub(crate) fn low(t: &Tensor) -> Result<Tensor> {
    match autocast_dtype() {
        Some(d) if t.dtype() == DType::F32 => {
            let keep = t.is_leaf() && t.requires_grad() && crate::is_grad_enabled() && !crate::graph::recording();
            if !keep {
                return t.cast(d);
            }
            let key = (t.id(), d);
            let kept = CASTS.with(|c| match c.borrow().as_ref() {
                Some(Some(casts)) if t.id() < casts.region_start => Some(casts.made.get(&key).cloned()),
                _ => None,
            });
            match kept {
                None => t.cast(d),
                Some(Some(cast)) => Ok(cast),
                Some(None) => {
                    let cast = t.cast(d)?;
                    CASTS.with(|c| {
                        if let Some(Some(casts)) = c.borrow_mut().as_mut() {
                            casts.made.insert(key, cast.clone());
                        }
                    });
                    Ok(cast)
                }
            }
        }
        _ => Ok(t.clone()),
    }
}

/// For an f32 op: `t` in f32 when autocast is on and `t` is bf16 or f16.
pub(crate) fn high(t: &Tensor) -> Result<Tensor> {
    match autocast_dtype() {
        Some(_) if matches!(t.dtype(), DType::BF16 | DType::F16) => t.cast(DType::F32),
        _ => Ok(t.clone()),
    }
}

/// For a binary op: both inputs in the wider of their float dtypes when autocast is on and they
/// differ (bf16 with f16 gives f32, as PyTorch promotes); unchanged otherwise.
pub(crate) fn promote(a: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
    let (da, db) = (a.dtype(), b.dtype());
    if autocast_dtype().is_none() || da == db || !da.is_float() || !db.is_float() {
        return Ok((a.clone(), b.clone()));
    }
    let rank = |d: DType| match d {
        DType::F64 => 2,
        DType::F32 => 1,
        _ => 0,
    };
    let wide = match rank(da).max(rank(db)) {
        2 => DType::F64,
        _ => DType::F32,
    };
    Ok((a.cast(wide)?, b.cast(wide)?))
}
