//! Runs as JSON: what `weft runs list --json` and `show --json` print and what the dashboard's
//! API returns (one encoding, so the two agree). Times are seconds since the Unix epoch;
//! non-finite numbers become `null`.

use serde_json::{json, Map, Value};

use crate::{RunDetail, RunSummary};

/// A number for JSON (non-finite values become null).
pub fn num(x: f64) -> Value {
    serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
}

/// A run of the run table: id, experiment, name, status, start and end time, params, tags and
/// each metric's last value (`metrics`).
pub fn summary(r: &RunSummary) -> Value {
    json!({
        "id": r.id,
        "experiment": r.experiment,
        "name": r.name,
        "status": r.status,
        "start_time": r.start_time,
        "end_time": r.end_time,
        "params": r.params,
        "tags": r.tags,
        "metrics": r.last.iter().map(|(k, v)| (k.clone(), num(*v))).collect::<Map<_, _>>(),
    })
}

/// Everything recorded of a run but its metric rows: [`summary`] plus command, git, host,
/// layout, heartbeat, error, artifacts and `metric_summaries` (count, last, last step, min, max).
pub fn detail(d: &RunDetail) -> Value {
    let mut v = summary(&d.summary);
    v["command"] = json!(d.command);
    v["git_commit"] = json!(d.git_commit);
    v["git_dirty"] = json!(d.git_dirty);
    v["host"] = json!(d.host);
    v["layout"] = json!(d.layout);
    v["heartbeat"] = json!(d.heartbeat);
    v["error"] = json!(d.error);
    v["artifacts"] = d.artifacts.iter().map(|(k, p)| json!({"kind": k, "path": p})).collect();
    v["inputs"] = d.inputs.iter().map(input).collect();
    v["metric_summaries"] = d
        .metrics
        .iter()
        .map(|(k, m)| {
            let s = json!({"count": m.count, "last": num(m.last), "last_step": m.last_step,
                           "min": num(m.min), "max": num(m.max)});
            (k.clone(), s)
        })
        .collect::<Map<_, _>>()
        .into();
    v
}

/// One input of a run: `{"kind", "uri", "digest", "source_run"}` (the last two may be null).
pub fn input(i: &crate::RunInput) -> Value {
    json!({"kind": i.kind, "uri": i.uri, "digest": i.digest, "source_run": i.source_run})
}

/// `value` quoted, its first 80 characters only (then `...` and its length), for echoing a
/// client's value in an error.
pub fn short(value: &str) -> String {
    match value.char_indices().nth(80) {
        None => format!("{value:?}"),
        Some((end, _)) => format!("{:?}... ({} bytes)", &value[..end], value.len()),
    }
}
