//! A multi-layer perceptron: `layers.{i}` Linears with an activation between them.

use weft_core::{DType, Error, Generator, Result, Tensor};
use weft_nn::layers::{Activation, Linear};
use weft_nn::module::{prefixed, Module};
use weft_nn::Context;

use crate::{config_error, Model};

/// Sizes of an [`MlpModel`].
#[derive(Clone, Debug, PartialEq)]
pub struct MlpConfig {
    pub in_features: usize,
    /// Widths of the hidden layers (may be empty: a single Linear).
    pub hidden: Vec<usize>,
    pub out_features: usize,
    /// Applied between Linears, not after the last.
    pub activation: Activation,
}

impl MlpConfig {
    pub fn validate(&self) -> Result<()> {
        if self.in_features == 0 || self.out_features == 0 || self.hidden.contains(&0) {
            return Err(config_error(
                "in_features/hidden/out_features",
                "sizes must be positive",
            ));
        }
        if self.activation == Activation::Flatten {
            return Err(config_error("activation", "must be relu, gelu or tanh"));
        }
        Ok(())
    }
}

/// `layers.0 -> act -> layers.1 -> act -> ... -> layers.{n-1}`, then mean cross-entropy.
pub struct MlpModel {
    pub config: MlpConfig,
    pub layers: Vec<Linear>,
    ctx: Context,
}

impl MlpModel {
    pub fn new(config: MlpConfig, seed: u64) -> Result<Self> {
        config.validate()?;
        let mut rng = Generator::new(seed);
        let mut widths = vec![config.in_features];
        widths.extend(&config.hidden);
        widths.push(config.out_features);
        let layers = widths
            .windows(2)
            .map(|w| Linear::new(w[0], w[1], true, &mut rng))
            .collect::<Result<Vec<_>>>()?;
        Ok(MlpModel {
            config,
            layers,
            ctx: Context::new(seed),
        })
    }

    /// # Shapes
    /// f32 `[B, in_features]` -> logits `[B, out_features]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() != 2 || x.shape()[1] != self.config.in_features || x.dtype() != DType::F32 {
            return Err(Error::Invalid {
                op: "mlp",
                msg: format!(
                    "inputs must be f32 [B, {}], got {:?} {:?}",
                    self.config.in_features,
                    x.dtype(),
                    x.shape()
                ),
            });
        }
        let mut y = x.clone();
        let act = self.config.activation;
        for (i, l) in self.layers.iter().enumerate() {
            let last = i + 1 == self.layers.len();
            y = match (last, act.unary()) {
                (true, _) => l.forward(&y)?,
                // the activation inside the linear's product (the same values)
                (false, Some(u)) => l.forward_act(&y, u)?,
                (false, None) => act.forward(&l.forward(&y)?)?,
            };
        }
        Ok(y)
    }
}

impl Module for MlpModel {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(i, l)| prefixed(&format!("layers.{i}"), l.parameters()))
            .collect()
    }
}

impl Model for MlpModel {
    fn logits(&self, inputs: &Tensor) -> Result<Tensor> {
        self.forward(inputs)
    }

    fn loss(&self, inputs: &Tensor, targets: &Tensor) -> Result<Tensor> {
        self.forward(inputs)?.cross_entropy(targets, -100, 0.0)
    }

    fn evaluate(&self, inputs: &Tensor, targets: &Tensor) -> Result<crate::EvalOutput> {
        crate::evaluate_classifier(&self.forward(inputs)?, targets)
    }

    fn context(&self) -> &Context {
        &self.ctx
    }
}
