//! The sweep file: `[sweep]`, `[sweep.parameters]` (see [`crate::space`]) and
//! `[sweep.pruner]`, read and checked before anything runs. Every error is one line naming the
//! file and the key.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::space::Space;

/// A TOML syntax error as one line: `source (line L, column C): message`, where the line and
/// the column (of characters, both from 1) are where the parser stopped, as in its own report.
pub(crate) fn syntax_error(source: &str, text: &str, e: &toml::de::Error) -> String {
    let at = e.span().map(|s| {
        let mut start = s.start.min(text.len());
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        let before = &text[..start];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().unwrap_or_default().chars().count() + 1;
        format!(" (line {line}, column {column})")
    });
    let message = e.message().trim().replace('\n', " ");
    format!("{source}{}: {message}", at.unwrap_or_default())
}

/// Whether lower or higher values of the metric are better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Goal {
    Minimize,
    Maximize,
}

impl Goal {
    /// `value` turned into a loss: lower is better (maximized metrics are negated).
    pub fn loss(self, value: f64) -> f64 {
        match self {
            Goal::Minimize => value,
            Goal::Maximize => -value,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Goal::Minimize => "minimize",
            Goal::Maximize => "maximize",
        }
    }
}

/// How each trial's parameters are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Tree-structured Parzen estimators after `startup_trials` random trials.
    Tpe,
    Random,
    /// Every point of the product of the parameters' values, in order.
    Grid,
}

/// Which pruner stops trials early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrunerKind {
    Asha,
    Hyperband,
    Median,
    None,
}

/// `[sweep.pruner]`.
#[derive(Debug, Clone, PartialEq)]
pub struct PrunerSpec {
    pub kind: PrunerKind,
    /// Training steps before the first rung (ASHA, Hyperband's most aggressive bracket), or
    /// before the median rule applies. Default 1.
    pub min_steps: u64,
    /// `eta`: rungs are `min_steps * eta^k` steps apart, and `1/eta` of a rung's trials go on.
    /// Default 4 (Ray Tune's ASHA and Optuna's successive halving).
    pub reduction_factor: u64,
}

/// A whole sweep file.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepSpec {
    /// The file it was read from, as given (names it in errors).
    pub source: String,
    /// The sweep's name (`[sweep] name`, default the file's stem): trials are tagged with it and
    /// named `NAME-trial-N`.
    pub name: String,
    /// The experiment its trials are recorded under (default: the name).
    pub experiment: String,
    /// The run config each trial starts from, resolved against the sweep file's folder.
    pub base: PathBuf,
    /// The metric the trials are ranked by (`val_loss`, `loss`, `val_accuracy`, ...): its last
    /// recorded value is a trial's result.
    pub metric: String,
    pub goal: Goal,
    pub method: Method,
    /// How many trials (a grid: at most its size; default its size).
    pub trials: u64,
    /// Trials run at once. Default 1.
    pub parallel: usize,
    /// Processes per trial (above 1 each trial is a `weft launch` job). Default 1.
    pub nproc_per_trial: usize,
    /// Seeds every draw of the samplers. Default 0.
    pub seed: u64,
    /// TPE: random trials before the estimators are used. Default 10.
    pub startup_trials: u64,
    /// TPE: one joint estimator over all parameters instead of one per parameter. Default false
    /// (as Optuna's `TPESampler`).
    pub multivariate: bool,
    /// TPE: the quantile of ended trials counted good (`l(x)`), in `(0, 1]`. Default 0.1 (as
    /// Optuna's), which did better than 0.25 on both of docs/sweep.md's benchmarks.
    pub gamma: f64,
    /// TPE with `parallel > 1`: trials still running count as the worst when the next trial's
    /// parameters are chosen (the constant liar). Default true.
    pub constant_liar: bool,
    pub space: Space,
    pub pruner: PrunerSpec,
}

const SWEEP_KEYS: [&str; 16] = [
    "name",
    "experiment",
    "base",
    "metric",
    "goal",
    "method",
    "trials",
    "parallel",
    "nproc_per_trial",
    "seed",
    "startup_trials",
    "multivariate",
    "gamma",
    "constant_liar",
    "parameters",
    "pruner",
];

/// Refuses a sweep name that cannot name its folder of trial logs (`sweeps/NAME` in the run
/// store): empty, `.`, `..`, or holding a `/` or a NUL.
pub fn check_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(format!(
            "{name:?}: a sweep's name must be non-empty, not \".\" or \"..\", and hold no '/' (it names a folder)"
        ));
    }
    Ok(())
}

impl SweepSpec {
    /// Reads and checks the sweep file at `path`.
    pub fn load(path: &Path) -> Result<SweepSpec> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let stem = path
            .file_stem()
            .map_or("sweep".into(), |s| s.to_string_lossy().into_owned());
        let folder = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::parse(&text, &path.display().to_string(), &stem, &folder)
    }

    /// Parses sweep-file text; `source` names it in errors, `stem` is the default name, and the
    /// base config resolves against `folder`.
    pub fn parse(text: &str, source: &str, stem: &str, folder: &Path) -> Result<SweepSpec> {
        let spec = |msg: String| Error::Spec(format!("{source}: {msg}"));
        let doc: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| Error::Spec(syntax_error(source, text, &e)))?;
        if let Some(k) = doc.keys().find(|k| *k != "sweep") {
            return Err(spec(format!(
                "unknown section or key {k:?} (a sweep file holds [sweep] only)"
            )));
        }
        let sweep = doc
            .get("sweep")
            .and_then(toml::Value::as_table)
            .ok_or_else(|| spec("no [sweep] section".into()))?;
        if let Some(k) = sweep.keys().find(|k| !SWEEP_KEYS.contains(&k.as_str())) {
            return Err(spec(format!(
                "sweep.{k}: unknown key (expected one of {})",
                SWEEP_KEYS.join(", ")
            )));
        }
        let keys = Keys {
            table: sweep,
            source,
            section: "sweep",
        };
        let name = keys.string("name")?.unwrap_or_else(|| stem.to_string());
        check_name(&name).map_err(|e| spec(format!("sweep.name: {e}")))?;
        let experiment = keys.string("experiment")?.unwrap_or_else(|| name.clone());
        let base = keys
            .string("base")?
            .ok_or_else(|| spec("sweep.base: missing: the run config each trial starts from".into()))?;
        let metric = keys
            .string("metric")?
            .ok_or_else(|| spec("sweep.metric: missing: the metric to rank trials by (e.g. \"val_loss\")".into()))?;
        let goal = match keys.string("goal")?.as_deref() {
            None | Some("minimize") => Goal::Minimize,
            Some("maximize") => Goal::Maximize,
            Some(other) => return Err(spec(format!("sweep.goal: {other:?} is not one of minimize, maximize"))),
        };
        let method = match keys.string("method")?.as_deref() {
            None | Some("tpe") => Method::Tpe,
            Some("random") => Method::Random,
            Some("grid") => Method::Grid,
            Some(other) => return Err(spec(format!("sweep.method: {other:?} is not one of tpe, random, grid"))),
        };
        let params = sweep
            .get("parameters")
            .map(|p| {
                p.as_table()
                    .ok_or_else(|| spec("sweep.parameters: expected a table".into()))
            })
            .transpose()?
            .ok_or_else(|| spec("[sweep.parameters] is missing: name at least one config key".into()))?;
        let space = Space::from_toml(params, source)?;
        let grid = space.grid_size();
        let given_trials = keys.count("trials", 1)?;
        if method == Method::Grid {
            let Some(size) = grid else {
                let p = space
                    .params
                    .iter()
                    .find(|p| p.grid_len().is_none())
                    .map_or("", |p| p.key.as_str());
                return Err(spec(format!(
                    "sweep.method: grid needs every parameter to list values, be int_uniform, or have q steps; \
                     {p:?} is a continuous range"
                )));
            };
            // a grid larger than the bound is fine when `trials` runs only a part of it
            if size > MAX_GRID && given_trials.is_none_or(|n| n > MAX_GRID) {
                // the parameter with the most points is the one to narrow
                let widest = space.params.iter().max_by_key(|p| p.grid_len().unwrap_or(0));
                let (key, len) = widest.map_or(("", 0), |p| (p.key.as_str(), p.grid_len().unwrap_or(0)));
                let total: f64 = space.params.iter().map(|p| p.grid_len().unwrap_or(1) as f64).product();
                return Err(spec(format!(
                    "sweep.method: the grid has {} points, more than the {MAX_GRID} a grid sweep may have; \
                     sweep.parameters.\"{key}\" alone has {len} (list fewer values, take larger q steps, or use \
                     method = \"random\" or \"tpe\")",
                    count(total)
                )));
            }
        }
        let trials = match (given_trials, method) {
            (Some(n), _) => n,
            (None, Method::Grid) => grid.unwrap_or(1),
            (None, _) => return Err(spec("sweep.trials: missing: how many trials to run".into())),
        };
        let pruner = match sweep.get("pruner") {
            None => PrunerSpec {
                kind: PrunerKind::None,
                min_steps: 1,
                reduction_factor: 4,
            },
            Some(p) => parse_pruner(p, source)?,
        };
        Ok(SweepSpec {
            source: source.to_string(),
            name,
            experiment,
            base: folder.join(base),
            metric,
            goal,
            method,
            trials,
            parallel: keys.count("parallel", 1)?.unwrap_or(1) as usize,
            nproc_per_trial: keys.count("nproc_per_trial", 1)?.unwrap_or(1) as usize,
            seed: keys.count("seed", 0)?.unwrap_or(0),
            startup_trials: keys.count("startup_trials", 0)?.unwrap_or(10),
            gamma: match sweep.get("gamma") {
                None => crate::sampler::GAMMA,
                Some(v) => match v.as_float().or_else(|| v.as_integer().map(|i| i as f64)) {
                    Some(g) if g > 0.0 && g <= 1.0 => g,
                    _ => return Err(spec(format!("sweep.gamma: expected a number in (0, 1], found {v}"))),
                },
            },
            multivariate: match sweep.get("multivariate") {
                None => false,
                Some(toml::Value::Boolean(b)) => *b,
                Some(other) => {
                    return Err(spec(format!(
                        "sweep.multivariate: expected true or false, found {other}"
                    )))
                }
            },
            constant_liar: match sweep.get("constant_liar") {
                None => true,
                Some(toml::Value::Boolean(b)) => *b,
                Some(other) => {
                    return Err(spec(format!(
                        "sweep.constant_liar: expected true or false, found {other}"
                    )))
                }
            },
            space,
            pruner,
        })
    }
}

/// The most points a grid sweep may have (each is a training run; a sweep of more is a
/// mistake, or wants `random` or `tpe`).
pub const MAX_GRID: u64 = 100_000;

/// A count as a whole number, or in scientific notation past 2^53.
fn count(n: f64) -> String {
    if n <= (1u64 << 53) as f64 {
        format!("{n}")
    } else {
        format!("{n:.3e}")
    }
}

fn parse_pruner(value: &toml::Value, source: &str) -> Result<PrunerSpec> {
    let spec = |msg: String| Error::Spec(format!("{source}: {msg}"));
    let table = value
        .as_table()
        .ok_or_else(|| spec("sweep.pruner: expected a table".into()))?;
    const KEYS: [&str; 3] = ["kind", "min_steps", "reduction_factor"];
    if let Some(k) = table.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(spec(format!(
            "sweep.pruner.{k}: unknown key (expected one of {})",
            KEYS.join(", ")
        )));
    }
    let keys = Keys {
        table,
        source,
        section: "sweep.pruner",
    };
    let kind = match keys.string("kind")?.as_deref() {
        Some("asha") => PrunerKind::Asha,
        Some("hyperband") => PrunerKind::Hyperband,
        Some("median") => PrunerKind::Median,
        Some("none") | None => PrunerKind::None,
        Some(other) => {
            return Err(spec(format!(
                "sweep.pruner.kind: {other:?} is not one of asha, hyperband, median, none"
            )))
        }
    };
    Ok(PrunerSpec {
        kind,
        min_steps: keys.count("min_steps", 1)?.unwrap_or(1),
        reduction_factor: keys.count("reduction_factor", 2)?.unwrap_or(4),
    })
}

/// Typed reads of one section's keys, with errors naming `section.key`.
struct Keys<'a> {
    table: &'a toml::Table,
    source: &'a str,
    section: &'a str,
}

impl Keys<'_> {
    fn string(&self, key: &str) -> Result<Option<String>> {
        match self.table.get(key) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(Error::Spec(format!(
                "{}: {}.{key}: expected a string, got {other}",
                self.source, self.section
            ))),
        }
    }

    /// A whole number of at least `min`.
    fn count(&self, key: &str, min: u64) -> Result<Option<u64>> {
        match self.table.get(key) {
            None => Ok(None),
            Some(toml::Value::Integer(i)) if *i >= min as i64 => Ok(Some(*i as u64)),
            Some(other) => Err(Error::Spec(format!(
                "{}: {}.{key}: expected a whole number >= {min}, got {other}",
                self.source, self.section
            ))),
        }
    }
}

#[cfg(test)]
mod tests;
