//! What a sweep keeps in the run store's file besides its trials' runs, in tables of its own (as
//! the pipeline cache keeps `pipeline_executions`):
//!
//! - `sweep_prunes`: each pruning decision, written when the pruner makes it and before the
//!   trial is told to stop. A trial that the driver did not see end (the driver was killed while
//!   the trial stopped, and the trainer recorded its run `killed`) is read back as `pruned`
//!   ([`crate::trials::load`]), so `--resume` never runs a pruned trial again.
//! - `sweep_definitions`: the sweep's definition when it started or was last resumed
//!   ([`crate::definition`]), which `--resume` compares with the file as it is now.
//!
//! Both are keyed by the sweep's experiment and name, as its trials are.

use std::collections::BTreeMap;

use rusqlite::{params, OptionalExtension};
use weft_track::Store;

use crate::error::{Error, Result};
use crate::spec::SweepSpec;

fn sql(store: &Store) -> impl Fn(rusqlite::Error) -> Error + '_ {
    move |e| Error::State(format!("{}: {e}", store.path().display()))
}

/// Makes the tables when missing.
fn make_tables(store: &Store) -> Result<()> {
    store
        .connection()
        .execute_batch(
            "CREATE TABLE IF NOT EXISTS sweep_prunes (
                run_id INTEGER NOT NULL, start_time REAL NOT NULL, experiment TEXT NOT NULL, sweep TEXT NOT NULL,
                trial INTEGER NOT NULL, step INTEGER NOT NULL, reason TEXT NOT NULL, PRIMARY KEY (run_id, start_time));
             CREATE TABLE IF NOT EXISTS sweep_definitions (
                experiment TEXT NOT NULL, sweep TEXT NOT NULL, definition TEXT NOT NULL, recorded REAL NOT NULL,
                PRIMARY KEY (experiment, sweep));",
        )
        .map_err(sql(store))
}

/// Whether the store's file has table `name` (a store no sweep of this version wrote to has
/// neither; reading one creates nothing, so a read-only store stays readable).
fn has_table(store: &Store, name: &str) -> Result<bool> {
    let n: i64 = store
        .connection()
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
            params![name],
            |r| r.get(0),
        )
        .map_err(sql(store))?;
    Ok(n > 0)
}

/// A pruning decision as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Prune {
    pub trial: u64,
    /// The step whose value pruned it.
    pub step: i64,
    /// The rule's reason.
    pub reason: String,
}

/// Records that trial `trial` of `spec`'s sweep, recorded as run `run_id` (started at
/// `start_time`, which tells it from a later run given the same id after a delete), was pruned
/// at `step` for `reason`.
pub fn record_prune(
    store: &Store,
    spec: &SweepSpec,
    trial: u64,
    run_id: i64,
    start_time: f64,
    step: i64,
    reason: &str,
) -> Result<()> {
    make_tables(store)?;
    store
        .connection()
        .execute(
            "INSERT OR REPLACE INTO sweep_prunes (run_id, start_time, experiment, sweep, trial, step, reason)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                run_id,
                start_time,
                spec.experiment,
                spec.name,
                trial as i64,
                step,
                reason
            ],
        )
        .map_err(sql(store))?;
    Ok(())
}

/// The recorded pruning decisions of `spec`'s sweep, by `(run id, run start time)`.
pub fn prunes(store: &Store, spec: &SweepSpec) -> Result<BTreeMap<(i64, u64), Prune>> {
    if !has_table(store, "sweep_prunes")? {
        return Ok(BTreeMap::new());
    }
    let mut stmt = store
        .connection()
        .prepare(
            "SELECT run_id, start_time, trial, step, reason FROM sweep_prunes WHERE experiment = ?1 AND sweep = ?2",
        )
        .map_err(sql(store))?;
    let rows = stmt
        .query_map(params![spec.experiment, spec.name], |r| {
            Ok((
                (r.get::<_, i64>(0)?, r.get::<_, f64>(1)?.to_bits()),
                Prune {
                    trial: r.get::<_, i64>(2)?.max(0) as u64,
                    step: r.get(3)?,
                    reason: r.get(4)?,
                },
            ))
        })
        .map_err(sql(store))?;
    rows.collect::<rusqlite::Result<BTreeMap<_, _>>>().map_err(sql(store))
}

/// Marks `pruned` every run of `spec`'s sweep that has a recorded pruning decision and ended
/// otherwise than finished (the trainer recorded it `killed` on its stop, and the driver that
/// would have marked it was gone); how many.
pub fn settle_prunes(store: &Store, spec: &SweepSpec) -> Result<usize> {
    let prunes = prunes(store, spec)?;
    if prunes.is_empty() {
        return Ok(0);
    }
    let mut settled = 0;
    for run in store.list_runs(Some(&spec.experiment))? {
        let Some(p) = prunes.get(&(run.id, run.start_time.to_bits())) else {
            continue;
        };
        if matches!(run.status.as_str(), "killed" | "failed") {
            store.set_status(
                run.id,
                weft_track::Status::Pruned,
                Some(&format!("pruned: {}", p.reason)),
            )?;
            settled += 1;
        }
    }
    Ok(settled)
}

/// The definition `spec`'s sweep was recorded with (TOML text), if one was.
pub fn definition(store: &Store, spec: &SweepSpec) -> Result<Option<String>> {
    if !has_table(store, "sweep_definitions")? {
        return Ok(None);
    }
    store
        .connection()
        .query_row(
            "SELECT definition FROM sweep_definitions WHERE experiment = ?1 AND sweep = ?2",
            params![spec.experiment, spec.name],
            |r| r.get(0),
        )
        .optional()
        .map_err(sql(store))
}

/// Records `text` as the definition of `spec`'s sweep (replacing an earlier one).
pub fn set_definition(store: &Store, spec: &SweepSpec, text: &str) -> Result<()> {
    make_tables(store)?;
    store
        .connection()
        .execute(
            "INSERT OR REPLACE INTO sweep_definitions (experiment, sweep, definition, recorded) VALUES (?1, ?2, ?3, ?4)",
            params![spec.experiment, spec.name, text, weft_track::now()],
        )
        .map_err(sql(store))?;
    Ok(())
}
