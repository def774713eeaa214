//! `weft pipeline run|show`: runs a pipeline file's steps (crate weft-tune's
//! [`weft_tune::pipeline`] reads and checks it), independent steps at once on threads of their
//! own, skipping a step whose cache key matches a finished execution recorded in the run
//! store (docs/registry.md). A sweep step's output records its best trial's values, which a
//! train step with `from_sweep` takes as overrides ([`weft_tune::pipeline::handover`]); a
//! step's `${steps.NAME.KEY}` references are resolved from the outputs of the steps before it
//! ([`weft_tune::pipeline::refs`]) before its cache key is made. [`execute`] runs one step,
//! [`data`] the prepare and evaluate steps, [`deploy`] the deploy steps; [`children`] keeps
//! the step processes tied to the pipeline (a signal to it stops them; none outlives it);
//! [`inputs`] keys the files a step's run config reads, and finds a cached execution whose
//! outputs are gone (run again rather than reused).

mod children;
mod data;
mod deploy;
mod execute;
mod inputs;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use weft_tune::pipeline::{Cache, Pipeline};

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
    /// The pipeline file's folder (absolute).
    root: PathBuf,
    pipeline: String,
    /// The pipeline (an evaluate step reads its train step's settings).
    steps: std::sync::Arc<Pipeline>,
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
        steps: std::sync::Arc::new(p.clone()),
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
            cached_before(&ctx, &p, &cache, from)?;
            let mut forced = p.descendants(from);
            forced.insert(from.clone());
            forced
        }
    };
    children::catch_signals();
    // whether a signal was passed on to the step processes
    let mut stopping = false;
    let mut state: BTreeMap<String, State> = p.steps.iter().map(|s| (s.name.clone(), State::Waiting)).collect();
    let (tx, rx) = mpsc::channel::<(String, String, f64, Result<String, String>)>();
    let mut running = 0usize;
    let mut keys: BTreeMap<String, String> = BTreeMap::new();
    // why each failed step failed
    let mut why: BTreeMap<String, String> = BTreeMap::new();
    loop {
        // start (or take from the cache) every step whose dependencies are done
        let mut progressed = children::caught().is_none();
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
                // what the step reads: the outputs of every step done so far (its ancestors
                // among them), and the values of its references in them
                let outputs: BTreeMap<String, String> = state
                    .iter()
                    .filter_map(|(n, s)| match s {
                        State::Done(out) => Some((n.clone(), out.clone())),
                        _ => None,
                    })
                    .collect();
                let resolved = step
                    .values(&outputs)
                    .and_then(|values| Ok((step.action.resolve(&values)?, values)));
                let (action, values) = match resolved {
                    Ok(r) => r,
                    Err(e) => {
                        print_out(&format!("step {}: failed: {e}\n", step.name))?;
                        why.insert(step.name.clone(), e);
                        state.insert(step.name.clone(), State::Failed);
                        continue;
                    }
                };
                let hash = inputs::of(&ctx, step, &action, &outputs).and_then(|read| {
                    p.hash_with_inputs(step, &deps, &values, &read)
                        .map_err(|e| e.to_string())
                });
                let hash = match hash {
                    Ok(h) => h,
                    Err(e) => {
                        // a file it names cannot be read, or its config is refused: the step
                        // fails, the others go on
                        print_out(&format!("step {}: failed: {e}\n", step.name))?;
                        why.insert(step.name.clone(), e);
                        state.insert(step.name.clone(), State::Failed);
                        continue;
                    }
                };
                keys.insert(step.name.clone(), hash.clone());
                if !a.no_cache && !forced.contains(&step.name) && !step.never_cached() {
                    if let Some(e) = cache.finished(&hash).map_err(|e| e.to_string())? {
                        match inputs::gone(&ctx, step, &e.output) {
                            None => {
                                print_out(&format!(
                                    "step {}: cached (execution {} of {}/{}): {}\n",
                                    step.name, e.id, e.pipeline, e.step, e.output
                                ))?;
                                state.insert(step.name.clone(), State::Done(e.output));
                                continue;
                            }
                            Some(gone) => print_out(&format!(
                                "step {}: cached execution {} is not reused: {gone}; running the step again\n",
                                step.name, e.id
                            ))?,
                        }
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
                        execute::execute_with_retries(&ctx, &step, &action, &outputs, &hash)
                    }))
                    .unwrap_or_else(|_| Err("the step's thread panicked".into()));
                    let _ = tx.send((step.name.clone(), hash, start, result));
                });
            }
        }
        if running == 0 {
            break;
        }
        let received = rx.recv_timeout(std::time::Duration::from_millis(100));
        if let Some((sig, n)) = children::caught() {
            if !stopping {
                print_out(&format!(
                    "pipeline {}: stopping on signal {sig}: the running steps get SIGTERM (another signal: SIGKILL)\n",
                    p.name
                ))?;
                children::signal_all(libc::SIGTERM);
                stopping = true;
            }
            if n > 1 {
                // a second signal: the step processes are killed and the pipeline ends now
                // (a step running in this process, a deploy's wait, is not waited for)
                children::signal_all(libc::SIGKILL);
                return Err(format!(
                    "pipeline {}: stopped by a second signal ({sig}); the running steps were killed",
                    p.name
                ));
            }
        }
        let (name, hash, start, result) = match received {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(e) => return Err(format!("a step's thread ended early: {e}")),
        };
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
    let left: Vec<&String> = state
        .iter()
        .filter(|(_, s)| !matches!(s, State::Done(_) | State::Skipped))
        .map(|(n, _)| n)
        .collect();
    if let (Some((sig, _)), false) = (children::caught(), left.is_empty()) {
        return Err(format!(
            "pipeline {}: stopped by signal {sig}; the steps {left:?} did not finish; `weft pipeline run {}` goes on \
             (finished steps come from the cache)",
            p.name,
            a.file.display()
        ));
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
/// the cache key it has now (keys chained through the cached outputs, as a run computes them)
/// whose outputs are still there; an error naming the first that has none.
fn cached_before(ctx: &Context, p: &Pipeline, cache: &Cache, from: &str) -> Result<(), String> {
    let before = p.ancestors(from);
    // step -> (cache key, output)
    let mut done: BTreeMap<String, (String, String)> = BTreeMap::new();
    for step in p.steps.iter().filter(|s| before.contains(&s.name)) {
        let outputs: BTreeMap<String, String> = done.iter().map(|(n, (_, out))| (n.clone(), out.clone())).collect();
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
        let values = step
            .values(&outputs)
            .map_err(|e| not_cached(&format!("cannot be keyed ({e})")))?;
        let key = step
            .action
            .resolve(&values)
            .and_then(|action| inputs::of(ctx, step, &action, &outputs))
            .and_then(|read| {
                p.hash_with_inputs(step, &deps, &values, &read)
                    .map_err(|e| e.to_string())
            })
            .map_err(|e| not_cached(&format!("cannot be keyed ({e})")))?;
        match cache.finished(&key).map_err(|e| e.to_string())? {
            Some(e) => {
                if let Some(gone) = inputs::gone(ctx, step, &e.output) {
                    return Err(not_cached(&format!(
                        "has a cached execution ({}) that cannot be reused: {gone}",
                        e.id
                    )));
                }
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
