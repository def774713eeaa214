//! Matrix products of bf16 operands into f32, on CPUs with AVX-512 BF16 (`vdpbf16ps`: 16 lanes,
//! each adding two products of bf16 pairs to an f32 accumulator per instruction, twice the
//! multiply-adds of an f32 fused multiply-add of the same width).
//!
//! Without it, a bf16 product converts both operands to f32 and runs the f32 `gemm`
//! (`crate::ops::matmul`); with it, the operands are read as they are: B packed in pairs along
//! the inner dimension (BLIS's packing, Van Zee and van de Geijn, "BLIS: A Framework for Rapidly
//! Instantiating BLAS Functionality", TOMS 2015), A read in place where its rows are contiguous
//! (each pair one word in memory) and packed the same way where not, and multiplied by an
//! 8 x 32 microkernel. The products of two bf16 values are exact in f32, and each is added to
//! its accumulator with one rounding, as an f32 fused multiply-add of the converted operands
//! would be; what differs is the order of the additions (pairs `2p + 1` then `2p` of each block
//! of [`KC`], blocks in order) and that the instruction treats subnormal inputs as zero and
//! flushes subnormal results to zero, as PyTorch's CPU bf16 products (oneDNN) do on the same
//! instruction.

use super::matmul::{Block, MatMut, MatRef};
use half::bf16;

/// Rows of the microkernel's tile.
const MR: usize = 8;
/// Vectors of 16 f32 lanes across the microkernel's tile.
const NV: usize = 2;
/// Columns of the microkernel's tile (and of a packed panel of B).
pub(super) const NR: usize = 16 * NV;
/// Inner-dimension elements per packed block (an even number: 128 pairs; a packed column panel
/// of B is then `KC / 2 x NR` pairs, 16 KiB, half this core's L1 data cache).
const KC: usize = 256;
/// Rows of A packed at once (`MC x KC` bf16, 64 KiB, in L2).
const MC: usize = 128;
/// Columns of B packed at once (`KC x NC` bf16, 512 KiB, in L2): a wide B (an output layer over
/// a large vocabulary) is packed a block at a time, not whole per thread.
const NC: usize = 1024;
/// Products of fewer multiply-adds than this run on the calling thread.
const PARALLEL_MIN: usize = 1 << 15;

/// The kernels that multiply bf16 matrices into f32 on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// `vdpbf16ps` on AVX-512 vectors (this module's microkernel).
    Avx512Bf16,
    /// `tdpbf16ps` on AMX tiles ([`super::amx`]).
    Amx,
}

impl Kernel {
    /// The fastest kernel this CPU runs (AMX where [`super::amx::available`], else AVX-512 BF16),
    /// used by every bf16 product of the process; None without AVX-512 BF16.
    pub fn best() -> Option<Kernel> {
        if super::amx::available() {
            Some(Kernel::Amx)
        } else if available() {
            Some(Kernel::Avx512Bf16)
        } else {
            None
        }
    }

    /// Every kernel this CPU runs (for tests that compare them).
    pub fn all_available() -> Vec<Kernel> {
        let mut all = Vec::new();
        if available() {
            all.push(Kernel::Avx512Bf16);
        }
        if super::amx::available() {
            all.push(Kernel::Amx);
        }
        all
    }

    /// Output rows per microkernel tile.
    fn tile_rows(self) -> usize {
        match self {
            Kernel::Avx512Bf16 => MR,
            Kernel::Amx => super::amx::ROWS,
        }
    }
}

/// Whether this CPU runs a native kernel (AVX-512 F and BF16), checked once.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *HAS.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bf16")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `dst[M, N] (=|+=) a[M, K] @ b[K, N]`, bf16 operands and an f32 result, on the compute pool
/// with [`Kernel::best`]: one block of rows (or of columns, when there are fewer rows than
/// columns) per thread, then `then(block)` on each block right after its product (as
/// [`super::matmul::gemm_parallel_then`]). A small product, or one started inside a pool task,
/// runs on the calling thread.
///
/// # Safety
/// [`available`] must be true. `dst` must be valid for writes of an `m x n` matrix at its stride
/// (its columns adjacent), and `a`/`b` valid for every strided read of an `m x k` / `k x n`
/// matrix.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_parallel_then(
    m: usize,
    n: usize,
    k: usize,
    dst: MatMut<f32>,
    a: MatRef<bf16>,
    b: MatRef<bf16>,
    then: impl Fn(Block<f32>) + Sync,
) {
    let kernel = Kernel::best().expect("bf16_gemm::gemm_parallel_then without AVX-512 BF16");
    // SAFETY: as the caller promises.
    unsafe { gemm_parallel_then_with(kernel, m, n, k, dst, a, b, then) }
}

/// [`gemm_parallel_then`] on a given kernel.
///
/// # Safety
/// As [`gemm_parallel_then`], and `kernel` is one of [`Kernel::all_available`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_parallel_then_with(
    kernel: Kernel,
    m: usize,
    n: usize,
    k: usize,
    dst: MatMut<f32>,
    a: MatRef<bf16>,
    b: MatRef<bf16>,
    then: impl Fn(Block<f32>) + Sync,
) {
    let (along_rows, chunk) = split(kernel, m, n, k);
    // SAFETY: `gemm` writes only its block; the rest as the caller promises.
    unsafe {
        super::matmul::for_each_block(
            m,
            n,
            dst,
            a,
            b,
            along_rows,
            chunk,
            |rows, cols, d, a, b| gemm_with(kernel, rows, cols, k, d, a, b),
            then,
        )
    }
}

/// How a product is cut over the pool: blocks of rows (true) or of columns, and their length. One
/// block for a small product or one started inside a pool task; else one block per thread of the
/// longer side, at least 16 long, rounded to whole tiles of `kernel` where there are enough.
pub(super) fn split(kernel: Kernel, m: usize, n: usize, k: usize) -> (bool, usize) {
    let threads = super::threads::num_threads();
    let (along_rows, pieces) = if super::pool::in_task() || m.saturating_mul(n).saturating_mul(k) < PARALLEL_MIN {
        (true, 1)
    } else {
        (m >= n, threads.min(m.max(n) / 16).max(1))
    };
    let len = if along_rows { m } else { n };
    let tile = if along_rows { kernel.tile_rows() } else { NR };
    (along_rows, len.div_ceil(pieces).next_multiple_of(tile).min(len.max(1)))
}

/// [`gemm_parallel_then`] with nothing after each block.
///
/// # Safety
/// As [`gemm_parallel_then`].
pub unsafe fn gemm_parallel(m: usize, n: usize, k: usize, dst: MatMut<f32>, a: MatRef<bf16>, b: MatRef<bf16>) {
    // SAFETY: as the caller promises.
    unsafe { gemm_parallel_then(m, n, k, dst, a, b, |_| {}) }
}

/// [`gemm_parallel`] on a given kernel.
///
/// # Safety
/// As [`gemm_parallel_then_with`].
pub unsafe fn gemm_parallel_with(
    kernel: Kernel,
    m: usize,
    n: usize,
    k: usize,
    dst: MatMut<f32>,
    a: MatRef<bf16>,
    b: MatRef<bf16>,
) {
    // SAFETY: as the caller promises.
    unsafe { gemm_parallel_then_with(kernel, m, n, k, dst, a, b, |_| {}) }
}

/// Packs lines `i0..i0 + count` of `mat` (an `[lines, k]` matrix: the rows of A, or the columns
/// of B read as the rows of B^T), inner elements `c0..c0 + kc` (`c0 + kc <= k`), into panels of
/// `width` lines: panel `q` holds, for each pair `p`, the `width` words
/// `mat[line, c0 + 2p] | mat[line, c0 + 2p + 1] << 16` (lines past `count`, and the second
/// half of the last pair when `kc` is odd, are zero), and then zero pairs up to a multiple of
/// `pad` pairs (a panel is `kc.div_ceil(2).next_multiple_of(pad) * width` words).
///
/// # Safety
/// Every element `(i0 + l, c0 + c)` with `l < count`, `c < kc` lies inside `mat`'s storage.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pack_pairs(
    mat: MatRef<bf16>,
    i0: usize,
    count: usize,
    c0: usize,
    kc: usize,
    width: usize,
    pad: usize,
    out: &mut Vec<u32>,
) {
    let full = kc / 2;
    // pairs per panel, the padding included
    let pairs = kc.div_ceil(2).next_multiple_of(pad);
    let panels = count.div_ceil(width);
    out.clear();
    out.resize(panels * pairs * width, 0);
    let base = mat.ptr.cast::<u16>();
    let (rs, cs) = (mat.row_stride, mat.col_stride);
    // SAFETY (every read below): (line, c) with line < i0 + count and c < c0 + kc, inside `mat`
    // as the caller promises.
    let elem = |line: usize, c: usize| unsafe { u32::from(*base.offset(line as isize * rs + c as isize * cs)) };
    for panel in 0..panels {
        let dst = &mut out[panel * pairs * width..(panel + 1) * pairs * width];
        let first = i0 + panel * width;
        let lines = width.min(count - panel * width);
        if cs == 1 {
            // a pair is one word in memory (bf16 little-endian: the first element in the low half)
            for l in 0..lines {
                // SAFETY: as above; `read_unaligned` of the two elements of a full pair.
                let line = unsafe { base.offset((first + l) as isize * rs + c0 as isize) };
                for p in 0..full {
                    dst[p * width + l] = unsafe { line.add(2 * p).cast::<u32>().read_unaligned() };
                }
            }
        } else if rs == 1 {
            // the panel's lines are adjacent: each pair interleaves two runs of elements
            for p in 0..full {
                // SAFETY: as above.
                let (lo, hi) = unsafe {
                    let lo = base.offset((c0 + 2 * p) as isize * cs + first as isize);
                    (lo, lo.offset(cs))
                };
                for (l, d) in dst[p * width..p * width + lines].iter_mut().enumerate() {
                    *d = unsafe { u32::from(*lo.add(l)) | (u32::from(*hi.add(l)) << 16) };
                }
            }
        } else {
            for l in 0..lines {
                for p in 0..full {
                    dst[p * width + l] = elem(first + l, c0 + 2 * p) | (elem(first + l, c0 + 2 * p + 1) << 16);
                }
            }
        }
        if !kc.is_multiple_of(2) {
            for l in 0..lines {
                dst[full * width + l] = elem(first + l, c0 + kc - 1);
            }
        }
    }
}

/// [`pack_pairs`] compiled for AVX-512, where its loops over adjacent elements vectorize.
///
/// # Safety
/// As [`pack_pairs`], on a CPU with AVX-512 F and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
#[allow(clippy::too_many_arguments)]
unsafe fn pack_pairs_v4(
    mat: MatRef<bf16>,
    i0: usize,
    count: usize,
    c0: usize,
    kc: usize,
    width: usize,
    pad: usize,
    out: &mut Vec<u32>,
) {
    // SAFETY: as the caller promises.
    unsafe { pack_pairs(mat, i0, count, c0, kc, width, pad, out) }
}

/// [`pack_pairs`] on the widest vector unit this CPU has.
///
/// # Safety
/// As [`pack_pairs`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn pack(
    mat: MatRef<bf16>,
    i0: usize,
    count: usize,
    c0: usize,
    kc: usize,
    width: usize,
    pad: usize,
    out: &mut Vec<u32>,
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512bw") {
        // SAFETY: the CPU has AVX-512 BW (and F, which the kernel needs anyway); the rest as
        // the caller promises.
        return unsafe { pack_pairs_v4(mat, i0, count, c0, kc, width, pad, out) };
    }
    // SAFETY: as the caller promises.
    unsafe { pack_pairs(mat, i0, count, c0, kc, width, pad, out) }
}

/// Packs rows `r0..r0 + rows` of `a` into panels of [`MR`] rows ([`pack_pairs`]).
unsafe fn pack_a(a: MatRef<bf16>, r0: usize, rows: usize, c0: usize, kc: usize, out: &mut Vec<u32>) {
    // SAFETY: as the caller of `gemm` promises.
    unsafe { pack(a, r0, rows, c0, kc, MR, 1, out) }
}

/// Packs columns `0..n` of `b` into panels of [`NR`] columns ([`pack_pairs`] of b^T).
unsafe fn pack_b(b: MatRef<bf16>, n: usize, c0: usize, kc: usize, out: &mut Vec<u32>) {
    let bt = MatRef {
        ptr: b.ptr,
        row_stride: b.col_stride,
        col_stride: b.row_stride,
    };
    // SAFETY: as the caller of `gemm` promises.
    unsafe { pack(bt, 0, n, c0, kc, NR, 1, out) }
}

/// `dst (=|+=) a @ b` on the calling thread, with [`Kernel::best`].
///
/// # Safety
/// As [`gemm_parallel_then`].
pub unsafe fn gemm(m: usize, n: usize, k: usize, dst: MatMut<f32>, a: MatRef<bf16>, b: MatRef<bf16>) {
    let kernel = Kernel::best().expect("bf16_gemm::gemm without AVX-512 BF16");
    // SAFETY: as the caller promises.
    unsafe { gemm_with(kernel, m, n, k, dst, a, b) }
}

/// `dst (=|+=) a @ b` on the calling thread, with `kernel`.
///
/// # Safety
/// As [`gemm_parallel_then_with`].
pub unsafe fn gemm_with(
    kernel: Kernel,
    m: usize,
    n: usize,
    k: usize,
    dst: MatMut<f32>,
    a: MatRef<bf16>,
    b: MatRef<bf16>,
) {
    // SAFETY: as the caller promises.
    unsafe {
        match kernel {
            Kernel::Avx512Bf16 => gemm_avx512(m, n, k, dst, a, b),
            Kernel::Amx => super::amx::gemm(m, n, k, dst, a, b),
        }
    }
}

/// `dst (=|+=) a @ b` on the calling thread, with the `vdpbf16ps` microkernel.
///
/// # Safety
/// As [`gemm_parallel_then`].
pub(super) unsafe fn gemm_avx512(m: usize, n: usize, k: usize, dst: MatMut<f32>, a: MatRef<bf16>, b: MatRef<bf16>) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !dst.accumulate {
            for i in 0..m {
                // SAFETY: row i of dst, inside the matrix the caller vouched for.
                unsafe { std::slice::from_raw_parts_mut(dst.ptr.offset(i as isize * dst.row_stride), n) }.fill(0.0);
            }
        }
        return;
    }
    let (mut ap, mut bp) = (Vec::new(), Vec::new());
    for j0 in (0..n).step_by(NC) {
        let nc = NC.min(n - j0);
        // columns j0.. of b (j0 < n: inside the matrix)
        let bj = MatRef {
            ptr: b.ptr.wrapping_offset(j0 as isize * b.col_stride),
            ..b
        };
        for c0 in (0..k).step_by(KC) {
            let kc = KC.min(k - c0);
            let pairs = kc.div_ceil(2);
            // the first block overwrites dst unless the product adds to it
            let load = dst.accumulate || c0 > 0;
            // SAFETY: the operands as the caller promises.
            unsafe { pack_b(bj, nc, c0, kc, &mut bp) };
            // rows whose pairs lie side by side in memory are read in place (a whole number of
            // pairs: an odd last block is packed, its padding zero)
            let direct = a.col_stride == 1 && kc.is_multiple_of(2);
            for r0 in (0..m).step_by(MC) {
                let mc = MC.min(m - r0);
                if !direct {
                    // SAFETY: as above.
                    unsafe { pack_a(a, r0, mc, c0, kc, &mut ap) };
                }
                for (jp, bpanel) in bp.chunks_exact(pairs * NR).enumerate() {
                    let cols = NR.min(nc - jp * NR);
                    for ip in 0..mc.div_ceil(MR) {
                        let rows = MR.min(mc - ip * MR);
                        let first = r0 + ip * MR;
                        let a_rows = if direct {
                            // SAFETY: rows first..first + rows of a, from inner element c0;
                            // the tile's rows past `rows` read the first (their sums are not
                            // stored).
                            unsafe { PairRows::in_place(a, first, rows, c0) }
                        } else {
                            PairRows::packed(&ap[ip * pairs * MR..(ip + 1) * pairs * MR])
                        };
                        // SAFETY: the tile (first, j0 + jp * NR) of rows x cols lies inside dst;
                        // a_rows and bpanel hold `pairs` pairs.
                        unsafe {
                            let c = dst
                                .ptr
                                .offset(first as isize * dst.row_stride + (j0 + jp * NR) as isize);
                            #[cfg(target_arch = "x86_64")]
                            avx512::tile(pairs, a_rows, bpanel, c, dst.row_stride, rows, cols, load);
                            #[cfg(not(target_arch = "x86_64"))]
                            let _ = (c, rows, cols, load, a_rows, bpanel);
                        }
                    }
                }
            }
        }
    }
}

/// Where a tile reads the pairs of its [`MR`] rows of A: pair `p` of row `r` is the 4 bytes at
/// `rows[r] + p * step` (the element of the even index in the low half).
#[derive(Clone, Copy)]
struct PairRows {
    rows: [*const u8; MR],
    step: usize,
}

impl PairRows {
    /// A packed panel ([`pack_a`]): `MR` words per pair.
    fn packed(panel: &[u32]) -> PairRows {
        let base = panel.as_ptr().cast::<u8>();
        PairRows {
            rows: std::array::from_fn(|r| base.wrapping_add(4 * r)),
            step: 4 * MR,
        }
    }

    /// Rows `first..first + rows` of `a` (`a.col_stride == 1`) from inner element `c0`, read in
    /// place; rows of the tile past `rows` read the first.
    ///
    /// # Safety
    /// `rows >= 1`, and the rows lie inside the matrix the caller of `gemm` vouched for.
    unsafe fn in_place(a: MatRef<bf16>, first: usize, rows: usize, c0: usize) -> PairRows {
        let at = |i: usize| {
            // SAFETY: row i, element c0, inside the matrix.
            unsafe { a.ptr.offset(i as isize * a.row_stride + c0 as isize).cast::<u8>() }
        };
        PairRows {
            rows: std::array::from_fn(|r| if r < rows { at(first + r) } else { at(first) }),
            step: 4,
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{PairRows, MR, NR, NV};
    use std::arch::x86_64::*;

    /// One `rows x cols` tile (at most `MR x NR`) of the output at `c` (rows `row_stride`
    /// apart): its accumulators start at zero, or at the tile's values when `load`, add the
    /// products of `pairs` pairs of A's rows (`a`) and of B's packed panel (`b`), and are
    /// stored.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and BF16; `a` reads `pairs` pairs of each row and `b` holds
    /// `pairs x NR` words; the tile lies inside the output.
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile(
        pairs: usize,
        a: PairRows,
        b: &[u32],
        c: *mut f32,
        row_stride: isize,
        rows: usize,
        cols: usize,
        load: bool,
    ) {
        debug_assert!(b.len() >= pairs * NR);
        // columns of each vector inside the tile
        let mut masks = [0 as __mmask16; NV];
        for (v, m) in masks.iter_mut().enumerate() {
            let valid = cols.saturating_sub(v * 16).min(16);
            *m = ((1u32 << valid) - 1) as __mmask16;
        }
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        if load {
            for (r, acc) in acc.iter_mut().enumerate().take(rows) {
                for (v, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: row r of the tile, its valid columns only.
                    unsafe {
                        *acc = _mm512_maskz_loadu_ps(masks[v], c.offset(r as isize * row_stride).wrapping_add(16 * v))
                    };
                }
            }
        }
        let bp = b.as_ptr();
        for p in 0..pairs {
            // SAFETY: pair p of A's rows (as the caller promises) and of B's panel (its length
            // checked above).
            unsafe {
                let mut bv = [std::mem::transmute::<__m512i, __m512bh>(_mm512_setzero_si512()); NV];
                for (v, b) in bv.iter_mut().enumerate() {
                    *b = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(bp.add(p * NR + 16 * v).cast()));
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let pair = a.rows[r].add(p * a.step).cast::<i32>().read_unaligned();
                    let x: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                    for (acc, &b) in acc.iter_mut().zip(&bv) {
                        *acc = _mm512_dpbf16_ps(*acc, x, b);
                    }
                }
            }
        }
        for (r, acc) in acc.iter().enumerate().take(rows) {
            for (v, &acc) in acc.iter().enumerate() {
                // SAFETY: row r of the tile, its valid columns only.
                unsafe { _mm512_mask_storeu_ps(c.offset(r as isize * row_stride).wrapping_add(16 * v), masks[v], acc) };
            }
        }
    }
}
