//! The autotuning search: one replay of a captured graph that times every variant of each
//! kernel call it makes (see [`crate::tune`]) and records the fastest per key.

use std::time::Instant;

use super::run::Prepared;
use crate::error::Result;
use crate::tune::{self, Kernel};
use crate::Tensor;

/// How kernels choose their variants.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Autotune {
    /// By their own rules (and choices recorded earlier in the process).
    #[default]
    Heuristic,
    /// Time the variants at the first replay of each graph, keep the fastest (and the choice in
    /// the machine's cache file).
    Search,
}

/// Timed rounds: each round runs every variant once, in turn (so that a machine that slows
/// down or speeds up during the search weighs on every variant alike); the median counts.
const ROUNDS: usize = 7;

/// A variant is preferred to the rule only when it is this much faster (noise is not a reason
/// to leave the rule).
const MARGIN: f64 = 0.95;

/// One kernel call the search timed.
#[derive(Clone, Debug)]
pub struct TuneEntry {
    pub kernel: Kernel,
    /// The kernel's key: its name, dtype, shapes and threads.
    pub key: String,
    /// Median milliseconds of the rule's variant and of the chosen one.
    pub heuristic_ms: f64,
    pub chosen: &'static str,
    pub chosen_ms: f64,
}

/// What a search did.
#[derive(Clone, Debug, Default)]
pub struct TuneReport {
    /// Kernel calls timed now.
    pub searched: Vec<TuneEntry>,
    /// Kernel calls whose choice was already known (from the cache file, or an earlier graph).
    pub known: usize,
    /// Choices read from the cache file at the start.
    pub from_file: usize,
    /// Seconds the search took.
    pub seconds: f64,
    /// Warnings: a cache file ignored, or one that could not be written.
    pub warnings: Vec<String>,
}

impl TuneReport {
    /// A table per kernel: the key, the rule's time, the choice and its time.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        for kernel in Kernel::ALL {
            let rows: Vec<&TuneEntry> = self.searched.iter().filter(|e| e.kernel == kernel).collect();
            if rows.is_empty() {
                continue;
            }
            out.push_str(&format!(
                "{}\n| call | heuristic ms | choice | choice ms | speed-up |\n|---|---:|---|---:|---:|\n",
                kernel.name()
            ));
            for e in rows {
                out.push_str(&format!(
                    "| {} | {:.4} | {} | {:.4} | {:.2}x |\n",
                    e.key.split_once(' ').map_or(e.key.as_str(), |(_, k)| k),
                    e.heuristic_ms,
                    e.chosen,
                    e.chosen_ms,
                    e.heuristic_ms / e.chosen_ms.max(1e-12)
                ));
            }
        }
        out
    }
}

/// How many times an op runs again with its new choices to find the calls they make.
const FOLLOW_ROUNDS: usize = 4;

/// Times every variant of the kernel calls `new` that `op` makes on `args` and records the
/// fastest for each.
fn search_calls(op: &crate::op::Op, args: &[&Tensor], new: &[(Kernel, String)], report: &mut TuneReport) -> Result<()> {
    for kernel in Kernel::ALL {
        let keys: Vec<&String> = new.iter().filter(|(k, _)| *k == kernel).map(|(_, k)| k).collect();
        if keys.is_empty() {
            continue;
        }
        // the variants that run and come to a plan of their own at these shapes (one that
        // plans what an earlier one does is not a choice of its own; one that fails, say
        // for memory, is none), each run once untimed
        let mut variants: Vec<u8> = Vec::new();
        let mut plans: Vec<Vec<String>> = Vec::new();
        for v in 0..kernel.variants().len() as u8 {
            let (ran, plan) = tune::planned(|| tune::forced(kernel, v, || crate::ops::execute(op, args)));
            if ran.is_ok() && !plans.contains(&plan) {
                plans.push(plan);
                variants.push(v);
            }
        }
        if variants.first() != Some(&0) {
            // the rule itself failed when forced: nothing to compare it with
            keys.iter().for_each(|key| tune::record(key, 0));
            continue;
        }
        let mut ms: Vec<Vec<f64>> = vec![Vec::with_capacity(ROUNDS); variants.len()];
        for _ in 0..ROUNDS {
            for (i, &v) in variants.iter().enumerate() {
                let t = Instant::now();
                tune::forced(kernel, v, || crate::ops::execute(op, args))?;
                ms[i].push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        let times: Vec<f64> = ms.into_iter().map(median).collect();
        let fastest = (0..times.len())
            .min_by(|&a, &b| times[a].total_cmp(&times[b]))
            .unwrap_or(0);
        // variants[0] is the rule
        let best = match (times.get(fastest), times.first()) {
            (Some(&f), Some(&rule)) if f < MARGIN * rule => fastest,
            _ => 0,
        };
        let variant = variants.get(best).copied().unwrap_or(0);
        for key in keys {
            tune::record(key, variant);
            report.searched.push(TuneEntry {
                kernel,
                key: key.clone(),
                heuristic_ms: times.first().copied().unwrap_or(0.0),
                chosen: kernel.variants()[usize::from(variant)],
                chosen_ms: times.get(best).copied().unwrap_or(0.0),
            });
        }
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

impl Prepared {
    /// Replays the graph on `inputs` (random draws from stream offset `at`), timing each variant
    /// of every kernel call whose choice is not known yet and recording the fastest (see
    /// [`crate::tune`]); returns the results (the rule's) and the report. Only the nodes that
    /// call a kernel with variants run more than once.
    pub(crate) fn tune(&self, inputs: &[Tensor], at: Option<u64>) -> Result<(Vec<Tensor>, TuneReport)> {
        let start = Instant::now();
        let mut report = TuneReport::default();
        let outputs = self.run_each(inputs, at, &mut |_, op, args| {
            let (out, seen) = tune::watched(|| crate::ops::execute(op, args));
            let out = out?;
            let seen_calls = seen.len();
            let mut new: Vec<(Kernel, String)> = seen.into_iter().filter(|(_, k)| tune::chosen(k).is_none()).collect();
            report.known += seen_calls - new.len();
            // the rule's result goes on through the graph, whatever the timings; a variant chosen
            // here may call kernels the rule does not (a convolution's im2col product, at a shape
            // of its own), which a run starting from the recorded choices would meet unchosen:
            // the op runs again with its choices until every call it makes is chosen
            for _ in 0..FOLLOW_ROUNDS {
                if new.is_empty() {
                    break;
                }
                search_calls(op, args, &new, &mut report)?;
                let (_, seen) = tune::watched(|| crate::ops::execute(op, args));
                new = seen.into_iter().filter(|(_, k)| tune::chosen(k).is_none()).collect();
            }
            Ok(out)
        })?;
        report.seconds = start.elapsed().as_secs_f64();
        Ok((outputs, report))
    }
}
