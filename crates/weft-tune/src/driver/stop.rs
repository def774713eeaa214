//! Stopping trials: each trial is told to stop once (SIGTERM; the trainer ends its step, writes
//! its checkpoint and exits), and its process group is killed (SIGKILL) only when it still runs
//! [`STOP_GRACE`] after it was told. A trial is never sent a second SIGTERM: the trainer takes a
//! second signal as "stop now" (`weft_train::stop`), which would cut its stop checkpoint short.
//! So a trial the pruner stopped is not told again when the sweep itself is stopped: the driver
//! waits for it and records it `pruned`.

use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use weft_track::{Status, Store};

use crate::error::{Error, Result};
use crate::space::Value;

use super::Plan;

/// How long a trial told to stop (SIGTERM) may take to finish its step and write its checkpoint
/// before its process group is killed (SIGKILL).
pub(super) const STOP_GRACE: Duration = Duration::from_secs(60);

/// A trial's process and what the driver has seen of it.
pub(super) struct Running {
    pub number: u64,
    pub child: Child,
    pub values: Vec<Value>,
    pub log: PathBuf,
    /// Runs of this trial number in the store before it started (earlier attempts).
    pub earlier: Vec<i64>,
    pub run_id: Option<i64>,
    /// The last step of the metric already reported to the pruner.
    pub seen_step: i64,
    /// Why the pruner stopped it (SIGTERM sent).
    pub pruned: Option<String>,
    /// When it was told to stop (its one SIGTERM): killed [`STOP_GRACE`] later if still running.
    pub told: Option<Instant>,
    /// Whether its process group was sent SIGKILL.
    pub killed: bool,
}

impl Running {
    /// Tells the trial to stop (SIGTERM), unless it was told already.
    pub fn tell(&mut self) {
        if self.told.is_none() {
            // SAFETY: kill with a pid this process started and has not reaped.
            unsafe {
                libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
            }
            self.told = Some(Instant::now());
        }
    }

    /// Kills the trial's process group (each trial runs in its own) when it was told to stop
    /// more than `grace` ago and has not been killed yet.
    pub fn kill_when_late(&mut self, grace: Duration) {
        if !self.killed && self.told.is_some_and(|t| t.elapsed() > grace) {
            // SAFETY: kill with the process group of a child this process started and has not
            // reaped.
            unsafe {
                libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL);
            }
            self.killed = true;
        }
    }

    /// Its exit status, once it has ended.
    pub fn ended(&mut self) -> Result<Option<ExitStatus>> {
        self.child.try_wait().map_err(|source| Error::Io {
            path: self.log.clone(),
            source,
        })
    }
}

/// The trials running, stopped (each told once, killed [`STOP_GRACE`] after) and waited for
/// when the driver returns early (an error) without having recorded them.
pub(super) struct Children(pub Vec<Running>);

impl Drop for Children {
    fn drop(&mut self) {
        for r in self.0.iter_mut() {
            r.tell();
        }
        while !self.0.is_empty() {
            self.0.retain_mut(|r| {
                r.kill_when_late(STOP_GRACE);
                !matches!(r.child.try_wait(), Ok(Some(_)) | Err(_))
            });
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Stops the sweep's running trials and records how each ended: trials not yet told to stop
/// are told (one SIGTERM), trials already stopping (pruned) are left to finish their stop, any
/// still running [`STOP_GRACE`] after it was told is killed. A pruned trial is recorded
/// `pruned` as when the sweep goes on; a trial stopped with the sweep stays `killed` (and a run
/// the trainer could not end, killed, is marked so), to run again on `--resume`. One line to
/// `say` per trial.
pub(super) fn stop_trials(
    plan: &Plan,
    store: &Store,
    running: &mut Vec<Running>,
    grace: Duration,
    say: &mut dyn FnMut(&str),
) -> Result<()> {
    let mut told = Vec::new();
    let mut stopping = Vec::new();
    for r in running.iter_mut() {
        if r.told.is_some() {
            stopping.push(r.number.to_string());
        } else {
            r.tell();
            told.push(r.number.to_string());
        }
    }
    if !running.is_empty() {
        let mut what = Vec::new();
        if !told.is_empty() {
            what.push(format!("trials {} told to stop (SIGTERM)", told.join(", ")));
        }
        if !stopping.is_empty() {
            what.push(format!("trials {} already stopping (pruned)", stopping.join(", ")));
        }
        say(&format!(
            "sweep {}: stopping: {}; waiting for them to write their checkpoints (SIGKILL {} s after each was told)",
            plan.spec.name,
            what.join(", "),
            grace.as_secs()
        ));
    }
    while !running.is_empty() {
        let mut i = 0;
        while i < running.len() {
            running[i].kill_when_late(grace);
            match running[i].ended()? {
                Some(status) => {
                    let r = running.remove(i);
                    say(&stopped(plan, store, r, status)?);
                }
                None => i += 1,
            }
        }
        if !running.is_empty() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}

/// Records trial `r`, ended with `status` while the sweep stopped; the line to say about it.
fn stopped(plan: &Plan, store: &Store, mut r: Running, status: ExitStatus) -> Result<String> {
    if r.run_id.is_none() {
        r.run_id = super::find_run(store, plan.spec, r.number, &r.earlier)?.map(|(id, _)| id);
    }
    let run_status = match r.run_id {
        Some(id) => Some(store.run_detail(id)?.summary.status),
        None => None,
    };
    if r.pruned.is_some() || matches!(run_status.as_deref(), Some("finished" | "failed")) || status.success() {
        // pruned, finished or failed before the stop took effect: recorded as the sweep would
        return super::finish(plan, store, r, status);
    }
    if let (Some(id), Some("running")) = (r.run_id, run_status.as_deref()) {
        // killed before it could record its end
        store.set_status(id, Status::Killed, Some("stopped with its sweep"))?;
    }
    Ok(format!(
        "trial {}: stopped with the sweep ({status}); --resume runs it again",
        r.number
    ))
}
