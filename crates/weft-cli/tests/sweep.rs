//! `weft sweep`: trials of a tiny gpt on the built-in text, each a run in the store, the ASHA
//! pruner stopping the trials its rung rule names, `weft sweep status`, `--resume`, a failed
//! trial, and bad sweep files refused in one line.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{alive, pids_with, temp_dir, weft_command};

/// A tiny gpt on the built-in corpus: every step logged, evaluated every 2 steps.
fn base_config(steps: usize) -> String {
    format!(
        "[model]\nkind = \"gpt\"\nvocab_size = 128\nblock_size = 16\nn_layer = 1\nn_head = 2\nn_embd = 32\n\
         bias = true\ndropout = 0.0\n\
         [data]\nkind = \"text\"\npath = \"builtin\"\nbatch_size = 4\nval_fraction = 0.1\n\
         [optim]\nkind = \"adamw\"\nlr = 0.01\n\
         [train]\nsteps = {steps}\nlog_every = 1\neval_every = 2\neval_batches = 1\nsample_tokens = 0\n"
    )
}

/// `weft ARGS` with the run store in `store`.
fn weft_with(store: &Path, args: &[&str]) -> Output {
    weft_command(args)
        .env("WEFT_TRACK_DIR", store)
        .output()
        .expect("the weft binary runs")
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A folder with `run.toml` (the base) and `sweep.toml`.
fn setup(name: &str, steps: usize, sweep: &str) -> (PathBuf, PathBuf, PathBuf) {
    let dir = temp_dir(name);
    std::fs::write(dir.join("run.toml"), base_config(steps)).unwrap();
    let file = dir.join("sweep.toml");
    std::fs::write(&file, sweep).unwrap();
    let store = dir.join("store");
    (dir, file, store)
}

fn runs(store: &Path, experiment: &str) -> Vec<serde_json::Value> {
    let out = weft_with(store, &["runs", "list", "--json", "--experiment", experiment]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    serde_json::from_str::<serde_json::Value>(&stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

/// Grid order (keys sorted, the last fastest): trials 0 and 1 train at lr 0.01 and differ only
/// in how often they log, so their val_loss curves are equal; trials 2 and 3 have lr 0, so their
/// val_loss stays at its first value. ASHA (rungs at steps 4, 8, 16, ... with eta 2) keeps a
/// trial only if fewer than max(1, n/2) of the n values at a rung are strictly better. Trials 2
/// and 3 start only once trial 0 or 1 has ended, so both good values are at rung 0 before them:
/// the first of them has 2 better of 3 (keep 1), the second 2 better of 4 (keep 2): both stop
/// at step 4, whichever comes first. Trials 0 and 1 tie at every rung and go on.
const ASHA_SWEEP: &str = "[sweep]\nname = \"tiny\"\nbase = \"run.toml\"\nmetric = \"val_loss\"\n\
    method = \"grid\"\nparallel = 2\n\
    [sweep.parameters]\n\"optim.lr\" = { values = [0.01, 0.0] }\n\"train.log_every\" = { values = [1, 2] }\n\
    [sweep.pruner]\nkind = \"asha\"\nmin_steps = 4\nreduction_factor = 2\n";

#[test]
fn a_grid_sweep_with_asha_records_every_trial_and_prunes_those_the_rungs_name() {
    let (_dir, file, store) = setup("sweep-asha", 3000, ASHA_SWEEP);
    let f = file.to_str().unwrap();
    let out = weft_with(&store, &["sweep", "--config", f]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.matches(": started (").count(), 4, "{stdout}");

    let runs = runs(&store, "tiny");
    assert_eq!(runs.len(), 4, "{runs:?}");
    let status: Vec<(&str, &str)> = runs
        .iter()
        .map(|r| (r["name"].as_str().unwrap(), r["status"].as_str().unwrap()))
        .collect();
    let mut status = status;
    status.sort();
    assert_eq!(
        status,
        [
            ("tiny-trial-0", "finished"),
            ("tiny-trial-1", "finished"),
            ("tiny-trial-2", "pruned"),
            ("tiny-trial-3", "pruned")
        ],
        "{stdout}"
    );
    for r in &runs {
        assert_eq!(r["tags"]["sweep"], "tiny");
        let n = r["name"].as_str().unwrap().rsplit('-').next().unwrap();
        assert_eq!(r["tags"]["sweep_trial"], n);
        let lr = if n == "0" || n == "1" { "0.01" } else { "0.0" };
        assert_eq!(r["params"]["optim.lr"], lr, "{r}");
        assert!(r["metrics"]["val_loss"].as_f64().is_some(), "{r}");
    }
    // the pruned trials stopped soon after rung 0 (step 4), far from the end
    let shown = weft_with(&store, &["runs", "show", "tiny/tiny-trial-2", "--json"]);
    let shown: serde_json::Value = serde_json::from_str(&text(&shown).0).unwrap();
    assert!(shown["error"].as_str().unwrap().contains("rung 0 (step 4"), "{shown}");
    let last_step = shown["metric_summaries"]["val_loss"]["last_step"].as_i64().unwrap();
    assert!((4..3000).contains(&last_step), "{shown}");

    let st = weft_with(&store, &["sweep", "status", "--config", f]);
    let (stdout, stderr) = text(&st);
    assert!(st.status.success(), "{stderr}");
    assert!(stdout.contains("2 finished, 2 pruned, 0 failed"), "{stdout}");
    assert!(stdout.contains("best: trial 0 (tiny-trial-0): val_loss = "), "{stdout}");
    assert!(stdout.contains("optim.lr=0.01 train.log_every=1"), "{stdout}");
    // status reads the store: it does not run the values' checks, so it answers where the base
    // config could not train (a cuda device this machine lacks)
    let st = weft_with(
        &store,
        &["sweep", "status", "--config", f, "--set", "train.device=\"cuda\""],
    );
    let (stdout, stderr) = text(&st);
    assert!(st.status.success(), "{stderr}");
    assert!(stdout.contains("2 finished, 2 pruned, 0 failed"), "{stdout}");

    // a finished sweep resumed runs nothing new; started again without --resume it is refused
    let again = weft_with(&store, &["sweep", "--config", f, "--resume"]);
    let (stdout, stderr) = text(&again);
    assert!(again.status.success(), "{stderr}");
    assert!(!stdout.contains("started"), "{stdout}");
    assert_eq!(self::runs(&store, "tiny").len(), 4);
    let fresh = weft_with(&store, &["sweep", "--config", f]);
    assert_eq!(fresh.status.code(), Some(1));
    assert!(text(&fresh).1.contains("--resume"), "{}", text(&fresh).1);
}

#[test]
fn a_failed_trial_is_recorded_and_the_sweep_goes_on() {
    // n_head = 3 does not divide n_embd = 32: that trial fails before its first step. (It
    // divides the swept n_embd = 48, so the check before the first trial lets it through.)
    let sweep = "[sweep]\nname = \"heads\"\nbase = \"run.toml\"\nmetric = \"loss\"\nmethod = \"grid\"\ntrials = 2\n\
                 [sweep.parameters]\n\"model.n_head\" = { values = [3, 2] }\n\"model.n_embd\" = { values = [32, 48] }\n";
    let (_dir, file, store) = setup("sweep-fail", 6, sweep);
    let out = weft_with(&store, &["sweep", "--config", file.to_str().unwrap()]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let runs = runs(&store, "heads");
    let by_name = |n: &str| {
        runs.iter()
            .find(|r| r["name"] == n)
            .unwrap_or_else(|| panic!("{n}: {runs:?}"))
    };
    assert_eq!(by_name("heads-trial-0")["status"], "failed");
    assert_eq!(by_name("heads-trial-0")["params"]["model.n_head"], "3");
    assert_eq!(by_name("heads-trial-1")["status"], "finished");
    assert!(stdout.contains("trial 0: failed"), "{stdout}");
    assert!(stdout.contains("best: trial 1 (heads-trial-1)"), "{stdout}");

    // the same as JSON: the failed trial with its typed value and error, the best trial
    let st = weft_with(
        &store,
        &["sweep", "status", "--json", "--config", file.to_str().unwrap()],
    );
    let (stdout, stderr) = text(&st);
    assert!(st.status.success(), "{stderr}");
    let status: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(status["sweep"], "heads");
    assert_eq!(status["metric"], "loss");
    assert_eq!(status["goal"], "minimize");
    let trials = status["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 2, "{status}");
    assert_eq!(trials[0]["id"], 0);
    assert_eq!(trials[0]["status"], "failed");
    assert_eq!(trials[0]["params"]["model.n_head"], 3);
    assert!(
        trials[0]["value"].is_null() && trials[0]["error"].is_string(),
        "{status}"
    );
    assert_eq!(trials[1]["status"], "finished");
    assert!(trials[1]["value"].as_f64().is_some(), "{status}");
    assert_eq!(status["best"]["id"], 1);
    assert_eq!(status["best"]["run"], "heads-trial-1");
    assert_eq!(status["best"]["params"]["model.n_head"], 2);
}

/// A seed drawn from 2^52 integers and a learning rate on steps of 1e-20: the check before the
/// first trial listed every value of each range to find its first, which aborted on a
/// 72-petabyte allocation (a seed range of 10^9 asked for 16 GB), or panicked.
#[test]
fn huge_ranges_are_drawn_without_listing_them() {
    for method in ["random", "tpe"] {
        let sweep = format!(
            "[sweep]\nname = \"huge\"\nbase = \"run.toml\"\nmetric = \"val_loss\"\nmethod = \"{method}\"\ntrials = 1\n\
             [sweep.parameters]\n\"train.seed\" = {{ distribution = \"int_uniform\", min = 0, max = 4503599627370496 }}\n\
             \"optim.lr\" = {{ distribution = \"uniform\", min = 0.0, max = 0.01, q = 1e-20 }}\n"
        );
        let (_dir, file, store) = setup(&format!("sweep-huge-{method}"), 2, &sweep);
        let out = weft_with(&store, &["sweep", "--config", file.to_str().unwrap()]);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{method}: {stdout}\n{stderr}");
        let runs = runs(&store, "huge");
        assert_eq!(runs.len(), 1, "{runs:?}");
        assert_eq!(runs[0]["status"], "finished", "{runs:?}");
        let seed: u64 = runs[0]["params"]["train.seed"].as_str().unwrap().parse().unwrap();
        assert!(seed <= 4503599627370496, "{seed}");
    }
}

#[test]
fn bad_sweep_files_are_one_line_and_exit_1() {
    let head = "[sweep]\nbase = \"run.toml\"\nmetric = \"val_loss\"\ntrials = 2\n";
    let lr = "[sweep.parameters]\n\"optim.lr\" = { distribution = \"log_uniform\", min = 1e-4, max = 1e-2 }\n";
    let cases = [
        (
            format!("{head}method = \"bayes\"\n{lr}"),
            "sweep.method: \"bayes\" is not one of tpe, random, grid",
        ),
        (
            format!(
                "{head}[sweep.parameters]\n\"optim.lrr\" = {{ distribution = \"uniform\", min = 0.1, max = 0.2 }}\n"
            ),
            "sweep.parameters.\"optim.lrr\": not a key this run config takes",
        ),
        (
            format!(
                "{head}[sweep.parameters]\n\"optim.lr\" = {{ distribution = \"uniform\", min = 0.2, max = 0.1 }}\n"
            ),
            "min (0.2) must be below max (0.1)",
        ),
        (
            format!(
                "{head}[sweep.parameters]\n\"optim.lr\" = {{ distribution = \"log_uniform\", min = 0.0, max = 0.1 }}\n"
            ),
            "touches 0",
        ),
        (
            format!("{head}{lr}[sweep.pruner]\nkind = \"sha\"\n"),
            "sweep.pruner.kind: \"sha\" is not one of",
        ),
        (
            format!("[sweep]\nbase = \"run.toml\"\nmetric = \"val_acc\"\ntrials = 2\n{lr}"),
            "sweep.metric: the trainer never logs \"val_acc\"",
        ),
        // a key the config takes, at a value it refuses
        (
            format!("{head}[sweep.parameters]\n\"optim.kind\" = {{ values = [\"lion\"] }}\n"),
            "sweep.parameters.\"optim.kind\": the base config does not load with it (optim.kind=\"lion\": ",
        ),
        // values weft train refuses, found before the first trial: the model's own checks (run
        // when the config is read), for every listed value (not only the first) and for a
        // range's ends
        (
            format!("{head}[sweep.parameters]\n\"model.n_layer\" = {{ values = [1, 0] }}\n"),
            "sweep.parameters.\"model.n_layer\": the base config does not load with it (model.n_layer=0: ",
        ),
        (
            format!(
                "{head}[sweep.parameters]\n\"model.n_head\" = {{ distribution = \"int_uniform\", min = 2, max = 3 }}\n"
            ),
            "sweep.parameters.\"model.n_head\": the base config does not load with it (model.n_head=3: ",
        ),
        // n_head = 3 divides no width the sweep gives
        (
            format!(
                "{head}[sweep.parameters]\n\"model.n_head\" = {{ values = [2, 3] }}\n\
                 \"model.n_embd\" = {{ values = [32, 64] }}\n"
            ),
            "run.toml: model.n_embd: 32 does not divide by n_head = 3); nor with the other swept keys at their \
             listed values or range ends",
        ),
        (
            format!("{head}[sweep.parameters]\n\"optim.betas\" = {{ values = [[0.9, 0.999], [0.9, 1.5]] }}\n"),
            // refused by the optimizer as the trainer builds it (or by the config's own checks)
            "it (optim.betas=[0.9, 1.5]: ",
        ),
        // numbers weft cannot take, named
        (
            format!(
                "{head}[sweep.parameters]\n\"train.seed\" = {{ distribution = \"int_uniform\", min = -9223372036854775808, max = 0 }}\n"
            ),
            "sweep.parameters.\"train.seed\": int_uniform min = -9223372036854775808 is outside the whole numbers weft accepts there",
        ),
        (
            "[sweep]\nbase = \"run.toml\"\nmetric = \"val_loss\"\nmethod = \"grid\"\n[sweep.parameters]\n\
             \"train.seed\" = { distribution = \"int_uniform\", min = 0, max = 1000000000 }\n"
                .to_string(),
            "sweep.method: the grid has 1000000001 points, more than the 100000 a grid sweep may have; \
             sweep.parameters.\"train.seed\" alone has 1000000001",
        ),
        // a gpt reports no accuracy
        (
            format!("[sweep]\nbase = \"run.toml\"\nmetric = \"val_accuracy\"\ntrials = 2\n{lr}"),
            "only classifiers",
        ),
        (
            format!("[sweep]\nbase = \"nope.toml\"\nmetric = \"loss\"\ntrials = 2\n{lr}"),
            "sweep.base: ",
        ),
        // keys the sweep sets for each trial itself: a swept value would be overridden
        (
            format!("{head}[sweep.parameters]\n\"track.dir\" = {{ values = [\"a\", \"b\"] }}\n"),
            "sweep.parameters.\"track.dir\": the sweep sets it for each trial itself",
        ),
        (
            format!("{head}[sweep.parameters]\n\"train.metrics\" = {{ values = [\"m.jsonl\"] }}\n"),
            "sweep.parameters.\"train.metrics\": the sweep sets it for each trial itself",
        ),
        (
            format!("{head}nproc_per_trial = 100000\n{lr}"),
            "sweep.nproc_per_trial: 100000 is above the ",
        ),
        (
            format!("{head}name = \"..\"\n{lr}"),
            "sweep.name: \"..\": a sweep's name must be non-empty, not",
        ),
    ];
    for (i, (sweep, want)) in cases.iter().enumerate() {
        let (_dir, file, store) = setup(&format!("sweep-bad-{i}"), 4, sweep);
        let out = weft_with(&store, &["sweep", "--config", file.to_str().unwrap()]);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{sweep}\n{stdout}\n{stderr}");
        assert!(stderr.contains(want), "{sweep}\n=> {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with("weft: error: "), "{stderr}");
        assert!(!store.join("runs.db").exists(), "nothing runs before the checks pass");
    }
    // a metric the base config does not evaluate
    let (dir, file, store) = setup("sweep-bad-noeval", 4, &format!("{head}{lr}"));
    std::fs::write(
        dir.join("run.toml"),
        base_config(4).replace("eval_every = 2", "eval_every = 0"),
    )
    .unwrap();
    let out = weft_with(&store, &["sweep", "--config", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).1.contains("train.eval_every > 0"), "{}", text(&out).1);
    // the command line's name and overrides of the base config
    let (_dir, file, store) = setup("sweep-bad-given", 4, &format!("{head}{lr}"));
    for (given, want) in [
        (
            vec!["--set", "optim.lr=0.1"],
            "--set optim.lr=0.1: optim.lr is swept by",
        ),
        (vec!["--set", "optim.kind=\"lion\""], "sweep.base: "),
        (
            vec!["--name", "a/b"],
            "--name \"a/b\": a sweep's name must be non-empty, not \".\" or \"..\", and hold no '/'",
        ),
        (vec!["--name", "."], "--name \".\": a sweep's name must be non-empty"),
        // the overrides reach the metric check: no evaluation, no val_loss
        (vec!["--set", "train.eval_every=0"], "train.eval_every > 0"),
    ] {
        let mut args = vec!["sweep", "--config", file.to_str().unwrap()];
        args.extend(&given);
        let out = weft_with(&store, &args);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{given:?}\n{stdout}\n{stderr}");
        assert!(stderr.contains(want), "{given:?} => {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(!store.join("runs.db").exists(), "nothing runs before the checks pass");
    }
}

#[test]
fn a_sweep_stopped_by_sigint_resumes_without_repeating_finished_trials() {
    use std::io::{BufRead, BufReader};
    let sweep = "[sweep]\nname = \"stop\"\nbase = \"run.toml\"\nmetric = \"loss\"\nmethod = \"random\"\ntrials = 4\n\
                 parallel = 1\n[sweep.parameters]\n\"optim.lr\" = { distribution = \"log_uniform\", min = 1e-3, max = 1e-2 }\n";
    let (_dir, file, store) = setup("sweep-stop", 2000, sweep);
    let f = file.to_str().unwrap();
    let mut child = weft_command(&["sweep", "--config", f])
        .env("WEFT_TRACK_DIR", &store)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    // stop it while trial 1 runs
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen.push(line.clone());
        if line.starts_with("trial 1: started") {
            break;
        }
    }
    // SAFETY: kill with the pid of a child this test started and has not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{seen:?}\n{stderr}");
    assert!(stderr.contains("--resume"), "{stderr}");
    let before = runs(&store, "stop");
    let status = |runs: &[serde_json::Value], name: &str| {
        runs.iter()
            .find(|r| r["name"] == name)
            .map(|r| r["status"].as_str().unwrap().to_string())
    };
    assert_eq!(
        status(&before, "stop-trial-0").as_deref(),
        Some("finished"),
        "{before:?}"
    );
    // trial 1 was stopped cleanly (killed), or had just finished
    let one = status(&before, "stop-trial-1");
    assert!(
        matches!(one.as_deref(), Some("killed") | Some("finished") | None),
        "{before:?}"
    );

    let again = weft_with(&store, &["sweep", "--config", f, "--resume"]);
    let (stdout, stderr) = text(&again);
    assert!(again.status.success(), "{stderr}");
    assert!(!stdout.contains("trial 0: started"), "{stdout}");
    assert!(stdout.contains("trial 3: started"), "{stdout}");
    let after = runs(&store, "stop");
    let trial0 = after.iter().filter(|r| r["tags"]["sweep_trial"] == "0").count();
    assert_eq!(trial0, 1, "{after:?}");
    assert!(stdout.contains("4 of 4 trials recorded: 4 finished"), "{stdout}");
}

/// A second driver of the same sweep is refused while the first runs (it ran every trial again
/// beside the first's), and trials stop when their driver is killed with SIGKILL (they ran on,
/// unsupervised, before).
#[test]
fn a_second_driver_is_refused_and_a_killed_drivers_trials_stop() {
    use std::io::{BufRead, BufReader};
    let sweep = "[sweep]\nname = \"held\"\nbase = \"run.toml\"\nmetric = \"loss\"\nmethod = \"random\"\ntrials = 1\n\
                 [sweep.parameters]\n\"optim.lr\" = { distribution = \"log_uniform\", min = 1e-3, max = 1e-2 }\n";
    let (_dir, file, store) = setup("sweep-held", 200_000, sweep);
    let f = file.to_str().unwrap();
    let mut driver = weft_command(&["sweep", "--config", f])
        .env("WEFT_TRACK_DIR", &store)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(driver.stdout.take().unwrap()).lines();
    assert!(lines
        .by_ref()
        .any(|l| l.is_ok_and(|l| l.starts_with("trial 0: started"))));
    // (bounded: a second driver that is not refused runs the trial again, for a long time)
    let mut second = weft_command(&["sweep", "--config", f, "--resume"])
        .env("WEFT_TRACK_DIR", &store)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let since = std::time::Instant::now();
    while second.try_wait().unwrap().is_none() && since.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    if second.try_wait().unwrap().is_none() {
        // SAFETY: kill with the pid of a child this test started and has not reaped.
        unsafe { libc::kill(second.id() as i32, libc::SIGINT) };
        let _ = driver.kill();
    }
    let second = second.wait_with_output().unwrap();
    let (_, stderr) = text(&second);
    assert_eq!(second.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("sweep \"held\" is being run by another process"),
        "{stderr}"
    );
    let trials = pids_with("held-trial-0");
    assert_eq!(trials.len(), 1, "the trial's process: {trials:?}");
    driver.kill().unwrap();
    driver.wait().unwrap();
    let since = std::time::Instant::now();
    while alive(trials[0]) && since.elapsed() < std::time::Duration::from_secs(60) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(!alive(trials[0]), "the trial runs on after its driver was killed");
}
