use weft_core::{Conv2dParams, DType, Generator, Pool2dParams, Result, Tensor};

use crate::init;
use crate::module::Module;

/// 2-D convolution (as `torch.nn.Conv2d`): weight `[out, in / groups, kh, kw]`, bias `[out]`,
/// PyTorch's default initialisation.
#[derive(Clone, Debug)]
pub struct Conv2d {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub params: Conv2dParams,
}

impl Conv2d {
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        params: Conv2dParams,
        bias: bool,
        rng: &mut Generator,
    ) -> Result<Self> {
        let groups = params.groups.max(1);
        let fan_in = in_channels / groups * kernel * kernel;
        let bound = init::default_bound(fan_in);
        let weight = init::uniform(
            &[out_channels, in_channels / groups, kernel, kernel],
            bound,
            DType::F32,
            rng,
        )?;
        let bias = if bias {
            Some(init::uniform(&[out_channels], bound, DType::F32, rng)?)
        } else {
            None
        };
        Ok(Conv2d { weight, bias, params })
    }

    /// # Shapes
    /// `[N, in, H, W] -> [N, out, OH, OW]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.conv2d(&self.weight, self.bias.as_ref(), self.params)
    }
}

impl Module for Conv2d {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = vec![("weight".to_string(), self.weight.clone())];
        if let Some(b) = &self.bias {
            p.push(("bias".to_string(), b.clone()));
        }
        p
    }
}

/// Max pooling (as `torch.nn.MaxPool2d`).
#[derive(Clone, Copy, Debug)]
pub struct MaxPool2d {
    pub params: Pool2dParams,
}

impl MaxPool2d {
    /// A `k x k` window with stride `k`.
    pub fn new(k: usize) -> Self {
        MaxPool2d {
            params: Pool2dParams::square(k),
        }
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.max_pool2d(self.params)
    }
}

impl Module for MaxPool2d {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
}
