//! Matrix products of bf16 operands into f32 on Intel AMX (Advanced Matrix Extensions, Sapphire
//! Rapids and later): eight tile registers of up to 16 rows of 64 bytes, and `tdpbf16ps`, which
//! adds the product of a 16 x 32 bf16 tile and a 32 x 16 one (stored as 16 rows of 16 pairs) into
//! a 16 x 16 f32 tile: 16,384 floating-point operations per instruction, eight times an AVX-512
//! `vdpbf16ps` of the same core per cycle (Intel's Architecture Instruction Set Extensions
//! Programming Reference, chapter 3, gives the instructions and the tile configuration).
//!
//! The kernel keeps a 32 x 32 block of the output in four tiles (`tmm0..3`) and, per 32 inner
//! elements, loads two 16-row tiles of A (`tmm4`, `tmm5`) and two 16-column tiles of B (`tmm6`,
//! `tmm7`) and issues four `tdpbf16ps`. B is packed as [`super::bf16_gemm`] packs it for
//! `vdpbf16ps` (panels of 32 columns, for each inner pair the 32 columns' pairs side by side),
//! which is the pair-interleaved layout the tile instruction reads, with the inner dimension
//! padded with zeros to a multiple of 32. A is read in place where its rows are contiguous and a
//! block spans a whole number of 32 elements; otherwise (a transposed operand, the last partial
//! block of the inner dimension, the last partial 32 rows) its rows are copied, zero-padded, into
//! a row-major buffer first. Partial output blocks go through a 32 x 32 scratch block.
//!
//! Numerics: each product of two bf16 values is exact in f32; the tile instruction adds them to
//! f32 accumulators rounding to nearest even, treats subnormal inputs as zero and flushes
//! subnormal results, as `vdpbf16ps` and PyTorch's CPU bf16 products (oneDNN, on the same
//! instructions here) do. The order of the additions inside one instruction is the hardware's,
//! so results differ from the `vdpbf16ps` kernel's in the last bits; one kernel is used for every
//! product of a process, so a compiled step and an eager one still agree bit for bit.
//!
//! Linux hands out the tile registers per process on request (`arch_prctl(ARCH_REQ_XCOMP_PERM,
//! XFEATURE_XTILEDATA)`); [`available`] asks once and answers false where it is refused, and
//! `WEFT_AMX=0` turns the kernel off (the `vdpbf16ps` kernel runs instead).

// the kernel exists on x86-64 Linux only; elsewhere `available` is false and its helpers unused
#![cfg_attr(
    not(all(target_arch = "x86_64", target_os = "linux")),
    allow(dead_code, unused_imports)
)]

use super::bf16_gemm::{pack, NR};
use super::matmul::{MatMut, MatRef};
use half::bf16;

/// Output rows per kernel block (two tiles of 16).
pub(super) const ROWS: usize = 32;
/// Inner elements per tile step (16 pairs: one 64-byte tile row of A).
const STEP: usize = 32;
/// Inner elements per packed block: 256 pairs, a packed panel of B is 32 KiB.
const KC: usize = 512;
/// Rows of A per block (`MC x KC` bf16, 128 KiB, in L2).
const MC: usize = 128;
/// Columns of B packed at once (`KC x NC` bf16, 1 MiB, in L2).
const NC: usize = 1024;

/// Whether this CPU and OS run the tile kernel (CPUID: AMX-TILE and AMX-BF16; AVX-512 F, BW, VL
/// and BF16 for the packing, the rounding and the fallback; the kernel's permission from Linux),
/// unless `WEFT_AMX=0`.
/// Checked once.
pub fn available() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        if std::env::var("WEFT_AMX").is_ok_and(|v| v.trim() == "0") || !super::bf16_gemm::available() {
            return false;
        }
        probe()
    })
}

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
fn probe() -> bool {
    // CPUID leaf 7, sub-leaf 0: EDX bit 22 AMX-BF16, bit 24 AMX-TILE
    let leaf = std::arch::x86_64::__cpuid_count(7, 0);
    if leaf.edx >> 22 & 1 == 0
        || leaf.edx >> 24 & 1 == 0
        || !std::arch::is_x86_feature_detected!("avx512bw")
        || !std::arch::is_x86_feature_detected!("avx512vl")
    {
        return false;
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a request for permission to use a CPU feature; no memory is passed.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu")))]
fn probe() -> bool {
    false
}

/// Where the tile kernel's f32 sums go.
#[derive(Clone, Copy)]
enum Out {
    /// Into an f32 matrix (added to its values when `accumulate`).
    F32(MatMut<f32>),
    /// Rounded to bf16 (nearest, ties to even) into a bf16 matrix: the inner dimension must fit
    /// one block ([`rounds_whole`]), so each sum is complete when it leaves the tiles.
    Bf16(MatMut<bf16>),
}

/// `dst (=|+=) a @ b` on the calling thread, on the tile registers.
///
/// # Safety
/// [`available`] must be true; `dst` valid for writes of an `m x n` matrix at its stride (its
/// columns adjacent), `a`/`b` valid for every strided read of an `m x k` / `k x n` matrix.
pub(super) unsafe fn gemm(m: usize, n: usize, k: usize, dst: MatMut<f32>, a: MatRef<bf16>, b: MatRef<bf16>) {
    if m == 0 || n == 0 || k == 0 {
        // SAFETY: as the caller promises (nothing to multiply: the tile kernel is not needed).
        return unsafe { super::bf16_gemm::gemm_avx512(m, n, k, dst, a, b) };
    }
    // SAFETY: as the caller promises.
    unsafe { gemm_into(m, n, k, Out::F32(dst), a, b) }
}

/// Whether [`gemm_parallel_rounded`] takes a product of `k` inner elements: the tile kernel is
/// in use and `1 <= k <= 512` (one packed block).
pub fn rounds_whole(k: usize) -> bool {
    available() && (1..=KC).contains(&k)
}

/// `dst = a @ b` rounded to bf16 once (bit for bit the f32 result of [`gemm`] then rounded), each
/// 32 x 32 block rounded as it leaves the tiles, so no f32 copy of the output is written; on the
/// compute pool as `bf16_gemm::gemm_parallel_then`.
///
/// # Safety
/// [`rounds_whole`]`(k)`; `dst.accumulate` is false; `dst`, `a` and `b` as for [`gemm`].
pub unsafe fn gemm_parallel_rounded(m: usize, n: usize, k: usize, dst: MatMut<bf16>, a: MatRef<bf16>, b: MatRef<bf16>) {
    assert!(
        rounds_whole(k) && !dst.accumulate,
        "amx::gemm_parallel_rounded of {k} inner elements"
    );
    let (along_rows, chunk) = super::bf16_gemm::split(super::bf16_gemm::Kernel::Amx, m, n, k);
    // SAFETY: each block's product writes only its block; the rest as the caller promises.
    unsafe {
        super::matmul::for_each_block(
            m,
            n,
            dst,
            a,
            b,
            along_rows,
            chunk,
            |rows, cols, d, a, b| {
                if rows > 0 && cols > 0 {
                    gemm_into(rows, cols, k, Out::Bf16(d), a, b)
                }
            },
            |_| {},
        )
    }
}

/// The tile kernel's loops over blocks (`m, n, k >= 1`).
///
/// # Safety
/// As [`gemm`]; for [`Out::Bf16`], `k <= KC` and no accumulation.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
unsafe fn gemm_into(m: usize, n: usize, k: usize, out: Out, a: MatRef<bf16>, b: MatRef<bf16>) {
    debug_assert!(available());
    let accumulate = match out {
        Out::F32(d) => d.accumulate,
        Out::Bf16(d) => {
            debug_assert!(k <= KC && !d.accumulate);
            false
        }
    };
    // SAFETY: the CPU has the tile registers and the process their permission (`available`).
    let _tiles = unsafe { tiles::Configured::new() };
    let (mut ap, mut bp, mut tail) = (Vec::new(), Vec::new(), Vec::new());
    let mut scratch = [0f32; ROWS * NR];
    for j0 in (0..n).step_by(NC) {
        let nc = NC.min(n - j0);
        // columns j0.. of b, read as the rows of b^T (j0 < n: inside the matrix)
        let bt = MatRef {
            ptr: b.ptr.wrapping_offset(j0 as isize * b.col_stride),
            row_stride: b.col_stride,
            col_stride: b.row_stride,
        };
        for c0 in (0..k).step_by(KC) {
            let kc = KC.min(k - c0);
            let padded = kc.next_multiple_of(STEP);
            let pairs = padded / 2;
            let steps = padded / STEP;
            // the first block overwrites dst unless the product adds to it
            let load = accumulate || c0 > 0;
            // SAFETY: columns j0..j0 + nc of b, inner elements c0..c0 + kc, as promised.
            unsafe { pack(bt, 0, nc, c0, kc, NR, STEP / 2, &mut bp) };
            // rows whose blocks are whole tile steps and adjacent in memory are read in place
            let direct = a.col_stride == 1 && a.row_stride > 0 && kc == padded;
            for r0 in (0..m).step_by(MC) {
                let mc = MC.min(m - r0);
                // the block's rows read in place (whole tiles of them); the rest, all of them
                // or the last partial 32, are read from a copy
                let in_place = if direct { mc / ROWS * ROWS } else { 0 };
                if in_place < mc {
                    // SAFETY: rows r0 + in_place..r0 + mc of a, inner elements c0..c0 + kc.
                    unsafe { copy_rows(a, r0 + in_place, mc - in_place, c0, kc, padded, &mut tail, &mut ap) };
                }
                for t0 in (0..mc).step_by(ROWS) {
                    let rows = ROWS.min(mc - t0);
                    let first = r0 + t0;
                    let (a_tile, a_stride) = if t0 < in_place {
                        // SAFETY: rows first..first + 32 of a from inner element c0.
                        let at = unsafe { a.ptr.offset(first as isize * a.row_stride + c0 as isize) };
                        (at.cast::<u8>(), a.row_stride as usize * 2)
                    } else {
                        (tail[(t0 - in_place) * pairs..].as_ptr().cast::<u8>(), pairs * 4)
                    };
                    for (jp, panel) in bp.chunks_exact(pairs * NR).enumerate() {
                        let cols = NR.min(nc - jp * NR);
                        let col0 = j0 + jp * NR;
                        let b_panel = panel.as_ptr().cast::<u8>();
                        match out {
                            Out::F32(dst) => {
                                // SAFETY: the block (first, col0) lies inside dst
                                let c = unsafe { dst.ptr.offset(first as isize * dst.row_stride + col0 as isize) };
                                if rows == ROWS && cols == NR && dst.row_stride > 0 {
                                    // SAFETY: 32 rows of `steps * 64` bytes of A at a_stride, the
                                    // panel's `pairs` rows of 128 bytes, the 32 x 32 block of dst.
                                    unsafe {
                                        tiles::block(
                                            steps,
                                            a_tile,
                                            a_stride,
                                            b_panel,
                                            c,
                                            dst.row_stride as usize * 4,
                                            load,
                                        )
                                    };
                                    continue;
                                }
                                if load {
                                    for r in 0..rows {
                                        // SAFETY: row r of the block, its valid columns.
                                        let row = unsafe {
                                            std::slice::from_raw_parts(c.offset(r as isize * dst.row_stride), cols)
                                        };
                                        scratch[r * NR..r * NR + cols].copy_from_slice(row);
                                    }
                                }
                                // SAFETY: as above, into the scratch block (rows of NR f32).
                                unsafe {
                                    tiles::block(steps, a_tile, a_stride, b_panel, scratch.as_mut_ptr(), NR * 4, load)
                                };
                                for r in 0..rows {
                                    // SAFETY: row r of the block, its valid columns.
                                    let row = unsafe {
                                        std::slice::from_raw_parts_mut(c.offset(r as isize * dst.row_stride), cols)
                                    };
                                    row.copy_from_slice(&scratch[r * NR..r * NR + cols]);
                                }
                            }
                            Out::Bf16(dst) => {
                                // SAFETY: as above, into the scratch block; the sums are whole
                                // (one block of the inner dimension), never loaded.
                                unsafe {
                                    tiles::block(steps, a_tile, a_stride, b_panel, scratch.as_mut_ptr(), NR * 4, false)
                                };
                                // SAFETY: rows first..first + rows of dst, columns col0..col0 + cols.
                                unsafe {
                                    round_block(
                                        &scratch,
                                        dst.ptr.offset(first as isize * dst.row_stride + col0 as isize),
                                        dst.row_stride,
                                        rows,
                                        cols,
                                    )
                                };
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
unsafe fn gemm_into(_: usize, _: usize, _: usize, _: Out, _: MatRef<bf16>, _: MatRef<bf16>) {
    unreachable!("the tile kernel runs only where `available` is true");
}

/// Rows `0..rows`, columns `0..cols` of the 32 x 32 `block` (rows of [`NR`]) rounded to bf16
/// (`convert::f32_to_bf16_bits`) into the matrix at `dst` (rows `row_stride` apart), on AVX-512.
///
/// # Safety
/// The CPU has AVX-512 F, BW and VL; the `rows x cols` block at `dst` is writable.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn round_block(block: &[f32; ROWS * NR], dst: *mut bf16, row_stride: isize, rows: usize, cols: usize) {
    for r in 0..rows.min(ROWS) {
        // SAFETY: row r of the block at dst, as the caller promises.
        let row = unsafe { std::slice::from_raw_parts_mut(dst.offset(r as isize * row_stride), cols.min(NR)) };
        for (d, &x) in row.iter_mut().zip(&block[r * NR..(r + 1) * NR]) {
            *d = bf16::from_bits(super::convert::f32_to_bf16_bits(x));
        }
    }
}

/// Copies rows `first..first + rows` of `a`, inner elements `c0..c0 + kc`, into `out` as
/// `rows.next_multiple_of(ROWS)` rows of `padded / 2` pair words each (the pairs of a row side by
/// side; the padding, past `kc` and past `rows`, zero). `scratch` holds the pairs column-major on
/// the way when the rows are not contiguous.
///
/// # Safety
/// Every element `(first + r, c0 + c)`, `r < rows`, `c < kc`, lies inside `a`'s storage.
#[allow(clippy::too_many_arguments)]
unsafe fn copy_rows(
    a: MatRef<bf16>,
    first: usize,
    rows: usize,
    c0: usize,
    kc: usize,
    padded: usize,
    out: &mut Vec<u32>,
    scratch: &mut Vec<u32>,
) {
    let pairs = padded / 2;
    out.clear();
    out.resize(rows.next_multiple_of(ROWS) * pairs, 0);
    if a.col_stride == 1 {
        // a row's pairs are its elements side by side (bf16 little-endian): copy each row
        for r in 0..rows {
            // SAFETY: row first + r, elements c0..c0 + kc, as the caller promises.
            let src = unsafe {
                std::slice::from_raw_parts(a.ptr.offset((first + r) as isize * a.row_stride + c0 as isize), kc)
            };
            let dst = out[r * pairs..(r + 1) * pairs].as_mut_ptr().cast::<bf16>();
            // SAFETY: the row's `pairs` words hold `padded >= kc` bf16.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, kc) };
        }
    } else {
        // pack the rows as one panel of pairs (`[pairs][rows]` words), then transpose it
        // SAFETY: as the caller promises.
        unsafe { pack(a, first, rows, c0, kc, rows, 1, scratch) };
        let real_pairs = kc.div_ceil(2);
        // SAFETY: u32 and f32 have one size and alignment; the transpose only moves bits.
        let (src, dst) = unsafe {
            (
                std::slice::from_raw_parts(scratch.as_ptr().cast::<f32>(), scratch.len()),
                std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<f32>(), out.len()),
            )
        };
        super::transpose::transpose(src, rows, real_pairs, rows, dst, pairs);
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod tiles {
    use super::STEP;
    use std::arch::asm;

    /// The tile configuration (`ldtilecfg`'s 64 bytes): palette 1, tiles 0-7 of 16 rows of 64
    /// bytes each.
    #[repr(C, align(64))]
    struct Config([u8; 64]);

    const CONFIG: Config = {
        let mut c = [0u8; 64];
        c[0] = 1;
        let mut t = 0;
        while t < 8 {
            // bytes per row of tile t (u16 at 16 + 2t), rows of tile t (u8 at 48 + t)
            c[16 + 2 * t] = 64;
            c[48 + t] = 16;
            t += 1;
        }
        Config(c)
    };

    /// The calling thread's tiles, configured; released when dropped.
    pub(super) struct Configured(());

    impl Configured {
        /// # Safety
        /// The CPU has AMX and the process the permission to use it.
        pub(super) unsafe fn new() -> Configured {
            // SAFETY: as the caller promises; the configuration is 64 valid bytes.
            unsafe { asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly)) };
            Configured(())
        }
    }

    impl Drop for Configured {
        fn drop(&mut self) {
            // SAFETY: the tiles were configured by `new` on this thread.
            unsafe { asm!("tilerelease", options(nostack, nomem)) };
        }
    }

    /// A 32 x 32 f32 block at `c` (rows `c_stride` bytes apart) starts at zero, or at its
    /// values when `load`, adds the product of 32 rows of A at `a` (rows `a_stride` bytes apart,
    /// `steps * 32` bf16 each) and of the packed panel at `b` (`steps * 16` rows of 32 pair words,
    /// 128 bytes each), and is stored.
    ///
    /// # Safety
    /// The tiles are configured ([`Configured`]); the memory described is readable (A, B) and
    /// writable (C).
    #[inline]
    pub(super) unsafe fn block(
        steps: usize,
        a: *const u8,
        a_stride: usize,
        b: *const u8,
        c: *mut f32,
        c_stride: usize,
        load: bool,
    ) {
        let c = c.cast::<u8>();
        let (c_low, c_right, c_low_right) = (
            c.wrapping_add(16 * c_stride),
            c.wrapping_add(64),
            c.wrapping_add(16 * c_stride + 64),
        );
        // SAFETY (every block below): the tiles are configured; each load or store touches 16
        // rows of 64 bytes of the memory the caller vouched for.
        unsafe {
            if load {
                asm!(
                    "tileloadd tmm0, [{c} + {s}*1]",
                    "tileloadd tmm1, [{cr} + {s}*1]",
                    "tileloadd tmm2, [{cl} + {s}*1]",
                    "tileloadd tmm3, [{clr} + {s}*1]",
                    c = in(reg) c, cr = in(reg) c_right, cl = in(reg) c_low, clr = in(reg) c_low_right,
                    s = in(reg) c_stride, options(nostack, readonly),
                );
            } else {
                asm!(
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    options(nostack, nomem)
                );
            }
            let a_low = a.wrapping_add(16 * a_stride);
            for step in 0..steps {
                // A: 64 bytes (32 inner elements) further per step; B: 16 pair rows of 128 bytes
                let (a0, a1) = (a.wrapping_add(step * STEP * 2), a_low.wrapping_add(step * STEP * 2));
                let b0 = b.wrapping_add(step * 16 * 128);
                asm!(
                    "tileloadd tmm4, [{a0} + {sa}*1]",
                    "tileloadd tmm5, [{a1} + {sa}*1]",
                    "tileloadd tmm6, [{b0} + {sb}*1]",
                    "tileloadd tmm7, [{b1} + {sb}*1]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    a0 = in(reg) a0, a1 = in(reg) a1, sa = in(reg) a_stride,
                    b0 = in(reg) b0, b1 = in(reg) b0.wrapping_add(64), sb = in(reg) 128usize,
                    options(nostack, readonly),
                );
            }
            asm!(
                "tilestored [{c} + {s}*1], tmm0",
                "tilestored [{cr} + {s}*1], tmm1",
                "tilestored [{cl} + {s}*1], tmm2",
                "tilestored [{clr} + {s}*1], tmm3",
                c = in(reg) c, cr = in(reg) c_right, cl = in(reg) c_low, clr = in(reg) c_low_right,
                s = in(reg) c_stride, options(nostack),
            );
        }
    }
}
