//! Products of a few rows against a matrix read down its columns: `dst[m, n] (=|+=) scale *
//! a[m, k] @ b[k, n]` where each row of `a` and each column of `b` is contiguous along `k` (`b`
//! is `w^T` for a weight `w [n, k]`, as a linear layer's forward reads it) and `m` is at most
//! [`MAX_ROWS`]: the projections of a decode step that runs a few sequences at once.
//!
//! The `gemm` crate packs `b` for such a product on every call, so its cost hardly falls with
//! the row count. Here each output element is the dot product of a row of `a` and a column of
//! `b`, accumulated in 16 lanes along `k` and then summed across the lanes in a fixed order, 4
//! rows by 4 columns (1 or 2 rows by 8) at a time with nothing packed. A linear layer's forward
//! (`x [m, k] @ w^T`, 2 threads, the development machine quiet; `cargo run --release -p
//! weft-core --example linear_rows [k] [n]`, binaries before and after alternated twice), in us:
//!
//! | m | k 256, n 768: crate | here | k 768, n 2304: crate | here |
//! |---:|---:|---:|---:|---:|
//! | 2 | 88-91 | 13 | 761-798 | 52-55 |
//! | 8 | 98-104 | 20-26 | 875-899 | 145-182 |
//! | 16 | 111-121 | 40-45 | 974-994 | 284-307 |
//! | 32 | 150-153 | 72-97 | 1246-1254 | 588-637 |
//! | 64 | 195-218 | 154-170 | 1853-1856 | 1149-1172 |
//!
//! At 128 rows and more the crate is as fast or faster (it reaches this core's FMA rate on
//! training shapes), hence [`MAX_ROWS`]. An element's value depends only on its row and column,
//! never on `m` or on the other rows: a sequence decoded in a batch gets, bit for bit, the values
//! it gets alone, as long as every product of the step has at most [`MAX_ROWS`] rows and the CPU
//! has AVX-512 (a prompt of more tokens than that, prefilled beside others, goes through the
//! crate, whose rounding depends on the rows around it).
//!
//! Only f32 on a CPU with AVX-512 takes this path ([`product_f32`] says whether it ran); anything
//! else stays with the `gemm` crate.

/// The most rows a product may have to run here.
pub const MAX_ROWS: usize = 64;

/// `dst[m, n] (=|+=) scale * a[m, k] @ b[k, n]`, row `i` of `a` at `a + i * a_rs` (contiguous
/// along k), column `j` of `b` at `b + j * b_cs` (contiguous along k), element `(i, j)` of `dst` at
/// `dst + i * dst_rs + j`. Returns false, having done nothing, when the CPU lacks AVX-512 or `m`
/// is above [`MAX_ROWS`].
///
/// # Safety
/// The pointers must be valid for every read and write the strides describe.
#[allow(clippy::too_many_arguments)]
pub unsafe fn product_f32(
    m: usize,
    n: usize,
    k: usize,
    a: *const f32,
    a_rs: usize,
    b: *const f32,
    b_cs: usize,
    dst: *mut f32,
    dst_rs: usize,
    accumulate: bool,
    scale: f32,
) -> bool {
    if m > MAX_ROWS {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        let p = Operands {
            k,
            a,
            a_rs,
            b,
            b_cs,
            dst,
            dst_rs,
            accumulate,
            scale,
        };
        // SAFETY: the CPU has AVX-512F; the caller vouches for the pointers.
        unsafe { avx512::product(m, n, &p) };
        return true;
    }
    let _ = (n, k, a, a_rs, b, b_cs, dst, dst_rs, accumulate, scale);
    false
}

/// The operands of one product (see [`product_f32`]).
#[derive(Clone, Copy)]
struct Operands {
    k: usize,
    a: *const f32,
    a_rs: usize,
    b: *const f32,
    b_cs: usize,
    dst: *mut f32,
    dst_rs: usize,
    accumulate: bool,
    scale: f32,
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::Operands;

    /// Rows of one block of outputs, and its columns: 4 x 4, or 8 columns for one or two rows
    /// (more columns streamed at once where few rows reuse each load of `b`).
    const ROWS: usize = 4;

    /// `block::<R, C>` for the runtime `c`, `C` up to `$max`.
    macro_rules! columns {
        ($r:literal, $c:expr, $i:expr, $j:expr, $p:expr, $($n:literal)*) => {
            match $c {
                $($n => block::<$r, $n>($i, $j, $p),)*
                _ => block::<$r, 1>($i, $j, $p),
            }
        };
    }

    /// Every output of the `m x n` product, in blocks of up to 4 x 4 (1 or 2 x 8).
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn product(m: usize, n: usize, p: &Operands) {
        for i in (0..m).step_by(ROWS) {
            let r = (m - i).min(ROWS);
            let width = if r <= 2 { 8 } else { 4 };
            for j in (0..n).step_by(width) {
                let c = (n - j).min(width);
                // SAFETY: rows i..i + r and columns j..j + c lie inside the product.
                unsafe {
                    match r {
                        4 => columns!(4, c, i, j, p, 4 3 2),
                        3 => columns!(3, c, i, j, p, 4 3 2),
                        2 => columns!(2, c, i, j, p, 8 7 6 5 4 3 2),
                        _ => columns!(1, c, i, j, p, 8 7 6 5 4 3 2),
                    }
                }
            }
        }
    }

    /// Outputs `(i..i + R, j..j + C)`: R x C sums of 16 lanes over k (the last piece of k
    /// masked), then each summed across its lanes.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn block<const R: usize, const C: usize>(i: usize, j: usize, p: &Operands) {
        let k = p.k;
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        // SAFETY (every load and store): inside the rows and columns the caller vouched for.
        unsafe {
            let a: [*const f32; R] = std::array::from_fn(|r| p.a.add((i + r) * p.a_rs));
            let b: [*const f32; C] = std::array::from_fn(|c| p.b.add((j + c) * p.b_cs));
            let mut q = 0;
            while q + 16 <= k {
                let bv: [__m512; C] = std::array::from_fn(|c| _mm512_loadu_ps(b[c].add(q)));
                for r in 0..R {
                    let av = _mm512_loadu_ps(a[r].add(q));
                    for c in 0..C {
                        acc[r][c] = _mm512_fmadd_ps(av, bv[c], acc[r][c]);
                    }
                }
                q += 16;
            }
            if q < k {
                let mask: __mmask16 = (1u32 << (k - q)) as u16 - 1;
                let bv: [__m512; C] = std::array::from_fn(|c| _mm512_maskz_loadu_ps(mask, b[c].add(q)));
                for r in 0..R {
                    let av = _mm512_maskz_loadu_ps(mask, a[r].add(q));
                    for c in 0..C {
                        acc[r][c] = _mm512_fmadd_ps(av, bv[c], acc[r][c]);
                    }
                }
            }
            for (r, row) in acc.iter().enumerate() {
                let out = p.dst.add((i + r) * p.dst_rs + j);
                for (c, v) in row.iter().enumerate() {
                    let sum = p.scale * _mm512_reduce_add_ps(*v);
                    let o = out.add(c);
                    *o = if p.accumulate { *o + sum } else { sum };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `a @ b` in f64, b given as columns (`cols[j * k + p]`).
    fn reference(m: usize, n: usize, k: usize, a: &[f32], cols: &[f32]) -> Vec<f64> {
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|p| a[i * k + p] as f64 * cols[j * k + p] as f64).sum();
            }
        }
        out
    }

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 7919 + seed * 104_729) % 2003) as f32 - 1001.0) * 1e-3)
            .collect()
    }

    #[test]
    fn products_of_every_block_shape_equal_the_reference() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("skipped: this CPU has no AVX-512 (the gemm crate keeps these products)");
            return;
        }
        for m in 1..=MAX_ROWS {
            for (n, k) in [(1, 1), (3, 7), (5, 16), (9, 17), (17, 33), (64, 256), (6, 300)] {
                let a = values(m * k, m + n);
                let cols = values(n * k, k);
                let want = reference(m, n, k, &a, &cols);
                for (accumulate, scale) in [(false, 1.0f32), (true, 0.5)] {
                    let before = values(m * n, 3);
                    let mut dst = before.clone();
                    // SAFETY: the buffers hold the m x k, n x k and m x n matrices.
                    let ran = unsafe {
                        product_f32(
                            m,
                            n,
                            k,
                            a.as_ptr(),
                            k,
                            cols.as_ptr(),
                            k,
                            dst.as_mut_ptr(),
                            n,
                            accumulate,
                            scale,
                        )
                    };
                    assert!(ran);
                    for (idx, (&got, &w)) in dst.iter().zip(&want).enumerate() {
                        let w = if accumulate {
                            before[idx] as f64 + scale as f64 * w
                        } else {
                            w
                        };
                        let tol = 1e-5 * (1.0 + w.abs()) * (k as f64).sqrt();
                        assert!((got as f64 - w).abs() <= tol, "m {m} n {n} k {k} [{idx}]: {got} vs {w}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_row_gets_the_same_bits_whatever_rows_run_with_it() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        let (n, k) = (23, 129);
        let cols = values(n * k, 1);
        let a = values(MAX_ROWS * k, 2);
        let mut all = vec![0.0f32; MAX_ROWS * n];
        // SAFETY: as above, with row strides of k and n
        unsafe {
            product_f32(
                MAX_ROWS,
                n,
                k,
                a.as_ptr(),
                k,
                cols.as_ptr(),
                k,
                all.as_mut_ptr(),
                n,
                false,
                1.0,
            )
        };
        for i in 0..MAX_ROWS {
            let mut one = vec![0.0f32; n];
            unsafe {
                product_f32(
                    1,
                    n,
                    k,
                    a[i * k..].as_ptr(),
                    k,
                    cols.as_ptr(),
                    k,
                    one.as_mut_ptr(),
                    n,
                    false,
                    1.0,
                )
            };
            assert_eq!(one, all[i * n..(i + 1) * n], "row {i}");
        }
        // rows and columns with gaps between them (strides above k and n)
        let (a_rs, b_cs, d_rs) = (k + 3, k + 5, n + 2);
        let a2: Vec<f32> = (0..4 * a_rs)
            .map(|x| {
                if x % a_rs < k {
                    a[(x / a_rs) * k + x % a_rs]
                } else {
                    f32::NAN
                }
            })
            .collect();
        let c2: Vec<f32> = (0..n * b_cs)
            .map(|x| {
                if x % b_cs < k {
                    cols[(x / b_cs) * k + x % b_cs]
                } else {
                    f32::NAN
                }
            })
            .collect();
        let mut d2 = vec![7.0f32; 4 * d_rs];
        unsafe {
            product_f32(
                4,
                n,
                k,
                a2.as_ptr(),
                a_rs,
                c2.as_ptr(),
                b_cs,
                d2.as_mut_ptr(),
                d_rs,
                false,
                1.0,
            )
        };
        for i in 0..4 {
            assert_eq!(d2[i * d_rs..i * d_rs + n], all[i * n..(i + 1) * n], "strided row {i}");
            assert!(
                d2[i * d_rs + n..(i + 1) * d_rs].iter().all(|&x| x == 7.0),
                "gap of row {i} untouched"
            );
        }
    }

    #[test]
    fn more_rows_than_the_limit_are_left_to_the_caller() {
        let mut dst = [0.0f32; 1];
        // SAFETY: nothing is read or written when it declines
        let ran = unsafe {
            product_f32(
                MAX_ROWS + 1,
                1,
                1,
                [1.0f32].as_ptr(),
                1,
                [1.0f32].as_ptr(),
                1,
                dst.as_mut_ptr(),
                1,
                false,
                1.0,
            )
        };
        assert!(!ran);
        assert_eq!(dst[0], 0.0);
    }
}
