//! weft's tensor core: [`Tensor`] (shared storage + layout, runtime dtype and device), one op set
//! ([`Op`]) that the CPU backend executes and autograd differentiates, counter-based RNG, and fast
//! CPU kernels.
//!
//! Every op returns [`Result`]: shape, dtype and range errors name the op and the shapes, and a
//! buffer too large for the machine is an [`Error::OutOfMemory`] naming the op and the bytes
//! (every tensor-sized buffer is allocated through [`alloc`]; see docs/architecture.md,
//! "Errors").

#![cfg_attr(not(test), deny(clippy::print_stdout, clippy::print_stderr))]

pub mod alloc;
pub mod autocast;
pub mod autograd;
pub mod console;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "cuda_off.rs"]
pub mod cuda;
pub mod dtype;
pub mod error;
pub mod function;
pub mod graph;
pub mod io;
pub mod layout;
pub mod memory;
pub mod op;
pub mod ops;
pub mod rng;
pub mod shape;
pub mod storage;
pub mod tensor;
pub mod tune;

mod device;

pub use autocast::{autocast, autocast_cached_casts, autocast_dtype, autocast_with_cache};
pub use autograd::{accumulation_fusion, is_grad_enabled, no_grad, set_accumulation_fusion, GradModeGuard};
pub use device::Device;
pub use dtype::{DType, Element, Float};
pub use error::{Error, Result};
pub use function::{BackwardReads, Function};
pub use layout::Layout;
pub use op::{BinaryOp, CompareOp, Conv2dParams, Distribution, Op, Pool2dParams, ReduceOp, UnaryOp};
pub use rng::Generator;
pub use shape::Shape;
pub use tensor::{Tensor, TensorId};
