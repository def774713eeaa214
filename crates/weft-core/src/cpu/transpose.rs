//! Out-of-place transpose of a strided matrix: `dst[c * dst_stride + r] = src[r * src_stride + c]`.
//!
//! Element by element, a transpose is one strided scalar load and one store per element (it was
//! a sixth of attention's time, which transposes each problem's keys and values). With AVX-512,
//! f32 goes in 16 x 16 blocks through registers: 16 row loads, 64 shuffles, 16 row stores.

/// Transposes the `rows x cols` matrix at `src` (rows `src_stride` apart) into `dst` (`cols` rows
/// of `rows`, `dst_stride` apart).
///
/// # Panics
/// If either slice is too short for its matrix.
pub fn transpose<T: Copy + 'static>(
    src: &[T],
    src_stride: usize,
    rows: usize,
    cols: usize,
    dst: &mut [T],
    dst_stride: usize,
) {
    if rows == 0 || cols == 0 {
        return;
    }
    let src = &src[..(rows - 1) * src_stride + cols];
    let dst = &mut dst[..(cols - 1) * dst_stride + rows];
    // the rows and columns the register blocks covered (none without AVX-512)
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let (mut r0, mut c0) = (0, 0);
    #[cfg(target_arch = "x86_64")]
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() && std::arch::is_x86_feature_detected!("avx512f") {
        (r0, c0) = (rows / 16 * 16, cols / 16 * 16);
        for r in (0..r0).step_by(16) {
            for c in (0..c0).step_by(16) {
                // SAFETY: the block's 16 rows of 16 lie inside `src` (r + 15 < rows, c + 15 < cols)
                // and its 16 columns inside `dst`, both checked by the slicing above; T is f32.
                unsafe {
                    avx512::block16(
                        src.as_ptr().add(r * src_stride + c) as *const f32,
                        src_stride,
                        dst.as_mut_ptr().add(c * dst_stride + r) as *mut f32,
                        dst_stride,
                    )
                };
            }
        }
    }
    // what the blocks left: the columns right of them (all rows), then the rows below them
    scalar(src, src_stride, 0..rows, c0..cols, dst, dst_stride);
    scalar(src, src_stride, r0..rows, 0..c0, dst, dst_stride);
}

fn scalar<T: Copy>(
    src: &[T],
    src_stride: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    dst: &mut [T],
    dst_stride: usize,
) {
    for c in cols {
        for r in rows.clone() {
            dst[c * dst_stride + r] = src[r * src_stride + c];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// One 16 x 16 block. Rows `a, b, ...` become, by interleaving 32-bit elements of row
    /// pairs, then 64-bit pairs of those, 128-bit lanes holding four rows of one column; two
    /// rounds of 128-bit lane shuffles then gather each column's four lanes.
    ///
    /// # Safety
    /// AVX-512F present; 16 rows of 16 readable at `src`, 16 rows of 16 writable at `dst`.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn block16(src: *const f32, src_stride: usize, dst: *mut f32, dst_stride: usize) {
        let mut r = [_mm512_setzero_ps(); 16];
        for (i, r) in r.iter_mut().enumerate() {
            // SAFETY: row i of the block (the caller's promise).
            *r = unsafe { _mm512_loadu_ps(src.add(i * src_stride)) };
        }
        // per 128-bit lane l: lo = a[4l] b[4l] a[4l+1] b[4l+1], hi = a[4l+2] b[4l+2] ...
        let mut t = [_mm512_setzero_ps(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
        }
        // u[4g + j], for rows 4g..4g+4: lane l holds those rows of column 4l + j
        let mut u = [_mm512_setzero_ps(); 16];
        for g in 0..4 {
            let (lo_ab, hi_ab, lo_cd, hi_cd) = (t[4 * g], t[4 * g + 1], t[4 * g + 2], t[4 * g + 3]);
            let pd = |x: __m512| _mm512_castps_pd(x);
            u[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(lo_ab), pd(lo_cd)));
            u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(lo_ab), pd(lo_cd)));
            u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(hi_ab), pd(hi_cd)));
            u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(hi_ab), pd(hi_cd)));
        }
        for j in 0..4 {
            // columns j, 4 + j, 8 + j, 12 + j
            let (g0, g1, g2, g3) = (u[j], u[4 + j], u[8 + j], u[12 + j]);
            let v_even = _mm512_shuffle_f32x4::<0x88>(g0, g1); // cols j, 8+j of rows 0-7
            let v_odd = _mm512_shuffle_f32x4::<0xdd>(g0, g1); // cols 4+j, 12+j of rows 0-7
            let w_even = _mm512_shuffle_f32x4::<0x88>(g2, g3); // the same of rows 8-15
            let w_odd = _mm512_shuffle_f32x4::<0xdd>(g2, g3);
            let cols = [
                (j, _mm512_shuffle_f32x4::<0x88>(v_even, w_even)),
                (8 + j, _mm512_shuffle_f32x4::<0xdd>(v_even, w_even)),
                (4 + j, _mm512_shuffle_f32x4::<0x88>(v_odd, w_odd)),
                (12 + j, _mm512_shuffle_f32x4::<0xdd>(v_odd, w_odd)),
            ];
            for (c, v) in cols {
                // SAFETY: column c of the block is row c of the destination block.
                unsafe { _mm512_storeu_ps(dst.add(c * dst_stride), v) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::transpose;

    #[test]
    fn matches_definition_at_every_edge() {
        for (rows, cols) in [(16, 16), (64, 32), (17, 33), (5, 40), (40, 5), (1, 1), (0, 3), (31, 47)] {
            let src_stride = cols + 3;
            let dst_stride = rows + 5;
            let src: Vec<f32> = (0..rows * src_stride).map(|i| i as f32).collect();
            let mut dst = vec![-1.0f32; cols * dst_stride];
            transpose(&src, src_stride, rows, cols, &mut dst, dst_stride);
            for c in 0..cols {
                for r in 0..dst_stride {
                    let want = if r < rows { src[r * src_stride + c] } else { -1.0 };
                    assert_eq!(dst[c * dst_stride + r], want, "{rows}x{cols}: dst[{c}][{r}]");
                }
            }
            // f64 takes the element-by-element path
            let src64: Vec<f64> = src.iter().map(|&v| v as f64).collect();
            let mut dst64 = vec![-1.0f64; cols * dst_stride];
            transpose(&src64, src_stride, rows, cols, &mut dst64, dst_stride);
            assert!(dst64.iter().zip(&dst).all(|(&a, &b)| a == b as f64));
        }
    }
}
