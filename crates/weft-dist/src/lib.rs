//! weft's communication runtime: process groups with collectives and point-to-point messages
//! between ranks (one process per rank), the rendezvous store, and the launcher behind
//! `weft launch`.
//!
//! A program joins its job with [`init`], which returns the group of all ranks:
//!
//! ```no_run
//! # fn main() -> weft_dist::Result<()> {
//! let world = weft_dist::init()?;
//! let t = weft_core::Tensor::from_vec(vec![world.rank() as f32; 4], &[4])?;
//! world.all_reduce(&t, weft_dist::ReduceOp::Sum)?.wait()?;
//! # Ok(()) }
//! ```
//!
//! Modules: [`env`] (who this rank is), [`auth`] (job token, handshake), [`store`] (rendezvous
//! key-value store), [`group`] (process groups and their operations), [`launch`] (starting and
//! watching workers), [`failure`] (what a failing worker tells its launcher); the transport
//! (`mesh`) and the algorithms (`collectives`) are internal.

#![cfg_attr(not(test), deny(clippy::print_stdout, clippy::print_stderr))]

#[cfg(target_endian = "big")]
compile_error!("weft-dist sends tensors in the machine's byte order and supports little-endian hosts only");

mod accept;
pub mod addr;
pub mod auth;
pub mod bench;
mod collectives;
pub mod ddp;
mod deadline;
pub mod device_mesh;
pub mod env;
pub mod error;
pub mod failure;
pub mod group;
mod inbox;
mod init;
pub mod interrupt;
pub mod launch;
mod mesh;
pub mod pipeline;
mod reduce;
pub mod selfcheck;
mod shm;
pub mod signal;
pub mod store;
pub mod tensor_parallel;
pub mod trace;
mod wire;
pub mod zero;

pub use auth::Token;
pub use ddp::{DataParallel, DdpOptions};
pub use device_mesh::DeviceMesh;
pub use error::{Error, Result};
pub use group::{ProcessGroup, Work};
pub use init::{init, init_with, Options, DEFAULT_TIMEOUT, MAX_TIMEOUT};
pub use reduce::ReduceOp;
pub use zero::{ShardedDataParallel, ZeroOptions};
