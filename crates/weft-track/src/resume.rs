//! Continuing a run: a training run resumed from a checkpoint goes on as the run that wrote the
//! checkpoint ([`RunWriter::resume`]), when that run is still in the same store and no other
//! process is recording it.
//!
//! A store names itself with a random id (`store_id` in its `meta` table, made the first time a
//! run is recorded in it), so a checkpoint names the store its run is in whatever path the store
//! is reached by; a run's id and start time name the run (SQLite may give a deleted run's id to
//! a later run).

use std::fmt;
use std::path::{Path, PathBuf};

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::error::{Result, SqlContext};
use crate::writer::{NewRun, RunWriter, WriterOptions};
use crate::Store;

/// The tag that records where a run was continued: the steps it was resumed after, in order,
/// joined by `,` (`"6"`, then `"6,12"`).
pub const RESUMED_TAG: &str = "resumed_after";

/// Which run of which store a checkpoint's steps were recorded in: what the trainer keeps in a
/// checkpoint so that resuming from it continues the run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRef {
    /// The store's own id (32 hex digits, random; `meta.store_id`).
    pub store: String,
    /// The run's id in that store.
    pub run: i64,
    /// The run's experiment.
    pub experiment: String,
    /// The run's name in its experiment.
    pub name: String,
    /// The run's start time, seconds since the Unix epoch (tells a run from a later one that got
    /// the same id after it was deleted; compared within a millisecond).
    pub start_time: f64,
}

/// Why [`RunWriter::resume`] did not continue the run: the caller records a new run instead.
#[derive(Debug, Clone, PartialEq)]
pub enum NotContinued {
    /// The store in the folder is not the one the run was recorded in (its file, this store's).
    OtherStore(PathBuf),
    /// The run is no longer in the store (deleted).
    Deleted,
    /// The run's id now names another run (the run was deleted and its id given again).
    Replaced,
    /// The run belongs to another experiment than the one asked for (the one asked for).
    OtherExperiment(String),
    /// The run is `running` and its heartbeat is fresh: another process is recording it. Its
    /// heartbeat's age, in seconds.
    Live(f64),
}

impl fmt::Display for NotContinued {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotContinued::OtherStore(path) => write!(f, "it was recorded in another store than {}", path.display()),
            NotContinued::Deleted => write!(f, "it was deleted from the store"),
            NotContinued::Replaced => write!(f, "it was deleted from the store (its id now names another run)"),
            NotContinued::OtherExperiment(e) => write!(f, "it belongs to another experiment than {e:?}"),
            NotContinued::Live(age) => write!(
                f,
                "it is still running (its heartbeat is {age:.0} s old: another process records it, or one that \
                 died less than a minute ago)"
            ),
        }
    }
}

/// What [`RunWriter::resume`] did.
pub enum Resumed {
    /// The run goes on: its writer.
    Continued(RunWriter),
    /// The run cannot be continued, and why; nothing was changed.
    NotContinued(NotContinued),
}

impl RunWriter {
    /// Continues run `prior` of the store in `dir` after step `from_step` (the steps done; the
    /// resumed run logs steps `from_step + 1` on), in one transaction:
    ///
    /// - the run's metric rows of steps after `from_step` are deleted (they will be logged
    ///   again), and its `metric_summary` rows recomputed from the rows left;
    /// - its `checkpoint` artifacts are deleted (the run records the checkpoint folders on disk
    ///   when it ends, as every run does; other artifacts stay, and one recorded again is not
    ///   written twice);
    /// - its params become `run`'s (the resumed config's; keys it lacks go); `run`'s tags are
    ///   set (others kept), and tag [`RESUMED_TAG`] gets `from_step` appended;
    /// - its status is `running` again, with a new heartbeat, no end time and no error; its
    ///   command, git state, host and layout become `run`'s. Its experiment, name and start time
    ///   stay.
    ///
    /// Nothing changes, and [`Resumed::NotContinued`] says why, when the store is another one,
    /// the run was deleted, it is not in `run.experiment`, or it is `running` with a heartbeat
    /// younger than [`OpenOptions::stale_after`](crate::OpenOptions::stale_after).
    pub fn resume(dir: &Path, prior: &RunRef, from_step: u64, run: NewRun, options: WriterOptions) -> Result<Resumed> {
        let mut store = Store::open(dir)?;
        let stale_after = store.options.stale_after.as_secs_f64();
        let from_step = i64::try_from(from_step).unwrap_or(i64::MAX);
        let path = store.path.clone();
        let tx = store
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .at(&path)?;
        let id = store_id(&tx, &path)?;
        let found = if id != prior.store {
            Err(NotContinued::OtherStore(path.clone()))
        } else {
            find(&tx, &path, prior, &run.experiment, stale_after)?
        };
        if let Err(why) = found {
            // nothing else changed: this commits only a store id made just now
            tx.commit().at(&path)?;
            return Ok(Resumed::NotContinued(why));
        }
        let run_id = prior.run;
        tx.execute(
            "DELETE FROM metrics WHERE run_id = ?1 AND step > ?2",
            params![run_id, from_step],
        )
        .at(&path)?;
        // a NaN the run met after its checkpoint is gone with the steps that met it
        tx.execute(
            "DELETE FROM tags WHERE run_id = ?1 AND key LIKE 'nan\\_step.%' ESCAPE '\\'
             AND CAST(value AS INTEGER) > ?2",
            params![run_id, from_step],
        )
        .at(&path)?;
        tx.execute("DELETE FROM metric_summary WHERE run_id = ?1", params![run_id])
            .at(&path)?;
        tx.execute(FILL_RUN_SUMMARY, params![run_id]).at(&path)?;
        tx.execute(
            "DELETE FROM artifacts WHERE run_id = ?1 AND kind = 'checkpoint'",
            params![run_id],
        )
        .at(&path)?;
        tx.execute("DELETE FROM params WHERE run_id = ?1", params![run_id])
            .at(&path)?;
        crate::writer::insert_params_and_tags(&tx, &path, run_id, &run)?;
        let before: Option<String> = tx
            .query_row(
                "SELECT value FROM tags WHERE run_id = ?1 AND key = ?2",
                params![run_id, RESUMED_TAG],
                |r| r.get(0),
            )
            .optional()
            .at(&path)?;
        let resumed = match before.filter(|b| !b.is_empty()) {
            Some(b) => format!("{b},{from_step}"),
            None => from_step.to_string(),
        };
        tx.execute(
            "INSERT OR REPLACE INTO tags (run_id, key, value) VALUES (?1, ?2, ?3)",
            params![run_id, RESUMED_TAG, resumed],
        )
        .at(&path)?;
        tx.execute(
            "UPDATE runs SET status = 'running', end_time = NULL, error = NULL, heartbeat = ?2, command = ?3,
             git_commit = ?4, git_dirty = ?5, host = ?6, layout = ?7 WHERE id = ?1",
            params![
                run_id,
                crate::now(),
                run.command,
                run.git.as_ref().map(|g| g.0.clone()),
                run.git.as_ref().map(|g| g.1),
                run.host,
                run.layout
            ],
        )
        .at(&path)?;
        tx.commit().at(&path)?;
        let writer = RunWriter::spawn(store, dir, prior.clone(), options)?;
        Ok(Resumed::Continued(writer))
    }
}

/// Checks that run `prior` is in the store, is the same run, belongs to `experiment` and is not
/// recorded by a live process.
fn find(
    conn: &Connection,
    path: &Path,
    prior: &RunRef,
    experiment: &str,
    stale_after: f64,
) -> Result<std::result::Result<(), NotContinued>> {
    let row: Option<(String, f64, f64, String)> = conn
        .query_row(
            "SELECT r.status, r.heartbeat, r.start_time, e.name FROM runs r
             JOIN experiments e ON e.id = r.experiment_id WHERE r.id = ?1",
            params![prior.run],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .optional()
        .at(path)?;
    let Some((status, heartbeat, start_time, exp)) = row else {
        return Ok(Err(NotContinued::Deleted));
    };
    // within a millisecond: the time may have gone through JSON (a checkpoint) and back
    if (start_time - prior.start_time).abs() > 1e-3 {
        return Ok(Err(NotContinued::Replaced));
    }
    if exp != experiment {
        return Ok(Err(NotContinued::OtherExperiment(experiment.to_string())));
    }
    let age = crate::now() - heartbeat;
    if status == crate::Status::Running.as_str() && age < stale_after {
        return Ok(Err(NotContinued::Live(age.max(0.0))));
    }
    Ok(Ok(()))
}

/// The store's id, made (random) when it has none yet.
pub(crate) fn store_id(conn: &Connection, path: &Path) -> Result<String> {
    conn.execute(
        "INSERT OR IGNORE INTO meta (key, value) VALUES ('store_id', lower(hex(randomblob(16))))",
        [],
    )
    .at(path)?;
    conn.query_row("SELECT value FROM meta WHERE key = 'store_id'", [], |r| r.get(0))
        .at(path)
}

/// Fills `metric_summary` for run `?1` from its metric rows (as the store's migration does for
/// every run): each key's value at its last step (the last written of that step), that step,
/// min, max and count.
pub(crate) const FILL_RUN_SUMMARY: &str = "
INSERT INTO metric_summary (run_id, key, last, last_step, min, max, count)
SELECT g.run_id, g.key,
       (SELECT m.value FROM metrics m WHERE m.run_id = g.run_id AND m.key = g.key
        ORDER BY m.step DESC, m.rowid DESC LIMIT 1),
       g.last_step, g.min, g.max, g.count
FROM (SELECT run_id, key, MAX(step) AS last_step, MIN(value) AS min, MAX(value) AS max, count(*) AS count
      FROM metrics WHERE run_id = ?1 GROUP BY run_id, key) g";
