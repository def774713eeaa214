//! Pipelines: a DAG of `[[step]]` entries read from a TOML file, checked (kinds, settings,
//! dependencies, cycles), put in order, and the cache of step executions kept in the run
//! store's SQLite file (`pipeline_executions`, a table of its own). Running the steps is the
//! CLI's (`weft pipeline run`, crates/weft-cli/src/pipeline/); docs/registry.md describes
//! the file. [`handover`]: a sweep step's best values handed to a train step (`from_sweep`);
//! [`refs`]: outputs as `key=value` text and `${steps.NAME.KEY}` references to them;
//! [`kinds`]: the settings of `prepare`, `evaluate`, `deploy` and `condition`; [`cache`]: the
//! executions table; [`inputs`]: the digests of the files a step's run config reads.

pub mod cache;
pub mod handover;
pub mod inputs;
pub mod kinds;
pub mod refs;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

pub use cache::{Cache, Execution};
pub use kinds::{Deploy, Evaluate, Gate, Prepare};

use crate::error::{Error, Result};

/// The step kinds.
pub const KINDS: [&str; 8] = [
    "prepare",
    "train",
    "sweep",
    "evaluate",
    "command",
    "condition",
    "register",
    "deploy",
];

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
    /// `weft sweep --config CONFIG --name NAME --set ...` (the name the execution's own:
    /// `PIPELINE-STEP-MILLIS`).
    Sweep {
        config: PathBuf,
        /// Overrides of the sweep's base config for every trial (`weft sweep --set`).
        set: Vec<String>,
    },
    /// A program and its arguments, run in the pipeline file's folder.
    Command { argv: Vec<String> },
    /// Goes on only when what `gate` reads compares to `value` (a finite number, or a reference
    /// to one) as `op` says; otherwise the steps after it are skipped. A `value` of NaN or an
    /// infinity is refused with the file (and fails the step when a reference resolves to one),
    /// and a NaN read by `gate` fails the step, naming it: no comparison with NaN says anything
    /// of the value (`!=` would hold), and a diverged run should not pass a gate, nor fail it
    /// as quietly as a worse value does.
    Condition { gate: Gate, op: Op, value: String },
    /// Registers the checkpoint of the run that train step `step` made as the next version of
    /// model `model`.
    Register { step: String, model: String },
    /// `weft data prepare`.
    Prepare(Prepare),
    /// `weft evaluate` of a train step's last checkpoint.
    Evaluate(Evaluate),
    /// Promotes a registered version (and tells a server).
    Deploy(Deploy),
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

impl Step {
    /// The references in the step's settings, each once (their syntax was checked when the
    /// file was loaded).
    pub fn references(&self) -> Vec<refs::Reference> {
        let mut all: Vec<refs::Reference> = self
            .action
            .templates()
            .iter()
            .flat_map(|(_, t)| refs::references(t).unwrap_or_default())
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// The values of the step's references read from `outputs` (step name -> output), keyed
    /// `NAME.KEY`; an error (one line, naming the reference and the output) for a key that an
    /// output does not have.
    pub fn values(&self, outputs: &BTreeMap<String, String>) -> std::result::Result<BTreeMap<String, String>, String> {
        refs::values(&self.references(), outputs)
    }

    /// Whether the step runs even when the cache holds it: a deploy step that tells a server
    /// (which may have restarted since, or been told otherwise).
    pub fn never_cached(&self) -> bool {
        matches!(&self.action, Action::Deploy(d) if d.server.is_some())
    }
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

pub(super) fn spec(file: &Path, msg: impl std::fmt::Display) -> Error {
    Error::Spec(format!("{}: {msg}", file.display()))
}

pub(super) fn string(file: &Path, t: &toml::Table, step: &str, key: &str) -> Result<String> {
    match t.get(key) {
        Some(toml::Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(spec(file, format!("step {step:?}: `{key}` must be a string"))),
        None => Err(spec(file, format!("step {step:?}: `{key}` is missing"))),
    }
}

pub(super) fn strings(file: &Path, t: &toml::Table, step: &str, key: &str) -> Result<Vec<String>> {
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
    // what `${steps.NAME.KEY}` can name, and what run, sweep and file names are made of
    if name.is_empty() || !name.chars().all(refs::key_char) {
        return Err(spec(
            file,
            format!("step {name:?}: a step's name is letters, digits, '_' and '-'"),
        ));
    }
    let kind = string(file, t, &name, "kind")?;
    let allowed: &[&str] = match kind.as_str() {
        "train" => &["config", "set", "from_sweep"],
        "sweep" => &["config", "set"],
        "command" => &["argv"],
        "condition" => &["metric", "run", "step", "key", "op", "value"],
        "register" => &["step", "model"],
        "prepare" => &["tokenizer", "input", "output", "val_fraction", "shard_tokens"],
        "evaluate" => &["step", "config", "batches", "data"],
        "deploy" => &[
            "model",
            "step",
            "version",
            "stage",
            "server",
            "token_file",
            "model_store",
            "timeout",
        ],
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
            set: strings(file, t, &name, "set")?,
        },
        "command" => {
            let argv = strings(file, t, &name, "argv")?;
            if argv.is_empty() {
                return Err(spec(file, format!("step {name:?}: `argv` must name a program")));
            }
            Action::Command { argv }
        }
        "condition" => kinds::condition(file, t, &name)?,
        "prepare" => kinds::prepare(file, t, &name)?,
        "evaluate" => kinds::evaluate(file, t, &name)?,
        "deploy" => kinds::deploy(file, t, &name)?,
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
        let doc: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            Error::Spec(crate::spec::syntax_error(&file.display().to_string(), &text, &e))
        })?;
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
            for (n, kind) in uses(s) {
                match (kinds.get(n), kind) {
                    (None, _) => return Err(spec(file, format!("step {:?} uses {n:?}, which is no step", s.name))),
                    (Some(k), Some(kind)) if *k != kind => {
                        return Err(spec(file, format!("step {:?}: {n:?} is no {kind} step", s.name)))
                    }
                    _ => {}
                }
            }
        }
        let steps = order(file, steps)?;
        for s in &steps {
            let before = ancestors(&steps, &s.name);
            for (n, _) in uses(s) {
                if !before.contains(n) {
                    return Err(spec(
                        file,
                        format!("step {:?} uses step {n:?}: list it in depends_on", s.name),
                    ));
                }
            }
            for (key, text) in s.action.templates() {
                let found =
                    refs::references(&text).map_err(|e| spec(file, format!("step {:?}: `{key}`: {e}", s.name)))?;
                for r in found {
                    if !names.contains(&r.step) {
                        return Err(spec(
                            file,
                            format!("step {:?}: `{key}`: {r} names no step {:?}", s.name, r.step),
                        ));
                    }
                    if !before.contains(&r.step) {
                        return Err(spec(
                            file,
                            format!(
                                "step {:?}: `{key}`: {r}: step {:?} is not a step it depends on (list it in depends_on)",
                                s.name, r.step
                            ),
                        ));
                    }
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

    /// The cache key of `step` with no inputs besides the files it names:
    /// [`Pipeline::hash_with_inputs`] with none.
    pub fn hash(
        &self,
        step: &Step,
        deps: &BTreeMap<String, String>,
        values: &BTreeMap<String, String>,
    ) -> Result<String> {
        self.hash_with_inputs(step, deps, values, &[])
    }

    /// The cache key of `step`: SHA-256 (hex) of its kind and settings, the values of its
    /// references (`values`, as [`Step::values`] gives them), the bytes of the files it names (a
    /// train, sweep or evaluate config, and a sweep's base config; every input of a prepare
    /// step, and its tokenizer file: the data's lineage), the `inputs` the caller found its run
    /// config to read (`(what, digest)`: a train or sweep step's data, tokenizer and `init.from`,
    /// which the CLI keys as docs/registry.md says), and what `deps` gives for each dependency
    /// (by step name: the CLI gives its cache key and output, so keys chain along the DAG). A
    /// train step's `from_sweep` step is one of its dependencies, and that step's output holds
    /// the best trial's values ([`handover`]), so a changed best changes the train step's key.
    pub fn hash_with_inputs(
        &self,
        step: &Step,
        deps: &BTreeMap<String, String>,
        values: &BTreeMap<String, String>,
        inputs: &[(String, String)],
    ) -> Result<String> {
        let mut h = Sha256::new();
        let mut table = step.table.clone();
        table.remove("retries");
        h.update(toml::to_string(&table).unwrap_or_default().as_bytes());
        for (r, v) in values {
            h.update(format!("\0ref\0{r}\0{v}").as_bytes());
        }
        let action = step
            .action
            .resolve(values)
            .map_err(|e| Error::Spec(format!("step {:?}: {e}", step.name)))?;
        // (relative to the pipeline file's folder)
        let mut files: Vec<PathBuf> = Vec::new();
        match &action {
            Action::Train { config, .. } => files.push(self.root.join(config)),
            Action::Sweep { config, .. } => {
                let file = self.root.join(config);
                // the run config its trials start from decides their results as much (the
                // sweep's own `base`, resolved against the sweep file's folder)
                let spec = crate::spec::SweepSpec::load(&file)?;
                files.extend([file, spec.base]);
            }
            Action::Evaluate(Evaluate { config: Some(c), .. }) => files.push(self.root.join(c)),
            Action::Prepare(p) => {
                files.extend(p.input.iter().map(|i| self.root.join(i)));
                if !["gpt2", "char"].contains(&p.tokenizer.as_str()) {
                    files.push(self.root.join(&p.tokenizer));
                }
            }
            _ => {}
        }
        for path in files {
            let mut file = std::fs::File::open(&path).map_err(|source| Error::Io {
                path: path.clone(),
                source,
            })?;
            h.update(b"\0file\0");
            std::io::copy(&mut file, &mut h).map_err(|source| Error::Io { path, source })?;
        }
        for (what, digest) in inputs {
            h.update(format!("\0input\0{what}\0{digest}").as_bytes());
        }
        for d in &step.depends_on {
            h.update(format!("\0dep\0{d}\0{}", deps.get(d).map_or("", String::as_str)).as_bytes());
        }
        Ok(format!("{:x}", h.finalize()))
    }
}

/// The steps whose results `s` reads, and the kind each must be (`None`: any): a condition's
/// `run`, a register's and an evaluate's `step` (train steps), a condition's `step` (any), a
/// train step's `from_sweep` (a sweep step), a deploy's `step` (a register step).
fn uses(s: &Step) -> Vec<(&str, Option<&'static str>)> {
    match &s.action {
        Action::Condition {
            gate: Gate::Metric { run: n, .. },
            ..
        }
        | Action::Register { step: n, .. }
        | Action::Evaluate(Evaluate { step: n, .. }) => vec![(n.as_str(), Some("train"))],
        Action::Condition {
            gate: Gate::Output { step: n, .. },
            ..
        } => vec![(n.as_str(), None)],
        Action::Train {
            from_sweep: Some(n), ..
        } => vec![(n.as_str(), Some("sweep"))],
        Action::Deploy(Deploy { step: Some(n), .. }) => vec![(n.as_str(), Some("register"))],
        _ => Vec::new(),
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

#[cfg(test)]
mod tests;
