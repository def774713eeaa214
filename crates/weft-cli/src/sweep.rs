//! `weft sweep`: hyperparameter sweeps over a run config (docs/sweep.md). The sweep file is
//! read and checked by `weft_tune`; here its keys are checked against the run config's, the
//! metric against what the trainer logs for it, and each trial becomes a `weft train` (or
//! `weft launch ... train`) command of this same binary.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use weft_train::config::{ModelConfig, Overrides, RunConfig};
use weft_tune::trials::{self, TAG_GOAL, TAG_METRIC, TAG_SWEEP, TAG_TRIAL};
use weft_tune::SweepSpec;

use crate::print_out;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct SweepArgs {
    #[command(subcommand)]
    what: Option<SweepCommand>,
    /// The sweep file (`[sweep]`, `[sweep.parameters]`, `[sweep.pruner]`).
    #[arg(long, required = true)]
    config: Option<PathBuf>,
    /// Go on with a sweep the run store already holds trials of: trials that finished, were
    /// pruned or failed are not run again; killed ones are. The sweep file and its base config
    /// must define the sweep as it was started (only `trials` and `parallel` may change).
    #[arg(long)]
    resume: bool,
    #[command(flatten)]
    given: Given,
}

/// What the command line changes of a sweep file (`weft sweep` and `weft sweep status` take
/// the same, to find the same trials).
#[derive(clap::Args, Default)]
pub struct Given {
    /// The sweep's name instead of the file's `[sweep] name` (its trials are `NAME-trial-N`; the
    /// experiment stays the file's).
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// `section.key=value` set in the base config of every trial (as `weft train --set`), before
    /// the swept values; a swept key cannot be set.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

#[derive(clap::Subcommand)]
pub enum SweepCommand {
    /// Prints a sweep's trials (status, steps, metric, values) and its best trial.
    Status(StatusArgs),
}

#[derive(clap::Args)]
pub struct StatusArgs {
    /// The sweep file.
    #[arg(long)]
    config: PathBuf,
    /// One JSON object: the sweep's name, experiment, metric, goal, planned trial count, its
    /// trials (id, run, status, params, step, value, error) and its best finished trial (or
    /// null).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    given: Given,
}

pub fn run(args: SweepArgs) -> Result<(), String> {
    match args.what {
        Some(SweepCommand::Status(s)) => status(&s.config, &s.given, s.json),
        None => sweep(
            args.config.as_deref().ok_or("--config is required")?,
            &args.given,
            args.resume,
        ),
    }
}

/// A sweep file with its base config, both checked.
struct Checked {
    spec: SweepSpec,
    /// The base config with the command line's `--set`s.
    base: RunConfig,
    store_dir: PathBuf,
    /// The command line's `--set`s, given to every trial.
    sets: Vec<String>,
}

/// `values`: whether each swept value is checked against the trainer's own checks (a new or
/// resumed sweep); `status` reads what the store holds and skips it, so a sweep stays
/// inspectable on a machine without its device, or after a value it ran became refused.
fn check(path: &Path, given: &Given, values: bool) -> Result<Checked, String> {
    let mut spec = SweepSpec::load(path).map_err(|e| e.to_string())?;
    if let Some(name) = &given.name {
        weft_tune::spec::check_name(name).map_err(|e| format!("--name {e}"))?;
        spec.name = name.clone();
    }
    let source = &spec.source;
    for p in &spec.space.params {
        if set_per_trial(&p.key) {
            return Err(format!(
                "{source}: sweep.parameters.\"{}\": the sweep sets it for each trial itself (its run store, name \
                 and tags; its own checkpoints, metrics and trace files)",
                p.key
            ));
        }
    }
    // (a sweep to run: its status reads the store on any machine)
    let most = weft_dist::launch::max_nproc_per_node();
    if values && spec.nproc_per_trial > most.workers {
        return Err(format!(
            "{source}: sweep.nproc_per_trial: {} is above the {} workers weft launch starts on one node: {}",
            spec.nproc_per_trial, most.workers, most.why
        ));
    }
    for kv in &given.set {
        let key = kv.split_once('=').map_or(kv.as_str(), |(k, _)| k).trim();
        if spec.space.params.iter().any(|p| p.key == key) {
            return Err(format!("--set {kv}: {key} is swept by {source} (sweep.parameters)"));
        }
    }
    let with = |more: &[String]| Overrides::set(given.set.iter().cloned().chain(more.iter().cloned()));
    let base = RunConfig::load(&spec.base, &with(&[])).map_err(|e| format!("{source}: sweep.base: {e}"))?;
    if values {
        check_values(&spec, &|sets| {
            RunConfig::load(&spec.base, &with(sets)).map_err(|e| e.to_string())
        })?;
    }
    let logged = logged_metrics(&base);
    if !logged.contains(&spec.metric.as_str()) {
        let hint = match spec.metric.as_str() {
            "val_loss" | "val_accuracy" if base.train.eval_every == 0 => {
                "; it evaluates only with train.eval_every > 0 in the base config"
            }
            "val_accuracy" => "; only classifiers (mlp, convnet) report an accuracy",
            _ => "",
        };
        return Err(format!(
            "{source}: sweep.metric: the trainer never logs {:?} for this base config (it logs {}){hint}",
            spec.metric,
            logged.join(", ")
        ));
    }
    let cwd = std::env::current_dir().map_err(|e| format!("the working directory: {e}"))?;
    let store_dir = cwd.join(weft_train::track::store_dir(&base));
    Ok(Checked {
        spec,
        base,
        store_dir,
        sets: given.set.clone(),
    })
}

/// Whether `key` is one [`train_args`] sets for every trial (so a swept value would be
/// overridden, or would send every trial's outputs to one place).
fn set_per_trial(key: &str) -> bool {
    key.starts_with("track.")
        || matches!(
            key,
            "train.checkpoint_dir" | "train.metrics" | "train.trace" | "train.overwrite"
        )
}

/// Combinations of the other swept keys' checked values tried with a value the base config
/// refuses alone, before the value is refused (a value may need another swept key's: a head
/// count that divides only a swept width).
const MAX_COMBINATIONS: usize = 256;

/// Checks every swept key against the run config (`load` reads the base config with the
/// given `key=value` sets): each key must be one the config takes, and each of its checked
/// values (every listed value, a range's two ends) must pass [`trainer_check`], with the other
/// swept keys at the base config's values or, failing that, at one of the first
/// [`MAX_COMBINATIONS`] combinations of their own checked values. Values between a range's ends,
/// and combinations past those, are not checked: a trial that fails with one is recorded as
/// failed and the sweep goes on.
fn check_values(spec: &SweepSpec, load: &dyn Fn(&[String]) -> Result<RunConfig, String>) -> Result<(), String> {
    let source = &spec.source;
    let params = &spec.space.params;
    let sets: Vec<Vec<String>> = params
        .iter()
        .map(|p| {
            p.checked_values()
                .into_iter()
                .map(|v| format!("{}={}", p.key, p.text(v)))
                .collect()
        })
        .collect();
    let unknown_key = |e: &str| e.contains("unknown field") || e.contains("is not a section");
    // every key first: a combination with a key the config does not take proves nothing
    for (p, sets) in params.iter().zip(&sets) {
        if let Err(e) = load(&sets[..1]) {
            if unknown_key(&e) {
                return Err(format!(
                    "{source}: sweep.parameters.\"{}\": not a key this run config takes ({}: {e})",
                    p.key, sets[0]
                ));
            }
        }
    }
    let check = |point: &[String]| -> Result<(), (&'static str, String)> {
        let config = load(point).map_err(|e| ("the base config does not load with it", e))?;
        trainer_check(&config).map_err(|e| ("weft train refuses the base config with it", e))
    };
    for (i, p) in params.iter().enumerate() {
        let others: Vec<&Vec<String>> = sets
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, s)| s)
            .collect();
        for set in &sets[i] {
            let Err((what, e)) = check(std::slice::from_ref(set)) else {
                continue;
            };
            // the value may need another swept key's value: try their combinations
            let accepted = some_combination_passes(&others, set, &|point| check(point).is_ok());
            if !accepted {
                let tried = if others.is_empty() {
                    ""
                } else {
                    "; nor with the other swept keys at their listed values or range ends"
                };
                return Err(format!(
                    "{source}: sweep.parameters.\"{}\": {what} ({set}: {e}){tried}",
                    p.key
                ));
            }
        }
    }
    Ok(())
}

/// Whether `set` passes `check` with the other swept keys at one of their values: first each
/// other key changed alone (every one of its checked values, the rest at the base config's),
/// then the first [`MAX_COMBINATIONS`] combinations of all their checked values (the last key
/// changing fastest).
fn some_combination_passes(others: &[&Vec<String>], set: &str, check: &dyn Fn(&[String]) -> bool) -> bool {
    if others.is_empty() {
        return false;
    }
    for values in others {
        for v in values.iter() {
            if check(&[v.clone(), set.to_string()]) {
                return true;
            }
        }
    }
    let mut index = vec![0usize; others.len()];
    for _ in 0..MAX_COMBINATIONS {
        let mut point: Vec<String> = others.iter().zip(&index).map(|(s, &k)| s[k].clone()).collect();
        point.push(set.to_string());
        if check(&point) {
            return true;
        }
        let mut d = index.len();
        loop {
            if d == 0 {
                return false; // every combination was tried
            }
            d -= 1;
            index[d] += 1;
            if index[d] < others[d].len() {
                break;
            }
            index[d] = 0;
        }
    }
    false
}

/// What `weft train` checks of `config` before its first step, where that is cheap and does
/// not depend on the job or the data, beyond what [`RunConfig::load`] has checked (the config's
/// keys, the model's sizes as the model checks them, the optimizer's and the schedule's): that
/// a `cuda` device is there. Not checked: the data (not read here), the memory the run needs,
/// the layout against the job's ranks, and `parallel.auto`'s plan.
fn trainer_check(config: &RunConfig) -> Result<(), String> {
    let device: weft_core::Device = config
        .train
        .device
        .parse()
        .map_err(|e: String| format!("train.device: {e}"))?;
    if device.is_cuda() {
        weft_core::cuda::check(device).map_err(|e| format!("train.device: {e}"))?;
    }
    Ok(())
}

/// The metric keys `weft train` records for `config` (docs/tracking.md, "What is recorded").
fn logged_metrics(config: &RunConfig) -> Vec<&'static str> {
    let mut keys = vec!["loss", "lr", "grad_norm", "step_ms", "data_wait_ms"];
    let language = matches!(config.model, ModelConfig::Gpt(_) | ModelConfig::Llama(_));
    keys.push(if language { "tokens_per_s" } else { "samples_per_s" });
    keys.push(if config.train.device == "cpu" {
        "host_mem_bytes"
    } else {
        "gpu_mem_bytes"
    });
    if config.train.skip_nonfinite {
        keys.push("skipped_steps");
    }
    if config.train.eval_every > 0 {
        keys.push("val_loss");
        if !language {
            keys.push("val_accuracy");
        }
    }
    keys
}

/// `value` as a TOML string literal.
fn toml_string(value: &str) -> String {
    toml::Value::String(value.to_string()).to_string()
}

/// A path given by a config, resolved, with `-trial-N` put before its extension.
fn per_trial_file(config: &RunConfig, path: &Path, number: u64) -> PathBuf {
    let p = config.resolve(path);
    let stem = p.file_stem().map_or("out".into(), |s| s.to_string_lossy().into_owned());
    let name = match p.extension() {
        Some(ext) => format!("{stem}-trial-{number}.{}", ext.to_string_lossy()),
        None => format!("{stem}-trial-{number}"),
    };
    p.with_file_name(name)
}

/// The `weft train` arguments of trial `number` with the swept `sets`.
fn train_args(c: &Checked, number: u64, sets: &[(String, String)]) -> Vec<String> {
    let (spec, base) = (&c.spec, &c.base);
    let mut args = vec!["train".to_string(), "--quiet".into(), "--config".into()];
    args.push(spec.base.display().to_string());
    let mut set = |kv: String| args.extend(["--set".to_string(), kv]);
    for kv in &c.sets {
        set(kv.clone());
    }
    for (k, v) in sets {
        set(format!("{k}={v}"));
    }
    let mut tags = toml::Table::new();
    for (k, v) in &base.track.tags {
        tags.insert(k.clone(), v.clone());
    }
    tags.insert(TAG_SWEEP.into(), toml::Value::String(spec.name.clone()));
    tags.insert(TAG_TRIAL.into(), toml::Value::Integer(number as i64));
    tags.insert(TAG_METRIC.into(), toml::Value::String(spec.metric.clone()));
    tags.insert(TAG_GOAL.into(), toml::Value::String(spec.goal.as_str().into()));
    set("track.enabled=true".into());
    // the driver polls every 50 ms: the trial's metrics reach the store as often
    set("track.flush_ms=50".into());
    set(format!("track.dir={}", toml_string(&c.store_dir.display().to_string())));
    set(format!("track.experiment={}", toml_string(&spec.experiment)));
    set(format!(
        "track.name={}",
        toml_string(&weft_tune::driver::trial_name(spec, number))
    ));
    set(format!("track.tags={}", toml::Value::Table(tags)));
    // each trial writes its own checkpoints, metrics file and trace
    let t = &base.train;
    let mut own = false;
    if let Some(dir) = &t.checkpoint_dir {
        let d = base.resolve(dir).join(format!("trial-{number}"));
        set(format!(
            "train.checkpoint_dir={}",
            toml_string(&d.display().to_string())
        ));
        own = true;
    }
    if let Some(m) = &t.metrics {
        let p = per_trial_file(base, m, number);
        set(format!("train.metrics={}", toml_string(&p.display().to_string())));
        own = true;
    }
    if let Some(tr) = &t.trace {
        let p = per_trial_file(base, tr, number);
        set(format!("train.trace={}", toml_string(&p.display().to_string())));
    }
    if own {
        // a trial run again after a killed sweep replaces its own earlier outputs
        set("train.overwrite=true".into());
    }
    args
}

fn sweep(path: &Path, given: &Given, resume: bool) -> Result<(), String> {
    let c = check(path, given, true)?;
    let exe = std::env::current_exe().map_err(|e| format!("finding this weft binary: {e}"))?;
    let nproc = c.spec.nproc_per_trial;
    let command = |number: u64, sets: &[(String, String)]| {
        let train = train_args(&c, number, sets);
        let mut cmd = Command::new(&exe);
        if nproc > 1 {
            cmd.args(["launch", "--nproc-per-node", &nproc.to_string(), "--"]);
            cmd.arg(&exe);
        }
        cmd.args(train);
        cmd
    };
    let plan = weft_tune::driver::Plan {
        spec: &c.spec,
        store_dir: c.store_dir.clone(),
        max_steps: c.base.train.steps as u64,
        resume,
        log_dir: c.store_dir.join("sweeps").join(&c.spec.name),
        poll: Duration::from_millis(50),
        command: &command,
        // what a resume must not change (docs/sweep.md, "State and resuming")
        base_params: c.base.track.params.clone(),
    };
    weft_core::outln!(
        "sweep {}: {} trials ({} at once), method {}, pruner {}; trial logs in {}",
        c.spec.name,
        c.spec.trials,
        c.spec.parallel,
        format!("{:?}", c.spec.method).to_lowercase(),
        format!("{:?}", c.spec.pruner.kind).to_lowercase(),
        plan.log_dir.display()
    );
    let records = weft_tune::driver::run(&plan, &mut |line| weft_core::outln!("{line}")).map_err(|e| e.to_string())?;
    print_out(&trials::status_text(&c.spec, &records))
}

fn status(path: &Path, given: &Given, json: bool) -> Result<(), String> {
    let c = check(path, given, false)?;
    let store = weft_track::Store::open_existing(&c.store_dir).map_err(|e| e.to_string())?;
    // the trials as they were run: a changed file does not retype their values
    let (spec, changed) =
        weft_tune::definition::for_status(&store, &c.spec, &c.base.track.params).map_err(|e| e.to_string())?;
    if !changed.is_empty() {
        weft_core::errln!(
            "weft sweep status: {}: sweep {:?} was started with another definition ({}); its trials are shown with \
             the parameters, metric and goal it was started with",
            spec.source,
            spec.name,
            weft_tune::definition::summary(&changed)
        );
    }
    let records = trials::load(&store, &spec).map_err(|e| e.to_string())?;
    if json {
        let text = serde_json::to_string_pretty(&status_json(&spec, &records)).map_err(|e| e.to_string())?;
        return print_out(&format!("{text}\n"));
    }
    print_out(&trials::status_text(&spec, &records))
}

/// `weft sweep status --json`: `{sweep, experiment, metric, goal, trials_planned, trials,
/// best}`; each trial `{id, run, run_id, status, params, step, value, error}` (params by key,
/// typed: numbers, or the listed value; step and value of the metric's last record, null
/// when none), `best` one of them (the best finished trial) or null.
fn status_json(spec: &SweepSpec, records: &[trials::TrialRecord]) -> serde_json::Value {
    let trial = |t: &trials::TrialRecord| {
        let mut params = serde_json::Map::new();
        for (i, (p, text)) in spec.space.params.iter().zip(&t.params).enumerate() {
            let v = text.as_deref().map_or(serde_json::Value::Null, |text| {
                serde_json::to_value(trials::param_value(&spec.space, i, text)).unwrap_or(serde_json::Value::Null)
            });
            params.insert(p.key.clone(), v);
        }
        serde_json::json!({
            "id": t.number,
            "run": t.run_name,
            "run_id": t.run_id,
            "status": t.status,
            "params": params,
            "step": t.last.map(|(s, _)| s),
            "value": t.last.map(|(_, v)| v),
            "error": t.error,
        })
    };
    serde_json::json!({
        "sweep": spec.name,
        "experiment": spec.experiment,
        "metric": spec.metric,
        "goal": spec.goal.as_str(),
        "trials_planned": spec.trials,
        "trials": records.iter().map(trial).collect::<Vec<_>>(),
        "best": trials::best(spec, records).map(trial),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value that needs one other key changed: found even when that key's second value lies
    /// past the first combinations of all the others (keys in name order, the last changing
    /// fastest: 4^4 = 256 combinations keep the first key at its first value).
    #[test]
    fn a_value_needing_one_other_key_is_found_past_the_first_combinations() {
        let values = |key: &str, n: usize| -> Vec<String> { (0..n).map(|i| format!("{key}={i}")).collect() };
        let width = vec!["model.n_embd=128".to_string(), "model.n_embd=192".to_string()];
        let rest: Vec<Vec<String>> = ["optim.lr", "optim.weight_decay", "train.grad_accum", "train.seed"]
            .iter()
            .map(|k| values(k, 4))
            .collect();
        let mut others: Vec<&Vec<String>> = vec![&width];
        others.extend(rest.iter());
        let needs_192 = |point: &[String]| point.iter().any(|s| s == "model.n_embd=192");
        assert!(some_combination_passes(&others, "model.n_head=3", &needs_192));
        assert!(!some_combination_passes(&others, "model.n_head=3", &|_| false));
    }
}
