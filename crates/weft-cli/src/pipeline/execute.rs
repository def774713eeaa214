//! Running one step: its action with its references resolved, given the outputs of the steps
//! done before it. Train, sweep, command, condition and register here; prepare and evaluate in
//! [`super::data`], deploy in [`super::deploy`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use weft_track::Store;
use weft_tune::pipeline::handover::{self, Best};
use weft_tune::pipeline::refs::parse_output;
use weft_tune::pipeline::{Action, Gate, Step};
use weft_tune::registry::ModelRegistry;

use super::Context;

/// The run id in a train step's output (`run=ID`).
pub(super) fn run_of(output: &str) -> Result<i64, String> {
    parse_output(output)
        .get("run")
        .and_then(|id| id.parse().ok())
        .ok_or_else(|| format!("its train step's output {output:?} names no run"))
}

pub(super) fn spawn_status(cmd: Command, what: &str) -> Result<(), String> {
    let status = super::children::run(cmd, false)
        .map_err(|e| format!("cannot start {what}: {e}"))?
        .status;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} exited with {status}"))
    }
}

/// Runs `cmd` capturing its output; its stdout, or an error of one line: `what` and the last
/// line it wrote on stderr (its `weft: error: ...`, without the prefix).
pub(super) fn captured(cmd: Command, what: &str) -> Result<String, String> {
    let out = super::children::run(cmd, true).map_err(|e| format!("cannot start {what}: {e}"))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
    let last = last.strip_prefix("weft: error: ").unwrap_or(last);
    Err(if last.is_empty() {
        format!("{what} exited with {}", out.status)
    } else {
        format!("{what}: {last}")
    })
}

/// The config file and `--set` overrides of train step `name` (its action with its references
/// resolved): the best trial's values of its `from_sweep` step first, then its own `set`.
pub(super) fn train_settings(
    ctx: &Context,
    name: &str,
    action: &Action,
    outputs: &BTreeMap<String, String>,
) -> Result<(PathBuf, Vec<String>), String> {
    let Action::Train {
        config,
        set,
        from_sweep,
    } = action
    else {
        return Err(format!("step {name:?} is no train step"));
    };
    let mut sets = match from_sweep {
        Some(from) => handover::best_sets(from, outputs.get(from).map(String::as_str))?,
        None => Vec::new(),
    };
    sets.extend(set.iter().cloned());
    Ok((ctx.root.join(config), sets))
}

/// Runs `step` once, its references resolved in `action`; its output. `outputs` holds the
/// outputs of the steps done before it (its ancestors among them); `key` is its cache key.
pub(super) fn execute(
    ctx: &Context,
    step: &Step,
    action: &Action,
    outputs: &BTreeMap<String, String>,
    key: &str,
) -> Result<String, String> {
    match action {
        Action::Train { set, .. } => {
            let (config, sets) = train_settings(ctx, &step.name, action, outputs)?;
            let millis = (weft_track::now() * 1000.0) as u64;
            let name = format!("{}-{}-{millis}", ctx.pipeline, step.name);
            let mut cmd = Command::new(&ctx.exe);
            cmd.current_dir(&ctx.root)
                .env("WEFT_TRACK_DIR", &ctx.dir)
                .args(["train", "--config"])
                .arg(config);
            for s in &sets {
                cmd.args(["--set", s]);
            }
            if !set.iter().any(|s| s.trim_start().starts_with("train.checkpoint_dir")) {
                // each execution keeps its own checkpoints (a registered version's files stay)
                let ckpt = ctx.dir.join("pipeline-checkpoints").join(&ctx.pipeline).join(&name);
                cmd.args(["--set", &format!("train.checkpoint_dir={:?}", ckpt.to_string_lossy())]);
            }
            cmd.args(["--set", "track.enabled=true", "--set", &format!("track.name={name:?}")])
                .args(["--set", &format!("track.dir={:?}", ctx.dir.to_string_lossy())]);
            spawn_status(cmd, "weft train")?;
            let store = Store::open_existing(&ctx.dir).map_err(|e| e.to_string())?;
            let id = store.find_run(&name).map_err(|e| e.to_string())?;
            // and its last checkpoint, when it wrote one (what a command step may take)
            let detail = store.run_detail(id).map_err(|e| e.to_string())?;
            let mut out = vec![("run", id.to_string())];
            if let Some(ckpt) = weft_tune::registry::last_checkpoint(&detail) {
                out.push(("checkpoint", ckpt.display().to_string()));
            }
            Ok(weft_tune::pipeline::refs::output(&out))
        }
        Action::Sweep { config, set } => {
            // each execution a sweep of its own (a re-run never meets the trials of an earlier one)
            let millis = (weft_track::now() * 1000.0) as u64;
            let name = format!("{}-{}-{millis}", ctx.pipeline, step.name);
            let mut cmd = Command::new(&ctx.exe);
            cmd.current_dir(&ctx.root)
                .env("WEFT_TRACK_DIR", &ctx.dir)
                .args(["sweep", "--config"])
                .arg(ctx.root.join(config))
                .args(sweep_given(&name, set));
            spawn_status(cmd, "weft sweep")?;
            sweep_best(ctx, config, &name, set)
        }
        Action::Command { argv } => {
            // the program may hand values to later steps: `key=value` lines in this file
            let millis = (weft_track::now() * 1000.0) as u64;
            let handed = ctx
                .dir
                .join("pipeline-outputs")
                .join(format!("{}-{}-{millis}", ctx.pipeline, step.name));
            std::fs::create_dir_all(handed.parent().unwrap_or(&ctx.dir))
                .map_err(|e| format!("{}: {e}", ctx.dir.display()))?;
            let mut cmd = Command::new(&argv[0]);
            cmd.current_dir(&ctx.root)
                .args(&argv[1..])
                .env("WEFT_TRACK_DIR", &ctx.dir)
                .env("WEFT_STEP_OUTPUT", &handed);
            let ran = spawn_status(cmd, &format!("{:?}", argv[0]));
            let text = std::fs::read_to_string(&handed).ok();
            let _ = std::fs::remove_file(&handed);
            ran?;
            let mut out = vec![("exit".to_string(), "0".to_string())];
            out.extend(handed_values(text.as_deref().unwrap_or(""))?);
            let pairs: Vec<(&str, String)> = out.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
            Ok(weft_tune::pipeline::refs::output(&pairs))
        }
        Action::Condition { gate, op, value } => {
            // a reference may resolve to `nan` or `inf`, which parse
            let value: f64 = match value.trim().parse::<f64>() {
                Ok(v) if v.is_finite() => v,
                Ok(_) => return Err(format!("`value` {value:?} is not a finite number")),
                Err(_) => return Err(format!("`value` {value:?} is not a number")),
            };
            let got = match gate {
                Gate::Metric { run, metric } => {
                    let id = run_of(outputs.get(run).map_or("", String::as_str))?;
                    let store = Store::open_existing(&ctx.dir).map_err(|e| e.to_string())?;
                    let detail = store.run_detail(id).map_err(|e| e.to_string())?;
                    let got = detail.metrics.get(metric).ok_or_else(|| {
                        let known: Vec<&String> = detail.metrics.keys().collect();
                        format!("run {id} (step {run:?}) logged no metric {metric:?} (logged: {known:?})")
                    })?;
                    if got.last.is_nan() {
                        return Err(format!(
                            "run {id} (step {run:?}) logged {metric} = NaN last, which a condition does not compare"
                        ));
                    }
                    got.last
                }
                Gate::Output { step: from, key } => {
                    let out = outputs.get(from).map_or("", String::as_str);
                    let text = parse_output(out)
                        .remove(key)
                        .ok_or_else(|| format!("the output of step {from:?} ({out:?}) has no key {key:?}"))?;
                    let got: f64 = text
                        .parse()
                        .map_err(|_| format!("step {from:?}'s {key} = {text:?} is not a number"))?;
                    if got.is_nan() {
                        return Err(format!(
                            "step {from:?}'s {key} is NaN, which a condition does not compare"
                        ));
                    }
                    got
                }
            };
            Ok(if op.holds(got, value) { "true" } else { "false" }.to_string())
        }
        Action::Register { step: from, model } => {
            let id = run_of(outputs.get(from).map_or("", String::as_str))?;
            // the run as EXPERIMENT/NAME: its id as text would be ambiguous with a run named
            // like that number, which the store refuses
            let summary = Store::open(&ctx.dir)
                .and_then(|store| store.run_detail(id))
                .map_err(|e| e.to_string())?
                .summary;
            let source = format!("{}/{}", summary.experiment, summary.name);
            let mut reg = ModelRegistry::open(&ctx.dir).map_err(|e| e.to_string())?;
            let check = |ckpt: &std::path::Path| crate::models::check_loadable(ckpt, true);
            let v = reg
                .register_checked(&ctx.dir, &source, model, &check)
                .map_err(|e| e.to_string())?;
            Ok(format!("model={} version={}", v.name, v.version))
        }
        Action::Prepare(p) => super::data::prepare(ctx, p, key),
        Action::Evaluate(e) => super::data::evaluate(ctx, e, outputs),
        Action::Deploy(d) => super::deploy::deploy(ctx, d, outputs),
    }
}

/// The values a command step's program wrote to `WEFT_STEP_OUTPUT`: one `key=value` a line (the
/// value the rest of the line; blank lines skipped), a key of letters, digits, `_` and `-` (what
/// a reference can name), not `exit`; a later line of the same key replaces the earlier one's
/// value (in its place). A line that is none of these fails the step, naming it.
fn handed_values(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut values: Vec<(String, String)> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |why: &str| format!("WEFT_STEP_OUTPUT line {}: {line:?}: {why}", n + 1);
        let (key, value) = line.split_once('=').ok_or_else(|| bad("not key=value"))?;
        let key = key.trim();
        if key.is_empty() || !key.chars().all(weft_tune::pipeline::refs::key_char) {
            return Err(bad("a key is letters, digits, '_' and '-'"));
        }
        if key == "exit" {
            return Err(bad("`exit` is the step's own key"));
        }
        match values.iter_mut().find(|(k, _)| k == key) {
            Some(kv) => kv.1 = value.to_string(),
            None => values.push((key.to_string(), value.to_string())),
        }
    }
    Ok(values)
}

/// `--name NAME --set KV...`: a sweep step's execution as `weft sweep` and `weft sweep status`
/// take it.
fn sweep_given(name: &str, set: &[String]) -> Vec<String> {
    let mut args = vec!["--name".to_string(), name.to_string()];
    for kv in set {
        args.extend(["--set".to_string(), kv.clone()]);
    }
    args
}

/// The output of a sweep step whose sweep (file `config`, run as sweep `name` with `set`) has
/// run: its best finished trial and that trial's values ([`handover::sweep_output`]), as `weft
/// sweep status --json` gives them with the store and folder the sweep ran with.
fn sweep_best(ctx: &Context, config: &Path, name: &str, set: &[String]) -> Result<String, String> {
    let mut cmd = Command::new(&ctx.exe);
    cmd.current_dir(&ctx.root)
        .env("WEFT_TRACK_DIR", &ctx.dir)
        .args(["sweep", "status", "--json", "--config"])
        .arg(ctx.root.join(config))
        .args(sweep_given(name, set));
    let out = super::children::run(cmd, true).map_err(|e| format!("cannot start weft sweep status: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!("weft sweep status: {}", err.trim()));
    }
    let status: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("weft sweep status --json: {e}"))?;
    let name = status["sweep"].as_str().unwrap_or_default();
    let best = &status["best"];
    if best.is_null() {
        return Ok(handover::sweep_output(name, None));
    }
    let trial = best["id"]
        .as_u64()
        .ok_or_else(|| format!("sweep {name}: weft sweep status --json gave a best trial without an id"))?;
    let field = |key: &str| format!("sweep {name}: trial {trial}, the best, has no {key} in weft sweep status --json");
    let mut params = toml::Table::new();
    for (k, v) in best["params"].as_object().ok_or_else(|| field("params"))? {
        // a parameter the trial did not draw (the sweep file gained it on a resume) is left to the
        // train step's own config
        if v.is_null() {
            weft_core::errln!(
                "weft pipeline: sweep {name}: trial {trial}, the best, has no value of {k}; not handed over"
            );
            continue;
        }
        let v = toml::Value::try_from(v).map_err(|e| format!("sweep {name}: trial {trial}'s value of {k}: {e}"))?;
        params.insert(k.clone(), v);
    }
    let best = Best {
        trial,
        run: best["run"].as_str().ok_or_else(|| field("run"))?.to_string(),
        value: best["value"].as_f64().ok_or_else(|| field("value"))?,
        params,
    };
    Ok(handover::sweep_output(name, Some(&best)))
}

/// Runs `step` up to `retries + 1` times; the last error when every try failed.
pub(super) fn execute_with_retries(
    ctx: &Context,
    step: &Step,
    action: &Action,
    outputs: &BTreeMap<String, String>,
    key: &str,
) -> Result<String, String> {
    let mut tries = 0;
    loop {
        match execute(ctx, step, action, outputs, key) {
            Ok(out) => return Ok(out),
            // a stopping pipeline retries nothing
            Err(e) if tries < step.retries && super::children::caught().is_none() => {
                tries += 1;
                weft_core::errln!(
                    "weft pipeline: step {}: {e}; try {} of {}",
                    step.name,
                    tries + 1,
                    step.retries + 1
                );
            }
            Err(e) => return Err(e),
        }
    }
}
