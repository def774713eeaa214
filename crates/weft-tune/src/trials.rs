//! A sweep's state, kept in the run store: each trial is a run of the sweep's experiment tagged
//! `sweep = NAME` and `sweep_trial = N`, whose params hold the values it was given and whose
//! metrics hold what it reported. Besides the runs, the store's file holds the sweep's pruning
//! decisions and its definition ([`crate::record`]), so a killed sweep resumes from the store
//! alone, and `weft runs` shows the same trials.

use std::collections::BTreeMap;

use weft_track::Store;

use crate::error::Result;
use crate::sampler::{Observation, Outcome};
use crate::space::{Space, Value};
use crate::spec::SweepSpec;

pub use weft_track::sweep_tags::{TAG_GOAL, TAG_METRIC, TAG_SWEEP, TAG_TRIAL};

/// One trial as recorded (its latest run, or the one that ended when it was run again).
#[derive(Debug, Clone, PartialEq)]
pub struct TrialRecord {
    pub number: u64,
    pub run_id: i64,
    pub run_name: String,
    /// The run's status: `running`, `finished`, `pruned`, `failed` or `killed`.
    pub status: String,
    /// The swept keys' recorded values, as text, in the space's order (`None`: not recorded).
    pub params: Vec<Option<String>>,
    /// The swept values read back (`None` when one does not parse).
    pub values: Option<Vec<Value>>,
    /// The metric's last value and its step: NaN when the run recorded it NaN at its last
    /// step ([`weft_track::nan_tag`]: the trial diverged).
    pub last: Option<(i64, f64)>,
    /// Why it failed, was killed or was pruned.
    pub error: Option<String>,
}

impl TrialRecord {
    /// Whether the trial has ended for good (finished, pruned or failed); a killed or running
    /// one is run again by `--resume`.
    pub fn is_done(&self) -> bool {
        matches!(self.status.as_str(), "finished" | "pruned" | "failed")
    }

    /// What the samplers learn from it (finished and pruned trials with a metric value; one
    /// that ended NaN teaches nothing, as a failed one, which is how Optuna counts it).
    pub fn observation(&self, spec: &SweepSpec) -> Option<Observation> {
        let (step, value) = self.last.filter(|(_, v)| !v.is_nan())?;
        let value = spec.goal.loss(value);
        let outcome = match self.status.as_str() {
            "finished" => Outcome::Finished(value),
            "pruned" => Outcome::Pruned {
                step: step.max(0) as u64,
                value,
            },
            _ => return None,
        };
        Some(Observation {
            values: self.values.clone()?,
            outcome,
        })
    }
}

/// The param text a run records for `v` (strings without quotes, as the trainer flattens its
/// config).
pub fn param_text(space: &Space, i: usize, v: Value) -> String {
    let p = &space.params[i];
    match (v, &p.dist) {
        (Value::Choice(c), crate::space::Distribution::Values(vals)) => match &vals[c] {
            toml::Value::String(s) => s.clone(),
            other => other.to_string(),
        },
        _ => p.text(v),
    }
}

/// The typed value of parameter `i` recorded as param text `text`: a float, an integer, or the
/// listed TOML value it names; text the parameter cannot take stays a string.
pub fn param_value(space: &Space, i: usize, text: &str) -> toml::Value {
    let p = &space.params[i];
    match (p.parse_text(text), &p.dist) {
        (Some(Value::Float(x)), _) => toml::Value::Float(x),
        (Some(Value::Int(n)), _) => toml::Value::Integer(n),
        (Some(Value::Choice(c)), crate::space::Distribution::Values(vals)) => vals[c].clone(),
        _ => toml::Value::String(text.to_string()),
    }
}

/// `v` in a table cell: six decimals, or six significant digits with an exponent when it is
/// that small or large (1e-300 took 300 characters).
fn short(v: f64) -> String {
    if v != 0.0 && v.is_finite() && !(1e-4..1e9).contains(&v.abs()) {
        format!("{v:.6e}")
    } else {
        format!("{v:.6}")
    }
}

/// A recorded param's text in a table cell: a long number in its shortest exact form
/// (`1e-300`), anything else as recorded.
fn short_text(text: &str) -> String {
    match text.parse::<f64>() {
        Ok(v) if text.len() > 24 => format!("{v:?}"),
        _ => text.to_string(),
    }
}

/// Metric `key`'s last value in run `detail` and its step; NaN when the run recorded it NaN at
/// that step or later (the store holds no NaN row: [`weft_track::nan_tag`]).
pub fn last_value(detail: &weft_track::RunDetail, key: &str) -> Option<(i64, f64)> {
    let last = detail.metrics.get(key).map(|m| (m.last_step, m.last));
    let nan = detail
        .summary
        .tags
        .get(&weft_track::nan_tag(key))
        .and_then(|s| s.parse::<i64>().ok());
    match (last, nan) {
        (Some((step, _)), Some(at)) if at >= step => Some((at, f64::NAN)),
        (None, Some(at)) => Some((at, f64::NAN)),
        (last, _) => last,
    }
}

/// Every trial of `spec`'s sweep in the store, by number: for a number run more than once, the
/// run that ended for good, else the latest.
/// A run the pruner stopped is `pruned` even when its driver did not see it end (the driver was
/// killed while the trial stopped, and the trainer recorded it `killed`): its pruning decision
/// was recorded before the trial was told to stop ([`crate::record::prunes`]).
pub fn load(store: &Store, spec: &SweepSpec) -> Result<Vec<TrialRecord>> {
    let prunes = crate::record::prunes(store, spec)?;
    let mut by_number: BTreeMap<u64, TrialRecord> = BTreeMap::new();
    for run in store.list_runs(Some(&spec.experiment))? {
        if run.tags.get(TAG_SWEEP) != Some(&spec.name) {
            continue;
        }
        let Some(number) = run.tags.get(TAG_TRIAL).and_then(|t| t.parse::<u64>().ok()) else {
            continue;
        };
        let detail = store.run_detail(run.id)?;
        let params: Vec<Option<String>> = spec
            .space
            .params
            .iter()
            .map(|p| run.params.get(&p.key).cloned())
            .collect();
        let values = spec
            .space
            .params
            .iter()
            .zip(&params)
            .map(|(p, t)| p.parse_text(t.as_deref()?))
            .collect::<Option<Vec<Value>>>();
        let mut record = TrialRecord {
            number,
            run_id: run.id,
            run_name: run.name.clone(),
            status: run.status.clone(),
            params,
            values,
            last: last_value(&detail, &spec.metric),
            error: detail.error.clone(),
        };
        if let Some(p) = prunes.get(&(run.id, run.start_time.to_bits())) {
            // still stopping (`running`) stays running: a resume waits for it
            if matches!(record.status.as_str(), "killed" | "failed") {
                record.status = "pruned".into();
                record.error = Some(format!("pruned: {}", p.reason));
            }
        }
        match by_number.get(&number) {
            Some(old) if old.is_done() && !record.is_done() => {}
            _ => {
                by_number.insert(number, record);
            }
        }
    }
    Ok(by_number.into_values().collect())
}

/// The best finished trial (by the metric's last value and the goal; the lowest number wins a
/// tie).
pub fn best<'a>(spec: &SweepSpec, trials: &'a [TrialRecord]) -> Option<&'a TrialRecord> {
    trials
        .iter()
        .filter(|t| t.status == "finished" && t.last.is_some_and(|(_, v)| !v.is_nan()))
        .min_by(|a, b| {
            let (la, lb) = (spec.goal.loss(a.last.unwrap().1), spec.goal.loss(b.last.unwrap().1));
            la.total_cmp(&lb).then(a.number.cmp(&b.number))
        })
}

/// The sweep's trials as a table, then the best trial, as `weft sweep status` prints them.
pub fn status_text(spec: &SweepSpec, trials: &[TrialRecord]) -> String {
    let count = |s: &str| trials.iter().filter(|t| t.status == s).count();
    let mut out = format!(
        "sweep {} (experiment {}): {} of {} trials recorded: {} finished, {} pruned, {} failed, {} killed, {} running; \
         {} ({})\n",
        spec.name,
        spec.experiment,
        trials.len(),
        spec.trials,
        count("finished"),
        count("pruned"),
        count("failed"),
        count("killed"),
        count("running"),
        spec.metric,
        spec.goal.as_str(),
    );
    let mut rows = vec![{
        let mut h = vec![
            "trial".to_string(),
            "run".into(),
            "status".into(),
            "step".into(),
            spec.metric.clone(),
        ];
        h.extend(spec.space.params.iter().map(|p| p.key.clone()));
        h
    }];
    for t in trials {
        let mut r = vec![
            t.number.to_string(),
            t.run_name.clone(),
            t.status.clone(),
            t.last.map_or("-".into(), |(s, _)| s.to_string()),
            t.last.map_or("-".into(), |(_, v)| short(v)),
        ];
        r.extend(t.params.iter().map(|p| p.as_deref().map_or("-".into(), short_text)));
        rows.push(r);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for r in &rows {
        let line: Vec<String> = r.iter().zip(&widths).map(|(v, w)| format!("{v:<w$}")).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    match best(spec, trials) {
        Some(b) => {
            let params: Vec<String> = spec
                .space
                .params
                .iter()
                .zip(&b.params)
                .map(|(p, v)| format!("{}={}", p.key, v.as_deref().unwrap_or("-")))
                .collect();
            let (step, value) = b.last.unwrap_or((0, f64::NAN));
            out.push_str(&format!(
                "best: trial {} ({}): {} = {value} at step {step}; {}\n",
                b.number,
                b.run_name,
                spec.metric,
                params.join(" ")
            ));
        }
        None => out.push_str("best: none yet (no trial has finished with a value of the metric)\n"),
    }
    out
}
