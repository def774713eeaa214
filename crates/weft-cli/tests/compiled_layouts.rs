//! Compiled mode on parallel layouts, through `weft launch` on 2 ranks: data parallelism and
//! ZeRO stages 1 and 2 are captured and log the eager run's losses and gradient norms bit for
//! bit (with and without gradient accumulation); tensor parallelism and ZeRO stage 3 run
//! eagerly with one line saying why.

mod common;

use std::path::{Path, PathBuf};

use common::{path_set, read_metrics, temp_dir, train_fixture};

/// Steps of every run: enough for the Adam moments and the warmup to move every step's update.
const STEPS: usize = 8;

/// Trains the gpt fixture (2 layers, 32 wide, blocks of 16) on 2 ranks with `compile` on or off
/// and the `layout` `--set`s; returns the metrics file and stderr.
fn train(out: &Path, tag: &str, compile: bool, layout: &[&str]) -> (PathBuf, String) {
    let metrics = out.join(format!("{tag}-{compile}.jsonl"));
    let mut sets = vec![format!("train.compile={compile}"), format!("train.steps={STEPS}")];
    sets.extend(layout.iter().map(|s| s.to_string()));
    let output = train_fixture("gpt_adamw", 2, &metrics, &[], &sets);
    (metrics, String::from_utf8_lossy(&output.stderr).to_string())
}

/// `(loss, grad_norm)` of every step record.
fn records(metrics: &Path) -> Vec<(f64, f64)> {
    read_metrics(metrics)
        .iter()
        .filter_map(|r| Some((r.get("loss")?.as_f64()?, r.get("grad_norm")?.as_f64()?)))
        .collect()
}

fn eager_lines(err: &str) -> Vec<&str> {
    err.lines()
        .filter(|l| l.contains("train.compile: running eagerly"))
        .collect()
}

/// Eager and compiled runs of `layout`: the compiled one was captured (and so replayed at the
/// later steps), and both log the same losses and gradient norms, bit for bit.
fn same_as_eager(out: &Path, tag: &str, layout: &[&str]) {
    let (eager, _) = train(out, tag, false, layout);
    let (compiled, err) = train(out, tag, true, layout);
    assert!(eager_lines(&err).is_empty(), "{tag}: {err}");
    assert_eq!(
        err.matches("train.compile: captured the step:").count(),
        1,
        "{tag}: one line, from rank 0: {err}"
    );
    let (a, b) = (records(&eager), records(&compiled));
    assert_eq!(a.len(), STEPS, "{tag}: {a:?}");
    assert_eq!(
        a, b,
        "{tag}: eager (left) and compiled (right) (loss, grad_norm) per step"
    );
}

#[test]
fn data_parallel_compiled_logs_the_eager_losses_bit_for_bit() {
    let out = temp_dir("compiled-dp");
    same_as_eager(&out, "dp2", &["parallel.dp=2"]);
    // the gradients are kept locally over the first micro-batch, averaged after the second
    same_as_eager(&out, "dp2-accum2", &["parallel.dp=2", "train.grad_accum=2"]);
}

#[test]
fn zero_stages_1_and_2_compiled_log_the_eager_losses_bit_for_bit() {
    let out = temp_dir("compiled-zero");
    for stage in [1, 2] {
        let zero = format!("parallel.zero={stage}");
        same_as_eager(&out, &format!("zero{stage}"), &["parallel.dp=2", &zero]);
        // stage 2 reduce-scatters each micro-batch's gradients and adds the shards
        let accum = ["parallel.dp=2", &zero, "train.grad_accum=2"];
        same_as_eager(&out, &format!("zero{stage}-accum2"), &accum);
    }
}

/// Rank 0's spans of a run's trace: `(name, start µs, end µs)`.
fn rank0_spans(trace: &Path) -> Vec<(String, f64, f64)> {
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(trace).unwrap()).unwrap();
    doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["pid"] == 0 && e["ph"] == "X")
        .map(|e| {
            let ts = e["ts"].as_f64().unwrap();
            (
                e["name"].as_str().unwrap().to_string(),
                ts,
                ts + e["dur"].as_f64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn replayed_steps_start_their_gradient_reductions_during_backward() {
    let out = temp_dir("compiled-overlap");
    // small buckets, so that the first ones fill early in backward
    let buckets = ["parallel.first_bucket_mb=0.001", "parallel.bucket_cap_mb=0.001"];
    for (tag, zero, accum, reduction) in [
        ("dp2", 0, 1, "launch all_reduce"),
        ("dp2-accum2", 0, 2, "launch all_reduce"),
        ("zero1", 1, 1, "launch all_reduce"),
        ("zero2", 2, 1, "launch reduce_scatter"),
        ("zero2-accum2", 2, 2, "launch reduce_scatter"),
    ] {
        let trace = out.join(format!("{tag}.json"));
        let mut layout = vec![
            "parallel.dp=2".to_string(),
            format!("parallel.zero={zero}"),
            format!("train.grad_accum={accum}"),
            path_set("train.trace", &trace),
        ];
        layout.extend(buckets.iter().map(|s| s.to_string()));
        let layout: Vec<&str> = layout.iter().map(String::as_str).collect();
        let (_, err) = train(&out, tag, true, &layout);
        assert!(err.contains("captured the step"), "{tag}: {err}");
        let spans = rank0_spans(&trace);
        let named = |name: &str| -> Vec<(f64, f64)> {
            spans
                .iter()
                .filter(|(n, ..)| n == name)
                .map(|(_, s, e)| (*s, *e))
                .collect()
        };
        let (steps, passes) = (named("step"), named("compiled forward and backward"));
        assert_eq!((steps.len(), passes.len()), (STEPS, STEPS * accum), "{tag}");
        // the first step captured the graph (its first backward ran eagerly, without hooks);
        // in every later step the last micro-batch's replay (at ZeRO-2 every one) starts
        // reductions before it ends (without handing the gradients over, all would start
        // after it, in `gradient sync` or `accumulate`)
        for (step, (s0, s1)) in steps.iter().enumerate().skip(1) {
            let mine: Vec<&(f64, f64)> = passes.iter().filter(|(s, e)| s >= s0 && e <= s1).collect();
            assert_eq!(mine.len(), accum, "{tag}: step {}", step + 1);
            let reducing = if zero == 2 { &mine[..] } else { &mine[accum - 1..] };
            for (j, (start, end)) in reducing.iter().enumerate() {
                let early = spans
                    .iter()
                    .filter(|(n, s, _)| n == reduction && s > start && s < end)
                    .count();
                assert!(early > 0, "{tag}: step {}: no {reduction} during replay {j}", step + 1);
            }
        }
    }
}

#[test]
fn tensor_parallelism_and_zero_3_run_eagerly_saying_why_once() {
    let out = temp_dir("compiled-eager-layouts");
    for (tag, layout, why) in [
        (
            "tp2",
            ["parallel.tp=2"].as_slice(),
            "tensor parallelism is not captured yet",
        ),
        (
            "zero3",
            ["parallel.dp=2", "parallel.zero=3"].as_slice(),
            "ZeRO stage 3 is not captured yet",
        ),
    ] {
        let (compiled, err) = train(&out, tag, true, layout);
        let lines = eager_lines(&err);
        assert_eq!(lines.len(), 1, "{tag}: one line, from rank 0: {err}");
        assert!(lines[0].contains(why), "{tag}: {}", lines[0]);
        assert!(!err.contains("captured the step"), "{tag}: {err}");
        assert_eq!(records(&compiled).len(), STEPS, "{tag}");
    }
}
