use super::{capped_cut, comparable, divisors, interleaved_cut, same_time, undominated, Plan};
use crate::cost::{stage_time, StepTime, TpComm, UnitTimes};
use crate::layout::{CommDtype, Layout, Schedule};
use crate::memory::MemoryBreakdown;

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

/// GPipe's and 1F1B's predictions for one pipeline, apart by the rounding of sums taken in
/// another order, are one time for ranking and for dominance; a real difference is not.
#[test]
fn times_apart_by_rounding_are_one_time() {
    let (gpipe, one_f_one_b) = (2.9182850883117317e-3, 2.918285088311732e-3);
    assert!(gpipe < one_f_one_b);
    assert_eq!(comparable(gpipe), comparable(one_f_one_b));
    assert!(same_time(gpipe, one_f_one_b));
    assert!(!same_time(gpipe, gpipe * (1.0 + 1e-9)));
    assert_ne!(comparable(gpipe), comparable(gpipe * (1.0 + 1e-9)));
}

/// A feasible plan of a 2-stage GPipe layout at `m` micro-batches predicted at `step` seconds
/// and holding `bytes`.
fn plan_of(m: usize, step: f64, bytes: f64) -> Plan {
    Plan {
        layout: Layout {
            dp: 1,
            tp: 1,
            pp: 2,
            zero: 0,
            micro_batches: m,
            schedule: Schedule::GPipe,
            recompute: false,
            comm_dtype: CommDtype::F32,
            pipeline_dtype: CommDtype::F32,
            sequence_parallel: false,
            stage_blocks: vec![2, 2],
        },
        time: StepTime {
            step,
            ..StepTime::default()
        },
        tokens_per_second: 1.0 / step,
        mfu: 0.5,
        memory: MemoryBreakdown {
            activations: bytes,
            ..MemoryBreakdown::default()
        },
        peak_stage: 0,
        feasible: true,
        reason: None,
    }
}

/// Ties within the tolerance chain without being transitive: `c ~ b ~ a` with `a` faster than
/// `c` beyond it, all of one memory, in the order `c, b, a`. Each is beaten by another (`c` by
/// the faster `a`, `b` by the tied earlier `c`, `a` by the tied earlier `b`), so the filter
/// alone keeps none; one plan, the fastest, stays.
#[test]
fn a_chain_of_tolerance_ties_keeps_one_plan() {
    let (a, b, c) = (1.0, 1.0 + 0.8e-12, 1.0 + 1.6e-12);
    assert!(same_time(a, b) && same_time(b, c) && !same_time(a, c));
    let group = vec![
        (plan_of(1, c, 100.0), 0usize),
        (plan_of(2, b, 100.0), 1),
        (plan_of(4, a, 100.0), 2),
    ];
    let kept = undominated(group);
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept[0].1, 2, "the fastest: {kept:?}");
    assert_eq!(kept[0].0.time.step, a);
}

/// The same chain beside a slower plan of half the memory, which no plan of the chain beats:
/// the chain's plans are still dropped by one another, and its fastest plan, which nothing beats
/// beyond the tolerance, stays beside the slower one (the filter kept only the slower plan, and
/// the planner's best plan was gone).
#[test]
fn a_chain_of_tolerance_ties_keeps_its_fastest_plan_beside_a_smaller_one() {
    let (a, b, c) = (1.0, 1.0 + 0.8e-12, 1.0 + 1.6e-12);
    let group = vec![
        (plan_of(1, c, 100.0), 0usize),
        (plan_of(2, b, 100.0), 1),
        (plan_of(4, a, 100.0), 2),
        (plan_of(8, 2.0, 50.0), 3),
    ];
    let kept: Vec<usize> = undominated(group).into_iter().map(|p| p.1).collect();
    assert_eq!(kept, vec![2, 3]);
    // a tie the smaller plan wins is no chain: the faster, larger plan is dropped as before
    let group = vec![(plan_of(1, a, 100.0), 0usize), (plan_of(2, b, 50.0), 1)];
    let kept: Vec<usize> = undominated(group).into_iter().map(|p| p.1).collect();
    assert_eq!(kept, vec![1]);
    // and a plan faster beyond the tolerance and no larger drops every plan of the chain
    let group = vec![
        (plan_of(1, c, 100.0), 0usize),
        (plan_of(2, b, 100.0), 1),
        (plan_of(4, a, 100.0), 2),
        (plan_of(8, 0.5, 100.0), 3),
    ];
    let kept: Vec<usize> = undominated(group).into_iter().map(|p| p.1).collect();
    assert_eq!(kept, vec![3]);
}
