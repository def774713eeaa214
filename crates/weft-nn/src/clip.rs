//! Gradient clipping by global L2 norm: `torch.nn.utils.clip_grad_norm_`.

use weft_core::cpu::pool;
use weft_core::{DType, Error, Result, Tensor};

/// Scales the gradients of `params` in place so that their global L2 norm is at most about
/// `max_norm`, and returns the norm before clipping, as `torch.nn.utils.clip_grad_norm_(params,
/// max_norm)` does (norm type 2).
///
/// ```text
/// total_norm = sqrt(Σ over all gradients and elements of g²)     (in gradient units)
/// clip_coef  = max_norm / (total_norm + 1e-6)
/// g = g * clip_coef   for every gradient, when clip_coef < 1
/// ```
///
/// The sum of squares is accumulated in f64 (PyTorch accumulates each gradient's norm in the
/// gradient's dtype); `clip_coef` is computed in f64 and rounded to each gradient's dtype before the
/// multiplication, as PyTorch multiplies by a float32 coefficient. PyTorch clamps the coefficient
/// to 1 and always multiplies; multiplying by 1 changes nothing, so this skips it.
///
/// Parameters without a gradient are ignored (with none at all the norm is 0). A non-finite total
/// norm is returned as is, not as an error, and the gradients are scaled as PyTorch scales them:
/// by 0 for an infinite norm (so infinite elements become NaN) and by NaN for a NaN norm. A
/// training loop that wants to skip such steps checks the returned value.
///
/// Gradients of dtype f32 and f64 are read and scaled in place (non-contiguous ones through a
/// scaled copy that is written back); bf16 and f16 gradients are scaled in f64 and rounded back.
///
/// Errors (before any gradient changes): `max_norm` negative or NaN; a gradient of a non-float
/// dtype.
pub fn clip_grad_norm(params: &[Tensor], max_norm: f64) -> Result<f64> {
    const OP: &str = "clip_grad_norm";
    if max_norm.is_nan() || max_norm < 0.0 {
        return Err(Error::Invalid {
            op: OP,
            msg: format!("max_norm {max_norm} must be >= 0"),
        });
    }
    let total_norm = grad_norm(params)?;
    clip_to_norm(params, max_norm, total_norm)?;
    Ok(total_norm)
}

/// The scaling step of [`clip_grad_norm`] with the global norm already known: scales the
/// gradients of `params` by `max_norm / (total_norm + 1e-6)` when that is below 1 (or NaN).
/// For gradients sharded across processes, where `total_norm` is the norm over every shard
/// (PyTorch FSDP's `clip_grad_norm_`), and `params` holds this process's shards.
pub fn clip_to_norm(params: &[Tensor], max_norm: f64, total_norm: f64) -> Result<()> {
    if max_norm.is_nan() || max_norm < 0.0 {
        return Err(Error::Invalid {
            op: "clip_grad_norm",
            msg: format!("max_norm {max_norm} must be >= 0"),
        });
    }
    let grads: Vec<Tensor> = params.iter().filter_map(|p| p.grad()).collect();
    let clip_coef = max_norm / (total_norm + 1e-6);
    // A NaN coefficient (NaN norm) scales too, as in PyTorch.
    if clip_coef.is_nan() || clip_coef < 1.0 {
        // one parallel job over the gradients (most are too small to split on their own)
        pool::map(grads.len(), |i| scale(&grads[i], clip_coef))
            .into_iter()
            .collect::<Result<()>>()?;
    }
    Ok(())
}

/// The global L2 norm of the gradients of `params` (those without a gradient are skipped), the
/// value [`clip_grad_norm`] clips against, without changing anything. Errors on a non-float gradient.
pub fn grad_norm(params: &[Tensor]) -> Result<f64> {
    let grads: Vec<Tensor> = params.iter().filter_map(|p| p.grad()).collect();
    norm_of(&grads)
}

/// The global L2 norm of `grads`, summed in their order (see [`grad_norm`]).
pub(crate) fn norm_of(grads: &[Tensor]) -> Result<f64> {
    const OP: &str = "grad_norm";
    for (i, g) in grads.iter().enumerate() {
        if !g.dtype().is_float() {
            return Err(Error::Invalid {
                op: OP,
                msg: format!(
                    "gradient #{i} (shape {:?}) has dtype {}, not a float type",
                    g.shape(),
                    g.dtype().name()
                ),
            });
        }
    }
    // Each gradient's sum on one thread, the sums added in order: the same result as one thread
    // going through them, whatever the pool's size.
    let sums = pool::map(grads.len(), |i| {
        let g = &grads[i];
        if g.device().is_cuda() {
            return weft_core::cuda::optim::sum_of_squares(g);
        }
        match g.dtype() {
            DType::F32 => g.with_data::<f32, _>(|s| sum_of_squares(s, |x| x as f64)),
            DType::F64 => g.with_data::<f64, _>(|s| sum_of_squares(s, |x| x)),
            _ => Ok(sum_of_squares(&g.to_vec_f64(), |x| x)),
        }
    });
    let mut sum_sq = 0.0f64;
    for s in sums {
        sum_sq += s?;
    }
    Ok(sum_sq.sqrt())
}

/// Σ f(x)² in f64 with 8 independent partial sums, so that the loop vectorizes.
fn sum_of_squares<T: Copy>(xs: &[T], f: impl Fn(T) -> f64) -> f64 {
    let mut acc = [0.0f64; 8];
    let chunks = xs.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            let x = f(x);
            *a += x * x;
        }
    }
    for (a, &x) in acc.iter_mut().zip(rest) {
        let x = f(x);
        *a += x * x;
    }
    acc.iter().sum()
}

/// `g *= coef` in place, with `coef` rounded to `g`'s dtype.
pub(crate) fn scale(g: &Tensor, coef: f64) -> Result<()> {
    if g.device().is_cuda() && g.is_contiguous() {
        return weft_core::cuda::optim::scale_(g, coef);
    }
    if g.is_contiguous() {
        match g.dtype() {
            DType::F32 => {
                let c = coef as f32;
                return g.with_data_mut::<f32, _>(|s| s.iter_mut().for_each(|x| *x *= c));
            }
            DType::F64 => return g.with_data_mut::<f64, _>(|s| s.iter_mut().for_each(|x| *x *= coef)),
            _ => {}
        }
    }
    // Non-contiguous or half-precision gradients: scale a copy in f64 and write it back.
    let c = if g.dtype() == DType::F32 {
        coef as f32 as f64
    } else {
        coef
    };
    let scaled: Vec<f64> = g.to_vec_f64().into_iter().map(|x| x * c).collect();
    g.copy_from(&Tensor::from_vec(scaled, g.shape())?)
}
