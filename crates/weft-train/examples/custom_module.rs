//! A user-defined module trained through the Rust API, no config file: a two-layer network
//! learning XOR-like labels from 2-D points.
//!
//! Run: `cargo run --release -p weft-train --example custom_module`

use weft_core::{DType, Generator, Result, Tensor};
use weft_nn::layers::Linear;
use weft_nn::module::{prefixed, Module};
use weft_nn::optim::{Adam, AdamConfig, Optimizer, ParamGroup};

/// Two Linears with a tanh between them.
struct TwoLayer {
    hidden: Linear,
    out: Linear,
}

impl TwoLayer {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.out.forward(&self.hidden.forward(x)?.tanh()?)
    }
}

impl Module for TwoLayer {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = prefixed("hidden", self.hidden.parameters());
        p.extend(prefixed("out", self.out.parameters()));
        p
    }
}

fn main() -> Result<()> {
    let mut rng = Generator::new(0);
    let model = TwoLayer {
        hidden: Linear::new(2, 16, true, &mut rng)?,
        out: Linear::new(16, 2, true, &mut rng)?,
    };
    let mut opt = Adam::new(AdamConfig {
        decoupled: true,
        ..AdamConfig::default()
    })?;
    let groups = [ParamGroup {
        params: model.parameters(),
        weight_decay: 0.0,
    }];

    // 256 points in [-1, 1)^2, labelled 1 where the coordinates have the same sign
    let x = Tensor::rand(&[256, 2], DType::F32, &mut rng)?.affine(2.0, -1.0)?;
    let signs = x
        .narrow(1, 0, 1)?
        .mul(&x.narrow(1, 1, 1)?)?
        .gt(&Tensor::zeros(&[], DType::F32)?)?;
    let y = signs.cast(DType::I64)?.reshape(&[-1])?;

    for step in 0..300 {
        let loss = model.forward(&x)?.cross_entropy(&y, -100, 0.0)?;
        loss.backward()?;
        opt.step(&groups, 0.02)?;
        model.zero_grad();
        if step % 50 == 0 || step == 299 {
            println!("step {step:>3}  loss {:.4}", loss.item()?);
        }
    }
    let predicted = model.forward(&x)?.argmax(-1, false)?;
    let correct = predicted.eq(&y)?.cast(DType::F32)?.mean_all()?.item()?;
    println!("training accuracy {:.1}%", 100.0 * correct);
    Ok(())
}
