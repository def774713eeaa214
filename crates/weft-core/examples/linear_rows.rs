//! Time of a linear layer's forward (`x [m, k] @ w^T`, w `[n, k]`, as the decode step runs its
//! projections) for a few row counts m, on the threads WEFT_NUM_THREADS gives.
//!
//! `cargo run --release -p weft-core --example linear_rows [k] [n]`

use std::time::Instant;

use weft_core::Tensor;

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let k = args.first().copied().unwrap_or(256);
    let n = args.get(1).copied().unwrap_or(768);
    let w = Tensor::from_vec(
        (0..n * k)
            .map(|i| ((i * 7919) % 1000) as f32 * 1e-3)
            .collect::<Vec<f32>>(),
        &[n, k],
    )
    .unwrap();
    weft_core::no_grad(|| {
        for m in [1usize, 2, 4, 8, 16, 32, 64, 128, 256] {
            let x = Tensor::from_vec(
                (0..m * k).map(|i| ((i * 31) % 97) as f32 * 1e-2).collect::<Vec<f32>>(),
                &[m, k],
            )
            .unwrap();
            let reps = 200;
            let mut times = Vec::new();
            for _ in 0..5 {
                let t = Instant::now();
                for _ in 0..reps {
                    let y = x.linear(&w, None).unwrap();
                    std::hint::black_box(&y);
                }
                times.push(t.elapsed().as_secs_f64() / reps as f64 * 1e6);
            }
            times.sort_by(f64::total_cmp);
            let us = times[2];
            let [plain, rows, tr] = raw(m, k, n);
            println!("m={m:3} k={k} n={n}: {us:8.1} us  ({:.2} GFLOP/s); gemm crate: as called {plain:.1}, by rows {rows:.1}, transposed {tr:.1} us", 2.0 * (m * k * n) as f64 / us * 1e-3);
        }
    });
}

/// The same product through the `gemm` crate directly, three ways: as the layer calls it, one row
/// at a time, and transposed (`y^T = w x^T`, written into y through its strides).
#[allow(dead_code)]
pub fn raw(m: usize, k: usize, n: usize) -> [f64; 3] {
    let w: Vec<f32> = (0..n * k).map(|i| ((i * 7919) % 1000) as f32 * 1e-3).collect();
    let x: Vec<f32> = (0..m * k).map(|i| ((i * 31) % 97) as f32 * 1e-2).collect();
    let mut y = vec![0f32; m * n];
    let reps = 200;
    let time = |f: &mut dyn FnMut()| {
        let mut ts = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            for _ in 0..reps {
                f();
            }
            ts.push(t.elapsed().as_secs_f64() / reps as f64 * 1e6);
        }
        ts.sort_by(f64::total_cmp);
        ts[2]
    };
    let yp = y.as_mut_ptr();
    // y[m, n] = x[m, k] @ w^T: b = w^T, element (p, j) at w[j * k + p]: rs 1, cs k
    let plain = time(&mut || unsafe {
        gemm::gemm(
            m,
            n,
            k,
            yp,
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    });
    let rows = time(&mut || unsafe {
        for i in 0..m {
            gemm::gemm(
                1,
                n,
                k,
                yp.add(i * n),
                1,
                n as isize,
                false,
                x.as_ptr().add(i * k),
                1,
                k as isize,
                w.as_ptr(),
                k as isize,
                1,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            )
        }
    });
    // y^T[n, m] = w[n, k] @ x^T[k, m]: dst (j, i) at y[i * n + j]: cs n, rs 1
    let transposed = time(&mut || unsafe {
        gemm::gemm(
            n,
            m,
            k,
            yp,
            n as isize,
            1,
            false,
            w.as_ptr(),
            1,
            k as isize,
            x.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    });
    [plain, rows, transposed]
}
