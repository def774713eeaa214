//! Compiled mode through the library API: a training step (forward, loss, backward) captured as a
//! graph at its first call and replayed after, checked against the same step run eagerly.
//!
//! Run: `cargo run --release -p weft-train --example compiled_step`

use std::time::Instant;

use weft_core::graph::{compile, Outcome};
use weft_core::{DType, Generator, Result, Tensor};
use weft_nn::layers::Linear;
use weft_nn::module::{prefixed, Module};
use weft_nn::optim::{Adam, AdamConfig, Optimizer, ParamGroup};

/// Three Linears with GELUs between them.
struct Net {
    layers: Vec<Linear>,
}

impl Net {
    fn new(widths: &[usize], rng: &mut Generator) -> Result<Net> {
        let layers = widths
            .windows(2)
            .map(|w| Linear::new(w[0], w[1], true, rng))
            .collect::<Result<_>>()?;
        Ok(Net { layers })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            h = layer.forward(&h)?;
            if i + 1 < self.layers.len() {
                h = h.gelu()?;
            }
        }
        Ok(h)
    }
}

impl Module for Net {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            p.extend(prefixed(&i.to_string(), l.parameters()));
        }
        p
    }
}

/// The step a compiled function runs: `[x, y]` -> `[loss, gradients...]`.
fn loss_and_grads(net: &Net, xs: &[Tensor]) -> Result<Vec<Tensor>> {
    net.zero_grad();
    let loss = net.forward(&xs[0])?.cross_entropy(&xs[1], -100, 0.0)?;
    loss.backward()?;
    let mut out = vec![loss.detach()];
    out.extend(net.parameters().iter().filter_map(|(_, p)| p.grad()));
    Ok(out)
}

fn main() -> Result<()> {
    let widths = [64, 256, 256, 10];
    let (eager_net, compiled_net) = (
        Net::new(&widths, &mut Generator::new(0))?,
        Net::new(&widths, &mut Generator::new(0))?,
    );
    let mut rng = Generator::new(1);
    let x = Tensor::randn(&[128, 64], DType::F32, &mut rng)?;
    let y = Tensor::rand(&[128], DType::F32, &mut rng)?
        .mul_scalar(10.0)?
        .cast(DType::I64)?;
    let adam = || {
        Adam::new(AdamConfig {
            decoupled: true,
            ..AdamConfig::default()
        })
    };
    let (mut opt_e, mut opt_c) = (adam()?, adam()?);
    let groups = |net: &Net| {
        [ParamGroup {
            params: net.parameters(),
            weight_decay: 0.0,
        }]
    };
    let (groups_e, groups_c) = (groups(&eager_net), groups(&compiled_net));

    let mut step = compile(|xs: &[Tensor]| loss_and_grads(&compiled_net, xs));
    let (mut eager_s, mut compiled_s) = (0.0, 0.0);
    for i in 0..50 {
        let t = Instant::now();
        let eager = loss_and_grads(&eager_net, &[x.clone(), y.clone()])?;
        eager_s += t.elapsed().as_secs_f64();
        opt_e.step(&groups_e, 1e-3)?;

        let t = Instant::now();
        let replayed = step.call(&[x.clone(), y.clone()])?;
        compiled_s += t.elapsed().as_secs_f64();
        // the replay returns gradients: hand them to the parameters for the optimizer
        for ((_, p), g) in compiled_net.parameters().iter().zip(&replayed[1..]) {
            p.set_grad(Some(g.clone()));
        }
        opt_c.step(&groups_c, 1e-3)?;

        let (le, lc) = (eager[0].item()?, replayed[0].item()?);
        assert_eq!(le.to_bits(), lc.to_bits(), "step {i}: eager {le}, compiled {lc}");
        if i % 10 == 0 {
            let what = match step.last_outcome() {
                Some(Outcome::Captured) => "captured".to_string(),
                Some(Outcome::Replayed) => "replayed".to_string(),
                Some(Outcome::Eager(why)) => format!("eager: {why}"),
                None => String::new(),
            };
            println!("step {i:>2}  loss {lc:.6} (eager {le:.6})  {what}");
        }
    }
    if let Some(graph) = step.graph_for(&[x.clone(), y.clone()]) {
        let plan = weft_core::graph::plan::plan(graph);
        println!(
            "graph: {} nodes, peak {:.2} MiB planned; passes {:?}",
            graph.nodes.len(),
            plan.peak_live_bytes as f64 / (1 << 20) as f64,
            step.pass_report()
        );
    }
    println!(
        "time in the step: eager {:.1} ms, compiled {:.1} ms (50 steps)",
        eager_s * 1e3,
        compiled_s * 1e3
    );
    Ok(())
}
