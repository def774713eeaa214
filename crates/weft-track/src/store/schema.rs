//! The store's tables and indexes, its schema version, and bringing an older store up to date.

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::error::{Error, Result, SqlContext};

/// The schema this code writes and reads: 2 added `metric_summary` (version 1 stores get it,
/// filled from their metrics, when opened).
pub(crate) const SCHEMA_VERSION: i64 = 2;

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS experiments (
    id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    experiment_id INTEGER NOT NULL REFERENCES experiments(id),
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    start_time REAL NOT NULL,
    end_time REAL,
    command TEXT NOT NULL DEFAULT '',
    git_commit TEXT,
    git_dirty INTEGER,
    host TEXT NOT NULL DEFAULT '',
    layout TEXT NOT NULL DEFAULT '',
    heartbeat REAL NOT NULL,
    error TEXT,
    UNIQUE (experiment_id, name));
CREATE TABLE IF NOT EXISTS params (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    key TEXT NOT NULL, value TEXT NOT NULL, num REAL,
    PRIMARY KEY (run_id, key));
CREATE TABLE IF NOT EXISTS tags (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    key TEXT NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (run_id, key));
CREATE TABLE IF NOT EXISTS metrics (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    step INTEGER NOT NULL, key TEXT NOT NULL, value REAL NOT NULL, time REAL NOT NULL);
CREATE INDEX IF NOT EXISTS metrics_run_key_step ON metrics (run_id, key, step);
CREATE TABLE IF NOT EXISTS metric_summary (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    key TEXT NOT NULL,
    last REAL NOT NULL, last_step INTEGER NOT NULL,
    min REAL NOT NULL, max REAL NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (run_id, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS artifacts (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    kind TEXT NOT NULL, path TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS artifacts_run ON artifacts (run_id);
CREATE TABLE IF NOT EXISTS run_inputs (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    kind TEXT NOT NULL, uri TEXT NOT NULL, digest TEXT, source_run INTEGER);
CREATE INDEX IF NOT EXISTS run_inputs_run ON run_inputs (run_id);
";

/// Fills `metric_summary` from the metric rows (a store written before it existed): each run's
/// and key's value at its last step (the last written among rows of that step), its min, max
/// and count. One pass over the metrics, once.
const FILL_SUMMARY: &str = "
INSERT OR REPLACE INTO metric_summary (run_id, key, last, last_step, min, max, count)
SELECT g.run_id, g.key,
       (SELECT m.value FROM metrics m WHERE m.run_id = g.run_id AND m.key = g.key
        ORDER BY m.step DESC, m.rowid DESC LIMIT 1),
       g.last_step, g.min, g.max, g.count
FROM (SELECT run_id, key, MAX(step) AS last_step, MIN(value) AS min, MAX(value) AS max, count(*) AS count
      FROM metrics GROUP BY run_id, key) g";

/// The names of the tables and indexes [`SCHEMA`] creates.
pub(super) fn schema_objects() -> impl Iterator<Item = &'static str> {
    SCHEMA.lines().filter_map(|l| {
        let rest = l
            .trim()
            .strip_prefix("CREATE TABLE IF NOT EXISTS ")
            .or_else(|| l.trim().strip_prefix("CREATE INDEX IF NOT EXISTS "))?;
        rest.split(|c: char| c.is_whitespace() || c == '(').next()
    })
}

/// Whether the file has every table and index of [`SCHEMA`] (a plain read).
pub(super) fn has_every_schema_object(conn: &Connection) -> bool {
    schema_objects().all(|name| {
        conn.query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = ?1",
            params![name],
            |r| r.get::<_, i64>(0),
        )
        .is_ok_and(|n| n > 0)
    })
}

/// Creates the tables (once), checks the schema version, and brings a store of an older
/// version up to this one (in the same transaction, so one opener migrates and the others wait
/// for it).
pub(super) fn init_schema(conn: &Connection, path: &Path) -> Result<()> {
    // a store of this version needs nothing: say so without the write lock, which another
    // process may hold for long (reads would wait for it, 30 s, and fail)
    // (and every table and index of SCHEMA already there: some were added without a new
    // version, and a store made before them gets them at its next open)
    if matches!(read_version(conn), Ok(Version::Known(SCHEMA_VERSION))) && has_every_schema_object(conn) {
        return Ok(());
    }
    let mut conn_tx = rusqlite::Transaction::new_unchecked(conn, TransactionBehavior::Immediate).at(path)?;
    conn_tx.set_drop_behavior(rusqlite::DropBehavior::Rollback);
    let mut migrate_from = None;
    let has_meta: bool = conn_tx
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .at(path)?
        > 0;
    if has_meta {
        let found = match read_version(&conn_tx).at(path)? {
            Version::Known(v) => v,
            other => return Err(other.error(path)),
        };
        if found > SCHEMA_VERSION {
            return Err(Error::NewerSchema {
                path: path.to_path_buf(),
                found,
                known: SCHEMA_VERSION,
            });
        }
        if found < SCHEMA_VERSION {
            migrate_from = Some(found);
        }
    } else {
        let tables: i64 = conn_tx
            .query_row("SELECT count(*) FROM sqlite_master WHERE type = 'table'", [], |r| {
                r.get(0)
            })
            .at(path)?;
        if tables > 0 {
            return Err(Error::Corrupt {
                path: path.to_path_buf(),
                reason: "a SQLite database, but not a weft run store (no meta table)".into(),
            });
        }
    }
    conn_tx.execute_batch(SCHEMA).at(path)?;
    if migrate_from.is_some_and(|v| v < 2) {
        conn_tx.execute_batch(FILL_SUMMARY).at(path)?;
    }
    conn_tx
        .execute(
            if migrate_from.is_some() {
                "UPDATE meta SET value = ?1 WHERE key = 'schema_version'"
            } else {
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?1)"
            },
            params![SCHEMA_VERSION.to_string()],
        )
        .at(path)?;
    conn_tx.commit().at(path)
}

/// What a store's `meta` table says of its schema version.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Version {
    /// A version weft may have written (1 or more).
    Known(i64),
    /// The table has no `schema_version` row.
    Missing,
    /// Something that is no version (`"two"`, `"99999999999999999999"`, `"0"`), as it reads.
    Invalid(String),
}

impl Version {
    /// The error of a store whose version is missing or invalid ([`Error::Corrupt`]).
    pub(super) fn error(&self, path: &Path) -> Error {
        let reason = match self {
            Version::Known(v) => format!("schema version {v}"),
            Version::Missing => "its meta table holds no schema_version".into(),
            Version::Invalid(found) => format!(
                "its meta table's schema_version is {found}, not a version number weft writes (1 or more): \
                 the file cannot be read as a run store"
            ),
        };
        Error::Corrupt {
            path: path.to_path_buf(),
            reason,
        }
    }
}

/// The `schema_version` row of the `meta` table (an error when there is no such table).
pub(super) fn read_version(conn: &Connection) -> rusqlite::Result<Version> {
    use rusqlite::types::Value;
    let found: Option<Value> = conn
        .query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |r| r.get(0))
        .optional()?;
    Ok(match found {
        None => Version::Missing,
        Some(Value::Integer(v)) if v >= 1 => Version::Known(v),
        Some(Value::Text(t)) => match t.parse::<i64>() {
            Ok(v) if v >= 1 => Version::Known(v),
            _ => Version::Invalid(crate::error::quoted(&t)),
        },
        Some(Value::Integer(v)) => Version::Invalid(v.to_string()),
        Some(Value::Real(v)) => Version::Invalid(v.to_string()),
        Some(Value::Blob(b)) => Version::Invalid(format!("a blob of {} bytes", b.len())),
        Some(Value::Null) => Version::Invalid("NULL".into()),
    })
}
