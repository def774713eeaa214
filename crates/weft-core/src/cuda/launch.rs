//! Kernel arguments and launch geometry shared by the op families.

use cudarc::driver::{DeviceRepr, LaunchConfig};

use crate::error::{invalid, Result};
use crate::layout::Layout;

/// The most dims a view passed to a kernel may have (`MAX_RANK` in the prelude).
pub const MAX_RANK: usize = 8;

/// A view's geometry as the kernels read it (`struct Strided` in `kernels/prelude.cuh`, same
/// field order and sizes): element `i` of the row-major result is at
/// `offset + Σ_d index_d(i) · strides[d]` in the storage, in elements.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Strided {
    pub shape: [u64; MAX_RANK],
    pub strides: [u64; MAX_RANK],
    pub offset: u64,
    pub rank: u32,
    pub pad: u32,
}

// SAFETY: plain `repr(C)` data of fixed-size integers, laid out as the kernels' `struct Strided`.
unsafe impl DeviceRepr for Strided {}

impl Strided {
    /// The geometry of `layout`; an error naming `op` when it has more than [`MAX_RANK`] dims.
    pub fn of(op: &'static str, layout: &Layout) -> Result<Strided> {
        Strided::new(op, &layout.shape, &layout.strides, layout.offset)
    }

    pub fn new(op: &'static str, shape: &[usize], strides: &[usize], offset: usize) -> Result<Strided> {
        if shape.len() > MAX_RANK {
            return Err(invalid(
                op,
                format!("a view of rank {} on the GPU (at most {MAX_RANK} dims)", shape.len()),
            ));
        }
        let mut s = Strided {
            shape: [1; MAX_RANK],
            strides: [0; MAX_RANK],
            offset: offset as u64,
            rank: shape.len() as u32,
            pad: 0,
        };
        for (d, (&n, &st)) in shape.iter().zip(strides).enumerate() {
            s.shape[d] = n as u64;
            s.strides[d] = st as u64;
        }
        Ok(s)
    }
}

/// Threads per block of the one-thread-per-element kernels.
pub const BLOCK: u32 = 256;

/// A grid-stride launch over `n` elements: enough blocks of [`BLOCK`] threads to cover them,
/// capped (each thread then loops) so huge tensors do not need huge grids.
pub fn for_elements(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, 1 << 20) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block of `threads` threads per row, for `rows` rows (row-wise reductions, softmax, norms).
pub fn for_rows(rows: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.clamp(1, i32::MAX as usize) as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}
