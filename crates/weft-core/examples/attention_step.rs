//! Time of causal grouped-query attention's forward and backward at a training step's shapes
//! (q `[B, T, H, D]` and k, v `[B, T, KVH, D]` viewed as `[B, heads, T, D]`, as the llama runs
//! it), on the threads WEFT_NUM_THREADS gives: the median of 5 rounds of 20 calls each, with the
//! multiply-adds the causal products need (the visible keys only) as GFLOP/s; for the rule's tile
//! of queries and each tile an autotuning search may choose.
//!
//! `cargo run --release -p weft-core --example attention_step [B] [T] [H] [KVH] [D]`
//! (default 8 256 8 4 32: the llama step of docs/benchmarks.md)

use std::time::Instant;

use weft_core::{tune, Tensor};

/// The median over 5 rounds of `f`'s time per call, in milliseconds.
fn median_ms(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut rounds: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..reps {
                f();
            }
            t.elapsed().as_secs_f64() / reps as f64 * 1e3
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[2]
}

/// `len` values in [-0.5, 0.5) that differ from element to element.
fn values(len: usize, mul: usize) -> Vec<f32> {
    (0..len).map(|i| ((i * mul) % 1009) as f32 / 1009.0 - 0.5).collect()
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let arg = |i: usize, d: usize| args.get(i).copied().unwrap_or(d);
    let (b, t, h, kvh, d) = (arg(0, 8), arg(1, 256), arg(2, 8), arg(3, 4), arg(4, 32));
    let leaf = |heads: usize, mul: usize| {
        Tensor::from_vec(values(b * t * heads * d, mul), &[b, t, heads, d])
            .unwrap()
            .requires_grad_()
            .unwrap()
    };
    let (q, k, v) = (leaf(h, 31), leaf(kvh, 37), leaf(kvh, 41));
    let run = |backward: bool| {
        let y = Tensor::grouped_query_attention(
            &q.transpose(1, 2).unwrap(),
            &k.transpose(1, 2).unwrap(),
            &v.transpose(1, 2).unwrap(),
            true,
            None,
        )
        .unwrap();
        if backward {
            y.sum_all().unwrap().backward().unwrap();
        }
        std::hint::black_box(y);
    };
    // multiply-adds of one product over the causal triangle: T (T + 1) / 2 rows x D, per problem
    let triangle = (b * h) as f64 * (t * (t + 1) / 2) as f64 * d as f64 * 2.0;
    // the rule's tile, then each tile an autotuning search may choose (16, 32, 64 queries)
    for (variant, name) in [(0u8, "rule"), (1, "16"), (2, "32"), (3, "64")] {
        let (fwd, both) = tune::forced(tune::Kernel::Attention, variant, || {
            let fwd = weft_core::no_grad(|| median_ms(20, || run(false)));
            (fwd, median_ms(20, || run(true)))
        });
        println!(
            "B={b} T={t} H={h} KVH={kvh} D={d} tile {name}: forward {fwd:.2} ms ({:.1} GFLOP/s), forward+backward {both:.2} ms ({:.1} GFLOP/s)",
            2.0 * triangle / fwd * 1e-6,
            7.0 * triangle / both * 1e-6,
        );
    }
}
