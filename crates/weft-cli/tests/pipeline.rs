//! `weft pipeline`: a tiny train -> condition -> register pipeline (with an independent
//! command step) runs end to end; a second run takes every step from the cache; `--no-cache`
//! runs them again; a condition that does not hold skips the steps after it; independent steps
//! run at once; a failing step is retried, then stops the steps after it; a cycle, a missing
//! dependency and an unknown kind are refused in one line.

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
        ("[[step]]\nname = \"a\"\nkind = \"deploy\"\n", "not built yet"),
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
