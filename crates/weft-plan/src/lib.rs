//! Automatic parallel planning: from a model's shapes, a global batch and a device description,
//! predict the step time and per-device memory of every `dp x tp x pp x ZeRO x micro-batch x
//! recompute` layout weft can run, and rank the ones that fit.
//!
//! Everything here is analytic: nothing of the model is allocated, so a 175B-parameter model
//! plans on a laptop. The formulas and their sources are in `docs/plan.md`.
//!
//! - [`model`]: [`ModelShape`], its parameter counts and FLOPs.
//! - [`device`]: [`DeviceSpec`] (the built-in datasheet specs) and [`Efficiency`].
//! - [`cluster`]: the `cluster.toml` format, checked field by field.
//! - [`calibration`]: the `local` spec that `weft plan calibrate` measures, as its cache file.
//! - [`cost`]: time per stage and per step of a [`Layout`].
//! - [`activations`]: what weft's autograd graph keeps of a micro-batch, tensor by tensor.
//! - [`memory`]: bytes per device of a [`Layout`], by term.
//! - [`search`]: the layouts, stage cuts by dynamic programming, the ranking.

#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod activations;
pub mod calibration;
pub mod cluster;
pub mod cost;
pub mod device;
pub mod error;
pub mod layout;
pub mod memory;
pub mod model;
pub mod search;
pub mod shared;

pub use device::{DeviceSpec, Efficiency, PassCost};
pub use error::{Error, Result};
pub use layout::{CommDtype, Layout, Schedule};
pub use memory::MemoryBreakdown;
pub use model::{ModelKind, ModelShape, Precision, Workload};
pub use search::{plan, virtual_stage_blocks, Plan, PlanReport, SearchOptions};
