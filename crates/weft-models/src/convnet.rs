//! A small convolutional classifier: stages of Conv2d(3x3, padding 1) + ReLU + MaxPool2d(2), then
//! a Linear `fc`.

use weft_core::{Conv2dParams, DType, Error, Generator, Result, Tensor};
use weft_nn::layers::{Conv2d, Linear, MaxPool2d};
use weft_nn::module::{prefixed, Module};
use weft_nn::Context;

use crate::{config_error, Model};

/// Sizes of a [`ConvNet`].
#[derive(Clone, Debug, PartialEq)]
pub struct ConvNetConfig {
    pub in_channels: usize,
    /// Height and width of the (square) input; must divide by `2^stages`.
    pub image_size: usize,
    /// Output channels of each stage.
    pub channels: Vec<usize>,
    pub num_classes: usize,
}

impl ConvNetConfig {
    pub fn validate(&self) -> Result<()> {
        if self.in_channels == 0 || self.num_classes == 0 || self.channels.is_empty() || self.channels.contains(&0) {
            return Err(config_error(
                "in_channels/channels/num_classes",
                "sizes must be positive and channels non-empty",
            ));
        }
        let div = 1usize.checked_shl(self.channels.len() as u32).unwrap_or(usize::MAX);
        if self.image_size == 0 || !self.image_size.is_multiple_of(div) {
            return Err(config_error(
                "image_size",
                format!(
                    "{} does not divide by 2^{} (one halving per stage)",
                    self.image_size,
                    self.channels.len()
                ),
            ));
        }
        Ok(())
    }

    fn final_side(&self) -> usize {
        self.image_size >> self.channels.len()
    }
}

/// `convs.{i}` stages, flatten (NCHW order), `fc`, then mean cross-entropy.
pub struct ConvNet {
    pub config: ConvNetConfig,
    pub convs: Vec<Conv2d>,
    pub fc: Linear,
    pool: MaxPool2d,
    ctx: Context,
}

impl ConvNet {
    pub fn new(config: ConvNetConfig, seed: u64) -> Result<Self> {
        config.validate()?;
        let mut rng = Generator::new(seed);
        let p = Conv2dParams {
            padding: (1, 1),
            ..Conv2dParams::new()
        };
        let mut convs = Vec::new();
        let mut c_in = config.in_channels;
        for &c in &config.channels {
            convs.push(Conv2d::new(c_in, c, 3, p, true, &mut rng)?);
            c_in = c;
        }
        let side = config.final_side();
        let fc = Linear::new(c_in * side * side, config.num_classes, true, &mut rng)?;
        Ok(ConvNet {
            config,
            convs,
            fc,
            pool: MaxPool2d::new(2),
            ctx: Context::new(seed),
        })
    }

    /// # Shapes
    /// f32 `[B, in_channels, image_size, image_size]` (or `[B, in_channels * image_size^2]`,
    /// reshaped) -> logits `[B, num_classes]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let c = &self.config;
        let want = c.in_channels * c.image_size * c.image_size;
        let ok = x.dtype() == DType::F32 && x.rank() >= 2 && x.numel() == x.shape()[0] * want;
        if !ok {
            return Err(Error::Invalid {
                op: "convnet",
                msg: format!(
                    "inputs must be f32 [B, {}, {}, {}], got {:?} {:?}",
                    c.in_channels,
                    c.image_size,
                    c.image_size,
                    x.dtype(),
                    x.shape()
                ),
            });
        }
        let b = x.shape()[0] as isize;
        let mut y = x.reshape(&[b, c.in_channels as isize, c.image_size as isize, c.image_size as isize])?;
        for conv in &self.convs {
            y = self.pool.forward(&conv.forward(&y)?.relu()?)?;
        }
        self.fc.forward(&y.flatten(1, -1)?)
    }
}

impl Module for ConvNet {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p: Vec<(String, Tensor)> = self
            .convs
            .iter()
            .enumerate()
            .flat_map(|(i, l)| prefixed(&format!("convs.{i}"), l.parameters()))
            .collect();
        p.extend(prefixed("fc", self.fc.parameters()));
        p
    }
}

impl Model for ConvNet {
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
