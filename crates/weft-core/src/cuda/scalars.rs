//! The per-step scalars of the fused optimizer updates (`crate::cuda::optim`), in their own file
//! so that a build without the `cuda` feature has the same types.

/// Adam/AdamW's per-step scalars, each already rounded to the parameter's dtype (an f32 value
/// carried exactly in an f64). Field meanings as weft-nn's `optim::adam::Coefs`.
#[derive(Debug, Clone, Copy)]
pub struct AdamScalars {
    pub l2: Option<f64>,
    pub decay: Option<f64>,
    pub lerp_w: f64,
    pub lerp_small: bool,
    pub lerp_w_minus_one: f64,
    pub beta2: f64,
    pub one_minus_beta2: f64,
    pub bias_correction2_sqrt: f64,
    pub eps: f64,
    pub neg_step_size: f64,
}

/// SGD's per-step scalars, rounded as [`AdamScalars`]'. Field meanings as weft-nn's
/// `optim::sgd::Coefs`.
#[derive(Debug, Clone, Copy)]
pub struct SgdScalars {
    pub weight_decay: Option<f64>,
    pub momentum: f64,
    pub one_minus_dampening: f64,
    pub nesterov: bool,
    pub first: bool,
    pub neg_lr: f64,
}
