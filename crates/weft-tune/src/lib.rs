//! Hyperparameter sweeps: a search space over run-config keys, samplers that pick each trial's
//! values (TPE, random, grid), pruners that stop trials falling behind (ASHA, Hyperband, the
//! median rule), and a driver that runs each trial as a `weft train` (or `weft launch`) process
//! recorded in the run store (crate `weft-track`), reading their metrics back from it.
//!
//! - [`spec::SweepSpec`]: the sweep file (`[sweep]`, `[sweep.parameters]`, `[sweep.pruner]`).
//! - [`space`]: the parameters and their distributions.
//! - [`sampler`]: [`sampler::Tpe`], [`sampler::Random`], [`sampler::Grid`].
//! - [`pruner`]: [`pruner::Asha`], [`pruner::Hyperband`], [`pruner::Median`].
//! - [`trials`]: a sweep's trials as they are recorded in the store (the sweep's state).
//! - [`record`]: a sweep's pruning decisions and definition, kept in the store's file.
//! - [`definition`]: what a resumed sweep must not change (its space, metric, base config...).
//! - [`driver`]: running trials in parallel, pruning them, recording failures.
//! - [`children`]: child processes that die with their driver, and one driver per sweep.
//! - [`registry`]: the model registry (named models, versions and stages) in the run store.
//! - [`pipeline`]: pipeline files (a DAG of steps) and the cache of their executions.
//!
//! docs/sweep.md describes the file format and the methods.

pub mod children;
pub mod definition;
pub mod driver;
mod error;
pub mod lineage;
pub mod pipeline;
pub mod pruner;
pub mod record;
pub mod registry;
pub mod rng;
pub mod sampler;
pub mod space;
pub mod spec;
pub mod trials;

pub use error::{Error, Result};
pub use spec::SweepSpec;
