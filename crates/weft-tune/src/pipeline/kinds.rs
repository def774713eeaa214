//! The settings of the step kinds `prepare`, `evaluate`, `deploy` and `condition`, read from a
//! `[[step]]` table, and the string settings of every kind that may hold references
//! (`${steps.NAME.KEY}`, [`super::refs`]).

use std::path::Path;

use super::{spec, string, strings, Action, Op};
use crate::error::Result;
use crate::registry::Stage;

/// `weft data prepare` of `input` into a folder of `output` ([`super::Pipeline::hash`] reads
/// every input's bytes into the step's cache key).
#[derive(Debug, Clone, PartialEq)]
pub struct Prepare {
    /// `gpt2`, `char`, or a tokenizer file relative to the pipeline file.
    pub tokenizer: String,
    /// Text files, relative to the pipeline file.
    pub input: Vec<String>,
    /// A folder relative to the pipeline file, or an object-store URL: each execution writes
    /// into its own folder in it, named by the step's cache key.
    pub output: String,
    pub val_fraction: Option<f64>,
    pub shard_tokens: Option<u64>,
}

/// `weft evaluate` of the last checkpoint of the run that train step `step` made.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluate {
    /// The train step.
    pub step: String,
    /// A run config relative to the pipeline file (default: the train step's config and
    /// overrides).
    pub config: Option<String>,
    /// Evaluation batches (default: the config's `train.eval_batches`).
    pub batches: Option<u64>,
    /// Other data to evaluate on: the config's `data.path` is set to it.
    pub data: Option<String>,
}

/// Promotes a version of `model` to `stage`, and (with `server`) waits until that server
/// answers with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Deploy {
    pub model: String,
    /// A register step: the version it registered.
    pub step: Option<String>,
    /// Or the version itself.
    pub version: Option<String>,
    pub stage: String,
    /// The management API of a running `weft serve` (`http://HOST:PORT`).
    pub server: Option<String>,
    /// The management API's token, relative to the pipeline file.
    pub token_file: Option<String>,
    /// The server's `--model-store` (relative to the pipeline file): the version's checkpoint
    /// is registered there through the management API and made the default. Without it the
    /// server must follow the registry (`weft serve --registry`).
    pub model_store: Option<String>,
    /// How long to wait for the server, in seconds.
    pub timeout: f64,
}

/// What a condition compares.
#[derive(Debug, Clone, PartialEq)]
pub enum Gate {
    /// The last value of `metric` of the run that train step `run` made.
    Metric { run: String, metric: String },
    /// The number under `key` in the output of step `step` (an evaluate step's `value`, a
    /// sweep's `value`, a prepare step's `tokens`, ...).
    Output { step: String, key: String },
}

fn number(file: &Path, t: &toml::Table, step: &str, key: &str) -> Result<Option<f64>> {
    match t.get(key) {
        None => Ok(None),
        Some(toml::Value::Float(f)) => Ok(Some(*f)),
        Some(toml::Value::Integer(i)) => Ok(Some(*i as f64)),
        Some(_) => Err(spec(file, format!("step {step:?}: `{key}` must be a number"))),
    }
}

fn whole(file: &Path, t: &toml::Table, step: &str, key: &str) -> Result<Option<u64>> {
    match t.get(key) {
        None => Ok(None),
        Some(toml::Value::Integer(i)) if *i >= 1 => Ok(Some(*i as u64)),
        Some(_) => Err(spec(
            file,
            format!("step {step:?}: `{key}` must be a whole number >= 1"),
        )),
    }
}

fn optional(file: &Path, t: &toml::Table, step: &str, key: &str) -> Result<Option<String>> {
    match t.get(key) {
        None => Ok(None),
        Some(_) => string(file, t, step, key).map(Some),
    }
}

/// A number or a string (a version written either way, or a reference).
fn text_or_number(file: &Path, t: &toml::Table, step: &str, key: &str) -> Result<Option<String>> {
    match t.get(key) {
        None => Ok(None),
        Some(toml::Value::String(s)) => Ok(Some(s.clone())),
        Some(toml::Value::Integer(i)) => Ok(Some(i.to_string())),
        Some(toml::Value::Float(f)) => Ok(Some(f.to_string())),
        Some(_) => Err(spec(
            file,
            format!("step {step:?}: `{key}` must be a number or a string"),
        )),
    }
}

/// Whether `s` holds a reference (its value is known only when the step runs).
fn has_ref(s: &str) -> bool {
    super::refs::references(s).is_ok_and(|r| !r.is_empty())
}

pub(super) fn prepare(file: &Path, t: &toml::Table, name: &str) -> Result<Action> {
    let input = strings(file, t, name, "input")?;
    if input.is_empty() {
        return Err(spec(
            file,
            format!("step {name:?}: `input` must list at least one file"),
        ));
    }
    let val_fraction = number(file, t, name, "val_fraction")?;
    if let Some(f) = val_fraction.filter(|f| !(0.0..1.0).contains(f)) {
        return Err(spec(
            file,
            format!("step {name:?}: `val_fraction` {f} is not in [0, 1)"),
        ));
    }
    Ok(Action::Prepare(Prepare {
        tokenizer: string(file, t, name, "tokenizer")?,
        input,
        output: string(file, t, name, "output")?,
        val_fraction,
        shard_tokens: whole(file, t, name, "shard_tokens")?,
    }))
}

pub(super) fn evaluate(file: &Path, t: &toml::Table, name: &str) -> Result<Action> {
    Ok(Action::Evaluate(Evaluate {
        step: string(file, t, name, "step")?,
        config: optional(file, t, name, "config")?,
        batches: whole(file, t, name, "batches")?,
        data: optional(file, t, name, "data")?,
    }))
}

pub(super) fn deploy(file: &Path, t: &toml::Table, name: &str) -> Result<Action> {
    let step = optional(file, t, name, "step")?;
    let version = text_or_number(file, t, name, "version")?;
    if step.is_some() == version.is_some() {
        return Err(spec(
            file,
            format!("step {name:?}: give either `step` (a register step) or `version`"),
        ));
    }
    if let Some(v) = version.as_deref().filter(|v| !has_ref(v)) {
        if !v.parse::<i64>().is_ok_and(|v| v >= 1) {
            return Err(spec(
                file,
                format!("step {name:?}: `version` {v:?} is not a version (1, 2, ...)"),
            ));
        }
    }
    let stage = optional(file, t, name, "stage")?.unwrap_or_else(|| "production".into());
    stage
        .parse::<Stage>()
        .map_err(|e| spec(file, format!("step {name:?}: `stage`: {e}")))?;
    let server = optional(file, t, name, "server")?;
    let token_file = optional(file, t, name, "token_file")?;
    let model_store = optional(file, t, name, "model_store")?;
    if let Some(s) = &server {
        if !(s.starts_with("http://") || s.starts_with("https://")) {
            return Err(spec(
                file,
                format!("step {name:?}: `server` {s:?} must be the management API's URL, http://HOST:PORT"),
            ));
        }
        if token_file.is_none() {
            return Err(spec(
                file,
                format!("step {name:?}: `server` needs `token_file` (the management API always asks for its token)"),
            ));
        }
        if stage != "production" && model_store.is_none() {
            return Err(spec(
                file,
                format!(
                    "step {name:?}: stage {stage:?} with a `server`: a server follows the registry's production versions only; give `model_store` to register the version there"
                ),
            ));
        }
    } else if let Some(k) = ["token_file", "model_store", "timeout"]
        .iter()
        .find(|k| t.contains_key(**k))
    {
        return Err(spec(file, format!("step {name:?}: `{k}` needs `server`")));
    }
    let timeout = number(file, t, name, "timeout")?.unwrap_or(60.0);
    if !(timeout > 0.0 && timeout <= 86400.0) {
        return Err(spec(
            file,
            format!("step {name:?}: `timeout` {timeout} must be in (0, 86400] seconds"),
        ));
    }
    Ok(Action::Deploy(Deploy {
        model: string(file, t, name, "model")?,
        step,
        version,
        stage,
        server,
        token_file,
        model_store,
        timeout,
    }))
}

pub(super) fn condition(file: &Path, t: &toml::Table, name: &str) -> Result<Action> {
    let op_text = string(file, t, name, "op")?;
    let op = Op::parse(&op_text).ok_or_else(|| {
        spec(
            file,
            format!("step {name:?}: op {op_text:?}: give <, <=, >, >=, == or !="),
        )
    })?;
    let value = text_or_number(file, t, name, "value")?
        .ok_or_else(|| spec(file, format!("step {name:?}: `value` must be a number")))?;
    if !has_ref(&value) {
        match value.trim().parse::<f64>() {
            Ok(v) if v.is_finite() => {}
            // `nan` and `inf` parse (as TOML and as text): a comparison with them says nothing
            Ok(_) => {
                return Err(spec(
                    file,
                    format!("step {name:?}: `value` {value:?} must be a finite number"),
                ))
            }
            Err(_) => {
                return Err(spec(
                    file,
                    format!("step {name:?}: `value` {value:?} must be a number (or a reference to one)"),
                ))
            }
        }
    }
    let gate = match (t.contains_key("run"), t.contains_key("step")) {
        (true, false) => Gate::Metric {
            run: string(file, t, name, "run")?,
            metric: string(file, t, name, "metric")?,
        },
        (false, true) => Gate::Output {
            step: string(file, t, name, "step")?,
            key: optional(file, t, name, "key")?.unwrap_or_else(|| "value".into()),
        },
        _ => {
            return Err(spec(
                file,
                format!(
                    "step {name:?}: give either `run` and `metric` (a train step's run) or `step` (and `key`, default \"value\": a number in a step's output)"
                ),
            ))
        }
    };
    for (k, needs) in [("metric", "run"), ("key", "step")] {
        if t.contains_key(k) && !t.contains_key(needs) {
            return Err(spec(file, format!("step {name:?}: `{k}` goes with `{needs}`")));
        }
    }
    Ok(Action::Condition { gate, op, value })
}

impl Action {
    /// The action with every string setting that may hold references passed through `f`
    /// (given the setting's name and text): [`Action::templates`] lists them, resolving
    /// substitutes them.
    pub fn map_strings<E>(
        &self,
        f: &mut impl FnMut(&'static str, &str) -> std::result::Result<String, E>,
    ) -> std::result::Result<Action, E> {
        fn each<E>(
            f: &mut impl FnMut(&'static str, &str) -> std::result::Result<String, E>,
            key: &'static str,
            list: &[String],
        ) -> std::result::Result<Vec<String>, E> {
            list.iter().map(|s| f(key, s)).collect()
        }
        Ok(match self {
            Action::Train {
                config,
                set,
                from_sweep,
            } => Action::Train {
                config: config.clone(),
                set: each(f, "set", set)?,
                from_sweep: from_sweep.clone(),
            },
            Action::Command { argv } => Action::Command {
                argv: each(f, "argv", argv)?,
            },
            Action::Prepare(p) => Action::Prepare(Prepare {
                tokenizer: f("tokenizer", &p.tokenizer)?,
                input: each(f, "input", &p.input)?,
                output: f("output", &p.output)?,
                ..p.clone()
            }),
            Action::Evaluate(e) => Action::Evaluate(Evaluate {
                config: e.config.as_deref().map(|c| f("config", c)).transpose()?,
                data: e.data.as_deref().map(|d| f("data", d)).transpose()?,
                ..e.clone()
            }),
            Action::Deploy(d) => Action::Deploy(Deploy {
                model: f("model", &d.model)?,
                version: d.version.as_deref().map(|v| f("version", v)).transpose()?,
                ..d.clone()
            }),
            Action::Condition { gate, op, value } => Action::Condition {
                gate: gate.clone(),
                op: *op,
                value: f("value", value)?,
            },
            Action::Sweep { config, set } => Action::Sweep {
                config: config.clone(),
                set: each(f, "set", set)?,
            },
            a @ Action::Register { .. } => a.clone(),
        })
    }

    /// The string settings that may hold references: `(setting, text)`.
    pub fn templates(&self) -> Vec<(&'static str, String)> {
        let mut found = Vec::new();
        let _ = self.map_strings(&mut |key, s| -> std::result::Result<String, ()> {
            found.push((key, s.to_string()));
            Ok(s.to_string())
        });
        found
    }

    /// The action with its references replaced by `values` (keyed `NAME.KEY`, as
    /// [`super::refs::values`] gives them).
    pub fn resolve(&self, values: &std::collections::BTreeMap<String, String>) -> std::result::Result<Action, String> {
        self.map_strings(&mut |key, s| super::refs::substitute(s, values).map_err(|e| format!("`{key}`: {e}")))
    }
}
