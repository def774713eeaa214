//! The one error type of `weft-core`.
//!
//! Every op returns `Result<Tensor>`; see docs/architecture.md ("Errors") for why.

use crate::{DType, Shape};

/// What went wrong, with the op and the shapes or dtypes involved.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Two shapes that had to agree (or broadcast) did not.
    #[error("{op}: shape mismatch: {lhs:?} vs {rhs:?}")]
    ShapeMismatch { op: &'static str, lhs: Shape, rhs: Shape },

    /// Two dtypes that had to agree did not.
    #[error("{op}: dtype mismatch: {lhs:?} vs {rhs:?}")]
    DTypeMismatch { op: &'static str, lhs: DType, rhs: DType },

    /// The op does not support this dtype.
    #[error("{op}: unsupported dtype {dtype:?}")]
    UnsupportedDType { op: &'static str, dtype: DType },

    /// A dimension index outside `-rank..rank`.
    #[error("{op}: dim {dim} out of range for a tensor of rank {rank}")]
    DimOutOfRange { op: &'static str, dim: isize, rank: usize },

    /// An index (into a dimension, a table, a class list) outside its range.
    #[error("{op}: index {index} out of range 0..{size}")]
    IndexOutOfRange { op: &'static str, index: i64, size: usize },

    /// Anything else the op could not accept; the message says what.
    #[error("{op}: {msg}")]
    Invalid { op: &'static str, msg: String },

    /// A buffer of `bytes` bytes could not be allocated: more than the machine's `memory` bytes
    /// (`Some`, refused before asking: see `crate::alloc`), or refused by the allocator (`None`).
    #[error("{op}: cannot allocate {} ({bytes} bytes): {}", crate::alloc::human_bytes(*.bytes), crate::alloc::why(*.memory))]
    OutOfMemory {
        op: &'static str,
        bytes: u128,
        memory: Option<u64>,
    },

    /// A file or stream could not be read or written, or its contents are malformed; the message
    /// names the path (and the tensor, when one is at fault).
    #[error("{0}")]
    Io(String),

    /// A device that cannot be used: no CUDA driver, no such GPU, a library missing, a kernel
    /// that failed to compile or launch, an op not available on the device; the message names
    /// the device and the cause.
    #[error("{0}")]
    Device(String),

    /// A GPU buffer of `bytes` bytes could not be allocated: the device had `free` of `total`
    /// bytes free (after the caching allocator released what it held).
    #[error("{op}: cannot allocate {} ({bytes} bytes) on {device}: {} free of {}", crate::alloc::human_bytes(*.bytes as u128), crate::alloc::human_bytes(*.free as u128), crate::alloc::human_bytes(*.total as u128))]
    DeviceOutOfMemory {
        op: &'static str,
        device: crate::Device,
        bytes: u64,
        free: u64,
        total: u64,
    },

    /// Gradient bookkeeping misuse (backward on a tensor that does not require grad, ...).
    #[error("autograd: {0}")]
    Autograd(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Shorthand for [`Error::Invalid`].
pub(crate) fn invalid(op: &'static str, msg: impl Into<String>) -> Error {
    Error::Invalid { op, msg: msg.into() }
}
