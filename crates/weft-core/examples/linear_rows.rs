//! Time of a linear layer's forward (`x [m, k] @ w^T`, w `[n, k]`, as the decode step runs its
//! projections) for a few row counts m, on the threads WEFT_NUM_THREADS gives: the median of 5
//! rounds of 200 calls each. Products of at most 64 rows take `cpu/skinny.rs`, larger ones the
//! `gemm` crate; a build from before skinny.rs times the crate alone.
//!
//! `cargo run --release -p weft-core --example linear_rows [k] [n]`

use std::time::Instant;

use weft_core::Tensor;

/// The median over 5 rounds of `f`'s time per call, in microseconds.
fn median_us(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut rounds: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..reps {
                f();
            }
            t.elapsed().as_secs_f64() / reps as f64 * 1e6
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[2]
}

/// `len` values in [0, scale * modulus) that differ from element to element.
fn values(len: usize, mul: usize, modulus: usize, scale: f32) -> Vec<f32> {
    (0..len).map(|i| ((i * mul) % modulus) as f32 * scale).collect()
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let k = args.first().copied().unwrap_or(256);
    let n = args.get(1).copied().unwrap_or(768);
    let w = Tensor::from_vec(values(n * k, 7919, 1000, 1e-3), &[n, k]).unwrap();
    weft_core::no_grad(|| {
        for m in [1usize, 2, 4, 8, 16, 32, 64, 128, 256] {
            let x = Tensor::from_vec(values(m * k, 31, 97, 1e-2), &[m, k]).unwrap();
            let us = median_us(200, || {
                std::hint::black_box(x.linear(&w, None).unwrap());
            });
            let gflops = 2.0 * (m * k * n) as f64 / us * 1e-3;
            println!("m={m:3} k={k} n={n}: {us:8.1} us ({gflops:.1} GFLOP/s)");
        }
    });
}
