//! A pipeline's step on ranks that share cores ([`crate::DeviceSpec::shared_compute`]: CPU
//! ranks on fewer cores than ranks), simulated pass by pass.
//!
//! With cores of their own, a pipeline of per-micro-batch stage times `t_s` takes `(m - 1) max
//! t_s + sum t_s` ([`crate::cost::pipeline_time`]). On shared cores neither that nor the
//! node's total compute over its cores bounds it well: how many ranks compute at once changes
//! from pass to pass (a pipeline's fill and drain leave cores idle, its steady state asks for
//! more than there are). So each rank runs its schedule's passes in order, a pass starting once
//! the pass it depends on has finished on the neighbouring stage (plus the hand-off's
//! latency), and the ranks computing at any moment share the cores equally (processor
//! sharing): with `r` of them on `k` cores, each runs at `min(1, k / r)` of its full rate.
//! A pass is CPU work at the full rate followed by waiting that takes no core (its
//! collectives).
//!
//! Every stage stands for its `dp x tp` ranks, which run the same passes at the same time.

use crate::layout::Schedule;

/// What one pass of one virtual stage costs a rank, seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PassTime {
    /// CPU work at the full rate (its compute, and the copies of what it receives and sends).
    pub work: f64,
    /// Waiting after the work that takes no core (its tensor-parallel collectives).
    pub wait: f64,
}

/// A pipeline to simulate: `stages` ranks (each standing for `ranks_per_stage` ranks) running
/// `schedule` over `micro_batches`, its virtual stage `c p + s` on stage `s`.
#[derive(Clone, Debug)]
pub struct SharedPipeline {
    pub stages: usize,
    pub schedule: Schedule,
    pub micro_batches: usize,
    /// The forward and backward pass of each virtual stage (`stages x chunks` of each).
    pub forward: Vec<PassTime>,
    pub backward: Vec<PassTime>,
    /// Ranks each stage stands for (`dp x tp`).
    pub ranks_per_stage: f64,
    /// Ranks that compute at the full rate at once (the cores).
    pub cores: f64,
    /// Seconds from a pass's end to the dependent pass's start on another stage.
    pub handoff: f64,
}

/// Beyond this many passes the simulation is not run ([`SharedPipeline::step`] is `None`).
const MAX_PASSES: usize = 20_000;

/// The passes of stage `s` in order: `(virtual stage, micro-batch, forward)`.
fn passes(schedule: Schedule, s: usize, p: usize, m: usize) -> Vec<(usize, usize, bool)> {
    match schedule {
        Schedule::GPipe => (0..m)
            .map(|i| (s, i, true))
            .chain((0..m).map(|i| (s, i, false)))
            .collect(),
        Schedule::OneFOneB => {
            let warmup = (p - 1 - s).min(m);
            let mut out: Vec<_> = (0..warmup).map(|i| (s, i, true)).collect();
            for i in 0..m {
                if warmup + i < m {
                    out.push((s, warmup + i, true));
                }
                out.push((s, i, false));
            }
            out
        }
        Schedule::Interleaved(_) => {
            // each chunk runs its micro-batches in order, forward and backward alike
            let order = schedule.chunk_order(s, p, m);
            let chunks = schedule.chunks();
            let (mut fwd, mut bwd) = (vec![0usize; chunks], vec![0usize; chunks]);
            order
                .into_iter()
                .map(|(c, forward)| {
                    let next = if forward { &mut fwd[c] } else { &mut bwd[c] };
                    *next += 1;
                    (c * p + s, *next - 1, forward)
                })
                .collect()
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// Waiting for the pass it depends on.
    Idle,
    /// CPU work left, seconds at the full rate.
    Work(f64),
    /// Waiting that takes no core, until this time.
    Wait(f64),
}

impl SharedPipeline {
    /// Seconds of the whole step (every micro-batch through every stage), or `None` when the
    /// shapes do not describe a pipeline (or one too long to simulate).
    pub fn step(&self) -> Option<f64> {
        let (p, m) = (self.stages, self.micro_batches);
        let virtual_stages = p * self.schedule.chunks();
        // the interleaved schedule runs at least as many micro-batches as stages
        let interleaved_ok = match self.schedule {
            Schedule::Interleaved(v) => v >= 1 && m >= p,
            _ => true,
        };
        if p == 0
            || m == 0
            || !interleaved_ok
            || self.forward.len() != virtual_stages
            || self.backward.len() != virtual_stages
            || 2 * virtual_stages * m > MAX_PASSES
            || !(self.cores > 0.0 && self.ranks_per_stage > 0.0)
        {
            return None;
        }
        let lists: Vec<_> = (0..p).map(|s| passes(self.schedule, s, p, m)).collect();
        // when each (virtual stage, micro-batch)'s forward and backward ended
        let mut fwd_done = vec![vec![f64::NAN; m]; virtual_stages];
        let mut bwd_done = vec![vec![f64::NAN; m]; virtual_stages];
        let mut pos = vec![0usize; p];
        let mut phase = vec![Phase::Idle; p];
        let mut t = 0.0f64;
        // when the next pass of a stage may start (NaN: its dependency has not ended yet)
        let ready_at = |s: usize, pos: &[usize], fwd: &[Vec<f64>], bwd: &[Vec<f64>]| -> Option<f64> {
            let &(vs, i, forward) = lists[s].get(pos[s])?;
            let (end, handoff) = match (forward, vs) {
                (true, 0) => (0.0, 0.0),
                (true, _) => (fwd[vs - 1][i], self.handoff),
                // the last virtual stage's backward follows its own forward
                (false, _) if vs + 1 == virtual_stages => (fwd[vs][i], 0.0),
                (false, _) => (bwd[vs + 1][i], self.handoff),
            };
            Some(end + handoff)
        };
        loop {
            // start every pass whose dependency has ended
            for s in 0..p {
                if phase[s] == Phase::Idle {
                    if let Some(r) = ready_at(s, &pos, &fwd_done, &bwd_done) {
                        if r <= t {
                            let (vs, _, forward) = lists[s][pos[s]];
                            let pass = if forward { self.forward[vs] } else { self.backward[vs] };
                            phase[s] = Phase::Work(pass.work.max(0.0));
                        }
                    }
                }
            }
            let working = phase.iter().filter(|ph| matches!(ph, Phase::Work(_))).count();
            let rate = if working == 0 {
                1.0
            } else {
                (self.cores / (working as f64 * self.ranks_per_stage)).min(1.0)
            };
            // the next event: a pass's work or wait ends, or a dependency's hand-off arrives
            let mut dt = f64::INFINITY;
            for (s, ph) in phase.iter().enumerate() {
                let d = match *ph {
                    Phase::Work(left) => left / rate,
                    Phase::Wait(until) => until - t,
                    Phase::Idle => match ready_at(s, &pos, &fwd_done, &bwd_done) {
                        Some(r) if r > t => r - t,
                        _ => f64::INFINITY,
                    },
                };
                dt = dt.min(d.max(0.0));
            }
            if !dt.is_finite() {
                // every stage is done (or waits on a pass that never comes: not a schedule)
                return pos.iter().zip(&lists).all(|(&k, l)| k == l.len()).then_some(t);
            }
            t += dt;
            for s in 0..p {
                let (vs, i, forward) = match lists[s].get(pos[s]) {
                    Some(&x) => x,
                    None => continue,
                };
                let pass = if forward { self.forward[vs] } else { self.backward[vs] };
                phase[s] = match phase[s] {
                    Phase::Work(left) if left - dt * rate <= 1e-15 * (1.0 + left) => {
                        Phase::Wait(t + pass.wait.max(0.0))
                    }
                    Phase::Work(left) => Phase::Work(left - dt * rate),
                    other => other,
                };
                if let Phase::Wait(until) = phase[s] {
                    if until <= t {
                        let done = if forward { &mut fwd_done } else { &mut bwd_done };
                        done[vs][i] = t;
                        pos[s] += 1;
                        phase[s] = Phase::Idle;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipeline(p: usize, m: usize, fwd: f64, cores: f64) -> SharedPipeline {
        SharedPipeline {
            stages: p,
            schedule: Schedule::OneFOneB,
            micro_batches: m,
            forward: vec![PassTime { work: fwd, wait: 0.0 }; p],
            backward: vec![
                PassTime {
                    work: 2.0 * fwd,
                    wait: 0.0
                };
                p
            ],
            ranks_per_stage: 1.0,
            cores,
            handoff: 0.0,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn with_a_core_each_it_is_the_pipeline_formula() {
        // (m + p - 1) stage times, each stage a forward and a backward
        for (p, m) in [(1, 1), (2, 1), (4, 4), (4, 8), (3, 16)] {
            for schedule in [Schedule::OneFOneB, Schedule::GPipe] {
                let sp = SharedPipeline {
                    schedule,
                    ..pipeline(p, m, 1.0, p as f64)
                };
                let t = sp.step().unwrap();
                assert!(close(t, 3.0 * (m + p - 1) as f64), "{schedule:?} p={p} m={m}: {t}");
            }
        }
        // interleaved over 2 chunks, each chunk pass half a stage's: (m - 1/v) + p / v stage times
        let sp = SharedPipeline {
            schedule: Schedule::Interleaved(2),
            forward: vec![PassTime { work: 0.5, wait: 0.0 }; 8],
            backward: vec![PassTime { work: 1.0, wait: 0.0 }; 8],
            ..pipeline(4, 8, 1.0, 4.0)
        };
        let t = sp.step().unwrap();
        assert!(close(t, 3.0 * (8.0 - 0.5 + 2.0)), "{t}");
    }

    #[test]
    fn one_core_runs_every_pass_one_after_another() {
        // all the work of every stage, whatever the order: 3 x p x m forward times
        for (p, m) in [(2, 1), (4, 4), (4, 16)] {
            let t = pipeline(p, m, 1.0, 1.0).step().unwrap();
            assert!(close(t, 3.0 * (p * m) as f64), "p={p} m={m}: {t}");
        }
        // with a stage of 2 ranks, the work is theirs twice
        let sp = SharedPipeline {
            ranks_per_stage: 2.0,
            ..pipeline(2, 4, 1.0, 1.0)
        };
        assert!(close(sp.step().unwrap(), 2.0 * 3.0 * 8.0));
    }

    #[test]
    fn shared_cores_fall_between_the_two_bounds() {
        // 4 stages on 2 cores: above both the critical path and the total work over the cores,
        // as the fill and drain leave a core idle
        let (p, m) = (4, 8);
        let t = pipeline(p, m, 1.0, 2.0).step().unwrap();
        let path = 3.0 * (m + p - 1) as f64;
        let work = 3.0 * (p * m) as f64 / 2.0;
        assert!(t > path.max(work) && t < path + work, "{t} vs {path}, {work}");
    }

    #[test]
    fn waiting_takes_no_core_and_handoffs_delay() {
        // one stage: every pass's wait adds to the step in full
        let mut one = pipeline(1, 4, 1.0, 1.0);
        one.forward[0].wait = 0.5;
        assert!(close(one.step().unwrap(), 4.0 * (3.0 + 0.5)));
        // one core, two stages: a wait of a pass lets the other stage compute, so the step
        // grows by less than the waits, but it grows (the last micro-batch's wait is exposed)
        let mut sp = pipeline(2, 4, 1.0, 1.0);
        let alone = sp.step().unwrap();
        sp.forward[0].wait = 0.5;
        let with_wait = sp.step().unwrap();
        assert!(
            with_wait > alone && with_wait < alone + 4.0 * 0.5,
            "{with_wait} vs {alone}"
        );
        // a hand-off's latency on every dependency across stages, with a core each: the
        // critical path crosses 2 (p - 1) hand-offs at m = 1
        let mut sp = pipeline(3, 1, 1.0, 3.0);
        sp.handoff = 0.25;
        assert!(close(sp.step().unwrap(), 3.0 * 3.0 + 4.0 * 0.25));
    }

    #[test]
    fn interleaving_follows_its_formula_for_any_chunks() {
        // a core each, chunk passes 1/v of a stage's: (m - 1/v) + p / v stage times of 3
        for v in [2usize, 3, 4] {
            for (p, m) in [(2, 4), (4, 8), (3, 9)] {
                let sp = SharedPipeline {
                    schedule: Schedule::Interleaved(v),
                    forward: vec![
                        PassTime {
                            work: 1.0 / v as f64,
                            wait: 0.0
                        };
                        p * v
                    ],
                    backward: vec![
                        PassTime {
                            work: 2.0 / v as f64,
                            wait: 0.0
                        };
                        p * v
                    ],
                    ..pipeline(p, m, 1.0, p as f64)
                };
                let want = 3.0 * (m as f64 - 1.0 / v as f64 + p as f64 / v as f64);
                let t = sp.step().unwrap();
                assert!(close(t, want), "v={v} p={p} m={m}: {t} vs {want}");
            }
        }
        // a hand-off on each of the 2 (v p - 1) crossings between virtual stages that one
        // micro-batch's critical path takes (a core each, one micro-batch group)
        let (p, v) = (2usize, 2usize);
        let mut sp = SharedPipeline {
            schedule: Schedule::Interleaved(v),
            forward: vec![PassTime { work: 0.5, wait: 0.0 }; p * v],
            backward: vec![PassTime { work: 1.0, wait: 0.0 }; p * v],
            ..pipeline(p, p, 1.0, p as f64)
        };
        let without = sp.step().unwrap();
        sp.handoff = 0.01;
        let with = sp.step().unwrap();
        assert!(
            with > without && with <= without + 2.0 * (v * p - 1) as f64 * 0.01 + 1e-9,
            "{with} vs {without}"
        );
    }

    #[test]
    fn shapes_that_are_no_pipeline_are_refused() {
        let mut sp = pipeline(2, 4, 1.0, 1.0);
        sp.forward.pop();
        assert_eq!(sp.step(), None);
        assert_eq!(pipeline(2, 0, 1.0, 1.0).step(), None);
        assert_eq!(pipeline(2, 4, 1.0, 0.0).step(), None);
        // interleaving needs at least as many micro-batches as stages, and chunks
        let interleaved = |v, m| SharedPipeline {
            schedule: Schedule::Interleaved(v),
            forward: vec![PassTime { work: 1.0, wait: 0.0 }; 2 * v],
            backward: vec![PassTime { work: 2.0, wait: 0.0 }; 2 * v],
            ..pipeline(2, m, 1.0, 2.0)
        };
        assert_eq!(interleaved(2, 1).step(), None);
        assert_eq!(interleaved(0, 4).step(), None);
        assert!(interleaved(2, 4).step().is_some());
        assert!(interleaved(2, 3).step().is_some());
    }
}
