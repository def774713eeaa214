//! `weft pipeline`: a tiny train -> condition -> register pipeline (with an independent
//! command step) runs end to end; a second run takes every step from the cache; `--no-cache`
//! runs them again; a condition that does not hold skips the steps after it; independent steps
//! run at once; a failing step is retried, then stops the steps after it; a cycle, a missing
//! dependency, an unknown kind and a deploy step naming no version are refused in one line; a
//! train step takes a sweep step's best values (`from_sweep`), and fails in one line when the
//! sweep finished no trial; `--from STEP` reruns that step and those after it. The kinds
//! prepare, evaluate and deploy and `${steps.NAME.KEY}` references: tests/pipeline_steps.rs. A
//! signal to a running pipeline: tests/pipeline_signals.rs.

mod common;

use std::path::Path;
use std::process::Output;

use common::temp_dir;
use serde_json::Value;

fn weft_with(runs: &Path, args: &[&str]) -> Output {
    common::weft_with_store(runs, args)
}

fn ok(runs: &Path, args: &[&str]) -> String {
    common::weft_ok_with_store(runs, args)
}

/// Writes a tiny mlp config and its CSV into `dir`.
fn write_mlp(dir: &Path) {
    common::write_tiny_mlp(dir, "steps = 4\nlog_every = 1\n");
}

fn pipeline(op: &str, value: f64) -> String {
    format!(
        "[[step]]\nname = \"train\"\nkind = \"train\"\nconfig = \"mlp.toml\"\n\
         set = [\"train.steps=4\"]\nretries = 1\n\n\
         [[step]]\nname = \"note\"\nkind = \"command\"\nargv = [\"sh\", \"-c\", \"echo made >> note.txt\"]\n\n\
         [[step]]\nname = \"gate\"\nkind = \"condition\"\nrun = \"train\"\nmetric = \"loss\"\nop = \"{op}\"\n\
         value = {value:?}\ndepends_on = [\"train\"]\n\n\
         [[step]]\nname = \"reg\"\nkind = \"register\"\nstep = \"train\"\nmodel = \"cls\"\n\
         depends_on = [\"gate\", \"note\"]\n"
    )
}

fn versions(runs: &Path) -> Vec<Value> {
    let list: Value = serde_json::from_str(&ok(runs, &["models", "list", "--json"])).unwrap();
    list.as_array().unwrap().clone()
}

#[test]
fn a_pipeline_runs_then_comes_from_the_cache() {
    let dir = temp_dir("pipeline");
    let runs = dir.join("runs");
    write_mlp(&dir);
    let file = dir.join("flow.toml");
    std::fs::write(&file, pipeline("<", 100.0)).unwrap();
    let f = file.to_str().unwrap();

    let first = ok(&runs, &["pipeline", "run", f]);
    for step in ["train", "note", "gate", "reg"] {
        assert!(first.contains(&format!("step {step}: finished")), "{first}");
    }
    assert!(first.contains("step gate: finished: true"), "{first}");
    let v = versions(&runs);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0]["name"], "cls");
    assert!(v[0]["run_name"].as_str().unwrap().contains("flow-train-"), "{v:?}");
    // each train execution checkpoints into a folder of its own in the store's folder
    assert!(
        v[0]["path"]
            .as_str()
            .unwrap()
            .contains("pipeline-checkpoints/flow/flow-train-"),
        "{v:?}"
    );

    // every step from the cache: nothing runs, no new version
    let second = ok(&runs, &["pipeline", "run", f]);
    for step in ["train", "note", "gate", "reg"] {
        assert!(second.contains(&format!("step {step}: cached")), "{second}");
    }
    assert!(!second.contains("running"), "{second}");
    assert_eq!(versions(&runs).len(), 1);
    assert_eq!(std::fs::read_to_string(dir.join("note.txt")).unwrap(), "made\n");
    let show = ok(&runs, &["pipeline", "show", f]);
    assert!(
        show.contains("reg") && show.contains("finished: model=cls version=1"),
        "{show}"
    );

    // a changed config file misses the cache for its step and those after it
    let config = std::fs::read_to_string(dir.join("mlp.toml")).unwrap();
    std::fs::write(dir.join("mlp.toml"), config.replace("lr = 0.01", "lr = 0.02")).unwrap();
    let third = ok(&runs, &["pipeline", "run", f]);
    assert!(third.contains("step note: cached"), "{third}");
    for step in ["train", "gate", "reg"] {
        assert!(third.contains(&format!("step {step}: finished")), "{third}");
    }
    assert_eq!(versions(&runs).len(), 2);

    // --no-cache runs every step again
    let fourth = ok(&runs, &["pipeline", "run", f, "--no-cache"]);
    for step in ["train", "note", "gate", "reg"] {
        assert!(fourth.contains(&format!("step {step}: finished")), "{fourth}");
    }
    assert_eq!(versions(&runs).len(), 3);

    // a condition that does not hold skips what follows it
    std::fs::write(&file, pipeline(">", 1e9)).unwrap();
    let gated = ok(&runs, &["pipeline", "run", f]);
    assert!(gated.contains("step gate: finished: false"), "{gated}");
    assert!(gated.contains("step reg: skipped"), "{gated}");
    assert_eq!(versions(&runs).len(), 3);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_pipelines_are_refused_in_one_line() {
    let dir = temp_dir("pipeline-bad");
    let runs = dir.join("runs");
    let cases = [
        (
            "[[step]]\nname = \"a\"\nkind = \"command\"\nargv = [\"true\"]\ndepends_on = [\"b\"]\n\
             [[step]]\nname = \"b\"\nkind = \"command\"\nargv = [\"true\"]\ndepends_on = [\"a\"]\n",
            "cycle",
        ),
        (
            "[[step]]\nname = \"a\"\nkind = \"command\"\nargv = [\"true\"]\ndepends_on = [\"zz\"]\n",
            "\"zz\", which is no step",
        ),
        ("[[step]]\nname = \"a\"\nkind = \"juggle\"\n", "unknown kind \"juggle\""),
        (
            "[[step]]\nname = \"a\"\nkind = \"deploy\"\nmodel = \"m\"\n",
            "give either `step` (a register step) or `version`",
        ),
        (
            "[[step]]\nname = \"a\"\nkind = \"command\"\nargv = [\"true\"]\n\
             [[step]]\nname = \"b\"\nkind = \"train\"\nconfig = \"x.toml\"\nfrom_sweep = \"a\"\ndepends_on = [\"a\"]\n",
            "step \"b\": \"a\" is no sweep step",
        ),
        // a comparison with NaN or infinity says nothing (`!=` held for NaN)
        (
            "[[step]]\nname = \"a\"\nkind = \"command\"\nargv = [\"true\"]\n\
             [[step]]\nname = \"gate\"\nkind = \"condition\"\nstep = \"a\"\nkey = \"exit\"\nop = \"!=\"\n\
             value = nan\ndepends_on = [\"a\"]\n",
            "step \"gate\": `value` \"NaN\" must be a finite number",
        ),
        // a name a reference, a run or a sweep could not carry
        (
            "[[step]]\nname = \"a/b\"\nkind = \"command\"\nargv = [\"true\"]\n",
            "step \"a/b\": a step's name is letters, digits, '_' and '-'",
        ),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let file = dir.join(format!("bad{i}.toml"));
        std::fs::write(&file, text).unwrap();
        for cmd in ["run", "show"] {
            let out = weft_with(&runs, &["pipeline", cmd, file.to_str().unwrap()]);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{err}");
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(err.contains(want), "{want}: {err}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A NaN a step hands over fails the condition that compares it, in one line naming both,
/// and the steps after it are skipped: `!=` held for NaN (`nan != 0`), so they ran. A
/// reference that resolves to `inf` as the value fails the same way.
#[test]
fn a_condition_on_nan_fails_and_skips_what_follows() {
    let dir = temp_dir("pipeline-nan");
    let runs = dir.join("runs");
    let text = "[[step]]\nname = \"score\"\nkind = \"command\"\n\
                argv = [\"sh\", \"-c\", \"echo loss=nan >> $WEFT_STEP_OUTPUT; echo cap=inf >> $WEFT_STEP_OUTPUT\"]\n\n\
                [[step]]\nname = \"gate\"\nkind = \"condition\"\nstep = \"score\"\nkey = \"loss\"\nop = \"!=\"\n\
                value = 0\ndepends_on = [\"score\"]\n\n\
                [[step]]\nname = \"capped\"\nkind = \"condition\"\nstep = \"score\"\nkey = \"exit\"\nop = \"<\"\n\
                value = \"${steps.score.cap}\"\ndepends_on = [\"score\"]\n\n\
                [[step]]\nname = \"after\"\nkind = \"command\"\nargv = [\"sh\", \"-c\", \"touch ran\"]\n\
                depends_on = [\"gate\"]\n\n\
                [[step]]\nname = \"after_cap\"\nkind = \"command\"\nargv = [\"sh\", \"-c\", \"touch ran\"]\n\
                depends_on = [\"capped\"]\n";
    let file = dir.join("nan.toml");
    std::fs::write(&file, text).unwrap();
    let out = weft_with(&runs, &["pipeline", "run", file.to_str().unwrap()]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("step score: finished"), "{stdout}");
    assert!(
        stdout.contains("step gate: failed: step \"score\"'s loss is NaN, which a condition does not compare"),
        "{stdout}"
    );
    assert!(
        stdout.contains("step capped: failed: `value` \"inf\" is not a finite number"),
        "{stdout}"
    );
    assert!(
        stdout.contains("step after: skipped") && stdout.contains("step after_cap: skipped"),
        "{stdout}"
    );
    assert!(!dir.join("ran").exists(), "{stdout}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("the steps [\"capped\", \"gate\"] failed"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn independent_steps_run_at_once_and_failures_retry_then_stop_what_follows() {
    let dir = temp_dir("pipeline-threads");
    let runs = dir.join("runs");
    // each of a and b waits (up to 20 s) for the other's file: run one after the other, the
    // first would fail
    let meet = |me: &str, other: &str| {
        format!(
            "argv = [\"sh\", \"-c\", \"touch {me}; i=0; while [ ! -f {other} ]; do i=$((i+1)); \
             [ $i -gt 200 ] && exit 1; sleep 0.1; done\"]\n"
        )
    };
    let text = format!(
        "[[step]]\nname = \"a\"\nkind = \"command\"\n{}\n\
         [[step]]\nname = \"b\"\nkind = \"command\"\n{}\n\
         [[step]]\nname = \"flaky\"\nkind = \"command\"\nretries = 1\n\
         argv = [\"sh\", \"-c\", \"[ -f tried ] && exit 0; touch tried; exit 1\"]\ndepends_on = [\"a\", \"b\"]\n\n\
         [[step]]\nname = \"broken\"\nkind = \"command\"\nargv = [\"sh\", \"-c\", \"exit 3\"]\nretries = 2\n\n\
         [[step]]\nname = \"after\"\nkind = \"command\"\nargv = [\"true\"]\ndepends_on = [\"broken\"]\n\n\
         [[step]]\nname = \"missing\"\nkind = \"train\"\nconfig = \"nope.toml\"\n",
        meet("a.flag", "b.flag"),
        meet("b.flag", "a.flag")
    );
    let file = dir.join("threads.toml");
    std::fs::write(&file, text).unwrap();
    let out = weft_with(&runs, &["pipeline", "run", file.to_str().unwrap()]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    for step in ["a", "b", "flaky"] {
        assert!(stdout.contains(&format!("step {step}: finished")), "{stdout}\n{stderr}");
    }
    assert!(stdout.contains("step broken: failed"), "{stdout}");
    assert!(stdout.contains("step after: skipped"), "{stdout}");
    assert_eq!(stderr.matches("step broken:").count(), 2, "two retries: {stderr}");
    assert!(
        stdout.contains("step missing: failed") && stdout.contains("nope.toml"),
        "{stdout}"
    );
    assert!(
        stderr.contains("the steps [\"broken\", \"missing\"] failed"),
        "{stderr}"
    );
    // the failed step is not cached: it runs again, the finished ones do not
    let again = ok_fails(&runs, &file);
    assert!(
        again.contains("step a: cached") && again.contains("step broken: failed"),
        "{again}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The stdout of a pipeline run that fails.
fn ok_fails(runs: &Path, file: &Path) -> String {
    let out = weft_with(runs, &["pipeline", "run", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_example_pipeline_runs_and_then_comes_from_the_cache() {
    let dir = temp_dir("pipeline-example");
    let runs = dir.join("runs");
    let file = common::repo().join("examples/pipeline_char_gpt.toml");
    let file = file.to_str().unwrap();
    let run = |args: &[&str]| {
        let mut all = vec!["pipeline", "run", file, "--dir", runs.to_str().unwrap()];
        all.extend(args);
        ok(&runs, &all)
    };
    let first = run(&[]);
    // the train step ran after the sweep, with its best values
    assert!(
        first.contains("step sweep: finished: sweep=pipeline_char_gpt-sweep-") && first.contains(" best=trial-"),
        "{first}"
    );
    assert!(
        first.contains("step register: finished: model=char_gpt version=1"),
        "{first}"
    );
    let v = versions(&runs);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0]["name"], "char_gpt");
    let second = run(&[]);
    assert_eq!(second.matches(": cached (").count(), 4, "{second}");
    assert_eq!(versions(&runs).len(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A grid sweep of the tiny mlp (`mlp.toml`, 4 steps, `loss` logged every step) named `name`
/// over `lr` values and two hidden widths.
fn sweep_file(name: &str, lrs: &str) -> String {
    format!(
        "[sweep]\nname = \"{name}\"\nbase = \"mlp.toml\"\nmetric = \"loss\"\nmethod = \"grid\"\nparallel = 2\n\
         [sweep.parameters]\n\"optim.lr\" = {{ values = [{lrs}] }}\n\"model.hidden\" = {{ values = [[8], [5]] }}\n"
    )
}

/// sweep `tune` (every trial with `train.seed=7`), then train `long`: the best trial's values,
/// then `train.steps=6` on top.
const HAND_OVER: &str = "[[step]]\nname = \"tune\"\nkind = \"sweep\"\nconfig = \"sweep.toml\"\n\
    set = [\"train.seed=7\"]\n\n\
    [[step]]\nname = \"long\"\nkind = \"train\"\nconfig = \"mlp.toml\"\nfrom_sweep = \"tune\"\n\
    set = [\"train.steps=6\"]\ndepends_on = [\"tune\"]\n";

/// The name of the sweep that step `tune` of pipeline output `out` ran (`sweep=NAME`).
fn sweep_name(out: &str) -> String {
    let line = out
        .lines()
        .find(|l| l.starts_with("step tune: finished: sweep="))
        .unwrap_or_else(|| panic!("step tune did not finish: {out}"));
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("sweep="))
        .unwrap()
        .to_string()
}

/// `weft sweep status --json` of the sweep file `dir/sweep.toml` run as sweep `name`.
fn sweep_status(dir: &Path, runs: &Path, name: &str) -> Value {
    let file = dir.join("sweep.toml");
    #[rustfmt::skip]
    let out = ok(runs, &["sweep", "status", "--json", "--config", file.to_str().unwrap(), "--name", name,
        "--set", "train.seed=7"]);
    serde_json::from_str(&out).unwrap()
}

/// The run of the store whose `key` is `value`, as `weft runs list --json` gives it.
fn run_where(runs: &Path, key: &str, value: Value) -> Value {
    let list: Value = serde_json::from_str(&ok(runs, &["runs", "list", "--json"])).unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .find(|r| r[key] == value)
        .unwrap_or_else(|| panic!("no run with {key} {value}: {list}"))
        .clone()
}

/// Checks that the `long` run of pipeline output `out` got the best trial's values of `weft
/// sweep status --json` (and the step's own `train.steps` on top); the best trial's run name.
fn check_handed_over(dir: &Path, runs: &Path, out: &str) -> String {
    let status = sweep_status(dir, runs, &sweep_name(out));
    let best = &status["best"];
    let trial = run_where(runs, "name", best["run"].clone());
    let line = out
        .lines()
        .find(|l| l.starts_with("step long: finished: run="))
        .expect(out);
    let id: i64 = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("run="))
        .unwrap()
        .parse()
        .unwrap();
    // and the checkpoint it wrote, under the store's pipeline-checkpoints folder
    let ckpt = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("checkpoint="))
        .expect(line);
    assert!(
        ckpt.contains("pipeline-checkpoints") && Path::new(ckpt).join("COMPLETE").is_file(),
        "{line}"
    );
    let long = run_where(runs, "id", Value::from(id));
    for key in ["optim.lr", "model.hidden"] {
        assert_eq!(long["params"][key], trial["params"][key], "{key}: {long}\n{trial}");
    }
    assert_eq!(trial["params"]["train.steps"], "4");
    assert_eq!(long["params"]["train.steps"], "6", "the step's own set goes on top");
    // the sweep step's set reached every trial, not the train step
    assert_eq!(trial["params"]["train.seed"], "7", "{trial}");
    assert_ne!(long["params"]["train.seed"], "7", "{long}");
    // the status's best is the finished trial with the lowest loss
    let finished: Vec<&Value> = status["trials"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["status"] == "finished")
        .collect();
    let lowest = finished
        .iter()
        .min_by(|a, b| a["value"].as_f64().unwrap().total_cmp(&b["value"].as_f64().unwrap()))
        .unwrap();
    assert_eq!(lowest["id"], best["id"], "{status}");
    best["run"].as_str().unwrap().to_string()
}

#[test]
fn a_train_step_takes_the_best_values_of_a_sweep_step() {
    let dir = temp_dir("pipeline-handover");
    let runs = dir.join("runs");
    write_mlp(&dir);
    std::fs::write(dir.join("sweep.toml"), sweep_file("tune", "0.0, 0.05")).unwrap();
    let file = dir.join("flow.toml");
    std::fs::write(&file, HAND_OVER).unwrap();
    let f = file.to_str().unwrap();

    let first = ok(&runs, &["pipeline", "run", f]);
    // each execution a sweep of its own, PIPELINE-STEP-MILLIS
    let name = sweep_name(&first);
    assert!(name.starts_with("flow-tune-"), "{first}");
    assert!(first.contains(&format!("sweep={name} best=trial-")), "{first}");
    let best = check_handed_over(&dir, &runs, &first);

    // `weft sweep status --json`: the sweep, its metric and goal, every trial typed
    let status = sweep_status(&dir, &runs, &name);
    assert_eq!(
        (
            &status["sweep"],
            &status["metric"],
            &status["goal"],
            &status["trials_planned"]
        ),
        (
            &Value::from(name.as_str()),
            &Value::from("loss"),
            &Value::from("minimize"),
            &Value::from(4)
        )
    );
    let trials = status["trials"].as_array().unwrap();
    assert_eq!(trials.len(), 4, "{status}");
    for (i, t) in trials.iter().enumerate() {
        assert_eq!(t["id"], i, "{t}");
        assert_eq!(t["run"], format!("{name}-trial-{i}"));
        assert_eq!(t["status"], "finished");
        assert_eq!(t["step"], 4, "{t}");
        assert!(t["value"].as_f64().is_some(), "{t}");
        // grid order: the keys sorted (model.hidden first), the last fastest
        let lr = if i % 2 == 0 { 0.0 } else { 0.05 };
        assert_eq!(t["params"]["optim.lr"].as_f64(), Some(lr), "{t}");
        assert_eq!(
            t["params"]["model.hidden"],
            serde_json::json!([if i < 2 { 8 } else { 5 }]),
            "{t}"
        );
    }
    assert_eq!(status["best"]["run"], best.as_str());

    // a second run takes both from the cache
    let second = ok(&runs, &["pipeline", "run", f]);
    assert!(
        second.contains("step tune: cached") && second.contains("step long: cached"),
        "{second}"
    );

    // the sweep file changed (only lr 0 now: a different best), its name kept: the step runs
    // as a new sweep beside the first one's trials, and the train step again with its best
    std::fs::write(dir.join("sweep.toml"), sweep_file("tune", "0.0")).unwrap();
    let third = ok(&runs, &["pipeline", "run", f]);
    assert!(third.contains("step long: finished"), "{third}");
    let name2 = sweep_name(&third);
    assert_ne!(name2, name);
    let best2 = check_handed_over(&dir, &runs, &third);
    assert!(best2.starts_with(&format!("{name2}-trial-")), "{best2}");
    // the first sweep's trials are still the store's
    assert_eq!(sweep_status(&dir, &runs, &name)["trials"].as_array().unwrap().len(), 4);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_sweep_that_finished_no_trial_fails_the_train_step_that_takes_its_best() {
    let dir = temp_dir("pipeline-handover-none");
    let runs = dir.join("runs");
    write_mlp(&dir);
    // every trial reads a file that is not there: each fails, none finishes
    let sweep = "[sweep]\nname = \"none\"\nbase = \"mlp.toml\"\nmetric = \"loss\"\nmethod = \"grid\"\n\
                 [sweep.parameters]\n\"data.path\" = { values = [\"missing.csv\"] }\n";
    std::fs::write(dir.join("sweep.toml"), sweep).unwrap();
    let file = dir.join("flow.toml");
    std::fs::write(&file, HAND_OVER).unwrap();
    let out = weft_with(&runs, &["pipeline", "run", file.to_str().unwrap()]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("step tune: finished: sweep=flow-tune-") && stdout.contains(" best=none"),
        "{stdout}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("the steps [\"long\"] failed (long: from_sweep \"tune\": its sweep finished no trial"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn from_step_reruns_it_and_what_follows_and_takes_what_precedes_from_the_cache() {
    let dir = temp_dir("pipeline-from");
    let runs = dir.join("runs");
    // a -> b -> c, d on its own; each appends its name to log.txt
    let step = |name: &str, deps: &str| {
        format!(
            "[[step]]\nname = \"{name}\"\nkind = \"command\"\nargv = [\"sh\", \"-c\", \"echo {name} >> log.txt\"]\n\
             depends_on = [{deps}]\n\n"
        )
    };
    let text = [step("a", ""), step("b", "\"a\""), step("c", "\"b\""), step("d", "")].concat();
    let file = dir.join("flow.toml");
    std::fs::write(&file, text).unwrap();
    let f = file.to_str().unwrap();
    let log = || std::fs::read_to_string(dir.join("log.txt")).unwrap_or_default();

    // nothing cached yet: refused before anything runs, naming the step before it
    let out = weft_with(&runs, &["pipeline", "run", f, "--from", "b"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("--from \"b\": step \"a\", which it depends on, has no cached execution"),
        "{err}"
    );
    assert_eq!(log(), "");

    ok(&runs, &["pipeline", "run", f]);
    let mut first: Vec<String> = log().lines().map(str::to_string).collect();
    first.sort();
    assert_eq!(first, ["a", "b", "c", "d"]);
    std::fs::write(dir.join("log.txt"), "").unwrap();

    let again = ok(&runs, &["pipeline", "run", f, "--from", "b"]);
    assert!(
        again.contains("step a: cached") && again.contains("step d: cached"),
        "{again}"
    );
    assert!(
        again.contains("step b: finished") && again.contains("step c: finished"),
        "{again}"
    );
    assert_eq!(log(), "b\nc\n");

    // --from the first step runs everything after it; an unknown step is refused
    std::fs::write(dir.join("log.txt"), "").unwrap();
    ok(&runs, &["pipeline", "run", f, "--from", "a"]);
    assert_eq!(log(), "a\nb\nc\n");
    for (args, want) in [
        (vec!["--from", "zz"], "--from \"zz\": no such step"),
        (vec!["--from", "a", "--no-cache"], "cannot be used with"),
    ] {
        let mut all = vec!["pipeline", "run", f];
        all.extend(args);
        let out = weft_with(&runs, &all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{err}");
        assert!(err.contains(want), "{want}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
