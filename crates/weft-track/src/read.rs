//! Reading runs back: the run table, one run's details, metric summaries and rows.

use std::collections::BTreeMap;

use rusqlite::{params, OptionalExtension, Row};

use crate::error::{Error, Result, SqlContext};
use crate::writer::RunInput;
use crate::Store;

/// A run as `weft runs list` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    pub id: i64,
    pub experiment: String,
    pub name: String,
    /// `running`, `finished`, `failed` or `killed`.
    pub status: String,
    /// Seconds since the Unix epoch.
    pub start_time: f64,
    /// Seconds since the Unix epoch; `None` while running.
    pub end_time: Option<f64>,
    pub params: BTreeMap<String, String>,
    pub tags: BTreeMap<String, String>,
    /// Each metric's value at its last step.
    pub last: BTreeMap<String, f64>,
}

/// A metric's values over a run.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricSummary {
    /// Values recorded.
    pub count: i64,
    /// The value at the last step, and that step.
    pub last: f64,
    pub last_step: i64,
    pub min: f64,
    pub max: f64,
}

/// Everything recorded of one run but its metric rows.
#[derive(Debug, Clone, PartialEq)]
pub struct RunDetail {
    pub summary: RunSummary,
    pub command: String,
    pub git_commit: Option<String>,
    pub git_dirty: Option<bool>,
    pub host: String,
    pub layout: String,
    /// Seconds since the Unix epoch.
    pub heartbeat: f64,
    /// Why it failed or was killed.
    pub error: Option<String>,
    /// `(kind, path)` in the order they were recorded.
    pub artifacts: Vec<(String, String)>,
    /// What it read (data, initial weights), in the order recorded.
    pub inputs: Vec<RunInput>,
    pub metrics: BTreeMap<String, MetricSummary>,
}

/// The run table's columns; the experiment's name is named by its table, so that a damaged one
/// is told from the run's own `name` ([`naming_run`]).
const RUN_COLUMNS: &str = "r.id, e.name AS \"experiments.name\", r.name, r.status, r.start_time, r.end_time";

fn summary_row(r: &Row) -> rusqlite::Result<RunSummary> {
    Ok(RunSummary {
        id: r.get(0)?,
        experiment: r.get(1)?,
        name: r.get(2)?,
        status: r.get(3)?,
        start_time: r.get(4)?,
        end_time: r.get(5)?,
        params: BTreeMap::new(),
        tags: BTreeMap::new(),
        last: BTreeMap::new(),
    })
}

/// Which run a failing row belongs to: its id in a column of the row, or known to the query.
#[derive(Clone, Copy)]
pub(crate) enum RunOf {
    Column(usize),
    Id(i64),
}

/// The column a failed read of `r` was about and what it holds (`text`, `blob (...)`), when the
/// failure is a column of another type than the read wanted; `None` for other errors.
fn damage(e: &rusqlite::Error, r: &Row) -> Option<(String, String)> {
    match e {
        rusqlite::Error::InvalidColumnType(_, name, ty) => Some((name.clone(), format!("{ty}").to_lowercase())),
        rusqlite::Error::FromSqlConversionFailure(i, ty, why) => Some((
            r.as_ref()
                .column_name(*i)
                .map_or_else(|_| format!("#{i}"), str::to_string),
            format!("{} ({why})", format!("{ty}").to_lowercase()),
        )),
        _ => None,
    }
}

/// An error whose message is `message` (the variant whose message is the one given: rusqlite
/// makes no other of its own).
fn damaged(message: String) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(message.into())
}

/// `read` of a row of `table`, a column of another type than weft writes there (the file edited
/// by hand or by another program) made an error naming the run, the table and the column: before,
/// `weft runs list` failed for every run with only `Invalid column type Text at index: 4, name:
/// start_time`. A column named `TABLE.COLUMN` (the run's experiment's name, joined in) is named
/// as that table's.
pub(crate) fn naming_run<T>(
    table: &'static str,
    run: RunOf,
    mut read: impl FnMut(&Row) -> rusqlite::Result<T>,
) -> impl FnMut(&Row) -> rusqlite::Result<T> {
    move |r| {
        read(r).map_err(|e| {
            let Some((column, holds)) = damage(&e, r) else {
                return e;
            };
            let id = match run {
                RunOf::Id(id) => id.to_string(),
                RunOf::Column(i) => r
                    .get::<_, i64>(i)
                    .map_or_else(|_| "(unreadable id)".to_string(), |id| id.to_string()),
            };
            damaged(match column.split_once('.') {
                Some((other, column)) => format!(
                    "run {id}'s row in table {other} is damaged: column {column} holds {holds}, not what weft \
                     writes there (fix that row, e.g. with sqlite3: deleting the run leaves it)"
                ),
                None => format!(
                    "run {id}'s row in table {table} is damaged: column {column} holds {holds}, not what weft \
                     writes there (fix the row, or delete the run with `weft runs delete {id}`)"
                ),
            })
        })
    }
}

/// [`naming_run`] for a row of table `experiments`, the experiment's id in column `id_column`.
fn naming_experiment<T>(
    id_column: usize,
    mut read: impl FnMut(&Row) -> rusqlite::Result<T>,
) -> impl FnMut(&Row) -> rusqlite::Result<T> {
    move |r| {
        read(r).map_err(|e| {
            let Some((column, holds)) = damage(&e, r) else {
                return e;
            };
            let id = r
                .get::<_, i64>(id_column)
                .map_or_else(|_| "(unreadable id)".to_string(), |id| id.to_string());
            damaged(format!(
                "experiment {id}'s row in table experiments is damaged: column {column} holds {holds}, not what \
                 weft writes there (fix that row, e.g. with sqlite3: deleting its runs leaves it)"
            ))
        })
    }
}

impl Store {
    /// The runs (of `experiment` when given), oldest first, with their params, tags and last
    /// metric values: four queries whatever the number of runs (the run rows, every param, every
    /// tag, and each run's last value of each metric from the summary table), none of which
    /// reads a metric row (docs/tracking.md).
    pub fn list_runs(&self, experiment: Option<&str>) -> Result<Vec<RunSummary>> {
        let p = &self.path;
        // reads through a memory map (up to 1 GiB of the file) rather than one read call per page
        self.conn.pragma_update(None, "mmap_size", 1i64 << 30).at(p)?;
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM runs r JOIN experiments e ON e.id = r.experiment_id
             WHERE ?1 IS NULL OR e.name = ?1 ORDER BY r.id"
        );
        let mut stmt = self.conn.prepare(&sql).at(p)?;
        let mut runs: Vec<RunSummary> = stmt
            .query_map(params![experiment], naming_run("runs", RunOf::Column(0), summary_row))
            .at(p)?
            .collect::<rusqlite::Result<_>>()
            .at(p)?;
        // run id -> index in `runs` (ids ascend, so a binary search)
        let at = |id: i64| runs.binary_search_by_key(&id, |r| r.id).ok();
        let in_experiment = "SELECT r.id FROM runs r JOIN experiments e ON e.id = r.experiment_id
                             WHERE ?1 IS NULL OR e.name = ?1";
        let mut found: Vec<(usize, u8, String, String)> = Vec::new();
        for (which, table) in [(0u8, "params"), (1, "tags")] {
            let sql = format!("SELECT run_id, key, value FROM {table} WHERE run_id IN ({in_experiment})");
            let mut stmt = self.conn.prepare(&sql).at(p)?;
            let rows = stmt
                .query_map(
                    params![experiment],
                    naming_run(table, RunOf::Column(0), |r| {
                        Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?))
                    }),
                )
                .at(p)?;
            for row in rows {
                let (id, k, v) = row.at(p)?;
                if let Some(i) = at(id) {
                    found.push((i, which, k, v));
                }
            }
        }
        let last = self.last_values(experiment)?;
        for (i, which, k, v) in found {
            let run = &mut runs[i];
            if which == 0 {
                run.params.insert(k, v);
            } else {
                run.tags.insert(k, v);
            }
        }
        for (id, key, value) in last {
            if let Ok(i) = runs.binary_search_by_key(&id, |r| r.id) {
                runs[i].last.insert(key, value);
            }
        }
        Ok(runs)
    }

    /// `(run, key, value at the key's last step)` for every run (of `experiment`) and key, from
    /// the summary table the writer keeps (`metric_summary`: one row a run and key, written in
    /// the transaction of the metric rows it sums up), so the cost grows with runs x keys and
    /// not at all with the number of metric rows.
    fn last_values(&self, experiment: Option<&str>) -> Result<Vec<(i64, String, f64)>> {
        let p = &self.path;
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT s.run_id, s.key, s.last FROM metric_summary s
                 WHERE ?1 IS NULL OR s.run_id IN (SELECT r.id FROM runs r JOIN experiments e ON e.id = r.experiment_id
                                                  WHERE e.name = ?1)",
            )
            .at(p)?;
        let rows = stmt
            .query_map(
                params![experiment],
                naming_run("metric_summary", RunOf::Column(0), |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                }),
            )
            .at(p)?;
        rows.collect::<rusqlite::Result<_>>().at(p)
    }

    /// Run `id`'s summary of each metric key (from `metric_summary`), by key.
    fn metric_summaries(&self, id: i64) -> Result<BTreeMap<String, MetricSummary>> {
        let p = &self.path;
        let mut stmt = self
            .conn
            .prepare_cached("SELECT key, count, last, last_step, min, max FROM metric_summary WHERE run_id = ?1")
            .at(p)?;
        let rows = stmt
            .query_map(
                params![id],
                naming_run("metric_summary", RunOf::Id(id), |r| {
                    Ok((
                        r.get(0)?,
                        MetricSummary {
                            count: r.get(1)?,
                            last: r.get(2)?,
                            last_step: r.get(3)?,
                            min: r.get(4)?,
                            max: r.get(5)?,
                        },
                    ))
                }),
            )
            .at(p)?;
        rows.collect::<rusqlite::Result<_>>().at(p)
    }

    /// Params and tags of `run`.
    fn fill(&self, run: &mut RunSummary) -> Result<()> {
        let p = &self.path;
        let id = run.id;
        let pairs = |table: &'static str, sql: &str| -> Result<BTreeMap<String, String>> {
            let mut stmt = self.conn.prepare_cached(sql).at(p)?;
            let rows = stmt
                .query_map(
                    params![id],
                    naming_run(table, RunOf::Id(id), |r| Ok((r.get(0)?, r.get(1)?))),
                )
                .at(p)?;
            rows.collect::<rusqlite::Result<_>>().at(p)
        };
        run.params = pairs("params", "SELECT key, value FROM params WHERE run_id = ?1")?;
        run.tags = pairs("tags", "SELECT key, value FROM tags WHERE run_id = ?1")?;
        Ok(())
    }

    /// Everything recorded of run `id` but its metric rows.
    pub fn run_detail(&self, id: i64) -> Result<RunDetail> {
        let p = &self.path;
        let sql = format!(
            "SELECT {RUN_COLUMNS}, r.command, r.git_commit, r.git_dirty, r.host, r.layout, r.heartbeat, r.error
             FROM runs r JOIN experiments e ON e.id = r.experiment_id WHERE r.id = ?1"
        );
        let found = self
            .conn
            .query_row(
                &sql,
                params![id],
                naming_run("runs", RunOf::Id(id), |r| {
                    Ok(RunDetail {
                        summary: summary_row(r)?,
                        command: r.get(6)?,
                        git_commit: r.get(7)?,
                        git_dirty: r.get(8)?,
                        host: r.get(9)?,
                        layout: r.get(10)?,
                        heartbeat: r.get(11)?,
                        error: r.get(12)?,
                        artifacts: Vec::new(),
                        inputs: Vec::new(),
                        metrics: BTreeMap::new(),
                    })
                }),
            )
            .optional()
            .at(p)?;
        let mut detail = found.ok_or_else(|| Error::UnknownRun(format!("{}: no run with id {id}", p.display())))?;
        self.fill(&mut detail.summary)?;
        let mut stmt = self
            .conn
            .prepare("SELECT kind, path FROM artifacts WHERE run_id = ?1 ORDER BY rowid")
            .at(p)?;
        detail.artifacts = stmt
            .query_map(
                params![id],
                naming_run("artifacts", RunOf::Id(id), |r| Ok((r.get(0)?, r.get(1)?))),
            )
            .at(p)?
            .collect::<rusqlite::Result<_>>()
            .at(p)?;
        detail.inputs = self.inputs(id)?;
        detail.metrics = self.metric_summaries(id)?;
        detail.summary.last = detail.metrics.iter().map(|(k, m)| (k.clone(), m.last)).collect();
        Ok(detail)
    }

    /// What run `id` read, in the order recorded (`[]` for an unknown run).
    pub fn inputs(&self, id: i64) -> Result<Vec<RunInput>> {
        let p = &self.path;
        let mut stmt = self
            .conn
            .prepare("SELECT kind, uri, digest, source_run FROM run_inputs WHERE run_id = ?1 ORDER BY rowid")
            .at(p)?;
        let rows = stmt
            .query_map(
                params![id],
                naming_run("run_inputs", RunOf::Id(id), |r| {
                    Ok(RunInput {
                        kind: r.get(0)?,
                        uri: r.get(1)?,
                        digest: r.get(2)?,
                        source_run: r.get(3)?,
                    })
                }),
            )
            .at(p)?;
        rows.collect::<rusqlite::Result<_>>().at(p)
    }

    /// The latest run whose recorded `checkpoint` artifact is `path` or a folder holding it
    /// (the run that wrote a checkpoint, or a file inside one).
    pub fn checkpoint_owner(&self, path: &str) -> Result<Option<i64>> {
        checkpoint_owner(&self.conn, &self.path, None, path)
    }

    /// Every metric row of run `id`: `(step, key, value, time)` by key, then step.
    pub fn metric_rows(&self, id: i64) -> Result<Vec<(i64, String, f64, f64)>> {
        let p = &self.path;
        let mut stmt = self
            .conn
            .prepare("SELECT step, key, value, time FROM metrics WHERE run_id = ?1 ORDER BY key, step, rowid")
            .at(p)?;
        let rows = stmt
            .query_map(
                params![id],
                naming_run("metrics", RunOf::Id(id), |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                }),
            )
            .at(p)?;
        rows.collect::<rusqlite::Result<_>>().at(p)
    }

    /// Every experiment: `(name, runs, running runs)`, by name.
    pub fn experiments(&self) -> Result<Vec<(String, i64, i64)>> {
        let p = &self.path;
        let mut stmt = self
            .conn
            .prepare(
                "SELECT e.name, count(r.id), COALESCE(SUM(r.status = 'running'), 0), e.id
                 FROM experiments e LEFT JOIN runs r ON r.experiment_id = e.id GROUP BY e.id ORDER BY e.name",
            )
            .at(p)?;
        let rows = stmt
            .query_map([], naming_experiment(3, |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))))
            .at(p)?;
        rows.collect::<rusqlite::Result<_>>().at(p)
    }

    /// Whether run `id` is in the store.
    pub fn has_run(&self, id: i64) -> Result<bool> {
        self.conn
            .query_row("SELECT count(*) FROM runs WHERE id = ?1", params![id], |r| {
                r.get::<_, i64>(0)
            })
            .at(&self.path)
            .map(|n| n > 0)
    }

    /// The metric keys run `id` recorded, by name (from `metric_summary`).
    pub fn metric_keys(&self, id: i64) -> Result<Vec<String>> {
        let p = &self.path;
        let mut stmt = self
            .conn
            .prepare_cached("SELECT key FROM metric_summary WHERE run_id = ?1 ORDER BY key")
            .at(p)?;
        let rows = stmt
            .query_map(params![id], naming_run("metric_summary", RunOf::Id(id), |r| r.get(0)))
            .at(p)?;
        rows.collect::<rusqlite::Result<_>>().at(p)
    }

    /// Run `id`'s values of metric `key`: `(step, value, time)` by step (time in seconds since
    /// the Unix epoch), in the order they were written within a step.
    pub fn metric_series(&self, id: i64, key: &str) -> Result<Vec<(i64, f64, f64)>> {
        let p = &self.path;
        let mut stmt = self
            .conn
            .prepare_cached("SELECT step, value, time FROM metrics WHERE run_id = ?1 AND key = ?2 ORDER BY step, rowid")
            .at(p)?;
        let rows = stmt
            .query_map(
                params![id, key],
                naming_run("metrics", RunOf::Id(id), |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?))),
            )
            .at(p)?;
        rows.collect::<rusqlite::Result<_>>().at(p)
    }
}

/// As [`Store::checkpoint_owner`], leaving out run `except`.
pub(crate) fn checkpoint_owner(
    conn: &rusqlite::Connection,
    path: &std::path::Path,
    except: Option<i64>,
    uri: &str,
) -> Result<Option<i64>> {
    conn.query_row(
        "SELECT run_id FROM artifacts WHERE kind = 'checkpoint' AND run_id IS NOT ?2
         AND (?1 = path OR substr(?1, 1, length(path) + 1) = path || '/')
         ORDER BY run_id DESC LIMIT 1",
        params![uri, except],
        |r| r.get(0),
    )
    .optional()
    .at(path)
}
