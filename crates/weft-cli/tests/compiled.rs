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
    for (case, extra) in [
        ("gpt_adamw", None),
        ("gpt_adamw_accum2", None),
        ("gpt_adamw_accum2", Some("train.precision=bf16")),
        ("llama_gqa_adamw", None),
        ("llama_gqa_adamw", Some("train.grad_accum=3")),
        ("mlp_adamw", None),
        ("convnet_adamw", None),
    ] {
        let extra: Vec<&str> = extra.into_iter().collect();
        let (eager, _) = train(case, &out, false, &extra);
        let (compiled, err) = train(case, &out, true, &extra);
        let case = format!("{case} {extra:?}");
        // the step really was captured (and so replayed after): the trainer says so once. From
        // the second step on, the last micro-batch's forward and backward, clipping and the
        // update are one graph (the first step makes the optimizer's state); the micro-batch
        // graph runs the first step and, with two micro-batches, every first one (llama's is first
        // captured at its second call, its rotary tables made at the first: there, by then, the
        // whole step)
        assert!(!err.contains("running eagerly"), "{case}: {err}");
        let whole = err
            .matches("train.compile: captured the whole step (forward, backward, clipping and the optimizer's update):")
            .count();
        let micro = err.matches("train.compile: captured the step:").count();
        let want = match case.as_str() {
            "llama_gqa_adamw []" => (1, 0),
            _ => (1, 1),
        };
        assert_eq!((whole, micro), want, "{case}: {err}");
        for key in ["loss", "grad_norm"] {
            let (a, b) = (column(&eager, key), column(&compiled, key));
            assert!(a.len() >= 10, "{case}: {} {key} records", a.len());
            assert_eq!(a, b, "{case}: {key}");
        }
    }
}

#[test]
fn the_whole_step_skips_non_finite_steps_as_eager_mode_does() {
    let out = temp_dir("compiled-nonfinite");
    // at this learning rate the first update overflows the weights: every later loss is NaN
    let sets = ["optim.lr=1e37", "train.skip_nonfinite=true"];
    let fields = |m: &Path| -> Vec<String> {
        read_metrics(m)
            .iter()
            .filter(|r| r.get("step_ms").is_some())
            .map(|r| {
                format!(
                    "{} {} {} {}",
                    r["loss"], r["grad_norm"], r["skipped"], r["skipped_steps"]
                )
            })
            .collect()
    };
    // with two micro-batches, the earlier one's loss is an input of the last one's graph
    for case in ["gpt_adamw", "gpt_adamw_accum2"] {
        let (eager, _) = train(case, &out, false, &sets);
        let (compiled, err) = train(case, &out, true, &sets);
        assert!(err.contains("captured the whole step"), "{case}: {err}");
        let (a, b) = (fields(&eager), fields(&compiled));
        // (the first update runs at the warm-up's learning rate of 0)
        assert!(
            a.len() >= 10 && a[..3].iter().any(|r| r.contains("true")),
            "{case}: {a:?}"
        );
        assert_eq!(a, b, "{case}");
    }
    // without skipping, the run stops at the first NaN, as eagerly
    let metrics = out.join("stops.jsonl");
    let m = common::path_set("train.metrics", &metrics);
    let config = fixture_config("gpt_adamw");
    #[rustfmt::skip]
    fails_with(
        &["train", "--config", config.to_str().unwrap(), "--quiet", "--set", "train.compile=true",
          "--set", "optim.lr=1e37", "--set", &m],
        &["step 2:", "NaN", "train.skip_nonfinite = true"],
    );
}

#[test]
fn a_compiled_run_resumed_from_a_checkpoint_logs_the_uninterrupted_losses() {
    let out = temp_dir("compiled-resume");
    let config = fixture_config("gpt_adamw");
    let c = config.to_str().unwrap();
    let run = |steps: usize, resume: bool, tag: &str| -> (Vec<String>, String) {
        let metrics = out.join(format!("{tag}.jsonl"));
        let _ = std::fs::remove_file(&metrics);
        let (m, d) = (
            common::path_set("train.metrics", &metrics),
            common::path_set("train.checkpoint_dir", &out.join(format!("ckpt-{tag}"))),
        );
        let steps = format!("train.steps={steps}");
        #[rustfmt::skip]
        let mut args = vec!["train", "--config", c, "--quiet", "--set", "train.compile=true", "--set", &steps,
            "--set", "train.checkpoint_every=6", "--set", &m, "--set", &d];
        if resume {
            args.push("--resume");
        }
        let o = common::weft_command(&args).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let rows = read_metrics(&metrics)
            .iter()
            .filter(|r| r.get("step_ms").is_some())
            .map(|r| format!("{} {} {}", r["step"], r["loss"], r["grad_norm"]))
            .collect();
        (rows, String::from_utf8_lossy(&o.stderr).to_string())
    };
    let (whole, _) = run(12, false, "a");
    // the same run stopped after step 6, then resumed: the restored optimizer state is checked
    // by one eager update, then the whole step is captured again
    let (first, _) = run(6, false, "b");
    std::fs::rename(out.join("ckpt-b"), out.join("ckpt-c")).unwrap();
    let (rest, err) = run(12, true, "c");
    assert!(err.contains("captured the whole step"), "{err}");
    assert_eq!(first, whole[..6]);
    assert_eq!(rest, whole[6..]);
}

fn eager_lines(err: &str) -> Vec<&str> {
    err.lines()
        .filter(|l| l.contains("train.compile: running eagerly"))
        .collect()
}

#[test]
fn dropout_is_replayed_with_new_masks_bit_for_bit() {
    let out = temp_dir("compiled-dropout");
    for case in ["gpt_adamw", "gpt_adamw_accum2"] {
        let (compiled, err) = train(case, &out, true, &["model.dropout=0.1"]);
        assert!(eager_lines(&err).is_empty(), "{err}");
        assert!(err.contains("train.compile: captured the step:"), "{err}");
        let compiled = ["loss", "grad_norm"].map(|key| column(&compiled, key));
        let (eager, _) = train(case, &out, false, &["model.dropout=0.1"]);
        let eager = ["loss", "grad_norm"].map(|key| column(&eager, key));
        assert!(eager[0].len() >= 10, "{case}");
        assert_eq!(compiled, eager, "{case}");
        // the masks are drawn: the run is not the run without dropout
        let (plain, _) = train(case, &out, false, &[]);
        assert_ne!(eager[0], column(&plain, "loss"));
    }
}

#[test]
fn what_cannot_be_captured_runs_eagerly_saying_why_once() {
    let out = temp_dir("compiled-eager");

    // data parallelism and ZeRO stages 1 and 2 are captured (tests/compiled_layouts.rs); stage 3
    // is not
    let sets = ["train.compile=true", "parallel.dp=2", "parallel.zero=3"];
    let output = train_fixture("gpt_adamw", 2, &out.join("zero3.jsonl"), &[], &sets);
    let err = String::from_utf8_lossy(&output.stderr);
    let lines = eager_lines(&err);
    assert_eq!(lines.len(), 1, "one line, from rank 0: {err}");
    assert!(lines[0].contains("ZeRO stage 3"), "{}", lines[0]);
}

#[test]
fn graph_dump_prints_the_captured_step() {
    let c = fixture_config("gpt_adamw");
    let c = c.to_str().unwrap();
    let text = String::from_utf8(weft_ok(&["graph", "dump", "--config", c]).stdout).unwrap();
    let mut lines = text.lines();
    let (title, first) = (lines.next().unwrap(), lines.next().unwrap());
    assert!(title.starts_with("the whole step"), "{title}");
    assert!(first.starts_with("captured ") && first.contains("folded"), "{first}");
    for needle in [
        "input 0 : i64",
        "external : f32",
        "Linear",
        "CrossEntropyBackward",
        "CustomOp(grad_norm)",
        "CustomOp(adam_update)",
        "return %",
        "memory plan:",
    ] {
        assert!(text.contains(needle), "{needle:?} in:\n{text}");
    }
    // one graph a step: the micro-batch graph only runs the first step
    assert_eq!(text.matches("memory plan:").count(), 1, "{text}");
    // with accumulation, also the graph of the earlier micro-batches, which has no update
    let accum = fixture_config("gpt_adamw_accum2");
    let text = String::from_utf8(weft_ok(&["graph", "dump", "--config", accum.to_str().unwrap()]).stdout).unwrap();
    let (whole, micro) = text.split_once("\neach earlier micro-batch").expect("two graphs");
    assert!(
        whole.contains("CustomOp(adam_update)") && whole.contains("memory plan:"),
        "{whole}"
    );
    assert!(!micro.contains("CustomOp") && micro.contains("memory plan:"), "{micro}");
    // SGD's update node
    let sgd = fixture_config("gpt_sgd");
    let sgd = weft_ok(&["graph", "dump", "--config", sgd.to_str().unwrap()]).stdout;
    assert!(String::from_utf8_lossy(&sgd).contains("CustomOp(sgd_update)"));
    let dot = String::from_utf8(weft_ok(&["graph", "dump", "--config", c, "--format", "dot"]).stdout).unwrap();
    assert!(dot.starts_with("digraph") && dot.trim_end().ends_with('}'), "{dot}");
    fails_with(
        &["graph", "dump", "--config", c, "--format", "svg"],
        &["--format", "svg"],
    );
    let with_dropout = weft_ok(&["graph", "dump", "--config", c, "--set", "model.dropout=0.1"]).stdout;
    assert!(String::from_utf8_lossy(&with_dropout).contains("Dropout"));
}

#[test]
fn autotune_search_tunes_the_compiled_step_and_keeps_its_choices() {
    let out = temp_dir("compiled-autotune");
    let cache = out.join("cache");
    let c = fixture_config("convnet_adamw");
    let c = c.to_str().unwrap();
    let metrics = out.join("m.jsonl");
    let set_metrics = common::path_set("train.metrics", &metrics);
    let run = |extra: &[&str]| {
        let mut args = vec![
            "train",
            "--config",
            c,
            "--quiet",
            "--set",
            &set_metrics,
            "--set",
            "train.overwrite=true",
        ];
        for e in extra {
            args.extend(["--set", e]);
        }
        let o = common::weft_command(&args)
            .env("WEFT_CACHE_DIR", &cache)
            .output()
            .unwrap();
        (o.status.code(), String::from_utf8_lossy(&o.stderr).to_string())
    };
    let search = ["train.compile=true", "train.autotune=\"search\""];
    let (code, err) = run(&search);
    assert_eq!(code, Some(0), "{err}");
    let line = err
        .lines()
        .find(|l| l.contains("train.autotune: searched"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(!line.contains("searched 0 kernel calls"), "{line}");
    let files: Vec<_> = std::fs::read_dir(&cache).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(std::fs::read_to_string(&files[0]).unwrap().contains("conv2d f32 n="));
    // the next run starts from the file and searches nothing
    let (code, err) = run(&search);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("train.autotune: searched 0 kernel calls"), "{err}");
    // a damaged file is named, ignored and rewritten
    std::fs::write(&files[0], "{").unwrap();
    let (code, err) = run(&search);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("warning: train.autotune") && err.contains("not JSON"),
        "{err}"
    );
    assert!(std::fs::read_to_string(&files[0]).unwrap().contains("weft-autotune-2"));
    // refusals
    fails_with(
        &["train", "--config", c, "--set", "train.autotune=\"search\""],
        &["train.autotune", "train.compile = true"],
    );
    fails_with(
        &[
            "train",
            "--config",
            c,
            "--set",
            "train.compile=true",
            "--set",
            "train.autotune=\"fast\"",
        ],
        &["train.autotune", "\"fast\""],
    );
    // weft graph tune prints a table per kernel
    let o = common::weft_command(&["graph", "tune", "--config", c, "--fresh"])
        .env("WEFT_CACHE_DIR", &cache)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && text.contains("conv2d\n| call | heuristic ms | choice |"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// The "peak live X MiB" of a `weft graph dump`'s memory plan line, in MiB.
fn planned_peak(dump: &str) -> f64 {
    let line = dump.lines().find(|l| l.starts_with("memory plan:")).unwrap();
    let after = line.split("peak live ").nth(1).unwrap();
    after.split(' ').next().unwrap().parse().unwrap()
}

#[test]
fn recomputation_keeps_the_losses_and_lowers_the_planned_peak() {
    let out = temp_dir("compiled-recompute");
    for case in ["gpt_adamw", "llama_gqa_adamw"] {
        // on by default: the capture line says what it recomputed
        let (on, err) = train(case, &out, true, &[]);
        assert!(err.contains("activations recomputed in the backward"), "{case}: {err}");
        let (off, err_off) = train(case, &out, true, &["train.compile_recompute=false"]);
        assert!(!err_off.contains("recomputed"), "{case}: {err_off}");
        for key in ["loss", "grad_norm"] {
            assert_eq!(column(&on, key), column(&off, key), "{case}: {key}");
        }
        // each step's peak of tensor bytes holds at least the model state it logs
        for r in read_metrics(&on).iter().filter(|r| r.get("loss").is_some()) {
            let s = &r["state_bytes"];
            let state: u64 = ["params", "grads", "optimizer"]
                .iter()
                .map(|k| s[k].as_u64().unwrap())
                .sum();
            let peak = r["host_mem_bytes"].as_u64().unwrap_or(0);
            assert!(
                peak >= state,
                "{case}: host_mem_bytes {peak} below the state {state}: {r}"
            );
        }
        let c = fixture_config(case);
        let c = c.to_str().unwrap();
        let dump = |extra: &[&str]| {
            let mut args = vec!["graph", "dump", "--config", c];
            args.extend_from_slice(extra);
            String::from_utf8(weft_ok(&args).stdout).unwrap()
        };
        let (with, without) = (dump(&[]), dump(&["--set", "train.compile_recompute=false"]));
        let captured = |dump: &str| dump.lines().find(|l| l.starts_with("captured ")).unwrap().to_string();
        assert!(captured(&with).contains("recomputed"), "{case}: {with}");
        assert!(!captured(&without).contains("recomputed"), "{case}: {without}");
        assert!(
            planned_peak(&with) < planned_peak(&without),
            "{case}: planned peak {} MiB with recomputation, {} without",
            planned_peak(&with),
            planned_peak(&without)
        );
    }
}

#[test]
#[cfg(unix)]
fn an_autotune_cache_that_is_no_regular_file_is_ignored_and_replaced() {
    // a FIFO there hung the run at its tuning replay (step 2), deaf to SIGTERM; a link to
    // /dev/zero was read until memory ran out
    let out = temp_dir("compiled-autotune-special");
    let cache = out.join("cache");
    let c = fixture_config("convnet_adamw");
    let metrics = common::path_set("train.metrics", &out.join("m.jsonl"));
    let run = || {
        let args = [
            "train",
            "--config",
            c.to_str().unwrap(),
            "--quiet",
            "--set",
            &metrics,
            "--set",
            "train.overwrite=true",
            "--set",
            "train.steps=3",
            "--set",
            "train.compile=true",
            "--set",
            "train.autotune=\"search\"",
        ];
        let mut child = common::weft_command(&args)
            .env("WEFT_CACHE_DIR", &cache)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("weft train: still running after 60 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        assert!(o.status.success(), "{err}");
        err
    };
    run();
    let files: Vec<_> = std::fs::read_dir(&cache).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let file = &files[0];
    for (what, why) in [
        ("a FIFO", "is a FIFO, not a regular file"),
        ("/dev/zero", "is a character device"),
    ] {
        std::fs::remove_file(file).unwrap();
        if what == "a FIFO" {
            let made = std::process::Command::new("mkfifo").arg(file).status().unwrap();
            assert!(made.success());
        } else {
            std::os::unix::fs::symlink("/dev/zero", file).unwrap();
        }
        let err = run();
        assert!(
            err.contains("warning: train.autotune")
                && err.contains(why)
                && err.contains("ignored and will be rewritten"),
            "{what}: {err}"
        );
        // searched again, and written as a regular file in its place
        assert!(!err.contains("searched 0 kernel calls"), "{what}: {err}");
        assert!(std::fs::symlink_metadata(file).unwrap().file_type().is_file(), "{what}");
        assert!(
            std::fs::read_to_string(file).unwrap().contains("conv2d f32 n="),
            "{what}"
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}
