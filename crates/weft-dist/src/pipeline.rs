//! Pipeline schedules as data: the order in which one stage runs the forward and backward
//! passes of the micro-batches of a step.
//!
//! - [`PipelineSchedule::GPipe`] (Huang et al., "GPipe", 2019): every forward, then every
//!   backward. A stage holds the activations of all `m` micro-batches at once.
//! - [`PipelineSchedule::OneFOneB`] (Narayanan et al., "PipeDream", 2019, its flush variant, as
//!   Megatron-LM runs it): stage `s` of `p` runs `min(p - 1 - s, m)` warm-up forwards, then
//!   alternates one forward and one backward, then drains the remaining backwards. A stage holds
//!   at most `p - s` micro-batches of activations.
//!
//! - [`PipelineSchedule::Interleaved`] (Narayanan et al., "Efficient Large-Scale Language Model
//!   Training on GPU Clusters Using Megatron-LM", SC'21, section 2.2.2): each rank holds `v`
//!   chunks of the model, rank `r` chunk `c` being virtual stage `c p + r` of `v p`, and runs
//!   1F1B over the `v m` (chunk, micro-batch) passes in Megatron-LM's order: forwards in groups
//!   of `p` micro-batches through chunk 0, then chunk 1, ..., backwards through the chunks in
//!   reverse; `(p - 1 - r) 2 + (v - 1) g` warm-up forwards, `g` the largest group (every forward
//!   first when `m = p`). `m` must be at least `p`; when it is not a multiple of `p`, the
//!   `m mod p` micro-batches left over join the `m / p` groups, as evenly as they go, the first
//!   groups taking one more ([`interleaved_groups`]), so `g = p + ceil((m mod p) / (m / p))`.
//!   (Left over as a group of their own, fewer than `p` micro-batches would wait for each other
//!   to come round the ranks between chunks: this module's simulation then measured up to
//!   1F1B's idle share, for example `p = 3, m = 4, v = 2`; shared out, they keep the bubble
//!   below.)
//!
//! With equal forward and backward times per stage GPipe and 1F1B leave the same idle share, the
//! bubble `(p - 1) / (m + p - 1)`; 1F1B saves activation memory, not time. The interleaved
//! schedule divides the bubble's time by `v` (passes of a chunk take `1/v` of a stage's), for
//! `v` times the sends between ranks.

/// A pipeline schedule; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PipelineSchedule {
    GPipe,
    OneFOneB,
    /// Interleaved 1F1B over this many model chunks per rank (at least 2).
    Interleaved(usize),
}

/// One step of a stage's schedule: the forward or the backward pass of micro-batch `i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Forward(usize),
    Backward(usize),
}

impl PipelineSchedule {
    /// `"gpipe"` or `"1f1b"`.
    pub fn parse(name: &str) -> Option<PipelineSchedule> {
        match name {
            "gpipe" => Some(PipelineSchedule::GPipe),
            "1f1b" => Some(PipelineSchedule::OneFOneB),
            _ => None,
        }
    }

    /// Model chunks each rank holds: `v` for [`PipelineSchedule::Interleaved`], else 1.
    pub fn chunks(&self) -> usize {
        match self {
            PipelineSchedule::Interleaved(v) => *v,
            _ => 1,
        }
    }

    /// Why this schedule cannot run `micro` micro-batches on `stages` stages, if it cannot (the
    /// interleaved schedule needs at least as many micro-batches as stages, and 2 chunks or
    /// more).
    pub fn check(&self, stages: usize, micro: usize) -> Option<String> {
        match self {
            PipelineSchedule::Interleaved(v) if *v < 2 => Some(format!(
                "{v} model chunks per rank: the interleaved schedule needs at least 2"
            )),
            PipelineSchedule::Interleaved(_) if stages < 2 => {
                Some(format!("{stages} stage: the interleaved schedule needs at least 2"))
            }
            PipelineSchedule::Interleaved(_) if micro < stages => Some(format!(
                "the interleaved schedule runs micro-batches in groups of the {stages} stages: {micro} \
                 micro-batches are fewer than {stages}"
            )),
            _ => None,
        }
    }

    /// The actions of stage `stage` (of `stages`) for `micro` micro-batches, in order, each with
    /// the model chunk it runs (always 0 but for [`PipelineSchedule::Interleaved`], which must
    /// pass [`PipelineSchedule::check`]). Every (chunk, micro-batch) forward comes once and
    /// before its backward; within a chunk forwards and backwards each run in micro-batch order.
    pub fn chunk_actions(&self, stage: usize, stages: usize, micro: usize) -> Vec<(usize, Action)> {
        let PipelineSchedule::Interleaved(v) = *self else {
            return self.actions(stage, stages, micro).into_iter().map(|a| (0, a)).collect();
        };
        let (p, m) = (stages, micro);
        let total = m * v;
        let groups = interleaved_groups(p, m);
        let forwards = interleaved_forwards(&groups, v);
        let forward = |k: usize| forwards[k];
        let backward = |k: usize| {
            let (c, i) = forward(k);
            (v - 1 - c, i)
        };
        // the k-th backward comes after the (warmup + k)-th forward: enough for a group's last
        // chunk to follow its first passes through the others
        let largest = groups.iter().copied().max().unwrap_or(p);
        let warmup = if m == p {
            total
        } else {
            ((p - 1 - stage) * 2 + (v - 1) * largest).min(total)
        };
        let mut out = Vec::with_capacity(2 * total);
        for k in 0..warmup {
            let (c, i) = forward(k);
            out.push((c, Action::Forward(i)));
        }
        for k in 0..total - warmup {
            let (c, i) = forward(warmup + k);
            out.push((c, Action::Forward(i)));
            let (c, i) = backward(k);
            out.push((c, Action::Backward(i)));
        }
        for k in total - warmup..total {
            let (c, i) = backward(k);
            out.push((c, Action::Backward(i)));
        }
        out
    }

    /// The actions of stage `stage` (of `stages`) for `micro` micro-batches, in order. Every
    /// micro-batch's forward comes once and before its backward; forwards and backwards each
    /// run in micro-batch order. For [`PipelineSchedule::Interleaved`], the passes of
    /// [`PipelineSchedule::chunk_actions`] without their chunks.
    pub fn actions(&self, stage: usize, stages: usize, micro: usize) -> Vec<Action> {
        let mut out = Vec::with_capacity(2 * micro);
        match self {
            PipelineSchedule::Interleaved(_) => {
                out.extend(self.chunk_actions(stage, stages, micro).into_iter().map(|(_, a)| a));
            }
            PipelineSchedule::GPipe => {
                out.extend((0..micro).map(Action::Forward));
                out.extend((0..micro).map(Action::Backward));
            }
            PipelineSchedule::OneFOneB => {
                let warmup = (stages - 1 - stage).min(micro);
                out.extend((0..warmup).map(Action::Forward));
                for i in 0..micro - warmup {
                    out.push(Action::Forward(warmup + i));
                    out.push(Action::Backward(i));
                }
                out.extend((micro - warmup..micro).map(Action::Backward));
            }
        }
        out
    }
}

/// The sizes of the interleaved schedule's groups of micro-batches, with `p` stages and `m >= p`
/// micro-batches: `m / p` groups (rounded down) of `p`, the `m mod p` left over shared out as
/// evenly as they go, the first groups taking one more where they do not go evenly (72 on 16
/// stages: 4 groups of 18; 7 on 4: one group of 7). A group is never smaller than `p`: the
/// first pass of a group on chunk `c` waits for its micro-batch to come round the `p` ranks
/// from chunk `c - 1`, which `p` passes cover. (Fewer than `p` micro-batches, which
/// [`PipelineSchedule::check`] refuses: one group of them.)
pub fn interleaved_groups(p: usize, m: usize) -> Vec<usize> {
    match m / p {
        0 => vec![m],
        n => (0..n).map(|j| p + (m % p) / n + usize::from(j < (m % p) % n)).collect(),
    }
}

/// The forwards of a rank under [`PipelineSchedule::Interleaved`] with `v` chunks, in order:
/// (chunk, micro-batch), each of the `groups` ([`interleaved_groups`]) through chunk 0, then
/// chunk 1, .... The `k`-th backward runs the `k`-th forward's micro-batch through chunk
/// `v - 1 - c`.
fn interleaved_forwards(groups: &[usize], v: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::with_capacity(v * groups.iter().sum::<usize>());
    let mut start = 0;
    for &g in groups {
        for c in 0..v {
            out.extend((start..start + g).map(|i| (c, i)));
        }
        start += g;
    }
    out
}

/// The most micro-batches whose forward has run and backward has not, at any point of
/// `actions`: the activations a stage holds at its peak, in micro-batches.
pub fn peak_in_flight(actions: &[Action]) -> usize {
    let (mut live, mut peak) = (0usize, 0usize);
    for a in actions {
        match a {
            Action::Forward(_) => {
                live += 1;
                peak = peak.max(live);
            }
            Action::Backward(_) => live -= 1,
        }
    }
    peak
}

/// The idle share of each stage in a pipeline of `stages` with `micro` micro-batches, when
/// forward and backward passes take equal time on every stage: `(p - 1) / (m + p - 1)`.
pub fn ideal_bubble(stages: usize, micro: usize) -> f64 {
    (stages - 1) as f64 / (micro + stages - 1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use Action::{Backward as B, Forward as F};

    #[test]
    fn gpipe_runs_every_forward_then_every_backward() {
        assert_eq!(
            PipelineSchedule::GPipe.actions(1, 2, 3),
            [F(0), F(1), F(2), B(0), B(1), B(2)]
        );
    }

    #[test]
    fn one_f_one_b_warms_up_by_the_stages_after_it() {
        let s = PipelineSchedule::OneFOneB;
        assert_eq!(
            s.actions(0, 4, 6),
            [F(0), F(1), F(2), F(3), B(0), F(4), B(1), F(5), B(2), B(3), B(4), B(5)]
        );
        assert_eq!(s.actions(3, 4, 3), [F(0), B(0), F(1), B(1), F(2), B(2)]);
        // fewer micro-batches than warm-up slots: all forwards first
        assert_eq!(s.actions(0, 4, 2), [F(0), F(1), B(0), B(1)]);
    }

    #[test]
    fn one_f_one_b_holds_at_most_p_minus_s_micro_batches_and_gpipe_all_of_them() {
        for p in 1..6 {
            for m in 1..10 {
                for s in 0..p {
                    let one = PipelineSchedule::OneFOneB.actions(s, p, m);
                    let gpipe = PipelineSchedule::GPipe.actions(s, p, m);
                    assert_eq!(peak_in_flight(&one), (p - s).min(m), "p={p} m={m} s={s}");
                    assert_eq!(peak_in_flight(&gpipe), m);
                    for acts in [&one, &gpipe] {
                        let fwd: Vec<usize> = acts
                            .iter()
                            .filter_map(|a| match a {
                                F(i) => Some(*i),
                                _ => None,
                            })
                            .collect();
                        let bwd: Vec<usize> = acts
                            .iter()
                            .filter_map(|a| match a {
                                B(i) => Some(*i),
                                _ => None,
                            })
                            .collect();
                        assert_eq!(fwd, (0..m).collect::<Vec<_>>());
                        assert_eq!(bwd, (0..m).collect::<Vec<_>>());
                    }
                }
            }
        }
    }

    /// Runs the stages' action lists against each other with unit-time passes (a forward needs
    /// the previous stage's forward, a backward the next stage's backward) and returns the idle
    /// share of the step for each stage; panics on a deadlock.
    fn simulate(schedule: PipelineSchedule, p: usize, m: usize) -> Vec<f64> {
        let lists: Vec<Vec<Action>> = (0..p).map(|s| schedule.actions(s, p, m)).collect();
        let mut pos = vec![0; p];
        let mut fwd_done = vec![vec![None; m]; p];
        let mut bwd_done = vec![vec![None; m]; p];
        let mut busy_until = vec![0usize; p];
        let mut time = 0;
        while pos.iter().zip(&lists).any(|(i, l)| *i < l.len()) {
            for s in 0..p {
                if pos[s] == lists[s].len() || busy_until[s] > time {
                    continue;
                }
                let ready = match lists[s][pos[s]] {
                    F(i) => s == 0 || fwd_done[s - 1][i].is_some_and(|t| t <= time),
                    B(i) => s == p - 1 || bwd_done[s + 1][i].is_some_and(|t| t <= time),
                };
                if ready {
                    match lists[s][pos[s]] {
                        F(i) => fwd_done[s][i] = Some(time + 1),
                        B(i) => bwd_done[s][i] = Some(time + 1),
                    }
                    busy_until[s] = time + 1;
                    pos[s] += 1;
                }
            }
            time += 1;
            assert!(time < 10 * (m + p) + 10, "deadlock: {schedule:?} p={p} m={m}");
        }
        let end = *busy_until.iter().max().unwrap();
        (0..p).map(|_| 1.0 - (2 * m) as f64 / end as f64).collect()
    }

    /// The interleaved schedule's lists against each other, one time unit a chunk pass: a
    /// forward of virtual stage `c p + r` needs the forward of the one before (rank `r - 1`'s
    /// chunk `c`, or for rank 0 rank `p - 1`'s chunk `c - 1`), a backward the backward of the
    /// one after. Also checks that every pair of ranks sees its messages of one kind in the
    /// order they are sent (the transport's queues are first in, first out). Returns each
    /// rank's idle share; panics on a deadlock.
    fn simulate_interleaved(v: usize, p: usize, m: usize) -> Vec<f64> {
        let s = PipelineSchedule::Interleaved(v);
        assert_eq!(s.check(p, m), None);
        let lists: Vec<Vec<(usize, Action)>> = (0..p).map(|r| s.chunk_actions(r, p, m)).collect();
        let vs = |r: usize, c: usize| c * p + r;
        let n = p * v;
        let mut fwd_done = vec![vec![None; m]; n];
        let mut bwd_done = vec![vec![None; m]; n];
        let (mut pos, mut busy_until, mut time) = (vec![0; p], vec![0usize; p], 0);
        while pos.iter().zip(&lists).any(|(i, l)| *i < l.len()) {
            for r in 0..p {
                if pos[r] == lists[r].len() || busy_until[r] > time {
                    continue;
                }
                let (c, a) = lists[r][pos[r]];
                let me = vs(r, c);
                let ready = match a {
                    F(i) => me == 0 || fwd_done[me - 1][i].is_some_and(|t: usize| t <= time),
                    B(i) => {
                        fwd_done[me][i].is_some()
                            && (me == n - 1 || bwd_done[me + 1][i].is_some_and(|t: usize| t <= time))
                    }
                };
                if ready {
                    match a {
                        F(i) => fwd_done[me][i] = Some(time + 1),
                        B(i) => bwd_done[me][i] = Some(time + 1),
                    }
                    busy_until[r] = time + 1;
                    pos[r] += 1;
                }
            }
            time += 1;
            assert!(time < 10 * v * (m + p) + 10, "deadlock: v={v} p={p} m={m}");
        }
        // first in, first out: what rank r sends to a neighbour, in its order, is what the
        // neighbour takes, in its order
        for r in 0..p {
            let sent_fwd: Vec<(usize, usize)> = lists[r]
                .iter()
                .filter_map(|&(c, a)| match a {
                    F(i) if vs(r, c) + 1 < n => Some((vs(r, c) + 1, i)),
                    _ => None,
                })
                .collect();
            let next = (r + 1) % p;
            let taken_fwd: Vec<(usize, usize)> = lists[next]
                .iter()
                .filter_map(|&(c, a)| match a {
                    F(i) if vs(next, c) > 0 && (vs(next, c) - 1) % p == r => Some((vs(next, c), i)),
                    _ => None,
                })
                .collect();
            assert_eq!(sent_fwd, taken_fwd, "activations {r} -> {next}, v={v} p={p} m={m}");
            let sent_bwd: Vec<(usize, usize)> = lists[r]
                .iter()
                .filter_map(|&(c, a)| match a {
                    B(i) if vs(r, c) > 0 => Some((vs(r, c) - 1, i)),
                    _ => None,
                })
                .collect();
            let prev = (r + p - 1) % p;
            let taken_bwd: Vec<(usize, usize)> = lists[prev]
                .iter()
                .filter_map(|&(c, a)| match a {
                    B(i) if vs(prev, c) + 1 < n && (vs(prev, c) + 1) % p == r => Some((vs(prev, c), i)),
                    _ => None,
                })
                .collect();
            assert_eq!(sent_bwd, taken_bwd, "gradients {r} -> {prev}, v={v} p={p} m={m}");
        }
        let end = *busy_until.iter().max().unwrap();
        (0..p).map(|_| 1.0 - (2 * m * v) as f64 / end as f64).collect()
    }

    #[test]
    fn the_interleaved_schedule_runs_every_chunk_pass_once_without_deadlock_and_a_smaller_bubble() {
        for v in [2, 3, 4] {
            for p in [2, 3, 4, 5, 8] {
                // whole groups of p micro-batches, and counts whose leftovers are shared out
                for m in p..=3 * p + 1 {
                    let s = PipelineSchedule::Interleaved(v);
                    for r in 0..p {
                        let acts = s.chunk_actions(r, p, m);
                        assert_eq!(acts.len(), 2 * v * m);
                        for c in 0..v {
                            let of = |fwd: bool| -> Vec<usize> {
                                acts.iter()
                                    .filter(|(k, _)| *k == c)
                                    .filter_map(|(_, a)| match (a, fwd) {
                                        (F(i), true) | (B(i), false) => Some(*i),
                                        _ => None,
                                    })
                                    .collect()
                            };
                            assert_eq!(of(true), (0..m).collect::<Vec<_>>(), "v={v} p={p} m={m} r={r} c={c}");
                            assert_eq!(of(false), (0..m).collect::<Vec<_>>(), "v={v} p={p} m={m} r={r} c={c}");
                        }
                    }
                    for idle in simulate_interleaved(v, p, m) {
                        // the bubble of 1F1B with passes v times as short: (p - 1) / (v m + p - 1)
                        let ideal = (p - 1) as f64 / (v * m + p - 1) as f64;
                        assert!(idle <= ideal + 1e-12, "v={v} p={p} m={m}: {idle} against {ideal}");
                        assert!(idle < ideal_bubble(p, m), "v={v} p={p} m={m}: {idle}");
                    }
                }
            }
        }
        // what is left over after whole groups of p is shared out from the first group
        assert_eq!(interleaved_groups(16, 72), [18, 18, 18, 18]);
        assert_eq!(interleaved_groups(4, 11), [6, 5]);
        assert_eq!(interleaved_groups(3, 7), [4, 3]);
        assert_eq!(interleaved_groups(4, 7), [7]);
        assert_eq!(interleaved_groups(4, 8), [4, 4]);
        let s = PipelineSchedule::Interleaved(2);
        assert!(s.check(4, 3).unwrap().contains("fewer than 4"));
        assert_eq!(s.check(4, 6), None);
        assert!(PipelineSchedule::Interleaved(1).check(4, 8).is_some());
        assert_eq!(s.chunks(), 2);
    }

    #[test]
    fn both_schedules_leave_the_ideal_bubble_with_equal_pass_times() {
        for p in [2, 4] {
            for m in [1, 2, 4, 8] {
                for schedule in [PipelineSchedule::GPipe, PipelineSchedule::OneFOneB] {
                    for idle in simulate(schedule, p, m) {
                        assert!(
                            (idle - ideal_bubble(p, m)).abs() < 1e-12,
                            "{schedule:?} p={p} m={m}: {idle}"
                        );
                    }
                }
            }
        }
    }
}
