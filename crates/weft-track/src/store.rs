//! Opening a store: the file, its schema and version, and runs whose heartbeat stopped.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection};

use crate::error::{Error, Result, SqlContext};

mod find;
mod schema;

pub(crate) use schema::SCHEMA_VERSION;
use schema::{has_every_schema_object, init_schema, read_version, Version};

/// The store's file inside its folder.
pub const STORE_FILE: &str = "runs.db";

/// How a store is opened.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// A run still `running` whose heartbeat is older than this is marked `killed` (writers
    /// beat every [`WriterOptions::heartbeat`](crate::WriterOptions::heartbeat), 10 s by
    /// default). Default: 60 s.
    pub stale_after: Duration,
    /// How long a writer waits for another's lock before failing. Default: 30 s.
    pub busy_timeout: Duration,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            stale_after: Duration::from_secs(60),
            busy_timeout: Duration::from_secs(30),
        }
    }
}

/// One run store: a folder holding [`STORE_FILE`].
pub struct Store {
    pub(crate) conn: Connection,
    pub(crate) path: PathBuf,
    pub(crate) options: OpenOptions,
    /// For a store read as it is ([`Store::open_read_only`]): the file's length and modification
    /// time when the connection was opened ([`Store::refresh`]).
    pub(crate) read_only: Option<FileStamp>,
    /// The file the connection opened (device and inode; `None` where unknown): a store whose
    /// path names another file now (deleted and made again) is opened again ([`Store::refresh`]).
    pub(crate) file: Option<FileId>,
}

impl Store {
    /// Opens the store in folder `dir` (created with the file when missing), with the default
    /// [`OpenOptions`].
    pub fn open(dir: &Path) -> Result<Store> {
        Self::open_with(dir, OpenOptions::default())
    }

    /// Opens the store in folder `dir`, refusing a file of a newer schema or one that is not a
    /// store, and marks runs whose heartbeat stopped as killed.
    pub fn open_with(dir: &Path, options: OpenOptions) -> Result<Store> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let path = dir.join(STORE_FILE);
        let conn = connect(&path, &options)?;
        init_schema(&conn, &path)?;
        let file = FileId::of(&path).ok();
        let store = Store {
            conn,
            path,
            options,
            read_only: None,
            file,
        };
        store.mark_stale_unless_busy()?;
        Ok(store)
    }

    /// Opens an existing store for reading and editing (`weft runs ...`): a folder without a
    /// store is an error naming it, not a new store, and so is an empty file (0 bytes, no
    /// write-ahead log beside it: a store truncated, or a file made by something else; SQLite
    /// would take it for a new database and make it an empty store). A store in a folder that
    /// cannot be written (a read-only volume) opens for reading only ([`Store::open_read_only`]);
    /// a write to it is then an error.
    pub fn open_existing(dir: &Path) -> Result<Store> {
        Self::open_existing_with(dir, OpenOptions::default())
    }

    /// [`Store::open_existing`] with `options`.
    fn open_existing_with(dir: &Path, options: OpenOptions) -> Result<Store> {
        let path = dir.join(STORE_FILE);
        let why: String = match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() && meta.len() == 0 && !has_wal(dir) => {
                "an empty file (0 bytes), not a run store: a store cut short, or a file made by \
                 something else (remove it; the next run makes a new store)"
                    .into()
            }
            Ok(meta) if meta.is_file() => {
                return match Self::open_with(dir, options) {
                    Err(e) if cannot_write(&e) && !writable(dir) => {
                        let store = Self::open_read_only(dir)?;
                        warn_read_only(dir);
                        Ok(store)
                    }
                    opened => opened,
                }
            }
            Ok(meta) if meta.is_dir() => "a directory, not a run store's file".into(),
            Ok(_) => "not a regular file, so not a run store".into(),
            Err(_) => "no run store here (no run recorded yet?)".into(),
        };
        Err(Error::Io {
            path,
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, why),
        })
    }

    /// Opens the store in folder `dir` for reading only, as it is on disk: SQLite's write-ahead
    /// log needs its `-shm` file next to the store, which a folder that cannot be written does
    /// not let it make, so the file is opened `immutable` (nothing is locked, nothing written).
    /// Rows still in a `-wal` file left there are not read.
    pub fn open_read_only(dir: &Path) -> Result<Store> {
        let path = dir.join(STORE_FILE);
        let uri = format!("file:{}?immutable=1", uri_path(&path));
        let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
            | rusqlite::OpenFlags::SQLITE_OPEN_URI
            | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&uri, flags).at(&path)?;
        match read_version(&conn).at(&path)? {
            Version::Known(v) if v == SCHEMA_VERSION && has_every_schema_object(&conn) => {}
            Version::Known(found) if found > SCHEMA_VERSION => {
                return Err(Error::NewerSchema {
                    path,
                    found,
                    known: SCHEMA_VERSION,
                })
            }
            bad @ (Version::Missing | Version::Invalid(_)) => return Err(bad.error(&path)),
            Version::Known(_) => {
                return Err(Error::Corrupt {
                    path,
                    reason: "its folder cannot be written, and the file is of an older weft's layout, which \
                             opening it where it can be written brings up to date"
                        .into(),
                })
            }
        }
        let stamp = FileStamp::of(&path);
        let file = FileId::of(&path).ok();
        Ok(Store {
            conn,
            path,
            options: OpenOptions::default(),
            read_only: Some(stamp),
            file,
        })
    }

    /// The store's connection, for tables kept beside the runs' (the model registry's): opened
    /// as the store was, read-only where [`Store::open_existing`] found the folder so.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// [`Store::connection`], for a transaction.
    pub fn connection_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// Whether the store is read as it is ([`Store::open_read_only`]): writes are errors.
    pub fn is_read_only(&self) -> bool {
        self.read_only.is_some()
    }

    /// Before reading again in a long-lived process (`weft ui`, `weft serve --registry`): opens
    /// the store again when its connection no longer reads the file at its path, and says
    /// whether it did.
    ///
    /// - A store whose path now names another file (the store's folder deleted and a new store
    ///   made there by a later run, or a file moved into its place) is opened again, as
    ///   [`Store::open_existing`] opens it (a store read as it is, as
    ///   [`Store::open_read_only`] does): its connection kept reading the deleted file.
    /// - A store whose file is gone (deleted, and no store made since) is an error naming the
    ///   path (each call, until a store is there again); its old connection is kept meanwhile.
    /// - A store read as it is sees the file as it was when opened (SQLite trusts an
    ///   `immutable` file not to change and keeps what it read): when the file's length or
    ///   modification time changed since (another host writes the volume), its connection is
    ///   opened again.
    ///
    /// A store opened for writing whose file is still the one it opened sees every change
    /// without this.
    pub fn refresh(&mut self) -> Result<bool> {
        let now = match FileId::of(&self.path) {
            Ok(id) => Some(id),
            // no file ids on this platform: a replaced file is not told
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => None,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::Io {
                    path: self.path.clone(),
                    source: std::io::Error::new(
                        e.kind(),
                        "the store's file was deleted or moved since it was opened: its runs are no longer \
                         there (a run recorded here makes a new store)",
                    ),
                });
            }
            Err(e) => {
                return Err(Error::Io {
                    path: self.path.clone(),
                    source: e,
                })
            }
        };
        let replaced = self.file.is_some() && now != self.file;
        let changed = self.read_only.is_some_and(|stamp| FileStamp::of(&self.path) != stamp);
        if !replaced && !changed {
            return Ok(false);
        }
        let dir = self.path.parent().map(Path::to_path_buf).unwrap_or_default();
        *self = if self.read_only.is_some() {
            Store::open_read_only(&dir)?
        } else {
            Store::open_existing_with(&dir, self.options.clone())?
        };
        Ok(true)
    }

    /// The store's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The time (seconds since the Unix epoch) before which a `running` run's heartbeat means
    /// its process died: now less `stale_after`.
    pub(crate) fn stale_before(&self) -> f64 {
        crate::now() - self.options.stale_after.as_secs_f64()
    }

    /// Marks every `running` run whose heartbeat is older than `stale_after` as `killed`, its
    /// end time its last heartbeat; how many.
    pub fn mark_stale(&self) -> Result<usize> {
        if self.is_read_only() {
            // nothing can be marked; the next writer's open does it
            return Ok(0);
        }
        let cutoff = self.stale_before();
        self.conn
            .execute(
                "UPDATE runs SET status = 'killed', end_time = heartbeat,
                 error = COALESCE(error, 'its heartbeat stopped (the process died)')
                 WHERE status = 'running' AND heartbeat < ?1",
                params![cutoff],
            )
            .at(&self.path)
    }

    /// [`Store::mark_stale`] when the store's write lock is free within 200 ms, else nothing (0):
    /// a process holding a long write transaction (another program, a stuck writer) made every
    /// open, and every read of the dashboard's run table, wait 30 s for it and fail. The next
    /// open marks what this one left.
    pub fn mark_stale_unless_busy(&self) -> Result<usize> {
        self.conn
            .busy_timeout(std::time::Duration::from_millis(200))
            .at(&self.path)?;
        let marked = self.mark_stale();
        self.conn.busy_timeout(self.options.busy_timeout).at(&self.path)?;
        match marked {
            Err(Error::Sql { source, .. })
                if matches!(
                    source.sqlite_error_code(),
                    Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
                ) =>
            {
                Ok(0)
            }
            other => other,
        }
    }

    /// The id of experiment `name`, made when missing.
    pub(crate) fn experiment_id(&self, name: &str) -> Result<i64> {
        self.conn
            .execute(
                "INSERT OR IGNORE INTO experiments (name, created) VALUES (?1, ?2)",
                params![name, crate::now()],
            )
            .at(&self.path)?;
        self.conn
            .query_row("SELECT id FROM experiments WHERE name = ?1", params![name], |r| {
                r.get(0)
            })
            .at(&self.path)
    }

    /// Sets the status of run `id` that has ended (a sweep marks a trial it stopped `pruned`),
    /// with `note` as its error text when given, and its end time when it has none yet; an
    /// unknown run is [`Error::UnknownRun`].
    pub fn set_status(&self, id: i64, status: crate::Status, note: Option<&str>) -> Result<()> {
        let changed = self
            .conn
            .execute(
                "UPDATE runs SET status = ?2, error = COALESCE(?3, error), end_time = COALESCE(end_time, ?4) \
                 WHERE id = ?1",
                params![id, status.as_str(), note, crate::now()],
            )
            .at(&self.path)?;
        if changed == 0 {
            return Err(Error::UnknownRun(format!(
                "{}: no run with id {id}",
                self.path.display()
            )));
        }
        Ok(())
    }

    /// Deletes run `id` with its params, tags, metrics, artifacts and inputs (not the files they
    /// name); the inputs of other runs that came from it no longer name it.
    pub fn delete_run(&mut self, id: i64) -> Result<()> {
        let tx = self.conn.transaction().at(&self.path)?;
        for table in ["params", "tags", "metrics", "metric_summary", "artifacts", "run_inputs"] {
            tx.execute(&format!("DELETE FROM {table} WHERE run_id = ?1"), params![id])
                .at(&self.path)?;
        }
        // inputs of other runs name it no more (its id may be given to a later run)
        tx.execute(
            "UPDATE run_inputs SET source_run = NULL WHERE source_run = ?1",
            params![id],
        )
        .at(&self.path)?;
        tx.execute("DELETE FROM runs WHERE id = ?1", params![id])
            .at(&self.path)?;
        tx.commit().at(&self.path)
    }
}

/// A file's length and modification time: what changes when it is written.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct FileStamp(Option<(u64, std::time::SystemTime)>);

impl FileStamp {
    fn of(path: &Path) -> FileStamp {
        FileStamp(
            std::fs::metadata(path)
                .ok()
                .and_then(|m| Some((m.len(), m.modified().ok()?))),
        )
    }
}

/// Which file a path names: its device and inode (Unix), so that a file deleted and made again
/// at the same path is told from the one opened. Elsewhere nothing is known (`Err`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct FileId(u64, u64);

impl FileId {
    fn of(path: &Path) -> std::io::Result<FileId> {
        let meta = std::fs::metadata(path)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            Ok(FileId(meta.dev(), meta.ino()))
        }
        #[cfg(not(unix))]
        {
            let _ = meta;
            Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "no file id here"))
        }
    }
}

/// Whether a non-empty write-ahead log lies beside the store in `dir`.
fn has_wal(dir: &Path) -> bool {
    std::fs::metadata(dir.join(format!("{STORE_FILE}-wal"))).is_ok_and(|m| m.len() > 0)
}

/// Says once per process and folder that the store in `dir` is read as it is.
fn warn_read_only(dir: &Path) {
    static WARNED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if warned.iter().any(|d| d == dir) {
        return;
    }
    warned.push(dir.to_path_buf());
    let path = dir.join(STORE_FILE);
    let wal = dir.join(format!("{STORE_FILE}-wal"));
    let pending = std::fs::metadata(&wal).map(|m| m.len() > 0).unwrap_or(false);
    // the one thing this library says itself: every command reading such a store needs it
    #[allow(clippy::print_stderr)]
    {
        let unread = if pending {
            format!(" (what {} still holds is not read)", wal.display())
        } else {
            String::new()
        };
        eprintln!(
            "weft: warning: {}: its folder cannot be written; reading the store as it is{unread}",
            path.display()
        );
    }
}

/// Whether opening the store failed for want of writing its folder: SQLite could not open or
/// make a file there (the store's `-shm`), or the folder refused.
fn cannot_write(e: &Error) -> bool {
    match e {
        Error::Sql { source, .. } => matches!(
            source.sqlite_error_code(),
            Some(rusqlite::ErrorCode::CannotOpen | rusqlite::ErrorCode::ReadOnly)
        ),
        Error::Io { source, .. } => matches!(
            source.kind(),
            std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem
        ),
        _ => false,
    }
}

/// Whether a file can be made in `dir` (a read-only mount, an immutable folder and missing
/// permissions all say no; so does root's view of an immutable folder, where permissions alone
/// would say yes).
fn writable(dir: &Path) -> bool {
    let probe = dir.join(format!(".weft-write-probe-{}", std::process::id()));
    match std::fs::OpenOptions::new().write(true).create_new(true).open(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            true
        }
        Err(_) => false,
    }
}

/// `path` as the path of an SQLite `file:` URI: `%`, `?` and `#` escaped.
fn uri_path(path: &Path) -> String {
    let mut out = String::new();
    for c in path.to_string_lossy().chars() {
        match c {
            '%' => out.push_str("%25"),
            '?' => out.push_str("%3f"),
            '#' => out.push_str("%23"),
            c => out.push(c),
        }
    }
    out
}

/// A connection to `path` in WAL mode with `busy_timeout`; a file that is not a database is
/// [`Error::Corrupt`].
pub(crate) fn connect(path: &Path, options: &OpenOptions) -> Result<Connection> {
    let conn = Connection::open(path).at(path)?;
    conn.busy_timeout(options.busy_timeout).at(path)?;
    // the first statement that reads the file finds out whether it is a database. Switching a
    // new file to WAL takes an exclusive lock and SQLite answers BUSY at once, without its busy
    // handler, while another connection creates or switches the same file: wait as the handler
    // would.
    let deadline = std::time::Instant::now() + options.busy_timeout;
    let mode: String = loop {
        match conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)) {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            other => break other.at(path)?,
        }
    };
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::Corrupt {
            path: path.to_path_buf(),
            reason: format!("cannot switch it to WAL mode (journal mode {mode})"),
        });
    }
    conn.execute_batch("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;")
        .at(path)?;
    Ok(conn)
}

#[cfg(test)]
mod tests;
