//! The model's own passes, for the planner's [`PassCost`]: what a micro-batch's forward and
//! backward take beyond the FLOPs and bytes the cost model counts (each op's dispatch,
//! allocation and autograd bookkeeping, which a small micro-batch pays as a large one does).
//!
//! The configured model is built with one block and with two, and each runs forwards (with
//! the loss) and backwards at up to four sizes, on one rank computing alone: the largest
//! micro-batch a layout runs (the whole batch, `rows` whole sequences), a half and a quarter
//! of it and one row; or, where such a pass would take more than a twelfth of the budget, the
//! largest size that does not (fewer rows, or one shorter sequence of at least twice
//! [`MIN_TOKENS`]) and a half and a quarter of it (not below [`MIN_TOKENS`]). Each runs as
//! the trainer runs a micro-batch: fresh ids, the loss read, the backward seeded with the
//! micro-batch's weight, the gradients adding up from pass to pass. Each time `T` (the median
//! of three) is fitted, by least squares of relative errors, to
//! `T = time_scale x analytic + blocks x block + ends`, with `analytic` the cost model's own
//! time of that pass ([`weft_plan::cost::unit_times`] at the rates just measured) and
//! `block`, `ends` not negative.

use std::time::Duration;

use weft_core::Tensor;
use weft_plan::cost::{accumulate_time, unfused_params, unit_times};
use weft_plan::{DeviceSpec, PassCost, Precision, Workload};
use weft_train::config::{ModelConfig, RunConfig};
use weft_train::plan_shape;

/// The fewest tokens a measured pass has (or half the model's sequence, if that is shorter;
/// the largest pass measured has at least twice as many): below that, a large model's
/// products are so thin that reading the weights, not a fixed cost, sets their time, and the
/// fit would take one for the other.
const MIN_TOKENS: usize = 64;

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
    (rows, ranks): (usize, usize),
    budget: Duration,
) -> Result<(PassCost, Vec<(String, f64)>), String> {
    let work = plan_shape::workload(config, None)?;
    // the passes add their gradients as the run would (`train.fuse_accumulation`)
    weft_core::set_accumulation_fusion(config.train.fuse_accumulation);
    // the passes measured run in f32 on this CPU
    let work = Workload {
        precision: Precision::F32,
        kv_repeated: false,
        ..work
    };
    let m = &work.model;
    let (seq, vocab) = (m.seq_len as usize, m.vocab as usize);
    // (rows, tokens a row) of the passes: the largest whose two-block pass the cost model puts
    // at a twelfth of the budget or less (3 timings of at least 4 calls each, so that the other
    // ranks' wait stays short; whole sequences up to the whole batch, else one shorter
    // sequence, down to twice the floor), then a half and a quarter of it and one row (not
    // below the floor)
    let analytic = |blocks: usize, (r, t): (usize, usize)| {
        let w = Workload {
            model: weft_plan::ModelShape {
                seq_len: t as u64,
                ..work.model.clone()
            },
            ..work.clone()
        };
        let u = unit_times(&w, spec, 1, 1, 1, r as f64);
        // every call adds its gradients to the ones before (those fusion leaves to a pass)
        let params = unfused_params(&w, 1, 1, blocks, true, true);
        3.0 * (blocks as f64 * u.block_forward + u.embed_forward + u.head_forward) + accumulate_time(params, spec)
    };
    // the smallest size measured: MIN_TOKENS, or half the sequence where that is shorter
    let floor = MIN_TOKENS.min(seq / 2).max(1);
    let Some(sizes) = pass_sizes(rows, seq, floor, |shape| {
        analytic(2, shape) <= budget.as_secs_f64() / 12.0
    }) else {
        let larger = if budget.as_millis() < 2000 {
            "; a larger --budget-ms (up to 2000) may measure them"
        } else {
            ""
        };
        return Err(format!(
            "a pass of two blocks takes longer than a twelfth of --budget-ms ({} ms) even at {} tokens{larger}",
            budget.as_millis(),
            (2 * floor).min(seq)
        ));
    };
    if sizes.len() < 2 {
        return Err("no two pass sizes to fit from".into());
    }
    let (r, t) = sizes[0];
    // the two-block model's parameters and gradients, and the largest pass's logits (read and
    // written three times), must fit in a share of this rank's memory
    let available = weft_core::memory::available().map_or(f64::INFINITY, |a| a.bytes as f64);
    let logits = 3.0 * 4.0 * (r * t) as f64 * vocab as f64;
    let needed = 2.0 * 4.0 * weft_plan::memory::stage_params(m, 1, 1, 2, true, true) + logits;
    if needed > available / ranks.max(1) as f64 / 2.0 {
        return Err(format!(
            "they need about {:.1} GB, more than half of a rank's share of this machine's memory",
            needed / 1e9
        ));
    }
    let mut points = Vec::new();
    let mut measured = Vec::new();
    for blocks in [1usize, 2] {
        let model = weft_train::run::build_model(&with_blocks(&config.model, blocks)?, 0).map_err(|e| e.to_string())?;
        let params = model.parameters();
        for &(r, t) in &sizes {
            let ids = |shift: usize| {
                let v: Vec<i64> = (0..r * t).map(|i| ((i * 7919 + shift) % vocab) as i64).collect();
                Tensor::from_vec(v, &[r, t])
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
            points.push(Point {
                analytic: analytic(blocks, (r, t)),
                blocks: blocks as f64,
                seconds,
            });
            measured.push((format!("pass_{blocks}_blocks_{r}x{t}_tokens_s"), seconds));
            measured.push((
                format!("pass_{blocks}_blocks_{r}x{t}_tokens_analytic_s"),
                analytic(blocks, (r, t)),
            ));
        }
    }
    Ok((fit(&points), measured))
}

/// The `(rows, tokens a row)` of the passes measured, largest first: the largest of whole
/// sequences from `rows` down (at least 2), else of one sequence shortened by halves down to
/// twice `floor`, that `fits` the time allowed; then a half and a quarter of it and one row
/// (whole sequences), or a half and a quarter of the shortened sequence, none below `floor`.
/// `None` when no size fits.
fn pass_sizes(
    rows: usize,
    seq: usize,
    floor: usize,
    fits: impl Fn((usize, usize)) -> bool,
) -> Option<Vec<(usize, usize)>> {
    let mut candidates: Vec<(usize, usize)> = (1..=rows.max(2)).rev().map(|r| (r, seq)).collect();
    candidates.extend((1..).map(|k| seq >> k).take_while(|&t| t >= 2 * floor).map(|t| (1, t)));
    let (r, t) = candidates.into_iter().find(|&shape| fits(shape))?;
    let mut sizes = if r > 1 {
        // a layout's micro-batches run from one row to the whole batch, and a row costs more in
        // a larger pass (its tensors leave the caches): the fit sees the sizes between
        vec![(r, t), ((r / 2).max(1), t), ((r / 4).max(1), t), (1, t)]
    } else {
        vec![(1, t), (1, t / 2), (1, t / 4)]
    };
    sizes.retain(|&(_, t)| t >= floor);
    sizes.dedup();
    Some(sizes)
}

/// Least squares of `seconds = time_scale x analytic + blocks x block + ends`, each point's
/// error relative to its seconds (a step's prediction is off by a share, and the one-row
/// passes, whose fixed costs decide layouts of many micro-batches, weigh as much as the
/// largest), with `block` and `ends` not negative and `time_scale` positive: every choice of
/// the fixed costs left free (both, one, none; the others held at 0) is solved, and the best
/// fit that keeps to those bounds is taken. No cost at all (a scale of 1) when none does.
fn fit(points: &[Point]) -> PassCost {
    // columns: analytic, blocks, 1
    let column = |p: &Point, c: usize| [p.analytic, p.blocks, 1.0][c];
    let weight = |p: &Point| p.seconds.powi(-2);
    let mut best: Option<(f64, PassCost)> = None;
    for free in [&[0usize, 1, 2][..], &[0, 1], &[0, 2], &[0]] {
        let n = free.len();
        let mut a = vec![vec![0.0f64; n + 1]; n];
        for p in points {
            let w = weight(p);
            for (i, &ci) in free.iter().enumerate() {
                for (j, &cj) in free.iter().enumerate() {
                    a[i][j] += w * column(p, ci) * column(p, cj);
                }
                a[i][n] += w * column(p, ci) * p.seconds;
            }
        }
        let Some(x) = solve(a) else { continue };
        let value = |c: usize| free.iter().position(|&f| f == c).map_or(0.0, |i| x[i]);
        let cost = PassCost {
            time_scale: value(0),
            block: value(1),
            ends: value(2),
        };
        // only fits the calibration file's reader takes back (`weft_plan::cluster::LIMITS`)
        let within = |name: &str, v: f64| {
            weft_plan::cluster::LIMITS
                .iter()
                .find(|l| l.0 == name)
                .is_some_and(|l| (l.1..=l.2).contains(&v))
        };
        if !(within("time_scale", cost.time_scale)
            && within("pass_seconds", cost.block)
            && within("pass_seconds", cost.ends))
        {
            continue;
        }
        let residual: f64 = points
            .iter()
            .map(|p| weight(p) * (cost.time_scale * p.analytic + p.blocks * cost.block + cost.ends - p.seconds).powi(2))
            .sum();
        if residual.is_finite() && best.as_ref().is_none_or(|(r, _)| residual < *r) {
            best = Some((residual, cost));
        }
    }
    best.map_or_else(PassCost::default, |(_, c)| c)
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

    /// The passes reach the largest micro-batch a layout runs (the whole batch of 16 rows), or
    /// the largest that fits the time, with the sizes between measured too.
    #[test]
    fn the_passes_run_from_one_row_to_the_whole_batch() {
        assert_eq!(
            pass_sizes(16, 64, 32, |_| true),
            Some(vec![(16, 64), (8, 64), (4, 64), (1, 64)])
        );
        assert_eq!(
            pass_sizes(16, 64, 32, |(r, _)| r <= 9),
            Some(vec![(9, 64), (4, 64), (2, 64), (1, 64)])
        );
        assert_eq!(pass_sizes(3, 64, 32, |_| true), Some(vec![(3, 64), (1, 64)]));
        // one row too long: one sequence shortened, down to twice the floor
        assert_eq!(
            pass_sizes(16, 1024, 64, |(r, t)| r * t <= 256),
            Some(vec![(1, 256), (1, 128), (1, 64)])
        );
        assert_eq!(pass_sizes(16, 1024, 64, |_| false), None);
        // one row fits, and its halves fall below the floor: one size, which the caller refuses
        assert_eq!(pass_sizes(1, 128, 100, |(r, _)| r == 1), Some(vec![(1, 128)]));
    }

    /// A large pass off the line (its tensors out of the caches) does not pull the fit away
    /// from the one-row passes: each error counts by its share of its pass, so the small
    /// passes, which decide layouts of many micro-batches, stay within a few percent.
    #[test]
    fn the_fit_weighs_each_pass_by_its_share() {
        let mut pts = points(1.0, 3e-4, 2e-4);
        // the largest pass (two blocks, 16 ms analytic) runs 15% over the line
        pts[3].seconds *= 1.15;
        let c = fit(&pts);
        let off = |p: &Point| (c.time_scale * p.analytic + p.blocks * c.block + c.ends) / p.seconds - 1.0;
        for p in &pts {
            assert!(off(p).abs() < 0.08, "{:?} {}", c, off(p));
        }
    }

    #[test]
    fn the_fit_finds_the_costs_it_was_made_of() {
        let c = fit(&points(1.2, 3e-4, 5e-4));
        assert!((c.time_scale - 1.2).abs() < 1e-9, "{c:?}");
        assert!((c.block - 3e-4).abs() < 1e-12, "{c:?}");
        assert!((c.ends - 5e-4).abs() < 1e-12, "{c:?}");
    }

    /// Passes that are nearly all fixed cost: the free fit's scale (1e-5) is below what the
    /// calibration file's reader takes back (`weft_plan::cluster::LIMITS`: at least 1e-3), so
    /// the fit taken is one within the reader's bounds.
    #[test]
    fn the_fit_stays_within_what_the_calibration_file_reads_back() {
        let c = fit(&points(1e-5, 4e-3, 2e-3));
        assert!(c.time_scale >= 1e-3 && c.time_scale <= 16.0, "{c:?}");
        assert!(
            (0.0..=60.0).contains(&c.block) && (0.0..=60.0).contains(&c.ends),
            "{c:?}"
        );
    }

    #[test]
    fn a_cost_that_would_be_negative_is_held_at_zero() {
        // passes that run below their analytic time's line at one block: the fixed cost of the
        // ends would come out negative; held at 0, the block's cost and the scale still fit
        // the points better than with both held
        let pts = points(1.0, 4e-4, -2e-4);
        let c = fit(&pts);
        assert_eq!(c.ends, 0.0, "{c:?}");
        assert!(c.block > 0.0 && c.time_scale > 0.0, "{c:?}");
        // the fit's own measure: each error relative to the point's seconds
        let residual = |c: &PassCost| -> f64 {
            pts.iter()
                .map(|p| ((c.time_scale * p.analytic + p.blocks * c.block + c.ends - p.seconds) / p.seconds).powi(2))
                .sum()
        };
        let scale_only = PassCost { block: 0.0, ..c };
        assert!(residual(&c) < residual(&scale_only), "{c:?}");
        // nothing to fit from, or a timing that is not a number: no cost
        assert_eq!(fit(&[]), PassCost::default());
        let mut broken = points(1.2, 3e-4, 5e-4);
        broken[1].seconds = f64::NAN;
        assert_eq!(fit(&broken), PassCost::default());
    }
}
