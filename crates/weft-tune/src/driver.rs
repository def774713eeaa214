//! Running a sweep: up to `parallel` trials at once, each a child process (the command the
//! caller builds: `weft train --set ...`, or `weft launch ... train`), recorded in the run
//! store. The driver polls the store for each running trial's metric (the trainer writes its
//! metrics about once a second), asks the pruner about every new value, and stops a pruned
//! trial with SIGTERM (the trainer stops cleanly after its step; `weft launch` forwards the
//! signal), then marks its run `pruned`. A trial that fails is recorded (with a run of its own
//! when it failed before the trainer recorded one) and the sweep goes on.
//!
//! Each trial runs in its own process group and is told to stop at most once ([`stop`]).
//! SIGINT and SIGTERM to the driver are passed on to the running trials as one SIGTERM (none to
//! a trial already stopping because it was pruned); the driver waits for them, records how each
//! ended (a pruned one `pruned`) and returns an error saying the sweep can be resumed. A pruning
//! decision is recorded before the trial is told ([`crate::record`]), so a resumed sweep never
//! runs a pruned trial again, even when its driver was killed. A driver killed outright takes its
//! trials with it (they get SIGTERM: [`crate::children::die_with_parent`]), and one sweep has one
//! driver at a time (a lock on its folder of trial logs). A resumed sweep must have the
//! definition it started with ([`crate::definition`]).

mod stop;

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use weft_track::{NewRun, RunWriter, Status, Store, WriterOptions};

use crate::error::{Error, Result};
use crate::pruner::{self, Decision, Pruner};
use crate::sampler::{self, Observation, Outcome};
use crate::space::Value;
use crate::spec::SweepSpec;
use crate::trials::{self, TrialRecord, TAG_GOAL, TAG_METRIC, TAG_SWEEP, TAG_TRIAL};

use stop::{Children, Running, STOP_GRACE};

/// Builds the process of trial `n` from the swept keys' `(key, TOML text)` pairs.
pub type TrialCommand<'a> = &'a dyn Fn(u64, &[(String, String)]) -> Command;

/// What a sweep needs besides its file.
pub struct Plan<'a> {
    pub spec: &'a SweepSpec,
    /// The run store's folder (the trials must record into it).
    pub store_dir: PathBuf,
    /// Training steps of a whole trial (the base config's `train.steps`): rungs at or past it
    /// are left out.
    pub max_steps: u64,
    /// Go on with a sweep the store already holds trials of.
    pub resume: bool,
    /// Where each trial's output goes (`trial-N.log`).
    pub log_dir: PathBuf,
    /// How often the store is read while trials run.
    pub poll: Duration,
    /// The process of trial `n`, given the swept keys' `(key, TOML text)` pairs.
    pub command: TrialCommand<'a>,
    /// The base config every trial starts from, as flat params (`section.key` -> value text, as
    /// a run records them): part of the sweep's definition, which a resume must not change.
    pub base_params: Vec<(String, String)>,
}

static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
}

/// Catches SIGINT and SIGTERM for the sweep's life (recorded; the loop passes them on).
fn catch_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
}

/// Runs the sweep to its end (or until the grid is done); every trial in the store after.
/// `say` gets one line per event (a trial started, pruned, ended).
pub fn run(plan: &Plan, say: &mut dyn FnMut(&str)) -> Result<Vec<TrialRecord>> {
    let spec = plan.spec;
    // one driver per sweep: a second would run every trial again beside the first's, and could
    // take the first's runs for its own
    let _lock = crate::children::FolderLock::take(&plan.log_dir, &format!("sweep {:?}", spec.name))?;
    let store = Store::open(&plan.store_dir)?;
    let mut records = trials::load(&store, spec)?;
    if !records.is_empty() && !plan.resume {
        return Err(Error::State(format!(
            "{}: sweep {:?} already has {} trial(s) in {}; run with --resume to go on with it, or give the sweep \
             another name (sweep.name)",
            spec.source,
            spec.name,
            records.len(),
            store.path().display()
        )));
    }
    if let Some(r) = records.iter().find(|r| r.status == "running") {
        return Err(Error::State(format!(
            "{}: trial {} (run {}) is still running (another sweep process?); stop it, or wait a minute for its \
             heartbeat to go stale",
            spec.source, r.number, r.run_name
        )));
    }
    crate::definition::check_and_record(&store, spec, &plan.base_params, &records)?;
    // pruned trials whose driver did not see them end (it was killed) are marked so (`records`
    // reads them as pruned already)
    crate::record::settle_prunes(&store, spec)?;
    let mut sampler = sampler::from_spec(spec);
    let mut pruner = pruner::from_spec(&spec.pruner, plan.max_steps);
    // the pruner learns the ended trials' curves first, in the order their values were recorded
    let mut curves = Vec::new();
    for r in records.iter().filter(|r| r.is_done()) {
        let rows = store.metric_series(r.run_id, &spec.metric)?;
        let rows: Vec<(i64, f64, f64)> = rows.into_iter().map(|(s, v, t)| (s, spec.goal.loss(v), t)).collect();
        curves.push((r.number, rows));
    }
    replay(pruner.as_mut(), &curves);
    // (a signal that stopped an earlier sweep of this process is not this one's)
    SIGNAL.store(0, Ordering::SeqCst);
    catch_signals();
    let mut running = Children(Vec::new());
    let mut next = 0u64;
    let mut exhausted = false;
    loop {
        if let Some(sig) = stop_signal() {
            stop::stop_trials(plan, &store, &mut running.0, STOP_GRACE, say)?;
            return Err(Error::State(format!(
                "the sweep was stopped by signal {sig}; `weft sweep --config {} --resume` goes on with it",
                spec.source
            )));
        }
        // start trials while there is room
        while running.0.len() < spec.parallel && !exhausted {
            let done = |n: u64| records.iter().any(|r| r.number == n && r.is_done());
            while next < spec.trials && done(next) {
                next += 1;
            }
            if next >= spec.trials {
                exhausted = true;
                break;
            }
            let mut history: Vec<Observation> = records.iter().filter_map(|r| r.observation(spec)).collect();
            if spec.constant_liar {
                // the trials running now, as the worst: the next one looks elsewhere
                history.extend(running.0.iter().map(|r| Observation {
                    values: r.values.clone(),
                    outcome: Outcome::Running,
                }));
            }
            let Some(values) = sampler.suggest(next, &spec.space, &history) else {
                exhausted = true;
                break;
            };
            let earlier = records.iter().filter(|r| r.number == next).map(|r| r.run_id).collect();
            let r = start(plan, next, values, earlier)?;
            say(&format!("trial {next}: started ({})", describe(spec, &r.values)));
            running.0.push(r);
            next += 1;
        }
        if running.0.is_empty() {
            break;
        }
        std::thread::sleep(plan.poll);
        // every running trial's new values, given to the pruner in the order they were recorded
        // (row time; trial number, then step, break ties), as a resumed sweep replays them
        let mut fresh: Vec<(f64, u64, i64, f64, usize)> = Vec::new();
        for (i, r) in running.0.iter_mut().enumerate() {
            if r.run_id.is_none() {
                r.run_id = find_run(&store, spec, r.number, &r.earlier)?.map(|(id, _)| id);
            }
            if let (Some(id), None) = (r.run_id, &r.pruned) {
                for (step, value, time) in store.metric_series(id, &spec.metric)? {
                    if step > r.seen_step {
                        fresh.push((time, r.number, step, value, i));
                    }
                }
            }
        }
        fresh.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        for (_, _, step, value, i) in fresh {
            let r = &mut running.0[i];
            if r.pruned.is_some() || step <= r.seen_step {
                continue;
            }
            r.seen_step = step;
            if let Decision::Prune(why) = pruner.report(r.number, step.max(0) as u64, spec.goal.loss(value)) {
                // recorded before the trial is told: a resume never runs it again, whatever ends
                // the driver meanwhile
                if let Some((id, start)) = find_run(&store, spec, r.number, &r.earlier)? {
                    crate::record::record_prune(&store, spec, r.number, id, start, step, &why)?;
                }
                say(&format!("trial {}: pruned at step {step}: {why}", r.number));
                r.tell();
                r.pruned = Some(why);
            }
        }
        let mut ended = false;
        let mut i = 0;
        while i < running.0.len() {
            let r = &mut running.0[i];
            r.kill_when_late(STOP_GRACE);
            match r.ended()? {
                Some(status) => {
                    let r = running.0.remove(i);
                    let line = finish(plan, &store, r, status)?;
                    say(&line);
                    ended = true;
                }
                None => i += 1,
            }
        }
        if ended {
            records = trials::load(&store, spec)?;
        }
    }
    trials::load(&store, spec)
}

/// A trial's recorded curve of the sweep's metric: its number and `(step, loss, time)` rows (the
/// loss: the value, negated when maximized; the time in seconds since the Unix epoch).
pub type Curve = (u64, Vec<(i64, f64, f64)>);

/// Gives `pruner` the recorded curves of ended trials, `(trial, [(step, loss, time)])`, in the
/// order the values were recorded (by time; trial number, then step, break ties), which is the
/// order the live driver gave them in: an asynchronous pruner such as ASHA judges a trial against
/// the trials that reached a rung before it, so replaying trial by trial would judge a trial that
/// reached a rung late against values recorded after it. As live, a trial's values at a step at
/// or before one already given are left out, and so are its values after the one that pruned it
/// (logged before its signal took effect). Returns the `(trial, step)` of each decision to prune.
pub fn replay(pruner: &mut dyn Pruner, curves: &[Curve]) -> Vec<(u64, i64)> {
    let mut events: Vec<(f64, u64, i64, f64)> = curves
        .iter()
        .flat_map(|(trial, rows)| rows.iter().map(|&(step, loss, time)| (time, *trial, step, loss)))
        .collect();
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut seen: BTreeMap<u64, i64> = BTreeMap::new();
    let mut pruned = Vec::new();
    for (_, trial, step, loss) in events {
        if pruned.iter().any(|(t, _)| *t == trial) || seen.get(&trial).is_some_and(|s| step <= *s) {
            continue;
        }
        seen.insert(trial, step);
        if let Decision::Prune(_) = pruner.report(trial, step.max(0) as u64, loss) {
            pruned.push((trial, step));
        }
    }
    pruned
}

/// The signal that asked the sweep to stop, if any.
fn stop_signal() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// `key=value ...` of a trial's values.
fn describe(spec: &SweepSpec, values: &[Value]) -> String {
    let parts: Vec<String> = spec
        .space
        .params
        .iter()
        .zip(values)
        .map(|(p, v)| format!("{}={}", p.key, p.text(*v)))
        .collect();
    parts.join(" ")
}

/// Starts trial `number`'s process, its output to `trial-N.log`.
fn start(plan: &Plan, number: u64, values: Vec<Value>, earlier: Vec<i64>) -> Result<Running> {
    let sets: Vec<(String, String)> = plan
        .spec
        .space
        .params
        .iter()
        .zip(&values)
        .map(|(p, v)| (p.key.clone(), p.text(*v)))
        .collect();
    let log = plan.log_dir.join(format!("trial-{number}.log"));
    let io = |source| Error::Io {
        path: log.clone(),
        source,
    };
    let out = File::create(&log).map_err(io)?;
    let err = out.try_clone().map_err(io)?;
    // its own process group: a Ctrl-C at the terminal reaches the driver alone, which passes
    // one SIGTERM on (a second signal would stop the trainer without its clean ending)
    let mut cmd = (plan.command)(number, &sets);
    // a driver killed with SIGKILL (no handler sees it) takes its trials with it
    crate::children::die_with_parent(&mut cmd);
    let child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(io)?;
    Ok(Running {
        number,
        child,
        values,
        log,
        earlier,
        run_id: None,
        seen_step: i64::MIN,
        pruned: None,
        told: None,
        killed: false,
    })
}

/// The run of trial `number` started after the runs in `earlier`, if it is recorded yet: its id
/// and start time.
fn find_run(store: &Store, spec: &SweepSpec, number: u64, earlier: &[i64]) -> Result<Option<(i64, f64)>> {
    let n = number.to_string();
    Ok(store
        .list_runs(Some(&spec.experiment))?
        .into_iter()
        .filter(|r| r.tags.get(TAG_SWEEP) == Some(&spec.name) && r.tags.get(TAG_TRIAL) == Some(&n))
        .filter(|r| !earlier.contains(&r.id))
        .max_by_key(|r| r.id)
        .map(|r| (r.id, r.start_time)))
}

/// Records how trial `r` ended; the line to say about it.
fn finish(plan: &Plan, store: &Store, mut r: Running, status: ExitStatus) -> Result<String> {
    let spec = plan.spec;
    if r.run_id.is_none() {
        r.run_id = find_run(store, spec, r.number, &r.earlier)?.map(|(id, _)| id);
    }
    let run = match r.run_id {
        Some(id) => Some(store.run_detail(id)?),
        None => None,
    };
    let run_status = run.as_ref().map(|d| d.summary.status.clone());
    let value = |id: i64| -> Result<String> {
        let detail = store.run_detail(id)?;
        Ok(trials::last_value(&detail, &spec.metric)
            .map_or("no value".into(), |(s, v)| format!("{} = {v} at step {s}", spec.metric)))
    };
    match (r.run_id, r.pruned.take(), status.success(), run_status.as_deref()) {
        // it finished before the signal arrived: it stays finished
        (Some(id), _, true, _) | (Some(id), _, _, Some("finished")) => {
            Ok(format!("trial {}: finished, {}", r.number, value(id)?))
        }
        (Some(id), Some(why), false, _) => {
            store.set_status(id, Status::Pruned, Some(&format!("pruned: {why}")))?;
            Ok(format!(
                "trial {}: stopped ({}), marked pruned, {}",
                r.number,
                status,
                value(id)?
            ))
        }
        (Some(id), None, false, s) => {
            if s == Some("running") {
                store.set_status(
                    id,
                    Status::Failed,
                    Some(&format!("the trial's process ended: {status}")),
                )?;
            }
            let why = run.and_then(|d| d.error).unwrap_or_else(|| last_error(&r.log));
            Ok(format!("trial {}: failed ({status}): {why}", r.number))
        }
        (None, _, ok, _) => {
            // ended before the trainer recorded a run (a config error, a crash at start)
            let why = if ok {
                "the trial ended without recording a run (is track.enabled false in the base config?)".to_string()
            } else {
                last_error(&r.log)
            };
            record_failure(plan, r.number, &r.values, &why)?;
            Ok(format!("trial {}: failed ({status}): {why}", r.number))
        }
    }
}

/// A run of trial `number` with its values, marked failed with `why`.
fn record_failure(plan: &Plan, number: u64, values: &[Value], why: &str) -> Result<()> {
    let spec = plan.spec;
    let run = NewRun {
        params: values
            .iter()
            .enumerate()
            .map(|(i, v)| (spec.space.params[i].key.clone(), trials::param_text(&spec.space, i, *v)))
            .collect(),
        tags: vec![
            (TAG_SWEEP.to_string(), spec.name.clone()),
            (TAG_TRIAL.to_string(), number.to_string()),
            (TAG_METRIC.to_string(), spec.metric.clone()),
            (TAG_GOAL.to_string(), spec.goal.as_str().to_string()),
        ],
        ..NewRun::here(&spec.experiment, Some(trial_name(spec, number)))
    };
    let w = RunWriter::start(&plan.store_dir, run, WriterOptions::default())?;
    w.end(Status::Failed, Some(why.to_string()))?;
    Ok(())
}

/// The run name of trial `number`: `SWEEP-trial-N`.
pub fn trial_name(spec: &SweepSpec, number: u64) -> String {
    format!("{}-trial-{number}", spec.name)
}

/// The last error line of a trial's log (`weft: error: ...`), else its last line.
fn last_error(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let line = lines
        .iter()
        .rev()
        .find(|l| l.contains("error:"))
        .or(lines.last())
        .map_or("no output", |l| l);
    let mut line: String = line.chars().take(400).collect();
    if line.is_empty() {
        line = format!("see {}", log.display());
    }
    line
}
