//! Compiled mode through the library API, without the trainer: a GPT's training step (forward,
//! loss, backward) captured as a graph at its first call and replayed after, side by side with the
//! same step run eagerly on a copy of the model. Every loss is checked bit for bit, and the two
//! step times are printed (medians, the two alternating in one process).
//!
//! Run: `WEFT_NUM_THREADS=2 cargo run --release -p weft-train --example compiled_step [-- --compiled-first] [--recompute]`
//! (`--recompute`: the graph recomputes cheap activations to lower its peak memory.)
//! The model is the CPU speed-target GPT of `tools/bench/gpt_step.toml` (vocab 65, block 64, 4
//! layers, 4 heads, n_embd 128, batch 16), trained with AdamW on one fixed batch.

use std::time::Instant;

use weft_core::graph::{compile, Compiled, Outcome};
use weft_core::{Result, Tensor, UnaryOp};
use weft_models::gpt::{Gpt, GptConfig};
use weft_models::Model;
use weft_nn::optim::{Adam, AdamConfig, Optimizer, ParamGroup};
use weft_nn::Module;

/// The step a compiled function runs: `[inputs, targets]` -> `[loss, gradients...]`.
fn loss_and_grads(model: &Gpt, xs: &[Tensor]) -> Result<Vec<Tensor>> {
    model.zero_grad();
    let loss = model.loss(&xs[0], &xs[1])?;
    loss.backward()?;
    let mut out = vec![loss.detach()];
    out.extend(model.parameters().iter().filter_map(|(_, p)| p.grad()));
    Ok(out)
}

/// One eager step: forward + backward (timed into `ms`), then the optimizer.
fn eager_step(
    model: &Gpt,
    xs: &[Tensor],
    opt: &mut Adam,
    groups: &[ParamGroup],
    ms: &mut Vec<f64>,
    peaks: &mut Vec<usize>,
) -> Result<Vec<Tensor>> {
    let start = weft_core::memory::allocated_bytes();
    weft_core::memory::reset_max_allocated();
    let t = Instant::now();
    let out = loss_and_grads(model, xs)?;
    ms.push(t.elapsed().as_secs_f64() * 1e3);
    peaks.push(weft_core::memory::max_allocated_bytes() - start);
    opt.step(groups, 1e-3)?;
    model.zero_grad();
    Ok(out)
}

/// One compiled step: the replay (timed into `ms`), its gradients handed to the parameters, then
/// the optimizer.
fn compiled_step<F>(
    step: &mut Compiled<F>,
    xs: &[Tensor],
    model: &Gpt,
    opt: &mut Adam,
    groups: &[ParamGroup],
    ms: &mut Vec<f64>,
    peaks: &mut Vec<usize>,
) -> Result<Vec<Tensor>>
where
    F: FnMut(&[Tensor]) -> Result<Vec<Tensor>>,
{
    let start = weft_core::memory::allocated_bytes();
    weft_core::memory::reset_max_allocated();
    let t = Instant::now();
    let out = step.call(xs)?;
    ms.push(t.elapsed().as_secs_f64() * 1e3);
    peaks.push(weft_core::memory::max_allocated_bytes() - start);
    for ((_, p), g) in model.parameters().iter().zip(&out[1..]) {
        p.set_grad(Some(g.clone()));
    }
    opt.step(groups, 1e-3)?;
    model.zero_grad();
    Ok(out)
}

const MIB: f64 = (1 << 20) as f64;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let compiled_first = std::env::args().any(|a| a == "--compiled-first");
    let recompute = std::env::args().any(|a| a == "--recompute");
    let config = GptConfig {
        vocab_size: 65,
        block_size: 64,
        n_layer: 4,
        n_head: 4,
        n_embd: 128,
        bias: true,
        dropout: 0.0,
        activation: UnaryOp::Gelu,
    };
    let (eager_model, compiled_model) = (Gpt::new(config.clone(), 0)?, Gpt::new(config, 0)?);
    let ids: Vec<i64> = (0..16 * 65).map(|i| (i * 7 + i / 13) % 65).collect();
    let x = Tensor::from_vec(ids[..16 * 64].to_vec(), &[16, 64])?;
    let y = Tensor::from_vec(ids[1..16 * 64 + 1].to_vec(), &[16, 64])?;
    let adamw = || {
        Adam::new(AdamConfig {
            decoupled: true,
            ..AdamConfig::default()
        })
    };
    let (mut opt_e, mut opt_c) = (adamw()?, adamw()?);
    let group = |m: &Gpt| {
        [ParamGroup {
            params: m.parameters(),
            weight_decay: 0.1,
        }]
    };
    let (groups_e, groups_c) = (group(&eager_model), group(&compiled_model));

    let mut step = compile(|xs: &[Tensor]| loss_and_grads(&compiled_model, xs)).with_recompute(recompute);
    let (mut eager_ms, mut compiled_ms) = (Vec::new(), Vec::new());
    let (mut eager_peak, mut compiled_peak) = (Vec::new(), Vec::new());
    for i in 0..60 {
        let xs = [x.clone(), y.clone()];
        // which runs first in a pair changes the times by about as much as compiling does
        let (eager, replayed) = if compiled_first {
            let r = compiled_step(
                &mut step,
                &xs,
                &compiled_model,
                &mut opt_c,
                &groups_c,
                &mut compiled_ms,
                &mut compiled_peak,
            )?;
            (
                eager_step(&eager_model, &xs, &mut opt_e, &groups_e, &mut eager_ms, &mut eager_peak)?,
                r,
            )
        } else {
            let e = eager_step(&eager_model, &xs, &mut opt_e, &groups_e, &mut eager_ms, &mut eager_peak)?;
            (
                e,
                compiled_step(
                    &mut step,
                    &xs,
                    &compiled_model,
                    &mut opt_c,
                    &groups_c,
                    &mut compiled_ms,
                    &mut compiled_peak,
                )?,
            )
        };
        let (le, lc) = (eager[0].item()?, replayed[0].item()?);
        assert_eq!(le.to_bits(), lc.to_bits(), "step {i}: eager {le}, compiled {lc}");
        if i % 20 == 0 {
            let what = match step.last_outcome() {
                Some(Outcome::Captured) => "captured".to_string(),
                Some(Outcome::Replayed) => "replayed".to_string(),
                Some(Outcome::Eager(why)) => format!("eager: {why}"),
                None => String::new(),
            };
            println!("step {i:>2}  loss {lc:.6} (eager {le:.6})  {what}");
        }
    }
    let r = step.pass_report();
    println!(
        "graph: {} nodes captured, {} folded, {} merged, {} removed",
        r.captured, r.folded, r.merged, r.removed
    );
    let m = step.remat_report();
    if recompute {
        println!(
            "recompute: {} buffers made again; the plan's peak {:.2} -> {:.2} MiB",
            m.recomputed,
            m.peak_before as f64 / MIB,
            m.peak_after as f64 / MIB
        );
    }
    // the tensors a step adds to what is alive between steps (parameters, optimizer state)
    println!(
        "tensor bytes at the peak of forward + backward, above those alive between steps: eager {:.2} MiB, compiled {:.2} MiB",
        eager_peak[5..].iter().max().copied().unwrap_or(0) as f64 / MIB,
        compiled_peak[5..].iter().max().copied().unwrap_or(0) as f64 / MIB
    );
    // the first 5 steps (the capture among them) are left out
    println!(
        "forward + backward, median of 55 steps: eager {:.2} ms, compiled {:.2} ms",
        median(eager_ms[5..].to_vec()),
        median(compiled_ms[5..].to_vec())
    );
    Ok(())
}
