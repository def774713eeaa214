//! Pipeline stage cuts: blocks per stage balanced by predicted stage time (by bisection over the
//! stage times), within what each stage's memory allows, and the even cuts of interleaved
//! layouts.

use super::*;

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
