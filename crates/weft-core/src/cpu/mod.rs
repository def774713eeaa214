//! CPU kernels: plain functions over row-major slices. The ops in `crate::ops` validate shapes and
//! dtypes, make inputs contiguous, and call these.

pub mod attention;
pub mod conv;
pub mod elementwise;
pub mod f32_view;
pub mod lanes;
pub mod math;
pub mod matmul;
pub mod nn;
pub mod pool;
pub mod reduce;
pub mod small_gemm;
pub mod threads;

/// Below this many elements a kernel stays on the calling thread.
pub const PARALLEL_THRESHOLD: usize = 1 << 15;
