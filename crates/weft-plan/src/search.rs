//! The search: every `dp x tp x pp` of the devices that weft can run for the model and batch,
//! each with its micro-batch counts, schedules, ZeRO stages, gather dtypes and recompute;
//! pipeline stages cut by dynamic programming over predicted stage times; plans that another
//! plan of the same `dp x tp x pp x m` beats on both time and memory dropped; the rest ranked
//! by predicted step time.
//!
//! The rules are weft's own (`weft_train::config` refuses the rest) and one of the planner's:
//! tp dividing the devices of a node (so that no tensor-parallel group straddles two) and
//! `n_head`, `n_kv_head` and the MLP width; `pp <= n_layer`; `dp` dividing the rows of one
//! forward and backward pass (`data.batch_size`, which weft shards over the replicas; the
//! global batch is `grad_accum` of them) and `micro_batches` dividing each replica's rows of it;
//! micro-batches, recompute and schedules only with a pipeline; ZeRO 2 and 3 not with one; `comm_dtype = bf16` only with
//! ZeRO; ZeRO only with `dp > 1`.

use std::collections::BTreeMap;

use crate::cost::{mfu, stage_time, step_time, unit_times, StepTime, UnitTimes};
use crate::device::DeviceSpec;
use crate::error::{human_bytes, Error, Result};
use crate::layout::{CommDtype, Layout, Schedule};
use crate::memory::{block_caps, peak_memory, MemoryBreakdown};
use crate::model::Workload;

/// What the search keeps besides the feasible plans.
#[derive(Clone, Copy, Debug)]
pub struct SearchOptions {
    /// Infeasible plans kept (those closest to fitting).
    pub keep_infeasible: usize,
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions { keep_infeasible: 20 }
    }
}

#[cfg(test)]
mod tests {
    use super::{divisors, interleaved_cut};

    #[test]
    fn an_interleaved_cut_sums_each_stages_virtual_stages() {
        // 10 blocks into 2 x 2 virtual stages: 3, 3, 2, 2; stage 0 holds virtual 0 and 2
        assert_eq!(interleaved_cut(10, 2, 2), vec![5, 5]);
        // 9 into 4 x 2: 2, 1, 1, 1, 1, 1, 1, 1
        assert_eq!(interleaved_cut(9, 4, 2), vec![3, 2, 2, 2]);
        assert_eq!(interleaved_cut(96, 16, 2).iter().sum::<usize>(), 96);
    }

    #[test]
    fn divisors_in_order() {
        assert_eq!(divisors(1), vec![1]);
        assert_eq!(divisors(12), vec![1, 2, 3, 4, 6, 12]);
        assert_eq!(divisors(16), vec![1, 2, 4, 8, 16]);
        assert_eq!(divisors(97), vec![1, 97]);
        assert_eq!(divisors(1152).len(), 24);
    }
}

/// A layout with its predictions.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub layout: Layout,
    pub time: StepTime,
    /// Tokens per second over the whole job.
    pub tokens_per_second: f64,
    /// Model FLOPs utilization (0-1).
    pub mfu: f64,
    /// Bytes on the device that needs the most (the stage `peak_stage`).
    pub memory: MemoryBreakdown,
    pub peak_stage: usize,
    pub feasible: bool,
    /// Why an infeasible plan fails.
    pub reason: Option<String>,
}

/// The outcome of a search.
#[derive(Clone, Debug, Default)]
pub struct PlanReport {
    /// Feasible plans, best (shortest predicted step) first, dominated ones dropped.
    pub plans: Vec<Plan>,
    /// Infeasible plans closest to fitting, at most `keep_infeasible`.
    pub infeasible: Vec<Plan>,
    /// Every infeasible plan's reason, counted.
    pub infeasible_reasons: BTreeMap<String, usize>,
    /// `dp x tp x pp` splits of the devices weft cannot run, by reason, counted.
    pub ruled_out: BTreeMap<String, usize>,
    /// Plans whose time and memory were predicted.
    pub evaluated: usize,
    /// Feasible plans dropped as dominated.
    pub dominated: usize,
    /// Plans whose time-balanced cut did not fit and that fit with a cut within each stage's
    /// memory.
    pub recut: usize,
    /// Usable memory per device, bytes (the margin taken off).
    pub usable_memory: f64,
}

/// The most devices a plan may have (a bound on the search, far above any job's).
pub const MAX_DEVICES: usize = 1 << 24;
/// The most rows a global batch may have.
pub const MAX_GLOBAL_BATCH: u64 = 1 << 32;
/// The most micro-batches a pipeline plan is given: past any run's (published plans use a few
/// hundred), and a bound on the schedule simulations, whose work grows with the count (a replica
/// of 2^30 rows would otherwise be simulated at 2^30 micro-batches).
pub const MAX_MICRO_BATCHES: usize = 1 << 12;
/// The most model chunks a stage an interleaved plan is tried with.
pub const MAX_CHUNKS: usize = 4;

/// Divisors of `n` in increasing order, by trial division up to its square root.
fn divisors(n: usize) -> Vec<usize> {
    let (mut low, mut high) = (Vec::new(), Vec::new());
    let mut d = 1;
    while d * d <= n {
        if n.is_multiple_of(d) {
            low.push(d);
            if d * d != n {
                high.push(n / d);
            }
        }
        d += 1;
    }
    low.extend(high.into_iter().rev());
    low
}

/// Blocks per stage of an interleaved layout: the model's blocks cut as evenly as they allow
/// into `pp v` virtual stages (weft's `balance = "blocks"`, earlier ones taking the extra), stage
/// `r` holding virtual stages `r, r + pp, ...`.
pub fn interleaved_cut(n_layer: usize, pp: usize, v: usize) -> Vec<usize> {
    let counts = virtual_stage_blocks(n_layer, pp, v);
    (0..pp).map(|r| (0..v).map(|c| counts[c * pp + r]).sum()).collect()
}

/// Blocks per virtual stage of an interleaved layout, in virtual-stage order (what
/// `parallel.stage_blocks` takes with the interleaved schedule): as even as the blocks allow.
pub fn virtual_stage_blocks(n_layer: usize, pp: usize, v: usize) -> Vec<usize> {
    let n = pp * v;
    (0..n).map(|vs| n_layer / n + usize::from(vs < n_layer % n)).collect()
}

/// Blocks per stage that minimize the slowest stage's per-micro-batch time (the embeddings on
/// the first stage, the output layer on the last), by dynamic programming over the cut points:
/// `best[s][j]` is the least slowest-stage time of the first `j` blocks on stages `0..=s`.
/// Of equal cuts, the one with more blocks on later stages (which hold fewer micro-batches
/// under 1F1B) is kept. A layout this cut does not fit in memory is cut again by
/// [`capped_cut`], each stage held to the blocks its memory allows.
pub fn balanced_cut(u: &UnitTimes, pp: usize, n_layer: usize, recompute: bool) -> Vec<usize> {
    if pp <= 1 {
        return vec![n_layer];
    }
    capped_cut(u, n_layer, recompute, &vec![n_layer; pp]).unwrap_or_else(|| even_cut(n_layer, pp))
}

/// Blocks as evenly as they go, earlier stages taking the extra ones (weft's `balance =
/// "blocks"`).
fn even_cut(n_layer: usize, pp: usize) -> Vec<usize> {
    let pp = pp.max(1);
    (0..pp).map(|s| n_layer / pp + usize::from(s < n_layer % pp)).collect()
}

/// As [`balanced_cut`], with stage `s` given at most `caps[s]` blocks (what its memory
/// allows): the fastest cut within the caps, or `None` when the caps leave no cut.
pub fn capped_cut(u: &UnitTimes, n_layer: usize, recompute: bool, caps: &[usize]) -> Option<Vec<usize>> {
    let pp = caps.len();
    if pp == 0 || pp > n_layer {
        return None;
    }
    let cost = |s: usize, k: usize| stage_time(u, k, s == 0, s + 1 == pp, recompute);
    let inf = f64::INFINITY;
    let mut best = vec![vec![inf; n_layer + 1]; pp];
    let mut take = vec![vec![0usize; n_layer + 1]; pp];
    for j in 1..=n_layer.min(caps[0]) {
        best[0][j] = cost(0, j);
        take[0][j] = j;
    }
    for s in 1..pp {
        // stage s ends at block j; stages 0..s need at least s blocks
        for j in (s + 1)..=n_layer {
            for k in 1..=(j - s).min(caps[s]) {
                let c = cost(s, k);
                if c > best[s][j] {
                    break; // later k only cost more on this stage
                }
                let v = best[s - 1][j - k].max(c);
                if v <= best[s][j] {
                    best[s][j] = v;
                    take[s][j] = k;
                }
            }
        }
    }
    if best[pp - 1][n_layer] == inf {
        return None;
    }
    let mut cut = vec![0; pp];
    let mut j = n_layer;
    for s in (0..pp).rev() {
        cut[s] = take[s][j];
        j -= take[s][j];
    }
    Some(cut)
}

/// Why weft cannot run `tp` x `pp` on `devices` devices, if it cannot.
fn ruled_out(work: &Workload, device: &DeviceSpec, devices: usize, tp: usize, pp: usize) -> Option<String> {
    let m = &work.model;
    let t = tp as u64;
    if !device.devices_per_node.is_multiple_of(tp) {
        return Some(format!(
            "tp does not divide the {} devices of a node",
            device.devices_per_node
        ));
    }
    if !m.n_head.is_multiple_of(t) || !m.n_kv_head.is_multiple_of(t) {
        return Some("tp does not divide the heads".into());
    }
    if !m.intermediate.is_multiple_of(t) {
        return Some("tp does not divide the MLP width".into());
    }
    if pp as u64 > m.n_layer {
        return Some("pp > n_layer".into());
    }
    let dp = devices / (tp * pp);
    // weft shards each pass's rows (`data.batch_size`) over the replicas
    if !work.pass_rows().is_multiple_of(dp as u64) {
        return Some(format!("dp does not divide the batch of {} rows", work.pass_rows()));
    }
    None
}

/// Plans `work` on `devices` devices of `device`, ranked.
pub fn plan(work: &Workload, device: &DeviceSpec, devices: usize, options: SearchOptions) -> Result<PlanReport> {
    work.model.check()?;
    if devices == 0 || devices > MAX_DEVICES {
        return Err(Error::BadRequest(format!(
            "--devices {devices}: must be between 1 and {MAX_DEVICES}"
        )));
    }
    if work.global_batch == 0 || work.global_batch > MAX_GLOBAL_BATCH {
        return Err(Error::BadRequest(format!(
            "the global batch of {} rows: must be between 1 and {MAX_GLOBAL_BATCH}",
            work.global_batch
        )));
    }
    if work.grad_accum == 0 || !work.global_batch.is_multiple_of(work.grad_accum) {
        return Err(Error::BadRequest(format!(
            "grad_accum {}: must be at least 1 and divide the global batch of {} rows",
            work.grad_accum, work.global_batch
        )));
    }
    let usable = device.usable_memory();
    let mut report = PlanReport {
        usable_memory: usable,
        ..PlanReport::default()
    };
    let n_layer = work.model.n_layer as usize;
    let mut feasible: Vec<Plan> = Vec::new();
    let mut infeasible: Vec<Plan> = Vec::new();
    for tp in divisors(devices) {
        for pp in divisors(devices / tp) {
            if let Some(why) = ruled_out(work, device, devices, tp, pp) {
                *report.ruled_out.entry(why).or_default() += 1;
                continue;
            }
            let dp = devices / (tp * pp);
            let rows = (work.pass_rows() / dp as u64) as usize;
            let ms = if pp == 1 {
                vec![1]
            } else {
                divisors(rows).into_iter().filter(|&m| m <= MAX_MICRO_BATCHES).collect()
            };
            for m in ms {
                let u = unit_times(work, device, tp, dp, pp, (rows / m) as f64);
                let recomputes: &[bool] = if pp == 1 { &[false] } else { &[false, true] };
                let mut group: Vec<Plan> = Vec::new();
                for &recompute in recomputes {
                    let cut = balanced_cut(&u, pp, n_layer, recompute);
                    let mut schedules: Vec<Schedule> = if pp == 1 {
                        vec![Schedule::OneFOneB]
                    } else {
                        vec![Schedule::OneFOneB, Schedule::GPipe]
                    };
                    // 2 to MAX_CHUNKS chunks a stage, as weft runs them: micro-batches in
                    // groups of the stages, a block at least a chunk
                    if pp > 1 && m.is_multiple_of(pp) {
                        schedules.extend(
                            (2..=MAX_CHUNKS)
                                .filter(|&v| n_layer >= v * pp)
                                .map(Schedule::Interleaved),
                        );
                    }
                    let zeros: Vec<usize> = match (dp, pp) {
                        (1, _) => vec![0],
                        (_, 1) => vec![0, 1, 2, 3],
                        _ => vec![0, 1],
                    };
                    for &schedule in &schedules {
                        // interleaved: the runtime's even cut into virtual stages, summed per stage
                        let cut = match schedule {
                            Schedule::Interleaved(v) => interleaved_cut(n_layer, pp, v),
                            _ => cut.clone(),
                        };
                        for &zero in &zeros {
                            let dtypes: &[CommDtype] = if zero == 0 {
                                &[CommDtype::F32]
                            } else {
                                &[CommDtype::F32, CommDtype::Bf16]
                            };
                            for &comm_dtype in dtypes {
                                let layout = Layout {
                                    dp,
                                    tp,
                                    pp,
                                    zero,
                                    micro_batches: m,
                                    schedule,
                                    recompute,
                                    comm_dtype,
                                    stage_blocks: cut.clone(),
                                };
                                report.evaluated += 1;
                                let mut plan = evaluate(work, device, layout, usable);
                                if !plan.feasible && pp > 1 && schedule.chunks() == 1 {
                                    // the fastest cut whose stages each fit, if there is one
                                    let caps = block_caps(work, &plan.layout, usable);
                                    if let Some(cut) = capped_cut(&u, n_layer, recompute, &caps) {
                                        let layout = Layout {
                                            stage_blocks: cut,
                                            ..plan.layout.clone()
                                        };
                                        let recut = evaluate(work, device, layout, usable);
                                        if recut.feasible {
                                            report.recut += 1;
                                            plan = recut;
                                        }
                                    }
                                }
                                if plan.feasible {
                                    group.push(plan);
                                } else {
                                    let why = plan.reason.clone().unwrap_or_default();
                                    *report.infeasible_reasons.entry(why).or_default() += 1;
                                    infeasible.push(plan);
                                }
                            }
                        }
                    }
                }
                let before = group.len();
                let kept = undominated(group);
                report.dominated += before - kept.len();
                feasible.extend(kept);
            }
        }
    }
    let by_time = |a: &Plan, b: &Plan| {
        a.time
            .step
            .total_cmp(&b.time.step)
            .then(a.memory.total().total_cmp(&b.memory.total()))
    };
    feasible.sort_by(by_time);
    infeasible.sort_by(|a, b| a.memory.total().total_cmp(&b.memory.total()));
    if feasible.is_empty() {
        // a layout that fits but has no finite time is the device spec's fault, not the memory's
        if let Some(p) = infeasible.iter().find(|p| p.memory.total() <= usable) {
            return Err(Error::NoFiniteTime {
                devices,
                device: device.name.clone(),
                layout: p.layout.label(),
                step: p.time.step,
            });
        }
        if let Some(least) = infeasible.first() {
            let (term, bytes) = least.memory.dominant();
            return Err(Error::DoesNotFit {
                devices,
                capacity: format!("{} ({} usable)", human_bytes(device.memory_bytes), human_bytes(usable)),
                needed: human_bytes(least.memory.total()),
                term: term.to_string(),
                term_bytes: human_bytes(bytes),
            });
        }
        let why = report
            .ruled_out
            .iter()
            .map(|(r, n)| format!("{r} ({n})"))
            .collect::<Vec<_>>()
            .join(", ");
        return Err(Error::NoLayout {
            devices,
            why: format!("every dp x tp x pp split is ruled out: {why}"),
        });
    }
    infeasible.truncate(options.keep_infeasible);
    report.plans = feasible;
    report.infeasible = infeasible;
    Ok(report)
}

/// The predictions for one layout, checked against `usable` bytes per device.
pub fn evaluate(work: &Workload, device: &DeviceSpec, layout: Layout, usable: f64) -> Plan {
    let time = step_time(work, device, &layout);
    let (peak_stage, memory) = peak_memory(work, &layout);
    let tokens = work.global_batch as f64 * work.model.seq_len as f64;
    // a plan is only as good as its time: one of forever (or of no time) is none
    let timed = time.step.is_finite() && time.step > 0.0 && (tokens / time.step).is_finite();
    let feasible = timed && memory.total() <= usable;
    let reason = match (timed, feasible) {
        (false, _) => Some(format!("time: predicted step of {} s", time.step)),
        (true, false) => Some(format!("memory: {} dominates", memory.dominant().0)),
        (true, true) => None,
    };
    Plan {
        tokens_per_second: tokens / time.step,
        mfu: mfu(work, device, layout.devices(), time.step),
        layout,
        time,
        memory,
        peak_stage,
        feasible,
        reason,
    }
}

/// Drops every plan another one beats on step time and memory (no worse on both, better on
/// one; of equal ones the first stays).
fn undominated(group: Vec<Plan>) -> Vec<Plan> {
    let key = |p: &Plan| (p.time.step, p.memory.total());
    let mut kept = Vec::with_capacity(group.len());
    for (i, p) in group.iter().enumerate() {
        let (t, m) = key(p);
        let beaten = group.iter().enumerate().any(|(j, q)| {
            let (tq, mq) = key(q);
            j != i && tq <= t && mq <= m && (tq < t || mq < m || j < i)
        });
        if !beaten {
            kept.push(p.clone());
        }
    }
    kept
}
