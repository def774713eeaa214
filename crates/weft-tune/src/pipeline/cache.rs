//! The cache of step executions: the `pipeline_executions` table in the run store's SQLite
//! file, and the one write a pipeline makes into a run's own records (an evaluate step's metric).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};

use crate::error::{Error, Result};

/// A finished execution of a step, as the cache keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Execution {
    pub id: i64,
    pub pipeline: String,
    pub step: String,
    pub hash: String,
    /// `finished` or `failed`.
    pub status: String,
    /// What the step made (a train step: `run=ID checkpoint=FOLDER`; a condition: `true`/`false`; a register:
    /// `model=NAME version=N`), or the error of a failed one.
    pub output: String,
    /// Seconds since the Unix epoch.
    pub start: f64,
    pub end: f64,
}

/// The executions table in the run store's file.
pub struct Cache {
    conn: Connection,
    path: PathBuf,
}

fn sql(path: &Path) -> impl Fn(rusqlite::Error) -> Error + '_ {
    move |e| Error::State(format!("{}: {e}", path.display()))
}

/// A connection of its own to `store`'s file (waiting up to 30 s for other writers), and the
/// file's path.
fn connect(store: weft_track::Store) -> Result<(Connection, PathBuf)> {
    let path = store.path().to_path_buf();
    drop(store);
    let conn = Connection::open(&path).map_err(sql(&path))?;
    conn.busy_timeout(Duration::from_secs(30)).map_err(sql(&path))?;
    Ok((conn, path))
}

/// An execution from a row of `SELECT id, pipeline, step, hash, status, output, start, end`.
fn execution_row(r: &rusqlite::Row) -> rusqlite::Result<Execution> {
    Ok(Execution {
        id: r.get(0)?,
        pipeline: r.get(1)?,
        step: r.get(2)?,
        hash: r.get(3)?,
        status: r.get(4)?,
        output: r.get(5)?,
        start: r.get(6)?,
        end: r.get(7)?,
    })
}

impl Cache {
    /// Opens the cache of the run store in folder `dir` (store and table made when missing).
    pub fn open(dir: &Path) -> Result<Cache> {
        let (conn, path) = connect(weft_track::Store::open(dir)?)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS pipeline_executions (
                id INTEGER PRIMARY KEY, pipeline TEXT NOT NULL, step TEXT NOT NULL, hash TEXT NOT NULL,
                status TEXT NOT NULL, output TEXT NOT NULL, start REAL NOT NULL, end REAL NOT NULL);
             CREATE INDEX IF NOT EXISTS pipeline_executions_hash ON pipeline_executions (hash);",
        )
        .map_err(sql(&path))?;
        Ok(Cache { conn, path })
    }

    /// Opens the cache of the existing run store in folder `dir` for reading: `None` when the
    /// store has no executions table (no pipeline ran on it); nothing is created.
    pub fn open_existing(dir: &Path) -> Result<Option<Cache>> {
        let (conn, path) = connect(weft_track::Store::open_existing(dir)?)?;
        let tables: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'pipeline_executions'",
                [],
                |r| r.get(0),
            )
            .map_err(sql(&path))?;
        Ok((tables > 0).then_some(Cache { conn, path }))
    }

    /// The latest finished execution with cache key `hash`.
    pub fn finished(&self, hash: &str) -> Result<Option<Execution>> {
        self.conn
            .query_row(
                "SELECT id, pipeline, step, hash, status, output, start, end FROM pipeline_executions
                 WHERE hash = ?1 AND status = 'finished' ORDER BY id DESC LIMIT 1",
                params![hash],
                execution_row,
            )
            .optional()
            .map_err(sql(&self.path))
    }

    /// Records an execution; its id.
    pub fn record(&self, pipeline: &str, step: &str, hash: &str, ok: bool, output: &str, start: f64) -> Result<i64> {
        self.conn
            .execute(
                "INSERT INTO pipeline_executions (pipeline, step, hash, status, output, start, end)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    pipeline,
                    step,
                    hash,
                    if ok { "finished" } else { "failed" },
                    output,
                    start,
                    weft_track::now()
                ],
            )
            .map_err(sql(&self.path))?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Records `value` as metric `key` of run `run` at `step`, as the run's own writer records
    /// its metrics: a row of `metrics` and the run's summary of the key, in one transaction (an
    /// evaluate step's `eval/val_loss`; `weft_track::Store::add_metric`).
    pub fn log_metric(&mut self, run: i64, step: i64, key: &str, value: f64) -> Result<()> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let mut store = weft_track::Store::open(dir)?;
        Ok(store.add_metric(run, step, key, value)?)
    }

    /// The finished executions whose output has a `key` that `is` accepts (`data` and a
    /// prepare step's folder, `run` and a train step's run id), oldest first: what made a run's
    /// input, or the run.
    pub fn made(&self, key: &str, is: impl Fn(&str) -> bool) -> Result<Vec<Execution>> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT id, pipeline, step, hash, status, output, start, end FROM pipeline_executions
                 WHERE status = 'finished' AND instr(output, ?1) > 0 ORDER BY id",
            )
            .map_err(sql(&self.path))?;
        let rows = stmt
            .query_map(params![format!("{key}=")], execution_row)
            .map_err(sql(&self.path))?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(sql(&self.path))?;
        Ok(rows
            .into_iter()
            .filter(|e| super::refs::parse_output(&e.output).get(key).is_some_and(|v| is(v)))
            .collect())
    }

    /// The latest execution of step `step` of pipeline `pipeline`: `(status, output, end)`.
    pub fn last(&self, pipeline: &str, step: &str) -> Result<Option<(String, String, f64)>> {
        self.conn
            .query_row(
                "SELECT status, output, end FROM pipeline_executions WHERE pipeline = ?1 AND step = ?2
                 ORDER BY id DESC LIMIT 1",
                params![pipeline, step],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .map_err(sql(&self.path))
    }
}
