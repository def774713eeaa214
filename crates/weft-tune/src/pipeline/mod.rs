//! Pipelines: a DAG of `[[step]]` entries read from a TOML file, checked (kinds, settings,
//! dependencies, cycles), put in order, and the cache of step executions kept in the run
//! store's SQLite file (`pipeline_executions`, a table of its own). Running the steps is the
//! CLI's (`weft pipeline run`, crates/weft-cli/src/pipeline.rs); docs/registry.md describes
//! the file. [`handover`]: a sweep step's best values handed to a train step (`from_sweep`).

pub mod handover;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// The step kinds that run.
pub const KINDS: [&str; 5] = ["train", "sweep", "command", "condition", "register"];
/// The step kinds of the design that do not run yet.
pub const NOT_BUILT: [&str; 3] = ["prepare", "evaluate", "deploy"];

/// A condition's comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

impl Op {
    fn parse(s: &str) -> Option<Op> {
        Some(match s {
            "<" => Op::Lt,
            "<=" => Op::Le,
            ">" => Op::Gt,
            ">=" => Op::Ge,
            "==" | "=" => Op::Eq,
            "!=" => Op::Ne,
            _ => return None,
        })
    }

    /// Whether `a OP b`.
    pub fn holds(self, a: f64, b: f64) -> bool {
        match self {
            Op::Lt => a < b,
            Op::Le => a <= b,
            Op::Gt => a > b,
            Op::Ge => a >= b,
            Op::Eq => a == b,
            Op::Ne => a != b,
        }
    }
}

/// What a step does.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// `weft train --config CONFIG --set ...` (CONFIG relative to the pipeline file). With
    /// `from_sweep`, the best finished trial of that sweep step gives its values as `--set`
    /// overrides first, then `set` applies on top.
    Train {
        config: PathBuf,
        set: Vec<String>,
        from_sweep: Option<String>,
    },
    /// `weft sweep --config CONFIG`.
    Sweep { config: PathBuf },
    /// A program and its arguments, run in the pipeline file's folder.
    Command { argv: Vec<String> },
    /// Goes on only when the last value of `metric` of the run that train step `run` made
    /// compares to `value` as `op` says; otherwise the steps after it are skipped.
    Condition {
        metric: String,
        run: String,
        op: Op,
        value: f64,
    },
    /// Registers the checkpoint of the run that train step `step` made as the next version of
    /// model `model`.
    Register { step: String, model: String },
}

/// One `[[step]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub name: String,
    pub kind: String,
    pub depends_on: Vec<String>,
    /// How many times a failed execution is run again (default 0).
    pub retries: u32,
    pub action: Action,
    /// The entry as written (its settings, hashed into the cache key).
    pub table: toml::Table,
}

/// A pipeline file: its steps in dependency order.
#[derive(Debug, Clone)]
pub struct Pipeline {
    /// The file's stem (executions are recorded under it).
    pub name: String,
    /// The folder holding the file: relative paths resolve against it.
    pub root: PathBuf,
    /// Every step, each after the steps it depends on (file order otherwise).
    pub steps: Vec<Step>,
}

fn spec(file: &Path, msg: impl std::fmt::Display) -> Error {
    Error::Spec(format!("{}: {msg}", file.display()))
}

fn string(file: &Path, t: &toml::Table, step: &str, key: &str) -> Result<String> {
    match t.get(key) {
        Some(toml::Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(spec(file, format!("step {step:?}: `{key}` must be a string"))),
        None => Err(spec(file, format!("step {step:?}: `{key}` is missing"))),
    }
}

fn strings(file: &Path, t: &toml::Table, step: &str, key: &str) -> Result<Vec<String>> {
    match t.get(key) {
        None => Ok(Vec::new()),
        Some(toml::Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| spec(file, format!("step {step:?}: `{key}` must be a list of strings"))),
        Some(_) => Err(spec(file, format!("step {step:?}: `{key}` must be a list of strings"))),
    }
}

fn parse_step(file: &Path, t: &toml::Table) -> Result<Step> {
    let name = string(file, t, "?", "name")?;
    let kind = string(file, t, &name, "kind")?;
    let allowed: &[&str] = match kind.as_str() {
        "train" => &["config", "set", "from_sweep"],
        "sweep" => &["config"],
        "command" => &["argv"],
        "condition" => &["metric", "run", "op", "value"],
        "register" => &["step", "model"],
        k if NOT_BUILT.contains(&k) => {
            return Err(spec(
                file,
                format!("step {name:?}: kind {k:?} is not built yet (kinds: {KINDS:?})"),
            ))
        }
        k => {
            return Err(spec(
                file,
                format!("step {name:?}: unknown kind {k:?} (kinds: {KINDS:?})"),
            ))
        }
    };
    for key in t.keys() {
        if !["name", "kind", "depends_on", "retries"].contains(&key.as_str()) && !allowed.contains(&key.as_str()) {
            return Err(spec(
                file,
                format!("step {name:?}: unknown key `{key}` for kind {kind:?} (keys: {allowed:?})"),
            ));
        }
    }
    let action = match kind.as_str() {
        "train" => Action::Train {
            config: string(file, t, &name, "config")?.into(),
            set: strings(file, t, &name, "set")?,
            from_sweep: match t.get("from_sweep") {
                None => None,
                Some(_) => Some(string(file, t, &name, "from_sweep")?),
            },
        },
        "sweep" => Action::Sweep {
            config: string(file, t, &name, "config")?.into(),
        },
        "command" => {
            let argv = strings(file, t, &name, "argv")?;
            if argv.is_empty() {
                return Err(spec(file, format!("step {name:?}: `argv` must name a program")));
            }
            Action::Command { argv }
        }
        "condition" => {
            let op_text = string(file, t, &name, "op")?;
            let op = Op::parse(&op_text).ok_or_else(|| {
                spec(
                    file,
                    format!("step {name:?}: op {op_text:?}: give <, <=, >, >=, == or !="),
                )
            })?;
            let value = match t.get("value") {
                Some(toml::Value::Float(f)) => *f,
                Some(toml::Value::Integer(i)) => *i as f64,
                _ => return Err(spec(file, format!("step {name:?}: `value` must be a number"))),
            };
            Action::Condition {
                metric: string(file, t, &name, "metric")?,
                run: string(file, t, &name, "run")?,
                op,
                value,
            }
        }
        _ => Action::Register {
            step: string(file, t, &name, "step")?,
            model: string(file, t, &name, "model")?,
        },
    };
    let retries = match t.get("retries") {
        None => 0,
        Some(toml::Value::Integer(n)) if (0..=100).contains(n) => *n as u32,
        Some(_) => {
            return Err(spec(
                file,
                format!("step {name:?}: `retries` must be an integer 0 to 100"),
            ))
        }
    };
    Ok(Step {
        depends_on: strings(file, t, &name, "depends_on")?,
        name,
        kind,
        retries,
        action,
        table: t.clone(),
    })
}

impl Pipeline {
    /// Reads and checks `file`: every step's kind and settings, unique names, dependencies
    /// that exist (a condition's `run` and a register's `step` name train steps it depends
    /// on), and no cycle. Each error is one line naming the file and the step.
    pub fn load(file: &Path) -> Result<Pipeline> {
        let text = std::fs::read_to_string(file).map_err(|source| Error::Io {
            path: file.to_path_buf(),
            source,
        })?;
        let doc: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| spec(file, e.message().replace('\n', " ")))?;
        if let Some(k) = doc.keys().find(|k| k.as_str() != "step") {
            return Err(spec(file, format!("unknown key `{k}` (give [[step]] entries)")));
        }
        let Some(toml::Value::Array(entries)) = doc.get("step") else {
            return Err(spec(file, "no [[step]] entries"));
        };
        let mut steps = Vec::new();
        for e in entries {
            let t = e
                .as_table()
                .ok_or_else(|| spec(file, "each step must be a [[step]] table"))?;
            steps.push(parse_step(file, t)?);
        }
        let mut names = BTreeSet::new();
        for s in &steps {
            if !names.insert(s.name.clone()) {
                return Err(spec(file, format!("two steps are named {:?}", s.name)));
            }
        }
        let kinds: BTreeMap<&str, &str> = steps.iter().map(|s| (s.name.as_str(), s.kind.as_str())).collect();
        for s in &steps {
            for d in &s.depends_on {
                if !names.contains(d) {
                    return Err(spec(
                        file,
                        format!("step {:?} depends on {d:?}, which is no step", s.name),
                    ));
                }
            }
            if let Some((n, kind)) = uses(s) {
                match kinds.get(n) {
                    None => return Err(spec(file, format!("step {:?} uses {n:?}, which is no step", s.name))),
                    Some(k) if *k != kind => {
                        return Err(spec(file, format!("step {:?}: {n:?} is no {kind} step", s.name)))
                    }
                    Some(_) => {}
                }
            }
        }
        let steps = order(file, steps)?;
        for s in &steps {
            if let Some((n, _)) = uses(s) {
                if !ancestors(&steps, &s.name).contains(n) {
                    return Err(spec(
                        file,
                        format!("step {:?} uses step {n:?}: list it in depends_on", s.name),
                    ));
                }
            }
        }
        let name = file
            .file_stem()
            .map_or("pipeline".into(), |s| s.to_string_lossy().into_owned());
        let root = file.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        let root = if root.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            root
        };
        Ok(Pipeline { name, root, steps })
    }

    /// The step named `name`.
    pub fn step(&self, name: &str) -> Option<&Step> {
        self.steps.iter().find(|s| s.name == name)
    }

    /// Every step step `name` depends on, directly or not.
    pub fn ancestors(&self, name: &str) -> BTreeSet<String> {
        ancestors(&self.steps, name)
    }

    /// Every step that depends on step `name`, directly or not.
    pub fn descendants(&self, name: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        // the steps are in dependency order: one pass reaches every descendant
        for s in &self.steps {
            if s.depends_on.iter().any(|d| d == name || seen.contains(d)) {
                seen.insert(s.name.clone());
            }
        }
        seen
    }

    /// The cache key of `step`: SHA-256 (hex) of its kind and settings, the bytes of the files
    /// it names (a train or sweep config), and what `deps` gives for each dependency (by step
    /// name: the CLI gives its cache key and output, so keys chain along the DAG). A train step's
    /// `from_sweep` step is one of its dependencies, and that step's output holds the best
    /// trial's values ([`handover`]), so a changed best changes the train step's key.
    pub fn hash(&self, step: &Step, deps: &BTreeMap<String, String>) -> Result<String> {
        let mut h = Sha256::new();
        let mut table = step.table.clone();
        table.remove("retries");
        h.update(toml::to_string(&table).unwrap_or_default().as_bytes());
        if let Action::Train { config, .. } | Action::Sweep { config } = &step.action {
            let path = self.root.join(config);
            let bytes = std::fs::read(&path).map_err(|source| Error::Io { path, source })?;
            h.update(b"\0file\0");
            h.update(&bytes);
        }
        for d in &step.depends_on {
            h.update(format!("\0dep\0{d}\0{}", deps.get(d).map_or("", String::as_str)).as_bytes());
        }
        Ok(format!("{:x}", h.finalize()))
    }
}

/// The step whose results `s` reads, and the kind that step must be: a condition's `run` and a
/// register's `step` (train steps), a train step's `from_sweep` (a sweep step).
fn uses(s: &Step) -> Option<(&str, &'static str)> {
    match &s.action {
        Action::Condition { run: n, .. } | Action::Register { step: n, .. } => Some((n.as_str(), "train")),
        Action::Train {
            from_sweep: Some(n), ..
        } => Some((n.as_str(), "sweep")),
        _ => None,
    }
}

/// Every step `name` depends on, directly or not.
fn ancestors(steps: &[Step], name: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![name.to_string()];
    while let Some(n) = todo.pop() {
        if let Some(s) = steps.iter().find(|s| s.name == n) {
            for d in &s.depends_on {
                if seen.insert(d.clone()) {
                    todo.push(d.clone());
                }
            }
        }
    }
    seen
}

/// `steps` with each after its dependencies (file order among the ready ones); a cycle is an
/// error naming its steps.
fn order(file: &Path, mut left: Vec<Step>) -> Result<Vec<Step>> {
    let mut done: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::new();
    while !left.is_empty() {
        let Some(i) = left.iter().position(|s| s.depends_on.iter().all(|d| done.contains(d))) else {
            let names: Vec<&str> = left.iter().map(|s| s.name.as_str()).collect();
            return Err(spec(
                file,
                format!("the steps {names:?} depend on each other in a cycle"),
            ));
        };
        let s = left.remove(i);
        done.insert(s.name.clone());
        out.push(s);
    }
    Ok(out)
}

/// A finished execution of a step, as the cache keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Execution {
    pub id: i64,
    pub pipeline: String,
    pub step: String,
    pub hash: String,
    /// `finished` or `failed`.
    pub status: String,
    /// What the step made (a train step: `run=ID`; a condition: `true`/`false`; a register:
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

impl Cache {
    /// Opens the cache of the run store in folder `dir` (store and table made when missing).
    pub fn open(dir: &Path) -> Result<Cache> {
        let path = weft_track::Store::open(dir)?.path().to_path_buf();
        let conn = Connection::open(&path).map_err(sql(&path))?;
        conn.busy_timeout(Duration::from_secs(30)).map_err(sql(&path))?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS pipeline_executions (
                id INTEGER PRIMARY KEY, pipeline TEXT NOT NULL, step TEXT NOT NULL, hash TEXT NOT NULL,
                status TEXT NOT NULL, output TEXT NOT NULL, start REAL NOT NULL, end REAL NOT NULL);
             CREATE INDEX IF NOT EXISTS pipeline_executions_hash ON pipeline_executions (hash);",
        )
        .map_err(sql(&path))?;
        Ok(Cache { conn, path })
    }

    /// The latest finished execution with cache key `hash`.
    pub fn finished(&self, hash: &str) -> Result<Option<Execution>> {
        self.conn
            .query_row(
                "SELECT id, pipeline, step, hash, status, output, start, end FROM pipeline_executions
                 WHERE hash = ?1 AND status = 'finished' ORDER BY id DESC LIMIT 1",
                params![hash],
                |r| {
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
                },
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

#[cfg(test)]
mod tests;
