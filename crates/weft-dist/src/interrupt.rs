//! A check that the waits of joining a job make, so that a process asked to stop (SIGINT or
//! SIGTERM while it waits for the other ranks, as a launcher or Slurm sends them) ends at once
//! rather than at the job's timeout (300 s by default). The trainer sets it; without it the
//! waits are as before.

use std::sync::OnceLock;
use std::time::Duration;

use crate::error::Error;

static CHECK: OnceLock<fn() -> Option<i32>> = OnceLock::new();

/// How often a wait looks at the check, at most.
pub(crate) const SLICE: Duration = Duration::from_millis(200);

/// Sets the check: a function returning the number of the signal that asked this process to
/// stop, if one did. Set once; later calls change nothing.
pub fn set_stop_check(check: fn() -> Option<i32>) {
    let _ = CHECK.set(check);
}

/// Whether a check is set (a wait then wakes every [`SLICE`] to look at it).
pub(crate) fn is_set() -> bool {
    CHECK.get().is_some()
}

/// The error ending a wait for `what` that a stop request cut short, if one came.
pub(crate) fn stopped(what: &str) -> Option<Error> {
    let sig = CHECK.get().and_then(|check| check())?;
    Some(Error::Timeout(format!(
        "stopped by signal {sig} ({}) while {what}",
        crate::signal::signal_name(sig)
    )))
}
