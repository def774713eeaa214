//! The nn family: softmax / log-softmax, layer and RMS norm, cross-entropy, dropout, forward
//! and backward, on the GPU against the CPU.

use super::{assert_close, compare, gpu, randn, tolerance};
use weft_core::{DType, Error, Generator, Tensor};

/// Every float dtype, with its tolerance.
const DTYPES: [DType; 4] = [DType::F32, DType::BF16, DType::F64, DType::F16];

/// Class ids `[n]` in `0..c`, with every `ignore_every`-th row (when nonzero) set to `ignore`.
fn targets(n: usize, c: usize, ignore_every: usize, ignore: i64, seed: u64) -> Tensor {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let v: Vec<i64> = (0..n)
        .map(|i| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if ignore_every > 0 && i % ignore_every == 0 {
                ignore
            } else {
                ((state >> 33) % c as u64) as i64
            }
        })
        .collect();
    Tensor::from_vec(v, &[n]).expect("targets")
}

#[test]
fn softmax_and_log_softmax_match_the_cpu() {
    let Some(dev) = gpu("softmax_and_log_softmax_match_the_cpu") else {
        return;
    };
    for dtype in DTYPES {
        let tol = tolerance(dtype);
        for log in [false, true] {
            let sm = move |t: &Tensor, dim: isize| {
                if log {
                    t.log_softmax(dim).unwrap()
                } else {
                    t.softmax(dim).unwrap()
                }
            };
            let case = |what: &str| format!("{} {dtype:?} {what}", if log { "log_softmax" } else { "softmax" });
            // A row shorter than a warp and not a multiple of 32.
            compare(&case("[4, 37]"), dev, &[randn(&[4, 37], dtype, 1)], true, tol, |t| {
                sm(&t[0], -1)
            });
            // Rows longer than the block (256 threads) and not a multiple of it.
            compare(&case("[3, 700]"), dev, &[randn(&[3, 700], dtype, 2)], true, tol, |t| {
                sm(&t[0], -1)
            });
            // One element per row.
            compare(&case("[5, 1]"), dev, &[randn(&[5, 1], dtype, 3)], true, tol, |t| {
                sm(&t[0], -1)
            });
            // Over a dim that is not the last: the kernel gets a transposed (strided) view.
            compare(
                &case("dim 0 of [33, 6]"),
                dev,
                &[randn(&[33, 6], dtype, 4)],
                true,
                tol,
                |t| sm(&t[0], 0),
            );
            // A narrowed view, and a broadcast (expanded) input.
            compare(&case("narrowed"), dev, &[randn(&[6, 50], dtype, 5)], true, tol, |t| {
                sm(&t[0].narrow(1, 3, 40).unwrap(), -1)
            });
            compare(&case("broadcast"), dev, &[randn(&[1, 45], dtype, 6)], true, tol, |t| {
                sm(&t[0].expand(&[7, 45]).unwrap(), -1)
            });
            // Large magnitudes (the max is subtracted first).
            compare(&case("large"), dev, &[randn(&[4, 90], dtype, 7)], true, tol, |t| {
                sm(&t[0].mul_scalar(30.0).unwrap(), -1)
            });
            // Empty.
            compare(&case("empty"), dev, &[randn(&[0, 9], dtype, 8)], true, tol, |t| {
                sm(&t[0], -1)
            });
        }
    }
}

#[test]
fn layer_norm_and_rms_norm_match_the_cpu() {
    let Some(dev) = gpu("layer_norm_and_rms_norm_match_the_cpu") else {
        return;
    };
    for dtype in DTYPES {
        let tol = tolerance(dtype);
        // (shape, seed): a short row, a row longer than the block, and enough rows (200) that
        // dweight/dbias are summed over several partial blocks.
        for (shape, seed) in [(&[4usize, 37][..], 10u64), (&[3, 700][..], 11), (&[200, 48][..], 12)] {
            let c = *shape.last().unwrap();
            let x = randn(shape, dtype, seed);
            let w = randn(&[c], dtype, seed + 100);
            let b = randn(&[c], dtype, seed + 200);
            let case = |what: &str| format!("{what} {dtype:?} {shape:?}");
            compare(
                &case("layer_norm w+b"),
                dev,
                &[x.clone(), w.clone(), b.clone()],
                true,
                tol,
                |t| t[0].layer_norm(Some(&t[1]), Some(&t[2]), 1e-5).unwrap(),
            );
            compare(&case("layer_norm w"), dev, &[x.clone(), w.clone()], true, tol, |t| {
                t[0].layer_norm(Some(&t[1]), None, 1e-5).unwrap()
            });
            compare(&case("layer_norm"), dev, std::slice::from_ref(&x), true, tol, |t| {
                t[0].layer_norm(None, None, 1e-5).unwrap()
            });
            compare(&case("rms_norm w"), dev, &[x.clone(), w.clone()], true, tol, |t| {
                t[0].rms_norm(Some(&t[1]), 1e-6).unwrap()
            });
            compare(&case("rms_norm"), dev, std::slice::from_ref(&x), true, tol, |t| {
                t[0].rms_norm(None, 1e-6).unwrap()
            });
        }
        let case = |what: &str| format!("{what} {dtype:?}");
        // A permuted (strided) input over a 3-d tensor, with a narrowed weight.
        let x = randn(&[40, 3, 5], dtype, 20);
        let w = randn(&[50], dtype, 21);
        let b = randn(&[40], dtype, 22);
        compare(
            &case("layer_norm of a permuted view"),
            dev,
            &[x, w, b],
            true,
            tol,
            |t| {
                let x = t[0].permute(&[1, 2, 0]).unwrap();
                let w = t[1].narrow(0, 5, 40).unwrap();
                x.layer_norm(Some(&w), Some(&t[2]), 1e-5).unwrap()
            },
        );
        // Broadcast input and weight.
        let x = randn(&[1, 33], dtype, 23);
        let w = randn(&[1], dtype, 24);
        compare(&case("rms_norm of broadcasts"), dev, &[x, w], true, tol, |t| {
            let x = t[0].expand(&[6, 33]).unwrap();
            let w = t[1].expand(&[33]).unwrap();
            x.rms_norm(Some(&w), 1e-6).unwrap()
        });
        // No rows: dweight and dbias are zeros.
        let (x, w, b) = (
            randn(&[0, 8], dtype, 25),
            randn(&[8], dtype, 26),
            randn(&[8], dtype, 27),
        );
        compare(&case("layer_norm with no rows"), dev, &[x, w, b], true, tol, |t| {
            t[0].layer_norm(Some(&t[1]), Some(&t[2]), 1e-5).unwrap()
        });
    }
}

#[test]
fn cross_entropy_matches_the_cpu() {
    let Some(dev) = gpu("cross_entropy_matches_the_cpu") else {
        return;
    };
    for dtype in DTYPES {
        let tol = tolerance(dtype);
        for smoothing in [0.0, 0.1] {
            let case = |what: &str| format!("cross_entropy {dtype:?} smoothing {smoothing} {what}");
            // (n, c, every how many rows one is ignored)
            for (n, c, ignore_every) in [(8usize, 37usize, 3usize), (5, 700, 0), (64, 10, 7), (1, 1, 0)] {
                let x = randn(&[n, c], dtype, (n * c) as u64);
                let t = targets(n, c, ignore_every, -100, n as u64);
                compare(&case(&format!("[{n}, {c}]")), dev, &[x, t], true, tol, |t| {
                    t[0].cross_entropy(&t[1], -100, smoothing).unwrap()
                });
            }
            // Leading dims flattened, a transposed (strided) logits view, and an ignore_index
            // that is a valid class id.
            let x = randn(&[13, 2, 3], dtype, 30);
            let t = targets(6, 13, 4, 5, 31).reshape(&[2, 3]).unwrap();
            compare(&case("strided 3-d"), dev, &[x, t], true, tol, |t| {
                t[0].permute(&[1, 2, 0])
                    .unwrap()
                    .cross_entropy(&t[1], 5, smoothing)
                    .unwrap()
            });
            // Broadcast logits.
            let x = randn(&[1, 20], dtype, 32);
            let t = targets(9, 20, 0, -100, 33);
            compare(&case("broadcast"), dev, &[x, t], true, tol, |t| {
                t[0].expand(&[9, 20])
                    .unwrap()
                    .cross_entropy(&t[1], -100, smoothing)
                    .unwrap()
            });
            // Every row ignored: NaN (and zero gradients), as on the CPU.
            let x = randn(&[4, 6], dtype, 34);
            let t = targets(4, 6, 1, -100, 35);
            compare(&case("all ignored"), dev, &[x, t], true, tol, |t| {
                t[0].cross_entropy(&t[1], -100, smoothing).unwrap()
            });
            // No rows at all.
            let x = randn(&[0, 6], dtype, 36);
            let t = targets(0, 6, 0, -100, 37);
            compare(&case("empty"), dev, &[x, t], false, tol, |t| {
                t[0].cross_entropy(&t[1], -100, smoothing).unwrap()
            });
        }
    }
}

#[test]
fn cross_entropy_refuses_a_target_out_of_range_as_the_cpu() {
    let Some(dev) = gpu("cross_entropy_refuses_a_target_out_of_range_as_the_cpu") else {
        return;
    };
    for bad in [7i64, -1] {
        let x = randn(&[3, 7], DType::F32, 40);
        let t = Tensor::from_vec(vec![0i64, bad, 2], &[3]).unwrap();
        let cpu = x.cross_entropy(&t, -100, 0.0).unwrap_err();
        let (xg, tg) = (x.to(dev).unwrap(), t.to(dev).unwrap());
        let got = xg.cross_entropy(&tg, -100, 0.0).unwrap_err();
        assert!(
            matches!(got, Error::IndexOutOfRange { index, size: 7, .. } if index == bad),
            "{got}"
        );
        assert_eq!(got.to_string(), cpu.to_string());
    }
}

/// Dropout of `x` with a generator at `seed`, its offset moved to `offset`.
fn dropout(x: &Tensor, p: f64, seed: u64, offset: u64) -> Tensor {
    let mut g = Generator::new(seed);
    g.set_offset(offset);
    x.dropout(p, true, &mut g).unwrap()
}

#[test]
fn dropout_matches_the_cpu() {
    let Some(dev) = gpu("dropout_matches_the_cpu") else {
        return;
    };
    for dtype in DTYPES {
        let tol = tolerance(dtype);
        let case = |what: &str| format!("dropout {dtype:?} {what}");
        for p in [0.1, 0.5, 1.0] {
            compare(
                &case(&format!("p {p}")),
                dev,
                &[randn(&[17, 33], dtype, 50)],
                true,
                tol,
                |t| dropout(&t[0], p, 7, 1000),
            );
        }
        // The mask follows the view's row-major order.
        compare(
            &case("permuted"),
            dev,
            &[randn(&[6, 5, 4], dtype, 51)],
            true,
            tol,
            |t| dropout(&t[0].permute(&[2, 0, 1]).unwrap(), 0.3, 8, 3),
        );
        compare(&case("broadcast"), dev, &[randn(&[1, 40], dtype, 52)], true, tol, |t| {
            dropout(&t[0].expand(&[5, 40]).unwrap(), 0.3, 9, 77)
        });
        compare(&case("empty"), dev, &[randn(&[0, 3], dtype, 53)], true, tol, |t| {
            dropout(&t[0], 0.3, 9, 77)
        });
    }
}

#[test]
fn dropout_mask_is_bit_identical_to_the_cpu() {
    let Some(dev) = gpu("dropout_mask_is_bit_identical_to_the_cpu") else {
        return;
    };
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        let x = randn(&[123, 77], dtype, 60);
        for (p, seed, offset) in [(0.1, 1234u64, 98_765u64), (0.5, 42, 1 << 33)] {
            let want = dropout(&x, p, seed, offset);
            let got = dropout(&x.to(dev).unwrap(), p, seed, offset);
            let case = format!("dropout mask {dtype:?} p {p} offset {offset}");
            let (w, g) = (want.to_vec_f64(), got.to_vec_f64());
            let (wz, gz) = (
                w.iter().filter(|v| **v == 0.0).count(),
                g.iter().filter(|v| **v == 0.0).count(),
            );
            for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                assert_eq!(*a == 0.0, *b == 0.0, "{case}: element {i}: gpu {a} vs cpu {b}");
            }
            assert_eq!(gz, wz, "{case}: dropped counts");
            // The kept values too: one multiply in the compute dtype on both sides.
            assert_close(&case, &got, &want, 0.0);
            let expected = p * w.len() as f64;
            assert!(
                (wz as f64 - expected).abs() < 5.0 * expected.sqrt() + 5.0,
                "{case}: {wz} dropped of {}",
                w.len()
            );
        }
    }
}
