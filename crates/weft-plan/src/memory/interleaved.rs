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
    // warm-up's forwards, a forward and a backward in turn, the backwards left; a chunk's passes
    // come in runs of up to `pp` in a row. Within a run of `n` steps (a pass, or a forward and a
    // backward in turn, of the same chunks) what is held changes by the same amount each step
    // after the first (which may cast the chunk's weights), so its most is at the first or the
    // last step: those two are walked, the ones between passed over. The turns also repeat
    // every `pp v` steps (a period holds each chunk's passes as often forward as backward, and
    // every chunk's weights are cast by the end of the first): whole periods past the second
    // are passed over too. A stage's walk is `O(v)` runs, however many micro-batches.
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
    let (total, period) = (m * v, pp * v);
    let chunk = |k: usize, forward: bool| {
        let c = (k % period) / pp;
        if forward {
            c
        } else {
            v - 1 - c
        }
    };
    let warmup = if m == pp {
        total
    } else {
        ((pp - 1 - stage) * 2 + (v - 1) * pp).min(total)
    };
    // passes k = from..to of one kind, in runs of one chunk
    let mut k = 0;
    while k < warmup {
        let end = (k + pp - k % pp).min(warmup);
        let c = chunk(k, true);
        run(&mut held, end - k, &mut |h| pass(c, true, h));
        k = end;
    }
    let steady = total - warmup;
    let mut k = 0;
    while k < steady {
        if k == 2 * period {
            k += (steady - k) / period * period;
            if k == steady {
                break;
            }
        }
        // forward warmup + k and backward k, until either changes chunk (or a second period ends)
        let mut end = (k + pp - k % pp).min(k + pp - (warmup + k) % pp).min(steady);
        if k < 2 * period {
            end = end.min(2 * period);
        }
        let (f, b) = (chunk(warmup + k, true), chunk(k, false));
        run(&mut held, end - k, &mut |h| {
            pass(f, true, h);
            pass(b, false, h);
        });
        k = end;
    }
    let mut k = steady;
    while k < total {
        let end = (k + pp - k % pp).min(total);
        let c = chunk(k, false);
        run(&mut held, end - k, &mut |h| pass(c, false, h));
        k = end;
    }
    peak
}
