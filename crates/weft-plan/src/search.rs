//! The search: every `dp x tp x pp` of the devices that weft can run for the model and batch,
//! each with its micro-batch counts, schedules, ZeRO stages, gather dtypes and recompute;
//! pipeline stages cut to balance predicted stage times (the least slowest stage, found by
//! bisection); plans that another plan of the same `dp x tp x pp x m` beats on both time and
//! memory dropped; the rest ranked by predicted step time. Micro-batch counts whose lower bound
//! on the step time cannot beat the best plans found, or none of whose layouts fits, are not
//! evaluated ([`plan`]).
//!
//! The rules are weft's own (`weft_train::config` refuses the rest) and one of the planner's:
//! tp dividing the devices of a node (so that no tensor-parallel group straddles two) and
//! `n_head`, `n_kv_head` and the MLP width; `pp <= n_layer`; `dp` dividing the rows of one
//! forward and backward pass (`data.batch_size`, which weft shards over the replicas; the
//! global batch is `grad_accum` of them) and `micro_batches` dividing each replica's rows of it;
//! micro-batches, recompute and schedules only with a pipeline; ZeRO 2 and 3 not with one; `comm_dtype = bf16` only with
//! ZeRO; ZeRO only with `dp > 1`.

use std::collections::{BTreeMap, BinaryHeap};

use crate::cost::{all_reduce, mfu, stage_backward_time, stage_time, step_time, unit_times, StepTime, UnitTimes};
use crate::device::DeviceSpec;
use crate::error::{human_bytes, Error, Result};
use crate::layout::{CommDtype, Layout, Schedule};
use crate::memory::{
    block_caps, peak_memory, stage_activations, stage_memory_floor, stage_memory_given, stage_memory_with,
    stage_params, MemoryBreakdown, BUCKET_BYTES,
};
use crate::model::Workload;

/// What the search keeps besides the feasible plans.
#[derive(Clone, Copy, Debug)]
pub struct SearchOptions {
    /// Infeasible plans kept (those closest to fitting); also the feasible plans the search
    /// ranks exactly (at least one, and the best that reduces in f32): a pipeline's micro-batch
    /// count that cannot beat them is not evaluated ([`plan`]).
    pub keep_infeasible: usize,
}

impl Default for SearchOptions {
    fn default() -> Self {
        SearchOptions { keep_infeasible: 20 }
    }
}

#[cfg(test)]
mod tests {
    use super::{capped_cut, divisors, interleaved_cut};
    use crate::cost::{stage_time, TpComm, UnitTimes};

    /// The dynamic programme `capped_cut` replaced (`O(pp n^2)`: minutes for a 1000-layer model
    /// across a search), kept to check that the cuts are the same.
    fn reference_cut(u: &UnitTimes, n_layer: usize, recompute: bool, caps: &[usize]) -> Option<Vec<usize>> {
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

    /// The cut by bisection is the dynamic programme's, ties and caps included, over random
    /// stage times (rounded to a few values, so that ties are common), stage counts and caps.
    #[test]
    fn the_bisected_cut_is_the_dynamic_programmes() {
        let mut state = 0x9e3779b97f4a7c15u64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let (mut capped, mut uneven) = (0, 0);
        for case in 0..3000 {
            let mut pick = |scale: f64| (next(4) as f64) * scale;
            let u = UnitTimes {
                block_forward: 1.0 + pick(0.5),
                embed_forward: pick(1.5),
                head_forward: pick(2.0),
                block_comm: TpComm {
                    forward: pick(0.25),
                    backward: pick(0.25),
                },
                embed_comm: TpComm::default(),
                head_comm: TpComm {
                    forward: pick(0.5),
                    backward: 0.0,
                },
                p2p: pick(0.125),
                block_accumulate: pick(0.25),
                embed_accumulate: pick(0.5),
                head_accumulate: pick(1.0),
            };
            let n = 1 + next(40) as usize;
            let pp = 1 + next(n.min(12) as u64) as usize;
            let recompute = next(2) == 1;
            let caps: Vec<usize> = (0..pp)
                .map(|_| match next(4) {
                    0 => n,
                    _ => next(n as u64 + 1) as usize,
                })
                .collect();
            let want = reference_cut(&u, n, recompute, &caps);
            let got = capped_cut(&u, n, recompute, &caps);
            assert_eq!(got, want, "case {case}: n {n} pp {pp} caps {caps:?} {u:?}");
            if let Some(cut) = &got {
                capped += usize::from(pp > 2 && caps.iter().any(|&c| c < n));
                uneven += usize::from(cut.iter().max() > cut.iter().min().map(|m| m + 1).as_ref());
            }
            let free = vec![n; pp];
            assert_eq!(
                capped_cut(&u, n, recompute, &free),
                reference_cut(&u, n, recompute, &free),
                "case {case}: n {n} pp {pp}"
            );
        }
        assert!(capped > 300 && uneven > 300, "{capped} {uneven}");
        // a stage time of forever is no cut
        let inf = UnitTimes {
            block_forward: f64::INFINITY,
            ..UnitTimes::default()
        };
        assert_eq!(capped_cut(&inf, 8, false, &[8, 8]), None);
    }

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
/// the first stage, the output layer on the last): `best[s][j]`, the least slowest-stage time of
/// the first `j` blocks on stages `0..=s`, found by bisection ([`capped_cut`]).
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
///
/// The cut is the one the dynamic programme over the cut points gives (`best[s][j]`, the least
/// slowest-stage time of the first `j` blocks on stages `0..=s`; of equal ones, each stage from
/// the last back the most blocks), found without its `O(pp n^2)` table: a stage's time depends
/// only on its blocks and on whether it is the first or the last, and grows with its blocks, so
/// `j` blocks fit on stages `0..=s` within a slowest time `τ` exactly when every stage can take
/// a block within `τ` and the most each can take within `τ` (and its cap) add up to `j`. The least
/// such `τ`, `best[s][j]`, is found by bisection over the stage times; from the last stage back,
/// stage `s` takes the most blocks within `best[s][j]` that leave each earlier stage one, and the
/// rest is cut again the same way. `O(n log n + pp log^2 n)`.
pub fn capped_cut(u: &UnitTimes, n_layer: usize, recompute: bool, caps: &[usize]) -> Option<Vec<usize>> {
    let pp = caps.len();
    let n = n_layer;
    if pp == 0 || pp > n || caps.contains(&0) {
        return None;
    }
    let kind = |s: usize| -> usize {
        match (s == 0, s + 1 == pp) {
            (true, true) => 3,
            (true, false) => 0,
            (false, false) => 1,
            (false, true) => 2,
        }
    };
    // each kind's time of k blocks, k = 0..=n (non-decreasing in k)
    let table =
        |first: bool, last: bool| -> Vec<f64> { (0..=n).map(|k| stage_time(u, k, first, last, recompute)).collect() };
    let costs: [Vec<f64>; 4] = [
        table(true, false),
        table(false, false),
        table(false, true),
        if pp == 1 { table(true, true) } else { Vec::new() },
    ];
    // the most blocks a stage of a kind takes within `tau`
    let most = |kind: usize, tau: f64| -> usize { costs[kind][1..].partition_point(|&c| c <= tau) };
    // every time a slowest stage can have, in order
    let mut taus: Vec<f64> = costs.iter().flat_map(|c| c.iter().skip(1).copied()).collect();
    taus.sort_by(f64::total_cmp);
    taus.dedup();
    let caps: Vec<usize> = caps.iter().map(|&c| c.min(n)).collect();
    // the middle stages still in the prefix, by cap: how many and their caps' sum (Fenwick trees
    // over caps 1..=n)
    let mut count = vec![0i64; n + 1];
    let mut total = vec![0i64; n + 1];
    let add = |tree: &mut [i64], at: usize, v: i64| {
        let mut i = at;
        while i <= n {
            tree[i] += v;
            i += i & i.wrapping_neg();
        }
    };
    let below = |tree: &[i64], at: usize| -> i64 {
        let (mut i, mut s) = (at.min(n), 0);
        while i > 0 {
            s += tree[i];
            i -= i & i.wrapping_neg();
        }
        s
    };
    for &c in caps.iter().take(pp.saturating_sub(1)).skip(1) {
        add(&mut count, c, 1);
        add(&mut total, c, c as i64);
    }
    // stages 0..=s (the last stage among them only when s = pp - 1), their middle ones in the
    // trees: can they take j blocks within tau?
    let fits = |s: usize, j: usize, tau: f64, count: &[i64], total: &[i64]| -> bool {
        if j < s + 1 {
            return false;
        }
        let mut sum = 0usize;
        let ends: &[usize] = if s + 1 == pp && pp > 1 { &[0, pp - 1] } else { &[0] };
        for &r in ends {
            let k = most(kind(r), tau).min(caps[r]);
            if k == 0 {
                return false;
            }
            sum += k;
        }
        let middles = s.min(pp.saturating_sub(2));
        if middles > 0 {
            let k = most(1, tau);
            if k == 0 {
                return false;
            }
            let capped = below(total, k) + k as i64 * (middles as i64 - below(count, k));
            sum += capped as usize;
        }
        sum >= j
    };
    // the least slowest time of j blocks on stages 0..=s, as an index into taus (at most `hi`)
    let least = |s: usize, j: usize, hi: usize, count: &[i64], total: &[i64]| -> Option<usize> {
        if hi >= taus.len() || !fits(s, j, taus[hi], count, total) {
            return None;
        }
        let (mut lo, mut hi) = (0usize, hi);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if fits(s, j, taus[mid], count, total) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Some(lo)
    };
    let mut at = least(pp - 1, n, taus.len().checked_sub(1)?, &count, &total)?;
    if taus[at] == f64::INFINITY {
        return None;
    }
    let mut cut = vec![0; pp];
    let mut j = n;
    for s in (1..pp).rev() {
        let k = most(kind(s), taus[at]).min(caps[s]).min(j - s);
        cut[s] = k;
        j -= k;
        if s + 1 < pp {
            add(&mut count, caps[s], -1);
            add(&mut total, caps[s], -(caps[s] as i64));
        }
        at = least(s - 1, j, at, &count, &total)?;
    }
    cut[0] = j;
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

/// A `dp x tp x pp` split weft can run, with the micro-batch counts its pipeline may take.
struct Split {
    dp: usize,
    tp: usize,
    pp: usize,
    /// Rows of one pass on each replica.
    rows: usize,
    /// Micro-batch counts, increasing (`[1]` without a pipeline).
    ms: Vec<usize>,
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
    // 2 to MAX_CHUNKS chunks a stage, as weft runs them: micro-batches in groups of the stages,
    // a block at least a chunk
    if pp > 1 && m.is_multiple_of(pp) {
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
            for &comm_dtype in dtypes {
                out.push(Layout {
                    dp,
                    tp,
                    pp,
                    zero,
                    micro_batches: m,
                    schedule,
                    recompute,
                    comm_dtype,
                    // the time-balanced cut, or interleaved the runtime's even one (below)
                    stage_blocks: Vec::new(),
                });
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
    let u = unit_times(work, device, split.tp, split.dp, pp, (split.rows / m) as f64);
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

/// Whether some 1F1B layout of `split` at `m` micro-batches with recompute `recompute` fits in
/// `usable` bytes per device, at some ZeRO stage and gather dtype, with a cut of each stage's
/// blocks within what its memory allows (1F1B holds no more than GPipe). With `floor`, whether
/// one at `m` or fewer micro-batches might ([`stage_memory_floor`]). Errs towards `true` by a
/// part in 10^9.
fn fits_pipelined(work: &Workload, split: &Split, m: usize, recompute: bool, usable: f64, floor: bool) -> bool {
    let n_layer = work.model.n_layer as usize;
    let slack = usable * (1.0 + 1e-9);
    group_layouts(split, m, recompute, n_layer)
        .into_iter()
        .filter(|l| l.schedule == Schedule::OneFOneB)
        .any(|layout| {
            let memory = |s: usize, k: usize| {
                if floor {
                    stage_memory_floor(work, &layout, s, k)
                } else {
                    stage_memory_with(work, &layout, s, k).total()
                }
            };
            let mut room = 0usize;
            for s in 0..split.pp {
                let (none, one) = (memory(s, 0), memory(s, 1));
                if one > slack {
                    return false;
                }
                let per_block = one - none;
                room += if per_block <= 0.0 {
                    n_layer
                } else {
                    (((slack - none) / per_block).floor() as usize).clamp(1, n_layer)
                };
            }
            room >= n_layer
        })
}

/// Whether some interleaved layout of `split` at `m` micro-batches with recompute `recompute`
/// fits in `usable` bytes per device with the runtime's even cut (the ends' stages first, each
/// layout given up at its first stage that does not fit).
fn fits_interleaved(work: &Workload, split: &Split, m: usize, recompute: bool, usable: f64) -> bool {
    let n_layer = work.model.n_layer as usize;
    let slack = usable * (1.0 + 1e-9);
    let pp = split.pp;
    let order: Vec<usize> = [0, pp - 1].into_iter().chain(1..pp - 1).collect();
    let layouts: Vec<Layout> = group_layouts(split, m, recompute, n_layer)
        .into_iter()
        .filter(|l| l.schedule.chunks() > 1)
        .map(|mut l| {
            l.stage_blocks = interleaved_cut(n_layer, pp, l.schedule.chunks());
            l
        })
        .collect();
    // a stage's activations are the same at every ZeRO stage and gather dtype
    let mut held: BTreeMap<(usize, usize), f64> = BTreeMap::new();
    layouts.iter().any(|layout| {
        order.iter().all(|&s| {
            let blocks = layout.stage_blocks[s];
            let a = *held
                .entry((layout.schedule.chunks(), s))
                .or_insert_with(|| stage_activations(work, layout, s, blocks));
            stage_memory_given(work, layout, s, blocks, a).total() <= slack
        })
    })
}

/// Whether some layout of `split` at its `mi`-th micro-batch count with recompute `recompute`
/// fits in memory ([`fits_pipelined`], [`fits_interleaved`]); `none_below` caches, per split and
/// recompute setting, how many of the smallest counts no 1F1B or GPipe layout fits at (found by
/// bisection on [`stage_memory_floor`]: memory only shrinks with more micro-batches).
fn could_fit(
    work: &Workload,
    (si, split): (usize, &Split),
    mi: usize,
    recompute: bool,
    usable: f64,
    none_below: &mut BTreeMap<(usize, bool), usize>,
) -> bool {
    let below = *none_below.entry((si, recompute)).or_insert_with(|| {
        // the first count at or below which a layout might fit
        let (mut lo, mut hi) = (0, split.ms.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if fits_pipelined(work, split, split.ms[mid], recompute, usable, true) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        lo
    });
    let m = split.ms[mi];
    (mi >= below && fits_pipelined(work, split, m, recompute, usable, false))
        || (m.is_multiple_of(split.pp) && fits_interleaved(work, split, m, recompute, usable))
}

/// A lower bound on the predicted step time of every layout of `split` at `m` micro-batches
/// with recompute `recompute` (any schedule, ZeRO stage, gather dtype and cut), from the cost
/// model's own terms ([`crate::cost::step_time`]): a stage's per-micro-batch time is linear in
/// its blocks, so the stages' sum is the same for every cut and the slowest is at least their
/// mean; the pipeline then takes at least `(m - 1/v) slowest + sum / v` (`v` the most chunks
/// an interleaved plan may have here, 1 else), on shared cores at least every stage's `m`
/// passes one after another and the node's compute over its cores; the data-parallel
/// reduction exposes at least its last bucket and what the backward cannot hide on the stage
/// with the most; the optimizer is at least its share of the mean stage's parameters; the
/// step's own all-reduces are what they are. Only pipelines (`pp > 1`) are bounded.
fn lower_bound(work: &Workload, device: &DeviceSpec, split: &Split, m: usize, recompute: bool) -> f64 {
    let Split { dp, tp, pp, rows, .. } = *split;
    let n = work.model.n_layer as usize;
    let nf = n as f64;
    let ppf = pp as f64;
    let rows = (rows / m) as f64;
    let passes = work.grad_accum.max(1) as f64;
    let u = unit_times(work, device, tp, dp, pp, rows);
    // the stages' sum of a linear function of their blocks, with the ends on the first and last
    let over_stages = |f: &dyn Fn(usize, bool, bool) -> f64| {
        let middle = f(0, false, false);
        f(0, true, false) + f(0, false, true) + (ppf - 2.0) * middle + nf * (f(1, false, false) - middle)
    };
    let sum = over_stages(&|k, first, last| stage_time(&u, k, first, last, recompute));
    let mut slowest = (sum / ppf)
        .max(stage_time(&u, 1, true, false, recompute))
        .max(stage_time(&u, 1, false, true, recompute));
    if pp > 2 {
        slowest = slowest.max(stage_time(&u, 1, false, false, recompute));
    }
    let devices = dp * tp * pp;
    let hbm = device.memory_bandwidth * device.efficiency.memory_bound;
    let params = stage_params(&work.model, tp, pp, n, true, true);
    let mut optimizer = 28.0 * params / ppf / if dp > 1 { dp as f64 } else { 1.0 } / hbm;
    let dp_link = device.link(tp, dp);
    let last_bucket = if dp > 1 {
        all_reduce(BUCKET_BYTES.min(4.0 * params / ppf), dp, dp_link)
    } else {
        0.0
    };
    let (pipeline, reduction) = match device.shared_compute {
        None => {
            let v = if m.is_multiple_of(pp) {
                (2..=MAX_CHUNKS).rev().find(|&v| n >= v * pp).unwrap_or(1)
            } else {
                1
            } as f64;
            let pipeline = (m as f64 - 1.0 / v) * slowest + sum / v;
            // what the backward of the stage with the most cannot hide: at least the mean
            let unhidden = if dp > 1 {
                let reduce = ppf * all_reduce(0.0, dp, dp_link) + all_reduce(4.0 * params, dp, dp_link)
                    - all_reduce(0.0, dp, dp_link);
                let backward = over_stages(&|k, first, last| stage_backward_time(&u, k, first, last));
                (reduce - backward) / ppf
            } else {
                0.0
            };
            (pipeline, last_bucket.max(unhidden))
        }
        Some(k) => {
            let no_comm = DeviceSpec {
                intra_bandwidth: f64::INFINITY,
                intra_latency: 0.0,
                inter_bandwidth: f64::INFINITY,
                inter_latency: 0.0,
                ..device.clone()
            };
            let uc = unit_times(work, &no_comm, tp, dp, pp, rows);
            let compute = over_stages(&|k, first, last| stage_time(&uc, k, first, last, recompute));
            let per_node = (devices as f64).min(device.devices_per_node as f64);
            let cores = (devices as f64 / per_node).max(1.0) * k;
            optimizer *= (per_node / k).max(1.0);
            let pipeline = m as f64 * (compute / ppf).max(compute * (dp * tp) as f64 / cores);
            // nothing hides it there
            let reduce = if dp > 1 {
                all_reduce(4.0 * params / ppf, dp, dp_link)
            } else {
                0.0
            };
            (pipeline, reduce)
        }
    };
    let own = 2.0 * all_reduce(8.0, devices, device.link(1, devices));
    (passes * pipeline + reduction + optimizer + own) * (1.0 - 1e-9)
}

/// The `top` shortest step times seen among plans that stay in the report, and the shortest
/// among those that reduce in f32: no layout predicted slower than both can enter the first
/// `top` plans or be the first `f32` one.
struct Bar {
    top: usize,
    best: BinaryHeap<Time>,
    best_f32: f64,
}

/// A step time ordered by `f64::total_cmp`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Time(f64);

impl Eq for Time {}

impl PartialOrd for Time {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Time {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

impl Bar {
    fn add(&mut self, plan: &Plan) {
        let t = plan.time.step;
        if plan.layout.comm_dtype == CommDtype::F32 {
            self.best_f32 = self.best_f32.min(t);
        }
        self.best.push(Time(t));
        if self.best.len() > self.top {
            self.best.pop();
        }
    }

    /// The longest step a layout still worth evaluating may have.
    fn limit(&self) -> f64 {
        let top = if self.best.len() >= self.top {
            self.best.peek().map_or(f64::INFINITY, |t| t.0)
        } else {
            f64::INFINITY
        };
        top.max(self.best_f32)
    }
}

/// Plans `work` on `devices` devices of `device`, ranked.
///
/// Every `dp x tp x pp` split weft can run is evaluated at its largest micro-batch count (the
/// least memory; the one micro-batch without a pipeline). Its other counts, with and without
/// recompute, are then taken in the order of a lower bound on their step time
/// ([`lower_bound`]), and each is evaluated only while that bound is within the time of the
/// `keep_infeasible`-th best plan found so far (at least the best) and of the best that reduces
/// in f32, and only with recompute settings some layout of it fits with ([`could_fit`]). A
/// layout left out so could not have been among those plans, so the best `keep_infeasible`
/// plans and the best `f32` one are those of every layout; the others are counted in
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
            splits.push(Split { dp, tp, pp, rows, ms });
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
        // each group is evaluated once, so what it drops as dominated is final
        if !found.is_empty() {
            found.sort_by_key(|p| p.1);
            let before = found.len();
            let kept = undominated(found);
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
            let bound = lower_bound(work, device, split, split.ms[mi], false);
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
                let bound = lower_bound(work, device, split, m, true);
                rest.push(std::cmp::Reverse((Time(bound), si, mi, true)));
            }
            (true, _) => {
                let with = again && lower_bound(work, device, split, m, true) <= limit;
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
        a.0.time
            .step
            .total_cmp(&b.0.time.step)
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

/// Drops every plan another one beats on step time and memory (no worse on both, better on
/// one; of equal ones the first stays).
fn undominated<T: Clone>(group: Vec<(Plan, T)>) -> Vec<(Plan, T)> {
    let key = |p: &(Plan, T)| (p.0.time.step, p.0.memory.total());
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
