//! The model registry: named models whose versions (1, 2, ...) are checkpoints of runs, each in
//! a stage (`none`, `staging`, `production`, `archived`), kept in the run store's SQLite file in
//! a table of its own (`model_versions`, created when missing; the run store's own tables are
//! not changed). `weft models` edits it, and `weft serve --registry` serves each model's
//! production version, following promotions (docs/registry.md).

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};
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
    conn: Connection,
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

fn row(r: &rusqlite::Row) -> rusqlite::Result<ModelVersion> {
    Ok(ModelVersion {
        name: r.get(0)?,
        version: r.get(1)?,
        stage: r.get(2)?,
        source_run: r.get(3)?,
        run_name: r.get(4)?,
        path: PathBuf::from(r.get::<_, String>(5)?),
        created: r.get(6)?,
        stage_time: r.get(7)?,
    })
}

const COLUMNS: &str = "name, version, stage, source_run, run_name, path, created, stage_time";

impl ModelRegistry {
    /// Opens the registry of the run store in folder `dir` (the store and the table are made
    /// when missing).
    pub fn open(dir: &Path) -> Result<ModelRegistry> {
        let store = Store::open(dir)?;
        let path = store.path().to_path_buf();
        drop(store);
        let conn = Connection::open(&path).map_err(sql(&path))?;
        conn.busy_timeout(Duration::from_secs(30)).map_err(sql(&path))?;
        conn.execute_batch(SCHEMA).map_err(sql(&path))?;
        Ok(ModelRegistry { conn, path })
    }

    /// Opens the registry of an existing run store for reading (`weft serve --registry`): a
    /// folder without a store is an error naming it.
    pub fn open_existing(dir: &Path) -> Result<ModelRegistry> {
        drop(Store::open_existing(dir)?);
        Self::open(dir)
    }

    /// Registers `source` as the next version of model `name`: `source` is a checkpoint folder
    /// or checkpoint directory (its newest checkpoint), or a run of the store (its id, name or
    /// `experiment/name`) whose last recorded checkpoint artifact is used.
    pub fn register(&mut self, dir: &Path, source: &str, name: &str) -> Result<ModelVersion> {
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
        let p = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql(&p))?;
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

    /// Every version of every model, by name then version.
    pub fn list(&self) -> Result<Vec<ModelVersion>> {
        let p = &self.path;
        let mut stmt = self
            .conn
            .prepare(&format!("SELECT {COLUMNS} FROM model_versions ORDER BY name, version"))
            .map_err(sql(p))?;
        let rows = stmt.query_map([], row).map_err(sql(p))?;
        rows.collect::<rusqlite::Result<_>>().map_err(sql(p))
    }

    /// The versions of model `name`, oldest first; an unknown name is an error.
    pub fn versions(&self, name: &str) -> Result<Vec<ModelVersion>> {
        let found: Vec<ModelVersion> = self.list()?.into_iter().filter(|v| v.name == name).collect();
        if found.is_empty() {
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
        let found = self
            .conn
            .query_row(
                &format!("SELECT {COLUMNS} FROM model_versions WHERE name = ?1 AND version = ?2"),
                params![name, version],
                row,
            )
            .optional()
            .map_err(sql(p))?;
        match found {
            Some(v) => Ok(v),
            None => {
                let known: Vec<i64> = self.versions(name)?.iter().map(|v| v.version).collect();
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
            .conn
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

    /// Each model's production version, by name.
    pub fn production(&self) -> Result<Vec<ModelVersion>> {
        Ok(self.list()?.into_iter().filter(|v| v.stage == "production").collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_checkpoint(dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("COMPLETE"), "").unwrap();
        std::fs::write(dir.join("index.json"), "{}").unwrap();
    }

    #[test]
    fn versions_count_up_and_one_production_per_name() {
        let dir = std::env::temp_dir().join(format!("weft-tune-registry-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let ckpts = dir.join("ckpt");
        fake_checkpoint(&ckpts.join("step-00000002"));
        fake_checkpoint(&ckpts.join("step-00000010"));
        let mut reg = ModelRegistry::open(&dir.join("store")).unwrap();
        let store = dir.join("store");
        let v1 = reg.register(&store, ckpts.to_str().unwrap(), "m").unwrap();
        assert_eq!((v1.version, v1.stage.as_str()), (1, "none"));
        assert!(v1.path.ends_with("step-00000010"), "{:?}", v1.path);
        let v2 = reg
            .register(&store, ckpts.join("step-00000002").to_str().unwrap(), "m")
            .unwrap();
        assert_eq!(v2.version, 2);
        assert_eq!(
            reg.register(&store, ckpts.to_str().unwrap(), "other").unwrap().version,
            1
        );
        // bad input
        assert!(reg.register(&store, dir.to_str().unwrap(), "m").is_err());
        assert!(reg.register(&store, "no-such-run", "m").is_err());
        assert!(reg.register(&store, ckpts.to_str().unwrap(), "bad/name").is_err());
        assert!(reg.promote("m", 9, Stage::Staging).is_err());
        assert!(reg.promote("nope", 1, Stage::Staging).is_err());
        assert!("live".parse::<Stage>().is_err());
        // one production version per name
        assert_eq!(reg.promote("m", 1, Stage::Production).unwrap(), None);
        assert_eq!(reg.promote("m", 2, Stage::Production).unwrap(), Some(1));
        assert_eq!(reg.version("m", 1).unwrap().stage, "archived");
        let prod = reg.production().unwrap();
        assert_eq!(prod.len(), 1);
        assert_eq!((prod[0].name.as_str(), prod[0].version), ("m", 2));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
