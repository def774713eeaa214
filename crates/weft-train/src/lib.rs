//! The trainer: a run config ([`config::RunConfig`]), the training loop ([`Trainer`]) with
//! callbacks for metrics and progress, checkpoints with exact resume, and evaluation.

#![cfg_attr(not(test), deny(clippy::print_stdout, clippy::print_stderr))]

pub mod builtin;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod export;
pub mod generate;
pub mod job;
pub mod lineage;
pub mod memory;
pub mod metrics;
pub mod pipeline;
pub mod plan_shape;
mod replicas;
pub mod run;
pub mod stop;
pub mod track;
pub mod trainer;
mod writable;

pub use config::MAX_EVAL_BATCHES;
pub use error::{Error, Result};
pub use replicas::StateBytes;
pub use trainer::{Callback, EvalRecord, FitSummary, StepRecord, Trainer};
