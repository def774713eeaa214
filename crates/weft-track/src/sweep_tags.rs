//! The tags a sweep's trials carry (`weft sweep` sets them; its state and the dashboard's sweep
//! view are read from them, docs/sweep.md).

/// The sweep's name.
pub const TAG_SWEEP: &str = "sweep";
/// The trial's number (0-based).
pub const TAG_TRIAL: &str = "sweep_trial";
/// The metric the sweep optimizes (`val_loss`, ...).
pub const TAG_METRIC: &str = "sweep_metric";
/// Its goal: `minimize` or `maximize`.
pub const TAG_GOAL: &str = "sweep_goal";
