//! `weft pipeline run|show`: runs a pipeline file's steps (crate weft-tune's
//! [`weft_tune::pipeline`] reads and checks it), independent steps at once on threads of their
//! own, skipping a step whose cache key matches a finished execution recorded in the run
//! store (docs/registry.md). A sweep step's output records its best trial's values, which a
//! train step with `from_sweep` takes as overrides ([`weft_tune::pipeline::handover`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;

use weft_track::Store;
use weft_tune::pipeline::handover::{self, Best};
use weft_tune::pipeline::{Action, Cache, Pipeline, Step};
use weft_tune::registry::ModelRegistry;

use crate::print_out;

#[derive(clap::Subcommand)]
pub enum PipelineCommand {
    /// Runs the steps (independent ones at once); a step whose settings, files and inputs
    /// match a finished execution in the store is skipped and its outputs reused.
    Run(RunArgs),
    /// Lists the steps in the order they run, with their kinds, dependencies and last
    /// recorded execution.
    Show(ShowArgs),
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// The pipeline file (TOML, `[[step]]` entries).
    file: PathBuf,
    /// Run every step, whatever the cache holds.
    #[arg(long, conflicts_with = "from")]
    no_cache: bool,
    /// Run step STEP and every step depending on it even when cached; the steps it depends on
    /// come from the cache (an error, before anything runs, when one is not cached); other
    /// steps run or come from the cache as usual.
    #[arg(long, value_name = "STEP")]
    from: Option<String>,
    /// The run store's folder (default: `WEFT_TRACK_DIR`, else `weft-runs`).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct ShowArgs {
    /// The pipeline file.
    file: PathBuf,
    /// The run store's folder (default: `WEFT_TRACK_DIR`, else `weft-runs`).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// What a step's thread needs.
#[derive(Clone)]
struct Context {
    exe: PathBuf,
    /// The run store's folder (absolute).
    dir: PathBuf,
    root: PathBuf,
    pipeline: String,
}

/// Where a step stands.
#[derive(Debug, Clone, PartialEq)]
enum State {
    Waiting,
    Running,
    /// Its output.
    Done(String),
    Failed,
    Skipped,
}

fn store_dir(dir: Option<&PathBuf>) -> Result<PathBuf, String> {
    let dir = crate::models::store_dir(dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    dir.canonicalize().map_err(|e| format!("{}: {e}", dir.display()))
}

/// The run id in a train step's output `run=ID`.
fn run_of(output: &str) -> Result<i64, String> {
    output
        .strip_prefix("run=")
        .and_then(|id| id.parse().ok())
        .ok_or_else(|| format!("its train step's output {output:?} names no run"))
}

fn spawn_status(mut cmd: Command, what: &str) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("cannot start {what}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} exited with {status}"))
    }
}

/// Runs `step` once; its output. `inputs` holds the outputs of the steps done before it
/// (those it depends on among them).
fn execute(ctx: &Context, step: &Step, inputs: &BTreeMap<String, String>) -> Result<String, String> {
    match &step.action {
        Action::Train {
            config,
            set,
            from_sweep,
        } => {
            // the best trial's values first, the step's own `set` on top
            let best = match from_sweep {
                Some(from) => handover::best_sets(from, inputs.get(from).map(String::as_str))?,
                None => Vec::new(),
            };
            let millis = (weft_track::now() * 1000.0) as u64;
            let name = format!("{}-{}-{millis}", ctx.pipeline, step.name);
            let mut cmd = Command::new(&ctx.exe);
            cmd.current_dir(&ctx.root)
                .env("WEFT_TRACK_DIR", &ctx.dir)
                .args(["train", "--config"])
                .arg(ctx.root.join(config));
            for s in best.iter().chain(set) {
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
            Ok(format!("run={id}"))
        }
        Action::Sweep { config } => {
            let mut cmd = Command::new(&ctx.exe);
            cmd.current_dir(&ctx.root)
                .env("WEFT_TRACK_DIR", &ctx.dir)
                .args(["sweep", "--config"])
                .arg(ctx.root.join(config));
            spawn_status(cmd, "weft sweep")?;
            sweep_best(ctx, config)
        }
        Action::Command { argv } => {
            let mut cmd = Command::new(&argv[0]);
            cmd.current_dir(&ctx.root)
                .args(&argv[1..])
                .env("WEFT_TRACK_DIR", &ctx.dir);
            spawn_status(cmd, &format!("{:?}", argv[0]))?;
            Ok("exit=0".into())
        }
        Action::Condition { metric, run, op, value } => {
            let id = run_of(inputs.get(run).map_or("", String::as_str))?;
            let store = Store::open_existing(&ctx.dir).map_err(|e| e.to_string())?;
            let detail = store.run_detail(id).map_err(|e| e.to_string())?;
            let got = detail.metrics.get(metric).ok_or_else(|| {
                let known: Vec<&String> = detail.metrics.keys().collect();
                format!("run {id} (step {run:?}) logged no metric {metric:?} (logged: {known:?})")
            })?;
            Ok(if op.holds(got.last, *value) { "true" } else { "false" }.to_string())
        }
        Action::Register { step: from, model } => {
            let id = run_of(inputs.get(from).map_or("", String::as_str))?;
            let mut reg = ModelRegistry::open(&ctx.dir).map_err(|e| e.to_string())?;
            let v = reg
                .register(&ctx.dir, &id.to_string(), model)
                .map_err(|e| e.to_string())?;
            Ok(format!("model={} version={}", v.name, v.version))
        }
    }
}

/// The output of a sweep step whose sweep (file `config`) has run: its best finished trial and
/// that trial's values ([`handover::sweep_output`]), as `weft sweep status --json` gives them
/// with the store and folder the sweep ran with.
fn sweep_best(ctx: &Context, config: &Path) -> Result<String, String> {
    let out = Command::new(&ctx.exe)
        .current_dir(&ctx.root)
        .env("WEFT_TRACK_DIR", &ctx.dir)
        .args(["sweep", "status", "--json", "--config"])
        .arg(ctx.root.join(config))
        .output()
        .map_err(|e| format!("cannot start weft sweep status: {e}"))?;
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
fn execute_with_retries(ctx: &Context, step: &Step, inputs: &BTreeMap<String, String>) -> Result<String, String> {
    let mut tries = 0;
    loop {
        match execute(ctx, step, inputs) {
            Ok(out) => return Ok(out),
            Err(e) if tries < step.retries => {
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

/// Whether `dep`'s state stops the steps after it: failed, skipped, or a condition that
/// did not hold.
fn blocks(p: &Pipeline, dep: &str, state: &State) -> bool {
    match state {
        State::Failed | State::Skipped => true,
        State::Done(out) => p.step(dep).is_some_and(|s| s.kind == "condition") && out == "false",
        _ => false,
    }
}

pub fn run(what: PipelineCommand) -> Result<(), String> {
    match what {
        PipelineCommand::Run(a) => run_pipeline(&a),
        PipelineCommand::Show(a) => show(&a),
    }
}

fn run_pipeline(a: &RunArgs) -> Result<(), String> {
    let p = Pipeline::load(&a.file).map_err(|e| e.to_string())?;
    let dir = store_dir(a.dir.as_ref())?;
    let cache = Cache::open(&dir).map_err(|e| e.to_string())?;
    let ctx = Context {
        exe: std::env::current_exe().map_err(|e| format!("cannot find the weft binary: {e}"))?,
        dir,
        root: p
            .root
            .canonicalize()
            .map_err(|e| format!("{}: {e}", p.root.display()))?,
        pipeline: p.name.clone(),
    };
    // --from STEP: it and the steps after it miss the cache on purpose
    let forced: BTreeSet<String> = match &a.from {
        None => BTreeSet::new(),
        Some(from) => {
            if p.step(from).is_none() {
                let names: Vec<&str> = p.steps.iter().map(|s| s.name.as_str()).collect();
                return Err(format!(
                    "{}: --from {from:?}: no such step (steps: {names:?})",
                    a.file.display()
                ));
            }
            cached_before(&p, &cache, from)?;
            let mut forced = p.descendants(from);
            forced.insert(from.clone());
            forced
        }
    };
    let mut state: BTreeMap<String, State> = p.steps.iter().map(|s| (s.name.clone(), State::Waiting)).collect();
    let (tx, rx) = mpsc::channel::<(String, String, f64, Result<String, String>)>();
    let mut running = 0usize;
    let mut keys: BTreeMap<String, String> = BTreeMap::new();
    // why each failed step failed
    let mut why: BTreeMap<String, String> = BTreeMap::new();
    loop {
        // start (or take from the cache) every step whose dependencies are done
        let mut progressed = true;
        while progressed {
            progressed = false;
            for step in &p.steps {
                if state[&step.name] != State::Waiting {
                    continue;
                }
                if let Some(d) = step.depends_on.iter().find(|d| blocks(&p, d, &state[*d])) {
                    print_out(&format!("step {}: skipped ({d} did not pass)\n", step.name))?;
                    state.insert(step.name.clone(), State::Skipped);
                    progressed = true;
                    continue;
                }
                // each dependency enters the cache key as its own key and output, so a change
                // anywhere upstream reaches every step after it
                let deps: Option<BTreeMap<String, String>> = step
                    .depends_on
                    .iter()
                    .map(|d| match &state[d] {
                        State::Done(out) => Some((d.clone(), format!("{}:{out}", keys[d]))),
                        _ => None,
                    })
                    .collect();
                let Some(deps) = deps else { continue };
                progressed = true;
                let hash = match p.hash(step, &deps) {
                    Ok(h) => h,
                    Err(e) => {
                        // a file it names cannot be read: the step fails, the others go on
                        print_out(&format!("step {}: failed: {e}\n", step.name))?;
                        why.insert(step.name.clone(), e.to_string());
                        state.insert(step.name.clone(), State::Failed);
                        continue;
                    }
                };
                keys.insert(step.name.clone(), hash.clone());
                // what the step reads: the outputs of every step done so far (its ancestors
                // among them)
                let inputs: BTreeMap<String, String> = state
                    .iter()
                    .filter_map(|(n, s)| match s {
                        State::Done(out) => Some((n.clone(), out.clone())),
                        _ => None,
                    })
                    .collect();
                if !a.no_cache && !forced.contains(&step.name) {
                    if let Some(e) = cache.finished(&hash).map_err(|e| e.to_string())? {
                        print_out(&format!(
                            "step {}: cached (execution {} of {}/{}): {}\n",
                            step.name, e.id, e.pipeline, e.step, e.output
                        ))?;
                        state.insert(step.name.clone(), State::Done(e.output));
                        continue;
                    }
                }
                print_out(&format!("step {}: running ({})\n", step.name, step.kind))?;
                state.insert(step.name.clone(), State::Running);
                running += 1;
                let (ctx, step, tx) = (ctx.clone(), step.clone(), tx.clone());
                std::thread::spawn(move || {
                    let start = weft_track::now();
                    // a panic is the step's failure, not a pipeline waiting for ever
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        execute_with_retries(&ctx, &step, &inputs)
                    }))
                    .unwrap_or_else(|_| Err("the step's thread panicked".into()));
                    let _ = tx.send((step.name.clone(), hash, start, result));
                });
            }
        }
        if running == 0 {
            break;
        }
        let (name, hash, start, result) = rx.recv().map_err(|e| format!("a step's thread ended early: {e}"))?;
        running -= 1;
        let (ok, text) = match &result {
            Ok(out) => (true, out.as_str()),
            Err(e) => (false, e.as_str()),
        };
        cache
            .record(&p.name, &name, &hash, ok, text, start)
            .map_err(|e| e.to_string())?;
        match result {
            Ok(out) => {
                print_out(&format!("step {name}: finished: {out}\n"))?;
                state.insert(name, State::Done(out));
            }
            Err(e) => {
                print_out(&format!("step {name}: failed: {e}\n"))?;
                why.insert(name.clone(), e);
                state.insert(name, State::Failed);
            }
        }
    }
    let failed: Vec<&String> = state
        .iter()
        .filter(|(_, s)| **s == State::Failed)
        .map(|(n, _)| n)
        .collect();
    if !failed.is_empty() {
        let reasons: Vec<String> = failed
            .iter()
            .filter_map(|n| why.get(*n).map(|e| format!("{n}: {e}")))
            .collect();
        let reasons = if reasons.is_empty() {
            String::new()
        } else {
            format!(" ({})", reasons.join("; ").replace('\n', " "))
        };
        return Err(format!("pipeline {}: the steps {failed:?} failed{reasons}", p.name));
    }
    Ok(())
}

/// For `--from STEP`: checks that every step STEP depends on has a finished execution with
/// the cache key it has now (keys chained through the cached outputs, as a run computes them);
/// an error naming the first that has none.
fn cached_before(p: &Pipeline, cache: &Cache, from: &str) -> Result<(), String> {
    let before = p.ancestors(from);
    // step -> (cache key, output)
    let mut done: BTreeMap<String, (String, String)> = BTreeMap::new();
    for step in p.steps.iter().filter(|s| before.contains(&s.name)) {
        let deps: BTreeMap<String, String> = step
            .depends_on
            .iter()
            .filter_map(|d| done.get(d).map(|(key, out)| (d.clone(), format!("{key}:{out}"))))
            .collect();
        let not_cached = |why: &str| {
            format!(
                "pipeline {}: --from {from:?}: step {:?}, which it depends on, {why}; run the pipeline without --from first",
                p.name, step.name
            )
        };
        let key = p
            .hash(step, &deps)
            .map_err(|e| not_cached(&format!("cannot be keyed ({e})")))?;
        match cache.finished(&key).map_err(|e| e.to_string())? {
            Some(e) => {
                done.insert(step.name.clone(), (key, e.output));
            }
            None => {
                return Err(not_cached(
                    "has no cached execution with its current settings, files and inputs",
                ))
            }
        }
    }
    Ok(())
}

fn show(a: &ShowArgs) -> Result<(), String> {
    let p = Pipeline::load(&a.file).map_err(|e| e.to_string())?;
    let dir = crate::models::store_dir(a.dir.as_ref());
    let cache = if Path::new(&dir).join(weft_track::STORE_FILE).is_file() {
        Some(Cache::open(&dir).map_err(|e| e.to_string())?)
    } else {
        None
    };
    let mut out = format!(
        "pipeline {} ({} steps)\n{:<16} {:<10} {:<24} {}\n",
        p.name,
        p.steps.len(),
        "STEP",
        "KIND",
        "DEPENDS_ON",
        "LAST EXECUTION"
    );
    for s in &p.steps {
        let last = match &cache {
            Some(c) => c.last(&p.name, &s.name).map_err(|e| e.to_string())?,
            None => None,
        };
        let last = last.map_or("-".to_string(), |(status, output, _)| format!("{status}: {output}"));
        out.push_str(&format!(
            "{:<16} {:<10} {:<24} {}\n",
            s.name,
            s.kind,
            if s.depends_on.is_empty() {
                "-".to_string()
            } else {
                s.depends_on.join(",")
            },
            last
        ));
    }
    print_out(&out)
}
