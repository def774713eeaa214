//! A resumed sweep gives the pruner the ended trials' curves in the order their values were
//! recorded: on a case where trials reached ASHA's rungs in another order than their numbers,
//! the replay makes the decisions the live sweep made, where replaying trial by trial does not.

use weft_tune::driver::{replay, Curve};
use weft_tune::pruner::{Asha, Decision, Pruner};

/// `(trial, [(step, loss, time)])` in trial order, as a resumed sweep reads them from the store.
/// ASHA with rungs at steps 2, 4 and 8 (eta 2, 16 steps): trial 2 reaches rung 0 first (time 1,
/// the best value), then trial 1 (time 2, worse: pruned), then trial 0 (time 3, worse than trial
/// 2: pruned); trial 0 logged a good value at step 4 (time 3.2) before its stop took effect.
/// Trial 2 reaches rung 1 alone (time 4) and goes on.
fn curves() -> Vec<Curve> {
    vec![
        (0, vec![(2, 2.0, 3.0), (4, 0.1, 3.2)]),
        (1, vec![(2, 3.0, 2.0)]),
        (2, vec![(2, 1.0, 1.0), (4, 0.5, 4.0), (8, 0.4, 5.0)]),
    ]
}

fn asha() -> Asha {
    Asha::new(2, 2, 16)
}

/// What the live driver did: each value given as it was recorded, a trial no longer read once
/// it was pruned; the `(trial, step)` of each decision to prune.
fn live(pruner: &mut dyn Pruner) -> Vec<(u64, i64)> {
    let mut events: Vec<(f64, u64, i64, f64)> = curves()
        .into_iter()
        .flat_map(|(t, rows)| rows.into_iter().map(move |(s, v, time)| (time, t, s, v)))
        .collect();
    events.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut pruned: Vec<(u64, i64)> = Vec::new();
    for (_, trial, step, loss) in events {
        if pruned.iter().any(|(t, _)| *t == trial) {
            continue;
        }
        if let Decision::Prune(_) = pruner.report(trial, step as u64, loss) {
            pruned.push((trial, step));
        }
    }
    pruned
}

#[test]
fn a_resumed_asha_replays_in_recorded_order_and_decides_as_the_live_sweep_did() {
    let mut live_asha = asha();
    let want = live(&mut live_asha);
    assert_eq!(want, [(1, 2), (0, 2)]);

    let mut replayed = asha();
    assert_eq!(replay(&mut replayed, &curves()), want);
    // the rungs hold the same values: a new trial is judged as the live sweep would judge it
    for k in 0..3 {
        assert_eq!(replayed.recorded(k), live_asha.recorded(k), "rung {k}");
    }
    assert_eq!(replayed.report(3, 4, 0.7), live_asha.report(3, 4, 0.7));

    // trial by trial, trial 0 looks first at rung 0 and goes on, its late value reaches rung 1
    // and trial 2 (which went on live) is pruned there
    let mut by_trial = asha();
    let mut decisions = Vec::new();
    for (trial, rows) in curves() {
        for (step, loss, _) in rows {
            if let Decision::Prune(_) = by_trial.report(trial, step as u64, loss) {
                decisions.push((trial, step));
                break;
            }
        }
    }
    assert_ne!(decisions, want);
    assert!(decisions.contains(&(2, 4)), "{decisions:?}");
}

#[test]
fn a_trials_repeated_steps_and_time_ties_are_given_once_in_trial_order() {
    // two trials record at the same instant: the lower number goes first, as a tie-break
    let curves = vec![(1, vec![(2, 1.0, 1.0)]), (0, vec![(2, 2.0, 1.0), (2, 0.5, 1.5)])];
    let mut a = asha();
    // trial 0 first (alone: goes on), then trial 1 (better: goes on); trial 0's second value
    // at step 2 is not given again
    assert_eq!(replay(&mut a, &curves), []);
    assert_eq!(a.recorded(0).get(&0), Some(&2.0));
}
