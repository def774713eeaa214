//! The native bf16 products (`cpu::bf16_gemm`: AVX-512 BF16, and AMX tiles where the CPU has
//! them) against products computed in f64 from the same bf16 values: every tile edge, an odd
//! inner dimension, inner dimensions across packed blocks, operands read along rows or down
//! columns, and adding into the output, on each kernel this CPU runs; then the `matmul` and
//! `linear` ops in bf16, which use the fastest of them.

use half::bf16;
use weft_core::cpu::bf16_gemm::{self, Kernel};
use weft_core::cpu::matmul::{MatMut, MatRef};
use weft_core::{DType, Tensor};

/// Skips (saying so) where the CPU lacks the instructions; the ops then take the f32 path, which
/// other tests cover.
fn kernel_present() -> bool {
    if !bf16_gemm::available() {
        eprintln!("skipped: this CPU has no AVX-512 BF16; bf16 products run through f32 here");
        return false;
    }
    true
}

/// `len` bf16 values in [-2, 2), from a fixed linear congruential sequence.
fn values(len: usize, seed: u64) -> Vec<bf16> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            bf16::from_f64(((s >> 11) as f64 / (1u64 << 53) as f64) * 4.0 - 2.0)
        })
        .collect()
}

/// A matrix of `rows x cols` stored row-major, or (when `transposed`) column-major.
struct Stored {
    data: Vec<bf16>,
    rows: usize,
    cols: usize,
    transposed: bool,
}

impl Stored {
    fn new(rows: usize, cols: usize, transposed: bool, seed: u64) -> Stored {
        Stored {
            data: values(rows * cols, seed),
            rows,
            cols,
            transposed,
        }
    }

    fn get(&self, i: usize, j: usize) -> f64 {
        let at = if self.transposed {
            j * self.rows + i
        } else {
            i * self.cols + j
        };
        self.data[at].to_f64()
    }

    fn as_ref(&self) -> MatRef<bf16> {
        let (row_stride, col_stride) = if self.transposed {
            (1, self.rows as isize)
        } else {
            (self.cols as isize, 1)
        };
        MatRef {
            ptr: self.data.as_ptr(),
            row_stride,
            col_stride,
        }
    }
}

/// Runs the kernel on `m x k` by `k x n` (each operand in either storage order), into an output
/// of row stride `n + 3` that starts at `start` (read back when `accumulate`), and checks every
/// element against the f64 product within the error bound of a sum of `k` rounded additions
/// (`k 2^-24 sum |a b|`, Higham's bound for recursive summation).
fn check(kernel: Kernel, m: usize, n: usize, k: usize, at: bool, bt: bool, accumulate: bool) {
    let a = Stored::new(m, k, at, (m * 31 + k) as u64);
    let b = Stored::new(k, n, bt, (n * 17 + k) as u64);
    let stride = n + 3;
    let start: Vec<f32> = (0..m * stride).map(|i| (i % 7) as f32 - 3.0).collect();
    let mut out = start.clone();
    let dst = MatMut {
        ptr: out.as_mut_ptr(),
        row_stride: stride as isize,
        accumulate,
    };
    // SAFETY: the kernel is present (checked by the caller); the operands and the output hold
    // the matrices at the strides given.
    unsafe { bf16_gemm::gemm_parallel_with(kernel, m, n, k, dst, a.as_ref(), b.as_ref()) };
    for i in 0..m {
        for j in 0..stride {
            let got = out[i * stride + j];
            if j >= n {
                assert_eq!(got, start[i * stride + j], "({i}, {j}) outside the output was written");
                continue;
            }
            let (mut want, mut size) = (
                if accumulate {
                    f64::from(start[i * stride + j])
                } else {
                    0.0
                },
                0.0,
            );
            size += want.abs();
            for c in 0..k {
                let p = a.get(i, c) * b.get(c, j);
                want += p;
                size += p.abs();
            }
            let bound = (k + 1) as f64 * 2f64.powi(-24) * size + 1e-30;
            assert!(
                (f64::from(got) - want).abs() <= bound,
                "{kernel:?}: {m}x{k} @ {k}x{n} (a transposed {at}, b transposed {bt}, accumulate {accumulate}): \
                 ({i}, {j}) = {got}, want {want} within {bound}"
            );
        }
    }
}

#[test]
fn the_kernels_match_f64_products_at_every_edge() {
    if !kernel_present() {
        return;
    }
    // AVX-512: tiles of 8 x 32, packed blocks of 256 inner elements, 128 rows and 1024 columns;
    // AMX: blocks of 32 x 32, tile steps of 32 inner elements, packed blocks of 512: sizes below,
    // at and past each, and an odd inner dimension (the last pair half padding)
    for kernel in Kernel::all_available() {
        for &(m, n, k) in &[
            (1, 1, 1),
            (1, 33, 7),
            (8, 32, 2),
            (9, 31, 3),
            (17, 65, 255),
            (130, 40, 256),
            (7, 100, 257),
            (40, 64, 600),
            (300, 3, 33),
            (32, 32, 32),
            (33, 64, 64),
            (64, 31, 96),
            (96, 96, 512),
            (161, 70, 1040),
            // past one block of 1024 packed columns
            (9, 2100, 33),
        ] {
            for (at, bt) in [(false, false), (false, true), (true, false), (true, true)] {
                check(kernel, m, n, k, at, bt, false);
            }
            check(kernel, m, n, k, false, true, true);
            check(kernel, m, n, k, true, false, true);
        }
    }
}

#[test]
fn an_empty_inner_dimension_writes_zeros_or_leaves_the_output() {
    if !kernel_present() {
        return;
    }
    for kernel in Kernel::all_available() {
        check(kernel, 5, 9, 0, false, false, false);
        check(kernel, 5, 9, 0, false, false, true);
    }
}

#[test]
fn products_split_over_threads_equal_one_thread_bit_for_bit() {
    if !kernel_present() {
        return;
    }
    // long enough on both sides to be cut into blocks of rows, and of columns (with more than
    // one compute thread: `WEFT_NUM_THREADS`, by default the cores)
    for kernel in Kernel::all_available() {
        for &(m, n, k) in &[(512, 96, 200), (24, 700, 130), (16, 2100, 40)] {
            let a = Stored::new(m, k, false, 1);
            let b = Stored::new(k, n, true, 2);
            let (mut one, mut split) = (vec![0f32; m * n], vec![0f32; m * n]);
            let dst = |out: &mut Vec<f32>| MatMut {
                ptr: out.as_mut_ptr(),
                row_stride: n as isize,
                accumulate: false,
            };
            // SAFETY: as in `check`.
            unsafe {
                bf16_gemm::gemm_with(kernel, m, n, k, dst(&mut one), a.as_ref(), b.as_ref());
                bf16_gemm::gemm_parallel_with(kernel, m, n, k, dst(&mut split), a.as_ref(), b.as_ref());
            }
            assert!(
                one.iter().zip(&split).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{kernel:?}: {m}x{k}x{n}"
            );
            check(kernel, m, n, k, false, true, false);
        }
    }
}

/// Where the CPU reports AMX (CPUID leaf 7: AMX-TILE and AMX-BF16) and `WEFT_AMX` does not turn
/// it off, the tile kernel is the one the ops use: a refused permission or a wrong feature check
/// would otherwise leave the slower kernel running unnoticed.
#[test]
fn amx_is_used_where_the_cpu_has_it() {
    #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
    {
        let leaf = std::arch::x86_64::__cpuid_count(7, 0);
        let cpu_has = leaf.edx >> 22 & 1 == 1 && leaf.edx >> 24 & 1 == 1 && bf16_gemm::available();
        if !cpu_has {
            eprintln!("skipped: this CPU has no AMX");
            return;
        }
        // the kernel must also offer the tile data state (Linux 5.16 and later:
        // ARCH_GET_XCOMP_SUPP, bit 18 XTILEDATA); without it the fallback is right
        let mut supported: u64 = 0;
        // SAFETY: the call writes one u64 through the pointer given.
        let asked = unsafe { libc::syscall(libc::SYS_arch_prctl, 0x1021, &mut supported as *mut u64) };
        if asked != 0 || supported >> 18 & 1 == 0 {
            eprintln!("skipped: this Linux kernel does not offer AMX tile state to processes");
            return;
        }
        if std::env::var("WEFT_AMX").is_ok_and(|v| v.trim() == "0") {
            eprintln!("skipped: WEFT_AMX=0 turns AMX off");
            return;
        }
        assert_eq!(Kernel::best(), Some(Kernel::Amx));
    }
}

/// `t` as f64 values.
fn to_f64(t: &Tensor) -> Vec<f64> {
    t.to_vec_f64()
}

/// Rounds to bf16 (nearest, ties to even) as the ops round their f32 results.
fn round_bf16(x: f64) -> f64 {
    bf16::from_f32(x as f32).to_f64()
}

#[test]
fn bf16_matmul_and_linear_round_the_exact_products() {
    if !kernel_present() {
        return;
    }
    let (m, k, n) = (37, 70, 45);
    let x = Tensor::from_vec(values(m * k, 3), &[m, k]).unwrap();
    let w = Tensor::from_vec(values(n * k, 4), &[n, k]).unwrap();
    let bias = Tensor::from_vec(values(n, 5), &[n]).unwrap();
    let (xs, ws, bs) = (to_f64(&x), to_f64(&w), to_f64(&bias));
    let exact = |i: usize, j: usize| (0..k).map(|c| xs[i * k + c] * ws[j * k + c]).sum::<f64>();
    let size = |i: usize, j: usize| (0..k).map(|c| (xs[i * k + c] * ws[j * k + c]).abs()).sum::<f64>();
    // each result is the f32 sum rounded to bf16: within one bf16 step of the exact value's
    // rounding, plus the f32 sum's own error
    let within = |got: f64, want: f64, size: f64| {
        (got - round_bf16(want)).abs() <= want.abs() * 2f64.powi(-8) + (k + 1) as f64 * 2f64.powi(-24) * size
    };
    let y = x.matmul(&w.t().unwrap()).unwrap();
    assert_eq!(y.dtype(), DType::BF16);
    let ys = to_f64(&y);
    let lin = x.linear(&w, Some(&bias)).unwrap();
    assert_eq!(lin.dtype(), DType::BF16);
    let ls = to_f64(&lin);
    for i in 0..m {
        for j in 0..n {
            assert!(
                within(ys[i * n + j], exact(i, j), size(i, j)),
                "matmul ({i}, {j}): {} against {}",
                ys[i * n + j],
                exact(i, j)
            );
            let want = exact(i, j) + bs[j];
            assert!(
                within(ls[i * n + j], want, size(i, j) + bs[j].abs()),
                "linear ({i}, {j}): {} against {want}",
                ls[i * n + j]
            );
        }
    }
}

/// `a @ b` of bf16 views, against the product of the same values in f32 rounded to bf16: equal,
/// or one bf16 step apart where the f32 sums round differently.
fn matches_f32(what: &str, a: &Tensor, b: &Tensor) {
    let got = a.matmul(b).unwrap();
    let want = a
        .cast(DType::F32)
        .unwrap()
        .matmul(&b.cast(DType::F32).unwrap())
        .unwrap()
        .cast(DType::BF16)
        .unwrap();
    assert_eq!(got.shape(), want.shape(), "{what}");
    assert_eq!(got.dtype(), DType::BF16, "{what}");
    for (i, (g, w)) in got.to_vec_f64().iter().zip(want.to_vec_f64()).enumerate() {
        assert!(
            (g - w).abs() <= w.abs() * 2f64.powi(-7) + 1e-6,
            "{what}: element {i}: {g} against {w}"
        );
    }
}

#[test]
fn views_of_every_kind_multiply_as_their_values() {
    if !kernel_present() {
        return;
    }
    let t = |shape: &[usize], seed: u64| Tensor::from_vec(values(shape.iter().product(), seed), shape).unwrap();
    let a = t(&[3, 19, 40], 7);
    let b = t(&[40, 33], 8);
    matches_f32("batched rows against a matrix", &a, &b);
    matches_f32("a transposed operand", &t(&[40, 19], 9).t().unwrap(), &b);
    matches_f32(
        "both transposed",
        &t(&[40, 19], 9).t().unwrap(),
        &t(&[33, 40], 10).t().unwrap(),
    );
    // a row broadcast down the rows (stride 0), and a batch broadcast against batched matrices
    matches_f32("a broadcast row", &t(&[1, 40], 11).expand(&[25, 40]).unwrap(), &b);
    matches_f32(
        "a broadcast batch",
        &t(&[19, 40], 12).unsqueeze(0).unwrap().expand(&[4, 19, 40]).unwrap(),
        &t(&[4, 40, 33], 13),
    );
    // every other column of a wider matrix (inner stride 2), and a window of its rows
    let strided = t(&[19, 40, 2], 14).narrow(2, 1, 1).unwrap().squeeze(2).unwrap();
    assert_eq!(strided.layout().strides, [80, 2], "the view's strides");
    matches_f32("an inner stride of 2", &strided, &b);
    matches_f32("a window of rows", &t(&[50, 40], 15).narrow(0, 7, 30).unwrap(), &b);
    // empty sides
    matches_f32("no rows", &t(&[0, 40], 16), &b);
    matches_f32("no inner elements", &t(&[19, 0], 17), &t(&[0, 33], 18));
}

/// On AMX, a product whose inner dimension fits one block is rounded to bf16 as each block leaves
/// the tiles (`amx::gemm_parallel_rounded`, what bf16 `matmul` takes there): bit for bit the f32
/// product of the same kernel rounded afterwards, at every edge and in every storage order.
#[test]
fn products_rounded_from_the_tiles_equal_the_f32_products_rounded() {
    use weft_core::cpu::amx;
    if !amx::rounds_whole(1) {
        eprintln!("skipped: this CPU has no AMX (or WEFT_AMX=0)");
        return;
    }
    assert!(amx::rounds_whole(512) && !amx::rounds_whole(513) && !amx::rounds_whole(0));
    for &(m, n, k) in &[
        (1, 1, 1),
        (31, 33, 7),
        (32, 32, 32),
        (70, 100, 257),
        (300, 64, 512),
        (40, 1100, 96),
    ] {
        for (at, bt) in [(false, false), (false, true), (true, false), (true, true)] {
            let a = Stored::new(m, k, at, (m + 3 * k) as u64);
            let b = Stored::new(k, n, bt, (n + 5 * k) as u64);
            let mut wide = vec![0f32; m * n];
            // rows of n + 3: the three columns past each row must stay as they are
            let stride = n + 3;
            let guard = bf16::from_bits(0x7fc1);
            let mut rounded = vec![guard; m * stride];
            // SAFETY: the kernel is present (rounds_whole); the buffers hold the matrices.
            unsafe {
                bf16_gemm::gemm_parallel_with(
                    Kernel::Amx,
                    m,
                    n,
                    k,
                    MatMut {
                        ptr: wide.as_mut_ptr(),
                        row_stride: n as isize,
                        accumulate: false,
                    },
                    a.as_ref(),
                    b.as_ref(),
                );
                amx::gemm_parallel_rounded(
                    m,
                    n,
                    k,
                    MatMut {
                        ptr: rounded.as_mut_ptr(),
                        row_stride: stride as isize,
                        accumulate: false,
                    },
                    a.as_ref(),
                    b.as_ref(),
                );
            }
            for i in 0..m {
                for j in 0..stride {
                    let got = rounded[i * stride + j].to_bits();
                    let want = if j < n {
                        bf16::from_f32(wide[i * n + j]).to_bits()
                    } else {
                        guard.to_bits()
                    };
                    assert_eq!(
                        got, want,
                        "{m}x{k}x{n} (a transposed {at}, b transposed {bt}): ({i}, {j})"
                    );
                }
            }
        }
    }
}
