//! Rotary position embeddings in Hugging Face's layout (`rotate_half`: each head's first and
//! second halves are the pairs rotated together), with `inv_freq`, cos and sin computed in f32 as
//! transformers' `LlamaRotaryEmbedding` computes them.

use std::sync::Mutex;

use weft_core::{DType, Device, Result, Tensor};

/// The cos and sin tables of positions `0..T`, computed for the longest `T` seen so far rounded up
/// to a power of two, and kept (a config's `block_size` allocates nothing until sequences that
/// long arrive; generation, whose context grows a token at a time, rebuilds them only when the
/// length doubles).
#[derive(Debug)]
pub struct Rotary {
    inv_freq: Vec<f32>,
    head_dim: usize,
    device: Device,
    /// Positions covered, `cos(pos * inv_freq)` twice side by side `[T, head_dim]`, and
    /// `sin(pos * inv_freq)` with its first half negated (`[-sin, sin]`, so that
    /// `rotate_half(x) * sin == swap_halves(x) * signed_sin`), `[T, head_dim]`.
    tables: Mutex<Option<(usize, Tensor, Tensor)>>,
}

/// `inv_freq[i] = 1 / theta^(2i / head_dim)`, `i < head_dim / 2`, in f32 as transformers
/// computes it (`torch.arange(0, dim, 2).float() / dim`, then `base ** that`).
pub fn inv_freq(head_dim: usize, theta: f64) -> Vec<f32> {
    let base = theta as f32;
    (0..head_dim / 2)
        .map(|i| 1.0f32 / base.powf((2 * i) as f32 / head_dim as f32))
        .collect()
}

/// [`inv_freq`] stretched by `scaling` (unchanged without one): what transformers'
/// `ROPE_INIT_FUNCTIONS` compute for the `rope_type`, in f32 and in the same order of operations
/// (see [`RopeScaling`] for the formulas).
pub fn scaled_inv_freq(head_dim: usize, theta: f64, scaling: Option<RopeScaling>) -> Vec<f32> {
    let inv = inv_freq(head_dim, theta);
    match scaling {
        None => inv,
        Some(RopeScaling::Linear { factor }) => {
            let factor = factor as f32;
            inv.into_iter().map(|f| f / factor).collect()
        }
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: old,
        }) => {
            // the wavelength bounds are Python floats; compared with an f32 tensor they are f32
            let low_freq_wavelen = (old as f64 / low_freq_factor) as f32;
            let high_freq_wavelen = (old as f64 / high_freq_factor) as f32;
            let (factor32, low32) = (factor as f32, low_freq_factor as f32);
            let span = (high_freq_factor - low_freq_factor) as f32;
            inv.into_iter()
                .map(|f| {
                    // `2 * math.pi / inv_freq` is `inv_freq.reciprocal() * (2 pi)`
                    let wavelen = (1.0f32 / f) * std::f32::consts::TAU;
                    let long = if wavelen > low_freq_wavelen { f / factor32 } else { f };
                    // transformers' `~(wavelen < high) * ~(wavelen > low)` (no NaN: f > 0)
                    let medium = wavelen >= high_freq_wavelen && wavelen <= low_freq_wavelen;
                    if !medium {
                        return long;
                    }
                    let smooth = ((1.0f32 / wavelen) * old as f32 - low32) / span;
                    (1.0 - smooth) * long / factor32 + smooth * long
                })
                .collect()
        }
    }
}

/// How the rotary frequencies are stretched for contexts longer than the ones a model was first
/// trained on (transformers' `rope_scaling`, or `rope_parameters` from transformers 5). Only
/// `inv_freq` changes; both kinds leave the attention's scale as it is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// `"linear"` (position interpolation, Chen et al. 2023): every frequency divided by
    /// `factor`, so position `p` rotates as `p / factor` did.
    Linear { factor: f64 },
    /// `"llama3"` (Llama 3.1's): with `L = original_max_position_embeddings`, a frequency whose
    /// wavelength `2 pi / f` is above `L / low_freq_factor` is divided by `factor`, one below
    /// `L / high_freq_factor` is kept, and one between is blended:
    /// `(1 - s) f / factor + s f` with `s = (L / wavelength - low_freq_factor) /
    /// (high_freq_factor - low_freq_factor)`.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
}

impl RopeScaling {
    /// transformers' name for the kind (`rope_type`).
    pub fn rope_type(&self) -> &'static str {
        match self {
            RopeScaling::Linear { .. } => "linear",
            RopeScaling::Llama3 { .. } => "llama3",
        }
    }

    /// Positive finite factors, `high_freq_factor > low_freq_factor` and a positive
    /// `original_max_position_embeddings`: the error names the key under `model.rope_scaling`.
    pub fn validate(&self) -> Result<()> {
        self.check()
            .map_err(|(key, msg)| crate::config_error(&format!("rope_scaling.{key}"), msg))
    }

    /// [`RopeScaling::validate`]'s checks, failing with the key (transformers' name) and why.
    pub fn check(&self) -> std::result::Result<(), (&'static str, String)> {
        let positive = |key: &'static str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err((key, format!("{v} must be positive and finite")))
            }
        };
        match *self {
            RopeScaling::Linear { factor } => positive("factor", factor),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                positive("factor", factor)?;
                positive("low_freq_factor", low_freq_factor)?;
                positive("high_freq_factor", high_freq_factor)?;
                if high_freq_factor <= low_freq_factor {
                    return Err((
                        "high_freq_factor",
                        format!("{high_freq_factor} must be above low_freq_factor = {low_freq_factor}"),
                    ));
                }
                if original_max_position_embeddings == 0 {
                    return Err(("original_max_position_embeddings", "0 must be positive".into()));
                }
                Ok(())
            }
        }
    }
}

impl Rotary {
    /// Rotations of heads of `head_dim` (even) by base `theta`, stretched by `scaling`, tables
    /// on `device`.
    pub fn new(head_dim: usize, theta: f64, scaling: Option<RopeScaling>, device: Device) -> Self {
        Rotary {
            inv_freq: scaled_inv_freq(head_dim, theta, scaling),
            head_dim,
            device,
            tables: Mutex::new(None),
        }
    }

    /// The cos and signed sin tables of positions `0..t`, `[t, head_dim]` each.
    fn tables(&self, t: usize) -> Result<(Tensor, Tensor)> {
        let mut cached = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((len, cos, sin)) = cached.as_ref() {
            if *len >= t {
                return Ok((cos.narrow(0, 0, t)?, sin.narrow(0, 0, t)?));
            }
        }
        let d = self.head_dim;
        let (len, n) = match t.checked_next_power_of_two() {
            Some(len) => (len, len.checked_mul(d)),
            None => (t, None),
        };
        let n = n.ok_or_else(|| weft_core::Error::Invalid {
            op: "rotary embeddings",
            msg: format!("tables for {t} positions of head dim {d} exceed the address space"),
        })?;
        let mut cos: Vec<f32> = weft_core::alloc::with_capacity("rotary embeddings", n)?;
        let mut sin: Vec<f32> = weft_core::alloc::with_capacity("rotary embeddings", n)?;
        for pos in 0..len {
            // freqs = position (f32) * inv_freq (f32), as transformers' f32 outer product
            let freqs: Vec<f32> = self.inv_freq.iter().map(|&f| pos as f32 * f).collect();
            for sign in [-1.0f32, 1.0] {
                for &f in &freqs {
                    cos.push(f.cos());
                    sin.push(sign * f.sin());
                }
            }
        }
        let table = |v: Vec<f32>| Tensor::from_vec(v, &[len, d])?.to(self.device);
        let (cos, sin) = (table(cos)?, table(sin)?);
        *cached = Some((len, cos.clone(), sin.clone()));
        Ok((cos.narrow(0, 0, t)?, sin.narrow(0, 0, t)?))
    }

    /// Builds the tables for positions `0..n` now (nothing when they cover `n` already).
    pub fn reserve(&self, n: usize) -> Result<()> {
        self.tables(n.max(1)).map(|_| ())
    }

    /// Rotates `x` by position.
    /// # Shapes
    /// `[B, T, H, head_dim]` -> `[B, T, H, head_dim]`: `x * cos + rotate_half(x) * sin`, with
    /// `rotate_half(x) = [-x2, x1]` for the halves `x1`, `x2` of each head.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        self.apply_at(x, 0)
    }

    /// Rotates `x` as positions `offset..offset + T` (new tokens after `offset` cached ones).
    /// # Shapes
    /// `[B, T, H, head_dim]` -> `[B, T, H, head_dim]`.
    pub fn apply_at(&self, x: &Tensor, offset: usize) -> Result<Tensor> {
        let (t, d) = (x.dim(1)?, self.head_dim);
        let (cos, sin) = self.tables(offset + t)?;
        let (cos, sin) = (cos.narrow(0, offset, t)?, sin.narrow(0, offset, t)?);
        let (cos, sin) = (cos.view(&[1, t, 1, d])?, sin.view(&[1, t, 1, d])?);
        let (cos, sin) = if x.dtype() == DType::F32 {
            (cos, sin)
        } else {
            (cos.cast(x.dtype())?, sin.cast(x.dtype())?)
        };
        x.rotate_halves(&cos, &sin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotating_matches_rotate_half_written_out() {
        let (t, h, d) = (5, 2, 4);
        let rot = Rotary::new(d, 500.0, None, Device::Cpu);
        let data: Vec<f32> = (0..t * h * d).map(|i| (i as f32 * 0.37).sin()).collect();
        let x = Tensor::from_vec(data.clone(), &[1, t, h, d]).unwrap();
        let y = rot.apply(&x).unwrap().to_vec::<f32>().unwrap();
        let inv = inv_freq(d, 500.0);
        for p in 0..t {
            for hh in 0..h {
                let row = &data[(p * h + hh) * d..(p * h + hh + 1) * d];
                for j in 0..d {
                    let f = p as f32 * inv[j % (d / 2)];
                    let rotated = if j < d / 2 { -row[j + d / 2] } else { row[j - d / 2] };
                    let want = row[j] * f.cos() + rotated * f.sin();
                    let got = y[(p * h + hh) * d + j];
                    assert!((want - got).abs() < 1e-6, "pos {p} head {hh} dim {j}: {got} vs {want}");
                }
            }
        }
        // position 0 is the identity
        assert_eq!(&y[..h * d], &data[..h * d]);
    }

    #[test]
    fn inv_freq_is_transformers() {
        let inv = inv_freq(8, 10000.0);
        assert_eq!(inv[0], 1.0);
        assert!((inv[1] - 0.1).abs() < 1e-7);
        assert!((inv[3] - 0.001).abs() < 1e-9);
    }
}
