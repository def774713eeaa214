//! Activations an interleaved schedule's stage holds at once, walked pass by pass in the
//! runtime's order.

use crate::activations;
use crate::layout::Layout;
use crate::model::Workload;

/// The most activation bytes stage `stage` of an interleaved layout holds at once: its passes
/// in the runtime's order ([`crate::layout::Schedule::chunk_order`]), each (chunk, micro-batch)
/// holding what its virtual stage keeps (its blocks of the even cut, with the embeddings on
/// the first virtual stage and the output layer on the last), or under recompute its input
/// until its backward rebuilds it whole; without recompute, a chunk's bf16 weight copies once,
/// from its first forward to the end of the step (autocast casts a parameter once per step's
/// region; with recompute the region does not keep casts, and each rebuilt pass makes its own).
pub(super) fn interleaved_activations(work: &Workload, layout: &Layout, stage: usize, tokens: f64) -> f64 {
    let model = &work.model;
    let (pp, v) = (layout.pp, layout.schedule.chunks());
    // blocks of virtual stage `vs` (`Layout::config_stage_blocks`, without listing them all)
    let blocks: usize = layout.stage_blocks.iter().sum();
    let count = |vs: usize| blocks / (pp * v) + usize::from(vs < blocks % (pp * v));
    // per chunk: a micro-batch's graph without the weight copies, its input, the copies
    let per_pass: Vec<(f64, f64, f64)> = (0..v)
        .map(|c| {
            let vs = c * pp + stage;
            let (first, last) = (vs == 0, vs + 1 == pp * v);
            let whole = super::graph_bytes(work, layout, count(vs), (first, last), tokens);
            let copies = activations::weight_copy_bytes(model, work.precision, layout.tp, count(vs), last);
            let input = tokens
                * if first {
                    8.0
                } else {
                    super::stream_bytes_per_token(work, layout)
                };
            (whole - copies, input, copies)
        })
        .collect();
    let (mut held, mut peak) = (0.0f64, 0.0f64);
    let mut cast = vec![false; v];
    // one pass: a forward or a backward of chunk `c`
    let mut pass = |c: usize, forward: bool, held: &mut f64| {
        let (graph, input, copies) = per_pass[c];
        match (layout.recompute, forward) {
            (false, true) => {
                if !cast[c] {
                    cast[c] = true;
                    *held += copies;
                }
                *held += graph;
            }
            (false, false) => *held -= graph,
            (true, true) => *held += input,
            (true, false) => {
                // rebuilt whole, weight copies included, for its backward, then gone
                peak = peak.max(*held + graph + copies);
                *held -= input;
            }
        }
        peak = peak.max(*held);
    };
    // the runtime's order (`Schedule::chunk_order`, which this walks without listing it): the
    // warm-up's forwards, a forward and a backward in turn, the backwards left. Forwards come
    // in runs of one chunk (each group of micro-batches through chunk 0, then chunk 1, ...;
    // `layout::interleaved_groups`), backwards in the same runs with the chunks reversed.
    // Within a stretch of `n` steps (a pass, or a forward and a backward in turn) that stays in
    // one run of each, what is held changes by the same amount each step after the first
    // (which may cast the chunk's weights), so its most is at the first or the last step: those
    // two are walked, the ones between passed over. Where a forward and a backward in turn both
    // lie in groups of one size `g`, what is held repeats every `g v` steps (each chunk `g`
    // forwards and `g` backwards, every chunk's weights cast by then): past two such periods,
    // whole periods are passed over too. A stage's walk is `O(v)` stretches a size of group.
    let run = |held: &mut f64, n: usize, step: &mut dyn FnMut(&mut f64)| {
        if n == 0 {
            return;
        }
        step(held);
        if n > 1 {
            let before = *held;
            step(held);
            let each = *held - before;
            *held += (n - 2) as f64 * each;
            if n > 2 {
                // the last step, walked again from the one before it
                *held -= each;
                step(held);
            }
        }
    };
    let m = layout.micro_batches;
    let total = m * v;
    // `layout::interleaved_groups` without listing them: `big` groups of `ga`, then of `gb`
    let groups = crate::layout::GroupSizes::of(pp, m);
    let (big, ga, gb) = (groups.larger_count, groups.larger, groups.smaller);
    let split = big * ga * v;
    let largest = groups.largest();
    let warmup = if m == pp {
        total
    } else {
        ((pp - 1 - stage) * 2 + (v - 1) * largest).min(total)
    };
    // stretches of groups of one size, in forward passes: (start, end, size)
    let sizes = [(0, split, ga), (split, total, gb)];
    // the run of one chunk holding forward `k` (a backward's, with the chunk reversed): where
    // it ends, and its chunk
    let at = |k: usize| {
        let (base, g, k) = if k < split { (0, ga, k) } else { (split, gb, k - split) };
        let (group, within) = (k / (g * v), k % (g * v));
        (base + group * g * v + (within / g + 1) * g, within / g)
    };
    let mut k = 0;
    while k < warmup {
        let (end, c) = at(k);
        let end = end.min(warmup);
        run(&mut held, end - k, &mut |h| pass(c, true, h));
        k = end;
    }
    let steady = total - warmup;
    let mut k = 0;
    // the stretch of one size both passes have been in since the step given
    let mut since: Option<(usize, usize)> = None;
    while k < steady {
        if let Some(i) = sizes.iter().position(|&(a, e, _)| a <= k && warmup + k < e) {
            let (_, e, g) = sizes[i];
            let period = g * v;
            match since {
                Some((j, k0)) if j == i => {
                    if k - k0 >= 2 * period {
                        k += ((e - warmup).min(steady) - k) / period * period;
                        since = Some((i, k));
                        if k == steady {
                            break;
                        }
                    }
                }
                _ => since = Some((i, k)),
            }
        } else {
            since = None;
        }
        // forward warmup + k and backward k, until either changes chunk
        let (fend, f) = at(warmup + k);
        let (bend, b) = at(k);
        let end = (fend - warmup).min(bend).min(steady);
        let b = v - 1 - b;
        run(&mut held, end - k, &mut |h| {
            pass(f, true, h);
            pass(b, false, h);
        });
        k = end;
    }
    let mut k = steady;
    while k < total {
        let (end, c) = at(k);
        let c = v - 1 - c;
        run(&mut held, end - k, &mut |h| pass(c, false, h));
        k = end;
    }
    peak
}
