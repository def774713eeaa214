//! Matrix products in bf16 against f32 at the shapes of a small llama's training step (the
//! projections' forward `x @ w^T`, and the two products of their backward), on the threads
//! WEFT_NUM_THREADS gives: GFLOP/s of the median of 5 rounds of 10 calls each. A bf16 product
//! reads its operands as they are where the CPU has AVX-512 BF16 (`cpu/bf16_gemm.rs`, on AMX tiles
//! where the CPU has them and `WEFT_AMX` is not 0: `cpu/amx.rs`), and converts them to f32 for
//! the f32 `gemm` elsewhere; the line `bf16 kernel` says which. tools/bench/torch_products.py
//! times PyTorch's on the same shapes.
//!
//! `cargo run --release -p weft-core --example bf16_products [m] [k] [n]`

use std::time::Instant;

use weft_core::{DType, Tensor};

/// The median over 5 rounds of `f`'s time per call, in seconds.
fn median_s(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut rounds: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..reps {
                f();
            }
            t.elapsed().as_secs_f64() / reps as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[2]
}

/// `len` values in [-1, 1) that differ from element to element.
fn values(len: usize, mul: usize) -> Vec<f32> {
    (0..len).map(|i| ((i * mul) % 2001) as f32 / 1000.0 - 1.0).collect()
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let m = args.first().copied().unwrap_or(2048);
    let k = args.get(1).copied().unwrap_or(256);
    let n = args.get(2).copied().unwrap_or(688);
    println!(
        "bf16 kernel: {}; {} threads",
        match weft_core::cpu::bf16_gemm::Kernel::best() {
            Some(k) => format!("{k:?}"),
            None => "none (operands converted to f32)".into(),
        },
        weft_core::cpu::threads::num_threads()
    );
    let flops = 2.0 * (m * n * k) as f64;
    weft_core::no_grad(|| {
        for dtype in [DType::F32, DType::BF16] {
            let x = Tensor::from_vec(values(m * k, 31), &[m, k])
                .unwrap()
                .cast(dtype)
                .unwrap();
            let w = Tensor::from_vec(values(n * k, 7919), &[n, k])
                .unwrap()
                .cast(dtype)
                .unwrap();
            let g = Tensor::from_vec(values(m * n, 13), &[m, n])
                .unwrap()
                .cast(dtype)
                .unwrap();
            let wt = w.t().unwrap();
            let gt = g.t().unwrap();
            let forward = median_s(10, || drop(x.matmul(&wt).unwrap()));
            let input_grad = median_s(10, || drop(g.matmul(&w).unwrap()));
            let weight_grad = median_s(10, || drop(gt.matmul(&x).unwrap()));
            println!(
                "{dtype:?} {m}x{k}x{n}: x @ w^T {:.1}, g @ w {:.1}, g^T @ x {:.1} GFLOP/s",
                flops / forward / 1e9,
                flops / input_grad / 1e9,
                flops / weight_grad / 1e9
            );
        }
    });
}
