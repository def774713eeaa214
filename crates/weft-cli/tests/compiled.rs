//! Compiled mode through the `weft` binary: `[train] compile = true` logs the eager run's losses
//! and gradient norms bit for bit (gpt, llama, mlp, convnet, with gradient accumulation), what
//! cannot be captured runs eagerly with one line saying why, and `weft graph dump` prints the
//! captured step.

mod common;

use std::path::{Path, PathBuf};

use common::{fails_with, fixture_config, read_metrics, temp_dir, train_fixture, weft_ok};

/// Trains fixture `case` in one process with `compile` on or off and extra `--set`s; returns
/// the metrics file and stderr.
fn train(case: &str, out: &Path, compile: bool, extra: &[&str]) -> (PathBuf, String) {
    let metrics = out.join(format!("{case}-{compile}.jsonl"));
    let mut sets = vec![format!("train.compile={compile}")];
    sets.extend(extra.iter().map(|s| s.to_string()));
    let output = train_fixture(case, 1, &metrics, &[], &sets);
    (metrics, String::from_utf8_lossy(&output.stderr).to_string())
}

fn column(metrics: &Path, key: &str) -> Vec<f64> {
    read_metrics(metrics)
        .iter()
        .filter_map(|r| r.get(key).and_then(|v| v.as_f64()))
        .collect()
}

#[test]
fn compiled_runs_log_the_eager_losses_bit_for_bit() {
    let out = temp_dir("compiled-same");
    for case in [
        "gpt_adamw",
        "gpt_adamw_accum2",
        "llama_gqa_adamw",
        "mlp_adamw",
        "convnet_adamw",
    ] {
        let (eager, _) = train(case, &out, false, &[]);
        let (compiled, err) = train(case, &out, true, &[]);
        // the step really was captured (and so replayed after): the trainer says so once
        assert!(!err.contains("running eagerly"), "{case}: {err}");
        assert_eq!(
            err.matches("train.compile: captured the step:").count(),
            1,
            "{case}: {err}"
        );
        for key in ["loss", "grad_norm"] {
            let (a, b) = (column(&eager, key), column(&compiled, key));
            assert!(a.len() >= 10, "{case}: {} {key} records", a.len());
            assert_eq!(a, b, "{case}: {key}");
        }
    }
}

fn eager_lines(err: &str) -> Vec<&str> {
    err.lines()
        .filter(|l| l.contains("train.compile: running eagerly"))
        .collect()
}

#[test]
fn what_cannot_be_captured_runs_eagerly_saying_why_once() {
    let out = temp_dir("compiled-eager");
    let (metrics, err) = train("gpt_adamw", &out, true, &["model.dropout=0.1"]);
    let lines = eager_lines(&err);
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("dropout"), "{}", lines[0]);
    let (eager, _) = train("gpt_adamw", &out, false, &["model.dropout=0.1"]);
    assert_eq!(column(&metrics, "loss"), column(&eager, "loss"));

    let sets = ["train.compile=true", "parallel.dp=2"];
    let output = train_fixture("gpt_adamw", 2, &out.join("dp2.jsonl"), &[], &sets);
    let err = String::from_utf8_lossy(&output.stderr);
    let lines = eager_lines(&err);
    assert_eq!(lines.len(), 1, "one line, from rank 0: {err}");
    assert!(lines[0].contains("data parallelism"), "{}", lines[0]);
}

#[test]
fn graph_dump_prints_the_captured_step() {
    let c = fixture_config("gpt_adamw");
    let c = c.to_str().unwrap();
    let text = String::from_utf8(weft_ok(&["graph", "dump", "--config", c]).stdout).unwrap();
    let first = text.lines().next().unwrap();
    assert!(first.starts_with("captured ") && first.contains("folded"), "{first}");
    for needle in [
        "input 0 : i64",
        "external : f32",
        "Linear",
        "CrossEntropyBackward",
        "return %",
        "memory plan:",
    ] {
        assert!(text.contains(needle), "{needle:?} in:\n{text}");
    }
    let dot = String::from_utf8(weft_ok(&["graph", "dump", "--config", c, "--format", "dot"]).stdout).unwrap();
    assert!(dot.starts_with("digraph") && dot.trim_end().ends_with('}'), "{dot}");
    fails_with(
        &["graph", "dump", "--config", c, "--format", "svg"],
        &["--format", "svg"],
    );
    fails_with(
        &["graph", "dump", "--config", c, "--set", "model.dropout=0.1"],
        &["cannot be captured", "dropout"],
    );
}
