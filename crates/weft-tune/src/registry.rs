//! The model registry: named models whose versions (1, 2, ...) are checkpoints of runs, each in
//! a stage (`none`, `staging`, `production`, `archived`), kept in the run store's SQLite file in
//! a table of its own (`model_versions`, created when missing; the run store's own tables are
//! not changed). `weft models` edits it, and `weft serve --registry` serves each model's
//! production version, following promotions (docs/registry.md).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, OptionalExtension};
use weft_track::Store;

use crate::error::{Error, Result};

/// The registry's table, in the run store's file.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS model_versions (
    name TEXT NOT NULL,
    version INTEGER NOT NULL,
    stage TEXT NOT NULL,
    source_run INTEGER,
    run_name TEXT,
    path TEXT NOT NULL,
    created REAL NOT NULL,
    stage_time REAL NOT NULL,
    PRIMARY KEY (name, version));
";

/// The stage of a model version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Registered, not promoted yet.
    None,
    Staging,
    /// Served by `weft serve --registry`; one version per name at most.
    Production,
    Archived,
}

impl Stage {
    /// The word stored in the `stage` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::None => "none",
            Stage::Staging => "staging",
            Stage::Production => "production",
            Stage::Archived => "archived",
        }
    }
}

impl std::str::FromStr for Stage {
    type Err = Error;

    fn from_str(s: &str) -> Result<Stage> {
        match s {
            "none" => Ok(Stage::None),
            "staging" => Ok(Stage::Staging),
            "production" => Ok(Stage::Production),
            "archived" => Ok(Stage::Archived),
            _ => Err(Error::Spec(format!(
                "unknown stage {s:?}: give staging, production, archived or none"
            ))),
        }
    }
}

/// One registered version of a model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelVersion {
    pub name: String,
    /// 1 for a name's first version, then 2, 3, ...
    pub version: i64,
    /// `none`, `staging`, `production` or `archived`.
    pub stage: String,
    /// The run whose checkpoint it is (its id and `experiment/name`), when registered from a
    /// run.
    pub source_run: Option<i64>,
    pub run_name: Option<String>,
    /// The checkpoint folder (absolute).
    pub path: PathBuf,
    /// When it was registered, in seconds since the Unix epoch.
    pub created: f64,
    /// When its stage last changed (its registration at first), in seconds since the Unix
    /// epoch.
    pub stage_time: f64,
}

/// The registry of one run store.
pub struct ModelRegistry {
    /// The run store the table lives in, on whose connection it is read and written.
    store: Store,
    path: PathBuf,
}

/// Whether `s` can name a model: 1 to 64 of `A-Z a-z 0-9 . _ -`, not starting with `.` (the
/// names `weft serve` takes).
pub fn is_model_name(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && !s.starts_with('.')
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Whether `path` is a complete checkpoint folder (`COMPLETE` and `index.json`).
fn is_checkpoint(path: &Path) -> bool {
    path.join("COMPLETE").is_file() && path.join("index.json").is_file()
}

/// The checkpoint `path` names: itself when it is a complete checkpoint folder, else the newest
/// complete `step-N` folder inside it; `None` when it is neither.
pub fn checkpoint_in(path: &Path) -> Option<PathBuf> {
    if is_checkpoint(path) {
        return Some(path.to_path_buf());
    }
    let mut steps: Vec<(u64, PathBuf)> = std::fs::read_dir(path)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let step = e.file_name().to_str()?.strip_prefix("step-")?.parse().ok()?;
            is_checkpoint(&e.path()).then(|| (step, e.path()))
        })
        .collect();
    steps.sort();
    steps.pop().map(|(_, p)| p)
}

/// The checkpoint of the last `checkpoint` artifact `run` recorded that is still a complete
/// checkpoint on disk (a folder, or the newest complete `step-N` folder of a directory): what
/// registering the run, or an evaluate step of a pipeline, reads.
pub fn last_checkpoint(run: &weft_track::RunDetail) -> Option<PathBuf> {
    run.artifacts
        .iter()
        .rev()
        .filter(|(kind, _)| kind == "checkpoint")
        .find_map(|(_, p)| checkpoint_in(Path::new(p)))
}

fn sql(path: &Path) -> impl Fn(rusqlite::Error) -> Error + '_ {
    move |e| Error::State(format!("{}: {e}", path.display()))
}

/// A row of the table that is not a version as weft writes them (edited by hand, or by another
/// program): a column of another type, text that is not UTF-8.
#[derive(Debug, Clone, PartialEq)]
pub struct UnreadableRow {
    /// Its `name` and `version` where those read.
    pub name: Option<String>,
    pub version: Option<i64>,
    /// Its `stage` where it reads.
    pub stage: Option<String>,
    /// Which column, and what it holds.
    pub why: String,
}

impl std::fmt::Display for UnreadableRow {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let name = self
            .name
            .as_deref()
            .map_or("(unreadable)".to_string(), |n| format!("{n:?}"));
        let version = self.version.map_or("(unreadable)".to_string(), |v| v.to_string());
        write!(
            f,
            "the registry's row for model {name} version {version} cannot be read ({}); it is left out",
            self.why
        )
    }
}

/// What a read of several rows found: the versions, and the rows that are not one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Listing {
    pub versions: Vec<ModelVersion>,
    pub unreadable: Vec<UnreadableRow>,
}

/// The SQLite type of a column's value, in words.
fn kind(v: rusqlite::types::ValueRef) -> &'static str {
    match v {
        rusqlite::types::ValueRef::Null => "null",
        rusqlite::types::ValueRef::Integer(_) => "an integer",
        rusqlite::types::ValueRef::Real(_) => "a real number",
        rusqlite::types::ValueRef::Text(_) => "text",
        rusqlite::types::ValueRef::Blob(_) => "a blob",
    }
}

/// Column `i` of `r` as a `T`, or what it holds instead (`column path holds a blob`). Errors of
/// SQLite itself are errors.
fn column<T: rusqlite::types::FromSql>(
    r: &rusqlite::Row,
    i: usize,
) -> rusqlite::Result<std::result::Result<T, String>> {
    const NAMES: [&str; 8] = [
        "name",
        "version",
        "stage",
        "source_run",
        "run_name",
        "path",
        "created",
        "stage_time",
    ];
    match r.get::<_, T>(i) {
        Ok(v) => Ok(Ok(v)),
        Err(e @ (rusqlite::Error::InvalidColumnType(..) | rusqlite::Error::FromSqlConversionFailure(..))) => {
            let what = match (r.get_ref(i)?, e) {
                (rusqlite::types::ValueRef::Text(_), rusqlite::Error::FromSqlConversionFailure(..)) => {
                    "text that is not UTF-8"
                }
                (other, _) => kind(other),
            };
            Ok(Err(format!("column {} holds {what}", NAMES[i])))
        }
        Err(e) => Err(e),
    }
}

/// One row (the columns of [`COLUMNS`]) as a version, or why it is not one.
fn row(r: &rusqlite::Row) -> rusqlite::Result<std::result::Result<ModelVersion, UnreadableRow>> {
    let name = column::<String>(r, 0)?;
    let version = column::<i64>(r, 1)?;
    let stage = column::<String>(r, 2)?;
    let source_run = column::<Option<i64>>(r, 3)?;
    let run_name = column::<Option<String>>(r, 4)?;
    let path = column::<String>(r, 5)?;
    let created = column::<f64>(r, 6)?;
    let stage_time = column::<f64>(r, 7)?;
    if let (Ok(name), Ok(version), Ok(stage), Ok(source_run), Ok(run_name), Ok(path), Ok(created), Ok(stage_time)) = (
        &name,
        &version,
        &stage,
        &source_run,
        &run_name,
        &path,
        &created,
        &stage_time,
    ) {
        return Ok(Ok(ModelVersion {
            name: name.clone(),
            version: *version,
            stage: stage.clone(),
            source_run: *source_run,
            run_name: run_name.clone(),
            path: PathBuf::from(path),
            created: *created,
            stage_time: *stage_time,
        }));
    }
    let why: Vec<&String> = [
        name.as_ref().err(),
        version.as_ref().err(),
        stage.as_ref().err(),
        source_run.as_ref().err(),
        run_name.as_ref().err(),
        path.as_ref().err(),
        created.as_ref().err(),
        stage_time.as_ref().err(),
    ]
    .into_iter()
    .flatten()
    .collect();
    Ok(Err(UnreadableRow {
        why: why.iter().map(|w| w.as_str()).collect::<Vec<_>>().join(", "),
        name: name.ok(),
        version: version.ok(),
        stage: stage.ok(),
    }))
}

const COLUMNS: &str = "name, version, stage, source_run, run_name, path, created, stage_time";

impl ModelRegistry {
    /// Opens the registry of the run store in folder `dir` (the store and the table are made
    /// when missing).
    pub fn open(dir: &Path) -> Result<ModelRegistry> {
        let registry = Self::of(Store::open(dir)?)?;
        registry
            .store
            .connection()
            .execute_batch(SCHEMA)
            .map_err(sql(&registry.path))?;
        Ok(registry)
    }

    /// Opens the registry of an existing run store for reading (`weft models list`, `weft ui`,
    /// `weft serve --registry`): a folder without a store is an error naming it. The table is
    /// not made here (that takes the store's write lock, which a reader must not wait for); a
    /// store without it lists no versions.
    pub fn open_existing(dir: &Path) -> Result<ModelRegistry> {
        Self::of(Store::open_existing(dir)?)
    }

    /// The registry on `store`'s connection (read-only where the store's folder is).
    fn of(store: Store) -> Result<ModelRegistry> {
        let path = store.path().to_path_buf();
        store
            .connection()
            .busy_timeout(Duration::from_secs(30))
            .map_err(sql(&path))?;
        Ok(ModelRegistry { store, path })
    }

    /// Before reading again in a long-lived process (`weft serve --registry`, `weft ui`): a
    /// store read as it is (its folder cannot be written) is opened again when its file changed,
    /// so that promotions made elsewhere are seen ([`Store::refresh`]).
    pub fn refresh(&mut self) -> Result<()> {
        self.store.refresh()?;
        Ok(())
    }

    /// Whether the store has the registry's table yet (none before the first version).
    fn has_table(&self) -> Result<bool> {
        self.store
            .connection()
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'model_versions'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n > 0)
            .map_err(sql(&self.path))
    }

    /// Registers `source` as the next version of model `name`: `source` is a checkpoint folder
    /// or checkpoint directory (its newest checkpoint), or a run of the store (its id, name or
    /// `experiment/name`) whose last recorded checkpoint artifact is used. Only that the folder
    /// is complete (`COMPLETE` and `index.json`) is checked: see
    /// [`ModelRegistry::register_checked`].
    pub fn register(&mut self, dir: &Path, source: &str, name: &str) -> Result<ModelVersion> {
        self.register_checked(dir, source, name, &|_| Ok(()))
    }

    /// [`ModelRegistry::register`], once `check` has accepted the checkpoint folder `source`
    /// names (`weft models register` checks that it loads as a model: its index, files,
    /// checksums and model config, which this crate cannot read): its error, one line, refuses
    /// the version before anything is written.
    pub fn register_checked(
        &mut self,
        dir: &Path,
        source: &str,
        name: &str,
        check: &dyn Fn(&Path) -> std::result::Result<(), String>,
    ) -> Result<ModelVersion> {
        if !is_model_name(name) {
            return Err(Error::Spec(format!(
                "--name {name:?}: a model name is 1 to 64 of A-Z a-z 0-9 . _ - (not starting with .)"
            )));
        }
        let as_path = Path::new(source);
        let (ckpt, run) = if as_path.exists() {
            let ckpt = checkpoint_in(as_path).ok_or_else(|| {
                Error::Spec(format!(
                    "{source}: holds no complete checkpoint (no COMPLETE and index.json, nor step-*/ folders with them)"
                ))
            })?;
            (ckpt, None)
        } else {
            let store = Store::open_existing(dir)?;
            let id = store.find_run(source)?;
            let detail = store.run_detail(id)?;
            let ckpt = last_checkpoint(&detail).ok_or_else(|| {
                    Error::Spec(format!(
                        "run {source:?} recorded no checkpoint that is still there (train it with train.checkpoint_dir set)"
                    ))
                })?;
            let run_name = format!("{}/{}", detail.summary.experiment, detail.summary.name);
            (ckpt, Some((id, run_name)))
        };
        let ckpt = ckpt.canonicalize().map_err(|source| Error::Io {
            path: ckpt.clone(),
            source,
        })?;
        check(&ckpt).map_err(Error::Spec)?;
        let p = self.path.clone();
        let tx = self
            .store
            .connection_mut()
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql(&p))?;
        // the table, where a reader opened the store before any version was registered
        tx.execute_batch(SCHEMA).map_err(sql(&p))?;
        let next: i64 = tx
            .query_row(
                "SELECT COALESCE(MAX(version), 0) + 1 FROM model_versions WHERE name = ?1",
                params![name],
                |r| r.get(0),
            )
            .map_err(sql(&p))?;
        let now = weft_track::now();
        tx.execute(
            "INSERT INTO model_versions (name, version, stage, source_run, run_name, path, created, stage_time)
             VALUES (?1, ?2, 'none', ?3, ?4, ?5, ?6, ?6)",
            params![
                name,
                next,
                run.as_ref().map(|r| r.0),
                run.as_ref().map(|r| r.1.clone()),
                ckpt.to_string_lossy(),
                now
            ],
        )
        .map_err(sql(&p))?;
        tx.commit().map_err(sql(&p))?;
        self.version(name, next)
    }

    /// Every version of every model, by name then version, and the rows that are not a version
    /// (each left out of the versions, not of the file).
    pub fn list(&self) -> Result<Listing> {
        let p = &self.path;
        if !self.has_table()? {
            return Ok(Listing::default());
        }
        let mut stmt = self
            .store
            .connection()
            .prepare(&format!("SELECT {COLUMNS} FROM model_versions ORDER BY name, version"))
            .map_err(sql(p))?;
        let rows = stmt.query_map([], row).map_err(sql(p))?;
        let mut listing = Listing::default();
        for r in rows {
            match r.map_err(sql(p))? {
                Ok(v) => listing.versions.push(v),
                Err(bad) => listing.unreadable.push(bad),
            }
        }
        Ok(listing)
    }

    /// The versions of model `name`, oldest first, and its rows that are not a version; a name
    /// with no row is an error.
    pub fn versions(&self, name: &str) -> Result<Listing> {
        let all = self.list()?;
        let found = Listing {
            versions: all.versions.into_iter().filter(|v| v.name == name).collect(),
            unreadable: all
                .unreadable
                .into_iter()
                .filter(|u| u.name.as_deref() == Some(name))
                .collect(),
        };
        if found.versions.is_empty() && found.unreadable.is_empty() {
            return Err(Error::Spec(format!(
                "no model named {name:?} in {}",
                self.path.display()
            )));
        }
        Ok(found)
    }

    /// Version `version` of model `name`; unknown ones are errors.
    pub fn version(&self, name: &str, version: i64) -> Result<ModelVersion> {
        let p = &self.path;
        if !self.has_table()? {
            // no model at all: the error names the model
            self.versions(name)?;
        }
        let found = self
            .store
            .connection()
            .query_row(
                &format!("SELECT {COLUMNS} FROM model_versions WHERE name = ?1 AND version = ?2"),
                params![name, version],
                row,
            )
            .optional()
            .map_err(sql(p))?;
        match found {
            Some(Ok(v)) => Ok(v),
            Some(Err(bad)) => Err(Error::State(format!(
                "{}: the row for model {name:?} version {version} cannot be read ({})",
                p.display(),
                bad.why
            ))),
            None => {
                let known: Vec<i64> = self.versions(name)?.versions.iter().map(|v| v.version).collect();
                Err(Error::Spec(format!(
                    "model {name:?} has no version {version} (versions: {known:?})"
                )))
            }
        }
    }

    /// Moves version `version` of `name` to `stage`; promoting to production moves the name's
    /// production version (if another) to archived, in the same transaction. Returns the
    /// version archived that way.
    pub fn promote(&mut self, name: &str, version: i64, stage: Stage) -> Result<Option<i64>> {
        self.version(name, version)?;
        let p = self.path.clone();
        let tx = self
            .store
            .connection_mut()
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql(&p))?;
        let now = weft_track::now();
        let mut archived = None;
        if stage == Stage::Production {
            archived = tx
                .query_row(
                    "SELECT version FROM model_versions WHERE name = ?1 AND stage = 'production' AND version != ?2",
                    params![name, version],
                    |r| r.get(0),
                )
                .optional()
                .map_err(sql(&p))?;
            tx.execute(
                "UPDATE model_versions SET stage = 'archived', stage_time = ?3
                 WHERE name = ?1 AND stage = 'production' AND version != ?2",
                params![name, version, now],
            )
            .map_err(sql(&p))?;
        }
        tx.execute(
            "UPDATE model_versions SET stage = ?3, stage_time = ?4 WHERE name = ?1 AND version = ?2",
            params![name, version, stage.as_str(), now],
        )
        .map_err(sql(&p))?;
        tx.commit().map_err(sql(&p))?;
        Ok(archived)
    }

    /// Each model's production version, by name, and the rows that are not a version whose
    /// stage is production or does not read.
    pub fn production(&self) -> Result<Listing> {
        let all = self.list()?;
        Ok(Listing {
            versions: all.versions.into_iter().filter(|v| v.stage == "production").collect(),
            unreadable: all
                .unreadable
                .into_iter()
                .filter(|u| u.stage.as_deref().is_none_or(|s| s == "production"))
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests;
