//! `weft train --resume` continues the run its checkpoint was recorded under: one run in the
//! store, every step recorded once, the losses after the resume point an uninterrupted run's; a
//! resume that records into another store starts a new run there, with a warning.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::{path_set, temp_dir, weft_in, TINY_GPT};

/// `weft train` of [`TINY_GPT`] for `steps` steps with more `--set`s and flags, in `cwd`; its
/// stderr, after checking that it succeeded.
fn train(cwd: &Path, steps: usize, flags: &[&str], sets: &[&str]) -> String {
    let steps = format!("train.steps={steps}");
    let mut args = vec!["train", "--quiet"];
    args.extend(flags);
    for s in TINY_GPT
        .iter()
        .copied()
        .chain([steps.as_str()])
        .chain(sets.iter().copied())
    {
        args.extend(["--set", s]);
    }
    let out = weft_in(cwd, &args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "weft {args:?}:\n{err}");
    err
}

fn json(cwd: &Path, args: &[&str]) -> serde_json::Value {
    let out = weft_in(cwd, args);
    assert!(
        out.status.success(),
        "{args:?}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every recorded `(key, step)` of run `run` of the store in `store` and its values, from
/// `weft runs export` (a key and step recorded twice has two values).
fn rows(cwd: &Path, store: &Path, run: &str) -> BTreeMap<(String, u64), Vec<f64>> {
    let store = store.to_str().unwrap();
    let out = weft_in(cwd, &["runs", "export", run, "--format", "csv", "--dir", store]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut rows: BTreeMap<(String, u64), Vec<f64>> = BTreeMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        rows.entry((f[1].to_string(), f[0].parse().unwrap()))
            .or_default()
            .push(f[2].parse().unwrap());
    }
    rows
}

/// The loss of each step, checking that each step has one.
fn losses(rows: &BTreeMap<(String, u64), Vec<f64>>) -> Vec<(u64, f64)> {
    rows.iter()
        .filter(|((k, _), _)| k == "loss")
        .map(|((_, s), v)| {
            assert_eq!(v.len(), 1, "step {s}: losses {v:?}");
            (*s, v[0])
        })
        .collect()
}

#[test]
fn a_resumed_run_is_the_same_run_with_every_step_once() {
    let dir = temp_dir("runs-resume");
    let (full, split) = (dir.join("full"), dir.join("split"));
    std::fs::create_dir_all(&full).unwrap();
    std::fs::create_dir_all(&split).unwrap();
    let ck = path_set("train.checkpoint_dir", &split.join("ck"));
    let sets = [
        ck.as_str(),
        "train.checkpoint_every=3",
        "train.keep_checkpoints=5",
        "track.name=\"r\"",
    ];
    // uninterrupted: 12 steps
    train(&full, 12, &[], &["track.name=\"r\""]);
    let want = losses(&rows(&full, &full.join("weft-runs"), "r"));
    assert_eq!(
        want.iter().map(|l| l.0).collect::<Vec<_>>(),
        (1..=12).collect::<Vec<_>>()
    );

    // 8 steps (checkpoints after 3, 6 and 8), then the one after 8 is lost, as when the process
    // dies between two checkpoints: the run resumes after step 6 and logs 7 and 8 again
    train(&split, 8, &[], &sets);
    std::fs::remove_dir_all(split.join("ck/step-00000008")).unwrap();
    let store = split.join("weft-runs");
    assert_eq!(losses(&rows(&split, &store, "r")).len(), 8);
    let err = train(&split, 12, &["--resume"], &sets);
    assert!(err.contains("resuming after step 6"), "{err}");
    assert!(!err.contains("warning"), "{err}");

    let runs = json(&split, &["runs", "list", "--json"]);
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0]["status"], "finished");
    assert_eq!(runs[0]["name"], "r");
    assert_eq!(runs[0]["params"]["train.steps"], "12");
    let got = rows(&split, &store, "r");
    // every key at every step once (no stale tail of the first attempt)
    for ((key, step), values) in &got {
        assert_eq!(values.len(), 1, "{key} at step {step}: {values:?}");
    }
    let got_losses = losses(&got);
    assert_eq!(got_losses, want, "the resumed run's losses are the uninterrupted run's");
    assert!(got_losses[7].1 != got_losses[0].1);
    assert_eq!(runs[0]["metrics"]["loss"].as_f64(), Some(want[11].1));
    let shown = json(&split, &["runs", "show", "r", "--json"]);
    assert_eq!(shown["tags"]["resumed_after"], "6", "{shown}");
    assert_eq!(shown["metric_summaries"]["loss"]["count"], 12, "{shown}");
    let min = want.iter().map(|l| l.1).fold(f64::INFINITY, f64::min);
    assert_eq!(shown["metric_summaries"]["loss"]["min"].as_f64(), Some(min));
    // the checkpoint artifacts are the folders there when the run ended, each once
    let checkpoints: Vec<&str> = shown["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["kind"] == "checkpoint")
        .map(|a| a["path"].as_str().unwrap())
        .collect();
    let names: Vec<&str> = checkpoints.iter().map(|p| p.rsplit('/').next().unwrap()).collect();
    assert_eq!(
        names,
        ["step-00000003", "step-00000006", "step-00000009", "step-00000012"],
        "{shown}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_resume_into_another_store_or_from_an_untracked_checkpoint_is_a_new_run() {
    let dir = temp_dir("runs-resume-other");
    let (a, b) = (dir.join("a"), dir.join("b"));
    let ck = path_set("train.checkpoint_dir", &dir.join("ck"));
    let in_a = path_set("track.dir", &a);
    let in_b = path_set("track.dir", &b);
    train(&dir, 4, &[], &[&ck, &in_a, "track.name=\"r\""]);
    let err = train(&dir, 6, &["--resume"], &[&ck, &in_b, "track.name=\"r\""]);
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].contains("not continuing run default/r")
            && warnings[0].contains("another store")
            && warnings[0].contains("recording a new run"),
        "{err}"
    );
    // store a keeps the first run as it was; b has a new run of the resumed steps only
    let first = rows(&dir, &a, "r");
    assert_eq!(losses(&first).iter().map(|l| l.0).collect::<Vec<_>>(), [1, 2, 3, 4]);
    let a_str = a.to_str().unwrap();
    assert_eq!(
        json(&dir, &["runs", "show", "r", "--json", "--dir", a_str])["status"],
        "finished"
    );
    let b_str = b.to_str().unwrap();
    let listed = json(&dir, &["runs", "list", "--json", "--dir", b_str]);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["status"], "finished");
    assert!(listed[0]["tags"].get("resumed_after").is_none(), "{listed}");
    let second = rows(&dir, &b, "r");
    assert_eq!(losses(&second).iter().map(|l| l.0).collect::<Vec<_>>(), [5, 6]);

    // a checkpoint that names no run (written untracked): a new run, no warning
    let ck2 = path_set("train.checkpoint_dir", &dir.join("ck2"));
    let in_c = path_set("track.dir", &dir.join("c"));
    train(&dir, 3, &[], &[&ck2, &in_c, "track.enabled=false"]);
    let err = train(&dir, 5, &["--resume"], &[&ck2, &in_c]);
    assert!(!err.contains("warning"), "{err}");
    let c_str = dir.join("c");
    let listed = json(&dir, &["runs", "list", "--json", "--dir", c_str.to_str().unwrap()]);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    let name = listed[0]["name"].as_str().unwrap();
    assert_eq!(
        losses(&rows(&dir, &c_str, name))
            .iter()
            .map(|l| l.0)
            .collect::<Vec<_>>(),
        [4, 5]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
