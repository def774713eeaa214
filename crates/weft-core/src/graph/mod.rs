//! Compiled graph mode: a computation over tensors captured once as a [`Graph`] of [`Op`] values,
//! optimized, and replayed.
//!
//! - [`trace`] runs a closure with the tracer on: every op that passes through the dispatcher
//!   (`ops::execute`, the one place all ops go) becomes a [`Node`]. The closure's arguments are the
//!   graph's inputs; tensors it reads that were made before the capture (parameters) are
//!   *externals*, read by reference at every replay, so in-place updates between calls are seen.
//! - [`passes`] rewrite the graph: constant folding, common-subexpression elimination,
//!   dead-code elimination; [`fusion`] groups chains of elementwise ops.
//! - [`remat`] makes cheap values a second time next to their late readers when that lowers the
//!   peak memory (a training step's activations; [`GraphCache::with_recompute`]).
//! - [`plan`] gives the static memory plan: each buffer's lifetime, an offset in one arena, and
//!   the peak bytes before anything runs.
//! - [`Graph::run`] replays the nodes in order, freeing each buffer after its last reader.
//! - [`compile`] wraps a closure: a bounded cache of graphs keyed by the inputs' shapes and
//!   dtypes, and eager execution (with one logged reason) when a closure cannot be captured.
//!
//! Replay runs the same kernels in the same order as the capture, so its results equal eager
//! execution bit for bit.

mod autotune;
mod compile;
mod dump;
pub mod fusion;
mod ir;
pub mod onnx;
pub mod passes;
pub mod plan;
mod pointwise;
pub mod remat;
mod run;
mod trace;

pub use autotune::{Autotune, TuneEntry, TuneReport};
pub use compile::{compile, Compiled, GraphCache, Outcome, RandomSource};
pub use ir::{Graph, Node, Source, Value, ValueId};
pub use pointwise::ReplayStats;
pub use run::Ready;
pub use trace::{trace, CaptureError};

pub(crate) use trace::{
    host_access, inlining, note_copy, note_hooks, record_op, recording, InlineFunctions, RecordGuard,
};

#[cfg(test)]
mod tests;
