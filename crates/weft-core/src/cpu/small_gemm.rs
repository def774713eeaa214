//! Products of small matrices (tens of rows and columns, as in one head's attention block),
//! computed in registers without packing: per tile of 8 rows x 32 columns, one pass over the
//! inner dimension keeps the 8 x 32 sums in vector registers (16 AVX-512 registers for f32), each
//! step broadcasting 8 elements of `a` against one 32-wide row of `b`. (Tiles of 4 rows, 8
//! registers, leave the two FMA units waiting on each other's latency: on the speed-target
//! attention, one thread, the forward took 367 us against 357 and forward + backward 1624 us
//! against 1494, medians of three alternating runs.) The portable loop, not measured with 8,
//! keeps tiles of 4 rows. The `gemm` crate packs both
//! operands first; on the speed-target GPT's heads (64 x 64 x 32 products) the attention forward took
//! 0.55 ms per call through it and 0.46 ms through these tiles together with 16-query causal tiles
//! (op timings over 800 calls, 2 threads).
//!
//! f32 on a CPU with AVX-512 takes the intrinsics path (fused multiply-adds, masked loads and
//! stores for the last columns); other types and CPUs the portable loop.

use super::matmul::{gemm, mat, MatMut, MatRef};
use crate::dtype::Float;

/// Products of at least this many multiply-adds go to the `gemm` crate, where packing pays off:
/// the attention benchmark (T = 512) ran at about 145 GFLOP/s with every product here and at 190
/// with the large ones there, as before these tiles.
const LARGE: usize = 1 << 17;

/// Columns per tile.
const NR: usize = 32;
/// Rows per tile: with AVX-512, and in the portable loop.
#[cfg(target_arch = "x86_64")]
const MR_AVX512: usize = 8;
const MR_PORTABLE: usize = 4;

/// `$body` with `$R` a constant equal to `$rows` (1 to 8): the tile kernels take their row count
/// as a const parameter, so the sums stay in registers.
macro_rules! with_rows {
    ($rows:expr, $R:ident => $body:expr) => {
        with_rows!(@arms $rows, $R, $body, 8 7 6 5 4 3 2)
    };
    (@arms $rows:expr, $R:ident, $body:expr, $($n:literal)*) => {
        match $rows {
            $($n => {
                const $R: usize = $n;
                $body
            })*
            _ => {
                const $R: usize = 1;
                $body
            }
        }
    };
}

/// The left operand: element `(i, p)` at `data[i * row_stride + p * col_stride]` (any strides,
/// so a transpose is read in place).
#[derive(Clone, Copy)]
pub struct Lhs<'a, T> {
    pub data: &'a [T],
    pub row_stride: usize,
    pub col_stride: usize,
}

/// The right operand: row `p` at `data[p * row_stride..]`, its columns contiguous.
#[derive(Clone, Copy)]
pub struct Rhs<'a, T> {
    pub data: &'a [T],
    pub row_stride: usize,
}

impl<'a, T> Lhs<'a, T> {
    /// A row-major matrix whose rows are `row_stride` apart.
    pub fn rows(data: &'a [T], row_stride: usize) -> Self {
        Lhs {
            data,
            row_stride,
            col_stride: 1,
        }
    }

    /// The transpose of a row-major matrix whose rows are `row_stride` apart, read in place.
    pub fn transposed(data: &'a [T], row_stride: usize) -> Self {
        Lhs {
            data,
            row_stride: 1,
            col_stride: row_stride,
        }
    }
}

impl<'a, T> Rhs<'a, T> {
    /// A row-major matrix whose rows are `row_stride` apart.
    pub fn rows(data: &'a [T], row_stride: usize) -> Self {
        Rhs { data, row_stride }
    }
}

/// The output: row `i` at `ptr + i * row_stride`, its columns contiguous.
#[derive(Clone, Copy)]
pub struct Out<T> {
    pub ptr: *mut T,
    pub row_stride: usize,
}

/// `out[m, n] = alpha * a[m, k] b[k, n]`, or `+=` with `accumulate`.
///
/// # Safety
/// `out` must be valid for reads and writes of `n` elements at each of its `m` rows, and no other
/// thread may access those elements during the call. Panics (before any write) if `a` or `b` is
/// too short for the sizes.
#[allow(clippy::too_many_arguments)]
pub unsafe fn product<T: Float + Default>(
    m: usize,
    n: usize,
    k: usize,
    a: Lhs<T>,
    b: Rhs<T>,
    out: Out<T>,
    alpha: T,
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k > 0 {
        assert!(
            (m - 1) * a.row_stride + (k - 1) * a.col_stride < a.data.len(),
            "small_gemm: lhs too short"
        );
        assert!((k - 1) * b.row_stride + n <= b.data.len(), "small_gemm: rhs too short");
    }
    if m * n * k >= LARGE {
        // big enough for packing to pay off (long sequences): the gemm crate
        let dst = MatMut {
            ptr: out.ptr,
            row_stride: out.row_stride as isize,
            accumulate,
        };
        let lhs = MatRef {
            ptr: a.data.as_ptr(),
            row_stride: a.row_stride as isize,
            col_stride: a.col_stride as isize,
        };
        // SAFETY: operand bounds checked above; `out` is the caller's.
        return unsafe { gemm(m, n, k, dst, lhs, mat(b.data, b.row_stride), T::from_f64(1.0), alpha) };
    }
    match (
        crate::cpu::f32_view::as_f32(a.data),
        crate::cpu::f32_view::as_f32(b.data),
    ) {
        (Some(af), Some(bf)) => {
            let a = Lhs {
                data: af,
                row_stride: a.row_stride,
                col_stride: a.col_stride,
            };
            let b = Rhs {
                data: bf,
                row_stride: b.row_stride,
            };
            let out = Out {
                ptr: out.ptr as *mut f32,
                row_stride: out.row_stride,
            };
            let alpha = crate::cpu::f32_view::as_f32(std::slice::from_ref(&alpha)).expect("T is f32")[0];
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F; the bounds were checked above, `out` is the caller's.
                return unsafe { avx512::product(m, n, k, a, b, out, alpha, accumulate) };
            }
            product_body(m, n, k, a, b, out, alpha, accumulate)
        }
        _ => product_body(m, n, k, a, b, out, alpha, accumulate),
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Lhs, Out, Rhs};
    use std::arch::x86_64::*;

    /// Mask of the first `w` (<= 16) lanes.
    #[inline(always)]
    fn lanes(w: usize) -> __mmask16 {
        ((1u32 << w.min(16)) - 1) as __mmask16
    }

    /// # Safety
    /// AVX-512F present; as `super::product` with the bounds checked.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn product(
        m: usize,
        n: usize,
        k: usize,
        a: Lhs<f32>,
        b: Rhs<f32>,
        out: Out<f32>,
        alpha: f32,
        accumulate: bool,
    ) {
        super::tiles(m, n, super::MR_AVX512, |i, j, rows, w| {
            // SAFETY: the tile lies inside the checked operands and the caller's output.
            with_rows!(rows, R => unsafe { tile::<R>(i, j, w, k, a, b, out, alpha, accumulate) })
        });
    }

    /// Rows `i..i + R`, columns `j..j + w` (`w <= 32`) of the product.
    #[target_feature(enable = "avx512f")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const R: usize>(
        i: usize,
        j: usize,
        w: usize,
        k: usize,
        a: Lhs<f32>,
        b: Rhs<f32>,
        out: Out<f32>,
        alpha: f32,
        accumulate: bool,
    ) {
        let (m0, m1) = (lanes(w), lanes(w.saturating_sub(16)));
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        let (ap, bp) = (a.data.as_ptr(), b.data.as_ptr());
        for p in 0..k {
            // SAFETY: masked loads touch only columns j..j + w of row p, inside b.
            let (b0, b1) = unsafe {
                let row = bp.wrapping_add(p * b.row_stride + j);
                (
                    _mm512_maskz_loadu_ps(m0, row),
                    _mm512_maskz_loadu_ps(m1, row.wrapping_add(16)),
                )
            };
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: element (i + r, p) of a, checked by the caller.
                let av = _mm512_set1_ps(unsafe { *ap.add((i + r) * a.row_stride + p * a.col_stride) });
                acc[0] = _mm512_fmadd_ps(av, b0, acc[0]);
                acc[1] = _mm512_fmadd_ps(av, b1, acc[1]);
            }
        }
        let al = _mm512_set1_ps(alpha);
        for (r, acc) in acc.iter().enumerate() {
            // SAFETY: columns j..j + w of row i + r of out, the caller's.
            unsafe {
                let o = out.ptr.add((i + r) * out.row_stride + j);
                let (mut v0, mut v1) = (_mm512_mul_ps(al, acc[0]), _mm512_mul_ps(al, acc[1]));
                if accumulate {
                    v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, o), v0);
                    v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, o.wrapping_add(16)), v1);
                }
                _mm512_mask_storeu_ps(o, m0, v0);
                _mm512_mask_storeu_ps(o.wrapping_add(16), m1, v1);
            }
        }
    }
}

/// # Safety
/// As [`product`], with the bounds of `a` and `b` already checked.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn product_body<T: Float>(
    m: usize,
    n: usize,
    k: usize,
    a: Lhs<T>,
    b: Rhs<T>,
    out: Out<T>,
    alpha: T,
    accumulate: bool,
) {
    tiles(m, n, MR_PORTABLE, |i, j, rows, w| {
        let t = Tile {
            i,
            j,
            w,
            k,
            alpha,
            accumulate,
        };
        // SAFETY: as this function's contract; the tile lies inside the product.
        with_rows!(rows, R => unsafe { t.run::<R>(a, b, out) })
    });
}

/// Calls `f(i, j, rows, w)` for each output tile of an `m x n` product, row block by row block:
/// `rows <= mr` (at most 8) rows from `i`, `w <= NR` columns from `j`.
#[inline(always)]
fn tiles(m: usize, n: usize, mr: usize, mut f: impl FnMut(usize, usize, usize, usize)) {
    let mut i = 0;
    while i < m {
        let rows = (m - i).min(mr);
        let mut j = 0;
        while j < n {
            let w = (n - j).min(NR);
            f(i, j, rows, w);
            j += w;
        }
        i += rows;
    }
}

/// One output tile: rows `i..i + R`, columns `j..j + w` (`w <= NR`).
#[derive(Clone, Copy)]
struct Tile<T> {
    i: usize,
    j: usize,
    w: usize,
    k: usize,
    alpha: T,
    accumulate: bool,
}

impl<T: Float> Tile<T> {
    /// # Safety
    /// As [`product_body`]; the tile lies inside the product.
    #[inline(always)]
    unsafe fn run<const R: usize>(self, a: Lhs<T>, b: Rhs<T>, out: Out<T>) {
        let Tile {
            i,
            j,
            w,
            k,
            alpha,
            accumulate,
        } = self;
        let mut acc = [[T::zero(); NR]; R];
        let (ap, bp) = (a.data.as_ptr(), b.data.as_ptr());
        let mut brow = [T::zero(); NR];
        for p in 0..k {
            // SAFETY: `product` checked that every (row, p) of a and the first n columns of every
            // row p of b are in bounds; the tile's columns j..j + w are among them.
            unsafe {
                let src = bp.add(p * b.row_stride + j);
                if w == NR {
                    std::ptr::copy_nonoverlapping(src, brow.as_mut_ptr(), NR);
                } else {
                    std::ptr::copy_nonoverlapping(src, brow.as_mut_ptr(), w);
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let av = *ap.add((i + r) * a.row_stride + p * a.col_stride);
                    for (s, &bv) in acc.iter_mut().zip(brow.iter()) {
                        *s += av * bv;
                    }
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            // SAFETY: the caller guarantees rows i..i+R, columns j..j+w of out are ours.
            let row = unsafe { std::slice::from_raw_parts_mut(out.ptr.add((i + r) * out.row_stride + j), w) };
            if accumulate {
                for (o, &s) in row.iter_mut().zip(acc.iter()) {
                    *o += alpha * s;
                }
            } else {
                for (o, &s) in row.iter_mut().zip(acc.iter()) {
                    *o = alpha * s;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check<T: Float + Default + std::fmt::Debug>(m: usize, n: usize, k: usize, transposed_a: bool, tol: f64) {
        let a: Vec<T> = (0..m * k)
            .map(|x| T::from_f64(((x * 7 % 13) as f64 - 6.0) / 5.0))
            .collect();
        let b: Vec<T> = (0..k * (n + 3))
            .map(|x| T::from_f64(((x * 5 % 11) as f64 - 5.0) / 3.0))
            .collect();
        let mut c: Vec<T> = (0..m * (n + 1)).map(|x| T::from_f64(x as f64 / 10.0)).collect();
        let before = c.clone();
        let (rs, cs) = if transposed_a { (1, m) } else { (k, 1) };
        let lhs = Lhs {
            data: &a,
            row_stride: rs,
            col_stride: cs,
        };
        let rhs = Rhs {
            data: &b,
            row_stride: n + 3,
        };
        let out = Out {
            ptr: c.as_mut_ptr(),
            row_stride: n + 1,
        };
        // SAFETY: c holds m rows of n + 1.
        unsafe { product(m, n, k, lhs, rhs, out, T::from_f64(0.5), true) };
        for i in 0..m {
            for j in 0..n + 1 {
                let mut s = 0.0;
                for p in 0..k {
                    s += a[i * rs + p * cs].to_f64() * b[p * (n + 3) + j].to_f64();
                }
                let want = before[i * (n + 1) + j].to_f64() + if j < n { 0.5 * s } else { 0.0 };
                let got = c[i * (n + 1) + j].to_f64();
                assert!(
                    (got - want).abs() <= tol * (1.0 + want.abs()),
                    "{m}x{n}x{k} ({i},{j}): {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn matches_the_definition_at_every_edge() {
        // (64, 64, 32) and the last two are large enough to go to the gemm crate
        for &(m, n, k) in &[
            (1, 1, 1),
            (4, 32, 8),
            (5, 33, 7),
            (64, 64, 32),
            (3, 70, 1),
            (9, 16, 0),
            (7, 31, 65),
            (13, 40, 12),
            (16, 64, 32),
            (6, 5, 3),
            (64, 64, 40),
            (40, 70, 64),
        ] {
            for t in [false, true] {
                check::<f32>(m, n, k, t, 1e-5);
                check::<f64>(m, n, k, t, 1e-12);
            }
        }
    }
}
