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
//! With equal forward and backward times per stage both leave the same idle share, the bubble
//! `(p - 1) / (m + p - 1)`; 1F1B saves activation memory, not time.

/// A pipeline schedule; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PipelineSchedule {
    GPipe,
    OneFOneB,
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

    /// The actions of stage `stage` (of `stages`) for `micro` micro-batches, in order. Every
    /// micro-batch's forward comes once and before its backward; forwards and backwards each
    /// run in micro-batch order.
    pub fn actions(&self, stage: usize, stages: usize, micro: usize) -> Vec<Action> {
        let mut out = Vec::with_capacity(2 * micro);
        match self {
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
