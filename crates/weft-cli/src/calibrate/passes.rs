//! The model's own passes, for the planner's [`PassCost`]: what a micro-batch's forward and
//! backward take beyond the FLOPs and bytes the cost model counts (each op's dispatch,
//! allocation and autograd bookkeeping, which a small micro-batch pays as a large one does).
//!
//! The configured model is built with one block and with two, and each runs forwards (with
//! the loss) and backwards at one row, half a rank's share of the batch (`rows`) and all of
//! it, on one rank computing alone, as the trainer runs a micro-batch: fresh ids, the loss
//! read, the backward seeded with the micro-batch's weight, the gradients adding up from pass
//! to pass. Each time `T` (the median of three) is fitted, by least squares, to
//! `T = time_scale x analytic + blocks x block + ends`, with `analytic` the cost model's own
//! time of that pass ([`weft_plan::cost::unit_times`] at the rates just measured) and
//! `block`, `ends` not negative.

use std::time::Duration;

use weft_core::Tensor;
use weft_plan::cost::unit_times;
use weft_plan::{DeviceSpec, PassCost, Precision, Workload};
use weft_train::config::{ModelConfig, RunConfig};
use weft_train::plan_shape;

/// One measured pass: the cost model's time of it, its blocks and its measured seconds.
struct Point {
    analytic: f64,
    blocks: f64,
    seconds: f64,
}

/// The model of `model` with `n` blocks.
fn with_blocks(model: &ModelConfig, n: usize) -> Result<ModelConfig, String> {
    Ok(match model {
        ModelConfig::Gpt(g) => ModelConfig::Gpt(weft_train::config::GptKeys {
            n_layer: n,
            ..g.clone()
        }),
        ModelConfig::Llama(l) => ModelConfig::Llama(weft_train::config::LlamaKeys {
            n_layer: n,
            ..l.clone()
        }),
        other => {
            return Err(format!(
                "model.kind = {:?}: the planner plans gpt and llama models",
                other.kind()
            ))
        }
    })
}

/// Measures the passes of `config`'s model and fits its [`PassCost`] against `spec` (the rates
/// of one rank alone, no pass cost yet); also the measured seconds by name.
pub(super) fn pass_cost(
    config: &RunConfig,
    spec: &DeviceSpec,
    rows: usize,
    budget: Duration,
) -> Result<(PassCost, Vec<(String, f64)>), String> {
    let work = plan_shape::workload(config, None)?;
    // the passes measured run in f32 on this CPU
    let work = Workload {
        precision: Precision::F32,
        kv_repeated: false,
        ..work
    };
    let m = &work.model;
    let (seq, vocab) = (m.seq_len as usize, m.vocab as usize);
    let mut points = Vec::new();
    let mut measured = Vec::new();
    for blocks in [1usize, 2] {
        let model = weft_train::run::build_model(&with_blocks(&config.model, blocks)?, 0).map_err(|e| e.to_string())?;
        let params = model.parameters();
        let mut sizes = vec![1, (rows / 2).max(1), rows.max(2)];
        sizes.dedup();
        for r in sizes {
            let ids = |shift: usize| {
                let v: Vec<i64> = (0..r * seq).map(|i| ((i * 7919 + shift) % vocab) as i64).collect();
                Tensor::from_vec(v, &[r, seq])
            };
            // as the trainer runs a micro-batch: its ids made, the loss read, the backward
            // seeded with the micro-batch's weight, the gradients adding up from pass to pass
            params.iter().for_each(|(_, p)| p.set_grad(None));
            let mut call = 0;
            let mut pass = || {
                call += 1;
                let (x, y) = (ids(call)?, ids(call + 1)?);
                let loss = model.loss(&x, &y)?;
                loss.item()?;
                loss.backward_with(&Tensor::ones_like(&loss)?.mul_scalar(0.5)?)
            };
            // the median of three timings (a small pass's fixed cost is what is fitted, so one
            // slow timing must not move it)
            let mut times = Vec::new();
            for _ in 0..3 {
                times.push(super::timed(None, budget / 3, &mut pass)?);
            }
            times.sort_by(f64::total_cmp);
            let seconds = times[1];
            params.iter().for_each(|(_, p)| p.set_grad(None));
            let u = unit_times(&work, spec, 1, 1, 1, r as f64);
            points.push(Point {
                analytic: 3.0 * (blocks as f64 * u.block_forward + u.embed_forward + u.head_forward),
                blocks: blocks as f64,
                seconds,
            });
            measured.push((format!("pass_{blocks}_blocks_{r}_rows_s"), seconds));
        }
    }
    Ok((fit(&points), measured))
}

/// Least squares of `seconds = time_scale x analytic + blocks x block + ends` with `block` and
/// `ends` held at 0 when free they would come out negative.
fn fit(points: &[Point]) -> PassCost {
    // columns: analytic, blocks, 1
    let column = |p: &Point, c: usize| [p.analytic, p.blocks, 1.0][c];
    let mut free = vec![0usize, 1, 2];
    loop {
        let n = free.len();
        let mut a = vec![vec![0.0f64; n + 1]; n];
        for p in points {
            for (i, &ci) in free.iter().enumerate() {
                for (j, &cj) in free.iter().enumerate() {
                    a[i][j] += column(p, ci) * column(p, cj);
                }
                a[i][n] += column(p, ci) * p.seconds;
            }
        }
        let Some(x) = solve(a) else {
            return PassCost::default();
        };
        let value = |c: usize| free.iter().position(|&f| f == c).map_or(0.0, |i| x[i]);
        // the most negative fixed cost leaves the fit, and it is made again
        let negative = free
            .iter()
            .copied()
            .filter(|&c| c > 0 && value(c) < 0.0)
            .min_by(|&a, &b| value(a).total_cmp(&value(b)));
        match negative {
            Some(c) => free.retain(|&f| f != c),
            None => {
                return PassCost {
                    time_scale: value(0).clamp(1.0 / 16.0, 16.0),
                    block: value(1),
                    ends: value(2),
                }
            }
        }
    }
}

/// Solves the augmented `n x (n + 1)` system by elimination with partial pivoting; `None`
/// when it is singular.
fn solve(mut a: Vec<Vec<f64>>) -> Option<Vec<f64>> {
    let n = a.len();
    for col in 0..n {
        let pivot = (col..n).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        if a[pivot][col].abs() < 1e-300 {
            return None;
        }
        a.swap(col, pivot);
        let pivot_row = a[col].clone();
        for (row, r) in a.iter_mut().enumerate() {
            if row != col {
                let f = r[col] / pivot_row[col];
                for (x, p) in r.iter_mut().zip(&pivot_row).skip(col) {
                    *x -= f * p;
                }
            }
        }
    }
    let x: Vec<f64> = (0..n).map(|i| a[i][n] / a[i][i]).collect();
    x.iter().all(|v| v.is_finite()).then_some(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn points(scale: f64, block: f64, ends: f64) -> Vec<Point> {
        [(1.0, 1e-3), (1.0, 8e-3), (2.0, 2e-3), (2.0, 16e-3)]
            .iter()
            .map(|&(blocks, analytic)| Point {
                analytic,
                blocks,
                seconds: scale * analytic + blocks * block + ends,
            })
            .collect()
    }

    #[test]
    fn the_fit_finds_the_costs_it_was_made_of() {
        let c = fit(&points(1.2, 3e-4, 5e-4));
        assert!((c.time_scale - 1.2).abs() < 1e-9, "{c:?}");
        assert!((c.block - 3e-4).abs() < 1e-12, "{c:?}");
        assert!((c.ends - 5e-4).abs() < 1e-12, "{c:?}");
    }

    #[test]
    fn a_cost_that_would_be_negative_is_held_at_zero() {
        // passes that run below their analytic time's line at one block: the fixed cost of the
        // ends would come out negative
        let c = fit(&points(1.0, 4e-4, -2e-4));
        assert_eq!(c.ends, 0.0, "{c:?}");
        assert!(c.block >= 0.0 && c.time_scale > 0.0, "{c:?}");
        // nothing to fit from
        assert_eq!(fit(&[]), PassCost::default());
    }
}
