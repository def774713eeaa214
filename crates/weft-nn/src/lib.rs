//! Layers with PyTorch's parameter names and initialisation, state dicts, optimizers with PyTorch's
//! update rules, gradient clipping and learning-rate schedules.

#![cfg_attr(not(test), deny(clippy::print_stdout, clippy::print_stderr))]

pub mod clip;
pub mod context;
pub mod init;
pub mod layers;
pub mod module;
pub mod optim;
pub mod parallel;
pub mod schedule;
pub mod sequence_parallel;
pub mod state_dict;
pub mod step_ops;

pub use context::{Context, UnitHooks};
pub use module::Module;
