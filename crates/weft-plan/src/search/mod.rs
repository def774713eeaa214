//! The search: every `dp x tp x pp` of the devices that weft can run for the model and batch,
//! each with its micro-batch counts, schedules, ZeRO stages, gather dtypes, pipeline send
//! dtypes and recompute; pipeline stages cut to balance predicted stage times (the least slowest
//! stage, found by bisection); plans that another plan of the same `dp x tp x pp x m` beats on
//! both time and memory dropped (one that reduces and sends in f32 only for another such); the
//! rest ranked by predicted step time. Micro-batch counts whose lower bound
//! on the step time cannot beat the best plans found, or none of whose layouts fits, are not
//! evaluated ([`plan`]).
//!
//! The rules are weft's own (`weft_train::config` refuses the rest) and one of the planner's:
//! tp dividing the devices of a node (so that no tensor-parallel group straddles two) and
//! `n_head`, `n_kv_head` and the MLP width; `pp <= n_layer`; `dp` dividing the rows of one
//! forward and backward pass (`data.batch_size`, which weft shards over the replicas; the
//! global batch is `grad_accum` of them) and `micro_batches` dividing each replica's rows of it;
//! micro-batches, recompute, schedules and `pipeline_dtype = bf16` only with a pipeline; ZeRO 2
//! and 3 not with one; `comm_dtype = bf16` only with ZeRO; ZeRO only with `dp > 1`.

use std::collections::{BTreeMap, BinaryHeap};

use crate::cost::{
    all_reduce, mfu, on_the_wire, stage_backward_time, stage_time, step_time, unit_times_sequence, whole_gradient_sums,
    without_whole_gradient_sums, StepTime, UnitTimes,
};
use crate::device::DeviceSpec;
use crate::error::{human_bytes, Error, Result};
use crate::layout::{CommDtype, Layout, Schedule};
use crate::memory::{
    block_caps, peak_memory, stage_activations, stage_memory_floor, stage_memory_given, stage_memory_with,
    stage_params, MemoryBreakdown, BUCKET_BYTES,
};
use crate::model::Workload;

mod cut;
mod prune;
#[cfg(test)]
mod tests;

pub use cut::{balanced_cut, capped_cut, interleaved_cut, virtual_stage_blocks};
use prune::{could_fit, lower_bound, Bar, Time};

/// What the search keeps besides the feasible plans.
#[derive(Clone, Copy, Debug)]
pub struct SearchOptions {
    /// Infeasible plans kept (those closest to fitting); also the feasible plans the search
    /// ranks exactly (at least one, and the best that reduces in f32): a pipeline's micro-batch
    /// count that cannot beat them is not evaluated ([`plan`]).
    pub keep_infeasible: usize,
    /// Whether to plan sequence-parallel layouts too (where `tp > 1` and the sequence length
    /// divides by `tp`); off for a model weft cannot run so (gpt with dropout).
    pub sequence_parallel: bool,
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions {
            keep_infeasible: 20,
            sequence_parallel: true,
        }
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
    /// Layouts not evaluated: pipelines' micro-batch counts (with or without recompute) whose
    /// lower bound on the step time was beyond the best plans found, or none of whose layouts
    /// fits in memory ([`plan`]).
    pub skipped: usize,
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

/// A `dp x tp x pp` split weft can run, with the micro-batch counts its pipeline may take.
struct Split {
    dp: usize,
    tp: usize,
    pp: usize,
    /// Rows of one pass on each replica.
    rows: usize,
    /// Micro-batch counts, increasing (`[1]` without a pipeline).
    ms: Vec<usize>,
    /// Sequence-parallel across the `tp` ranks (only with `tp > 1`).
    sp: bool,
}

/// Where a plan came from in the order every layout is enumerated in (split, micro-batch
/// count, place in its group): ties in time and memory keep that order, whatever order the
/// search evaluated them in.
type Ordinal = (usize, usize, usize);

/// Layouts of one `dp x tp x pp x micro_batches` group with recompute `recompute` (the schedules,
/// ZeRO stages and gather dtypes): what [`plan`] evaluates together.
fn group_layouts(split: &Split, m: usize, recompute: bool, n_layer: usize) -> Vec<Layout> {
    let Split { dp, tp, pp, .. } = *split;
    let mut schedules: Vec<Schedule> = if pp == 1 {
        vec![Schedule::OneFOneB]
    } else {
        vec![Schedule::OneFOneB, Schedule::GPipe]
    };
    // 2 to MAX_CHUNKS chunks a stage, as weft runs them: at least as many micro-batches as
    // stages (in groups of the stages, what is left over shared out among them), a block at
    // least a chunk
    if pp > 1 && m >= pp {
        schedules.extend(
            (2..=MAX_CHUNKS)
                .filter(|&v| n_layer >= v * pp)
                .map(Schedule::Interleaved),
        );
    }
    let zeros: &[usize] = match (dp, pp) {
        (1, _) => &[0],
        (_, 1) => &[0, 1, 2, 3],
        _ => &[0, 1],
    };
    let mut out = Vec::new();
    for &schedule in &schedules {
        for &zero in zeros {
            let dtypes: &[CommDtype] = if zero == 0 {
                &[CommDtype::F32]
            } else {
                &[CommDtype::F32, CommDtype::Bf16]
            };
            // the pipeline's sends in f32, or bf16 where there is a pipeline
            let wires: &[CommDtype] = if pp == 1 {
                &[CommDtype::F32]
            } else {
                &[CommDtype::F32, CommDtype::Bf16]
            };
            for &comm_dtype in dtypes {
                for &pipeline_dtype in wires {
                    out.push(Layout {
                        dp,
                        tp,
                        pp,
                        zero,
                        micro_batches: m,
                        schedule,
                        recompute,
                        comm_dtype,
                        pipeline_dtype,
                        sequence_parallel: split.sp,
                        // the time-balanced cut, or interleaved the runtime's even one (below)
                        stage_blocks: Vec::new(),
                    });
                }
            }
        }
    }
    out
}

/// Layouts in a group of `split` at `m` micro-batches with one recompute setting.
fn group_size(split: &Split, m: usize, n_layer: usize) -> usize {
    group_layouts(split, m, false, n_layer).len()
}

/// Evaluates the layouts of `split` at `m` micro-batches with recompute `recompute`: each with
/// its time-balanced cut (interleaved: the runtime's even cut, summed per stage), a cut that
/// does not fit cut again within each stage's memory. Feasible plans go to `group`, the others
/// to `infeasible`, with their ordinals.
#[allow(clippy::too_many_arguments)]
fn evaluate_group(
    work: &Workload,
    device: &DeviceSpec,
    usable: f64,
    (index, split): (usize, &Split),
    (mi, m): (usize, usize),
    recompute: bool,
    report: &mut PlanReport,
    group: &mut Vec<(Plan, Ordinal)>,
    infeasible: &mut Vec<(Plan, Ordinal)>,
) {
    let n_layer = work.model.n_layer as usize;
    let pp = split.pp;
    let u = unit_times_sequence(work, device, split.tp, split.dp, pp, (split.rows / m) as f64, split.sp);
    let cut = balanced_cut(&u, pp, n_layer, recompute);
    for (k, mut layout) in group_layouts(split, m, recompute, n_layer).into_iter().enumerate() {
        layout.stage_blocks = match layout.schedule {
            Schedule::Interleaved(v) => interleaved_cut(n_layer, pp, v),
            _ => cut.clone(),
        };
        // the enumeration's order: without recompute first, then schedule, ZeRO, dtype
        let ordinal = (index, mi, (usize::from(recompute) << 16) | k);
        report.evaluated += 1;
        let chunks = layout.schedule.chunks();
        let mut plan = evaluate(work, device, layout, usable);
        if !plan.feasible && pp > 1 && chunks == 1 {
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
            group.push((plan, ordinal));
        } else {
            let why = plan.reason.clone().unwrap_or_default();
            *report.infeasible_reasons.entry(why).or_default() += 1;
            infeasible.push((plan, ordinal));
        }
    }
}

/// Plans `work` on `devices` devices of `device`, ranked.
///
/// Every `dp x tp x pp` split weft can run is evaluated at its largest micro-batch count (the
/// least memory; the one micro-batch without a pipeline). Its other counts, with and without
/// recompute, are then taken in the order of a lower bound on their step time
/// ([`lower_bound`]), and each is evaluated only while that bound is within the time of the
/// `keep_infeasible`-th best plan found so far (at least the best) and of the best that reduces
/// and sends in f32 (the group's bound with f32 sends against the latter), and only with
/// recompute settings some layout of it fits with ([`could_fit`]). A layout left out so could
/// not have been among those plans, so the best `keep_infeasible` plans and the best `f32` one
/// are those of every layout; the others are counted in
/// [`PlanReport::skipped`].
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
    let mut splits: Vec<Split> = Vec::new();
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
            // with tp > 1, each split once more sequence-parallel (after it: equal plans keep
            // the plain one first)
            let sequence = options.sequence_parallel && tp > 1 && (work.model.seq_len as usize).is_multiple_of(tp);
            for sp in [false, true].into_iter().take(if sequence { 2 } else { 1 }) {
                splits.push(Split {
                    dp,
                    tp,
                    pp,
                    rows,
                    ms: ms.clone(),
                    sp,
                });
            }
        }
    }
    // feasible plans by group (split, micro-batch count): the dominated are dropped per group
    let mut groups: BTreeMap<(usize, usize), Vec<(Plan, Ordinal)>> = BTreeMap::new();
    let mut infeasible: Vec<(Plan, Ordinal)> = Vec::new();
    let mut bar = Bar {
        top: options.keep_infeasible.max(1),
        best: BinaryHeap::new(),
        best_f32: f64::INFINITY,
    };
    // evaluates a group's layouts with the recompute settings given, keeping its undominated
    let mut run = |key: (usize, usize), recomputes: &[bool], report: &mut PlanReport, bar: &mut Bar| {
        let (si, mi) = key;
        let split = &splits[si];
        let mut found = Vec::new();
        for &recompute in recomputes {
            evaluate_group(
                work,
                device,
                usable,
                (si, split),
                (mi, split.ms[mi]),
                recompute,
                report,
                &mut found,
                &mut infeasible,
            );
        }
        // each group is evaluated once, so what it drops as dominated is final; a plan that
        // reduces and sends in f32 is dropped only for another such (`auto` takes the best of
        // them, and a bf16 twin is faster at the same memory)
        if !found.is_empty() {
            found.sort_by_key(|p| p.1);
            let before = found.len();
            let (exact, rounded): (Vec<_>, Vec<_>) = found.into_iter().partition(|p| p.0.layout.communicates_in_f32());
            let mut kept = undominated(exact);
            kept.extend(undominated(rounded));
            kept.sort_by_key(|p| p.1);
            report.dominated += before - kept.len();
            for (p, _) in &kept {
                bar.add(p);
            }
            groups.insert(key, kept);
        }
    };
    // every split at its largest micro-batch count
    let mut rest: BinaryHeap<std::cmp::Reverse<(Time, usize, usize, bool)>> = BinaryHeap::new();
    for (si, split) in splits.iter().enumerate() {
        let last = split.ms.len() - 1;
        let recomputes: &[bool] = if split.pp == 1 { &[false] } else { &[false, true] };
        run((si, last), recomputes, &mut report, &mut bar);
        for mi in 0..last {
            let bound = lower_bound(work, device, split, split.ms[mi], false, CommDtype::Bf16);
            rest.push(std::cmp::Reverse((Time(bound), si, mi, false)));
        }
    }
    // the others by their bound: `checked` once it is known which recompute settings could fit
    let mut none_below: BTreeMap<(usize, bool), usize> = BTreeMap::new();
    while let Some(std::cmp::Reverse((Time(bound), si, mi, checked))) = rest.pop() {
        let split = &splits[si];
        let m = split.ms[mi];
        let limit = bar.limit();
        if bound > limit {
            report.skipped += group_size(split, m, n_layer) * if checked { 1 } else { 2 };
            for std::cmp::Reverse((_, si, mi, checked)) in rest.drain() {
                let split = &splits[si];
                report.skipped += group_size(split, split.ms[mi], n_layer) * if checked { 1 } else { 2 };
            }
            break;
        }
        // within the limit only as a plan that is not the first to reduce and send in f32:
        // worth it if the fastest of the group can enter the first `top`
        if bound > bar.top_limit() && lower_bound(work, device, split, m, checked, CommDtype::F32) > bar.best_f32 {
            report.skipped += group_size(split, m, n_layer) * if checked { 1 } else { 2 };
            continue;
        }
        if checked {
            // recompute alone fits (the rest was counted as skipped), within the limit
            run((si, mi), &[true], &mut report, &mut bar);
            continue;
        }
        let plain = could_fit(work, (si, split), mi, false, usable, &mut none_below);
        let again = could_fit(work, (si, split), mi, true, usable, &mut none_below);
        match (plain, again) {
            (false, false) => report.skipped += 2 * group_size(split, m, n_layer),
            (false, true) => {
                // only recompute can fit: taken again in the order of its own bound
                report.skipped += group_size(split, m, n_layer);
                let bound = lower_bound(work, device, split, m, true, CommDtype::Bf16);
                rest.push(std::cmp::Reverse((Time(bound), si, mi, true)));
            }
            (true, _) => {
                let with = again && lower_bound(work, device, split, m, true, CommDtype::Bf16) <= limit;
                run(
                    (si, mi),
                    if with { &[false, true] } else { &[false] },
                    &mut report,
                    &mut bar,
                );
                if !with {
                    report.skipped += group_size(split, m, n_layer);
                }
            }
        }
    }
    let mut feasible: Vec<(Plan, Ordinal)> = groups.into_values().flatten().collect();
    let by_time = |a: &(Plan, Ordinal), b: &(Plan, Ordinal)| {
        comparable(a.0.time.step)
            .total_cmp(&comparable(b.0.time.step))
            .then(a.0.memory.total().total_cmp(&b.0.memory.total()))
            .then(a.1.cmp(&b.1))
    };
    feasible.sort_by(by_time);
    infeasible.sort_by(|a, b| a.0.memory.total().total_cmp(&b.0.memory.total()).then(a.1.cmp(&b.1)));
    let feasible: Vec<Plan> = feasible.into_iter().map(|p| p.0).collect();
    let mut infeasible: Vec<Plan> = infeasible.into_iter().map(|p| p.0).collect();
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

/// A predicted time rounded to 12 significant digits, for ranking: two layouts whose
/// predictions differ only by the rounding of sums taken in another order (GPipe and 1F1B at
/// the same micro-batch count, say) rank by memory. (Two such times may still straddle a
/// rounding boundary; dominance uses [`same_time`], which they cannot.)
fn comparable(t: f64) -> f64 {
    if t == 0.0 || !t.is_finite() {
        return t;
    }
    let scale = 10f64.powi(11 - t.abs().log10().floor() as i32);
    (t * scale).round() / scale
}

/// Whether two predicted times differ by no more than the rounding of sums taken in another
/// order (a relative 1e-12).
fn same_time(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
}

/// Drops every plan another one beats on step time and memory (no worse on both, better on
/// one; of equal ones the first stays). Times within a relative 1e-12 of each other count as
/// equal ([`same_time`]).
///
/// Ties within the tolerance do not chain transitively (`a ~ b ~ c` with `a` faster than `c`):
/// a plan can be dropped only for a tie with one that is itself dropped, down a chain that ends
/// at a plan it beats (a cycle of them dropped every plan of the chain, its fastest too). So a
/// dropped plan that none beats beyond the tolerance (faster, no larger) stays when no plan that
/// stays is as fast (or tied) and no larger: taken from the fastest, then smallest, the fastest
/// plan of such a chain stays, and the chain's others are tied with it or slower. Where ties
/// chain nowhere, every dropped plan has one that stays and beats it, and nothing changes.
fn undominated<T: Clone>(group: Vec<(Plan, T)>) -> Vec<(Plan, T)> {
    let key = |i: usize| (group[i].0.time.step, group[i].0.memory.total());
    // `q` (time, memory) beats `p` beyond the tolerance: faster and no larger
    let strictly = |(tq, mq): (f64, f64), (t, m): (f64, f64)| tq < t && !same_time(tq, t) && mq <= m;
    let mut keep: Vec<bool> = (0..group.len())
        .map(|i| {
            let (t, m) = key(i);
            !(0..group.len()).any(|j| {
                let (tq, mq) = key(j);
                // no slower and no larger, and faster (beyond rounding), smaller, or an earlier equal
                j != i && (same_time(tq, t) && mq <= m && (mq < m || j < i) || strictly((tq, mq), (t, m)))
            })
        })
        .collect();
    let mut dropped: Vec<usize> = (0..group.len()).filter(|&i| !keep[i]).collect();
    dropped.sort_by(|&a, &b| key(a).0.total_cmp(&key(b).0).then(key(a).1.total_cmp(&key(b).1)));
    for i in dropped {
        let (t, m) = key(i);
        let beaten = (0..group.len()).any(|j| {
            let (tq, mq) = key(j);
            j != i && (strictly((tq, mq), (t, m)) || keep[j] && same_time(tq, t) && mq <= m)
        });
        if !beaten {
            keep[i] = true;
        }
    }
    group
        .into_iter()
        .zip(keep)
        .filter_map(|(p, k)| k.then_some(p))
        .collect()
}
