//! The life of a `weft train` run, through the binary: what it writes to (stdout, stderr) never
//! stops it or loses a checkpoint, problems with its outputs or data are found before its first
//! step, non-finite steps stop it (or are skipped), and sizes no machine can hold are refused
//! with the estimate. (A checkpoint folder's one run: `checkpoint_ownership.rs`.)

mod common;

use std::io::BufRead;
use std::path::Path;
use std::process::Stdio;

use common::{
    fails_with, fixtures, gpt_fixture, path_set, read_metrics, small_run, temp_dir, weft, weft_command, weft_ok,
};

#[test]
fn a_closed_pipe_does_not_stop_the_run() {
    // `weft train 2>&1 | head -2`: both streams into one pipe whose reader leaves after 2 lines
    let out = temp_dir("closed-pipe");
    let (ckpt, metrics) = (path_set("train.checkpoint_dir", &out.join("ckpt")), out.join("m.jsonl"));
    let m = path_set("train.metrics", &metrics);
    #[rustfmt::skip]
    let args = small_run(&["--set", "train.steps=300", "--set", "train.log_every=1", "--set", "train.eval_every=100",
        "--set", "train.sample_tokens=50", "--set", &ckpt, "--set", &m]);
    let (reader, writer) = std::io::pipe().unwrap();
    let mut child = weft_command(&args)
        .stdout(writer.try_clone().unwrap())
        .stderr(writer)
        .spawn()
        .unwrap();
    let mut head = std::io::BufReader::new(reader);
    for _ in 0..2 {
        let mut line = String::new();
        head.read_line(&mut line).unwrap();
    }
    drop(head);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "the run goes on without its readers");
    assert!(weft_train::checkpoint::is_complete(&out.join("ckpt/step-00000300")));
    // the metrics say that output was lost
    let records = read_metrics(&metrics);
    assert_eq!(records.last().unwrap()["step"].as_u64(), Some(300));
    let lost = records.last().unwrap()["lost_output_writes"].as_u64().unwrap_or(0);
    assert!(lost > 0, "{:?}", records.last());
}

#[test]
fn a_full_disk_behind_stdout_or_stderr_does_not_stop_the_run() {
    let out = temp_dir("dev-full");
    let ckpt = path_set("train.checkpoint_dir", &out.join("ckpt"));
    #[rustfmt::skip]
    let args = small_run(&["--set", "train.steps=20", "--set", "train.log_every=1", "--set", "train.sample_tokens=20",
        "--set", &ckpt]);
    for stream in ["stdout", "stderr"] {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let mut cmd = weft_command(&args);
        cmd.arg("--set").arg("train.overwrite=true");
        match stream {
            "stdout" => cmd.stdout(full).stderr(Stdio::piped()),
            _ => cmd.stderr(full).stdout(Stdio::piped()),
        };
        let run = cmd.output().unwrap();
        assert_eq!(run.status.code(), Some(0), "{stream} on /dev/full: {run:?}");
        assert!(
            weft_train::checkpoint::is_complete(&out.join("ckpt/step-00000020")),
            "{stream}"
        );
    }
}

#[test]
fn problems_with_the_outputs_are_found_before_the_first_step() {
    let out = temp_dir("outputs");
    let file = out.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let metrics = out.join("m.jsonl");
    let m = path_set("train.metrics", &metrics);
    let cfg = gpt_fixture();
    let run = |sets: &[&str], needles: &[&str]| {
        let mut args = vec!["train", "--config", &cfg, "--quiet", "--set", &m];
        for s in sets {
            args.extend(["--set", s]);
        }
        fails_with(&args, needles);
        // no step ran (the metrics file may have been opened, but holds no record)
        let records = std::fs::read_to_string(&metrics).unwrap_or_default();
        assert!(
            records.is_empty(),
            "{sets:?}: refused before the first step, but:\n{records}"
        );
        let _ = std::fs::remove_file(&metrics);
    };
    run(
        &[&path_set("train.checkpoint_dir", &file)],
        &["train.checkpoint_dir", "is not a folder"],
    );
    run(
        &[&path_set("train.checkpoint_dir", &file.join("ckpt"))],
        &["train.checkpoint_dir", "cannot create"],
    );
    run(
        &[&path_set("train.trace", &file.join("trace.json"))],
        &["train.trace", "cannot write"],
    );
    run(&[&path_set("train.trace", &out)], &["train.trace", "folder"]);
    // evaluations asked of data with no validation split
    run(
        &["train.eval_every=5"],
        &["train.eval_every = 5", "no validation split"],
    );
}

#[test]
fn a_fifo_named_as_an_output_is_refused_unless_read() {
    let out = temp_dir("fifo-outputs");
    let fifo = out.join("fifo");
    common::mkfifo(&fifo);
    let cfg = gpt_fixture();
    let ckpt = path_set("train.checkpoint_dir", &out.join("ckpt"));
    // a run to resume, its metrics file then replaced by the FIFO
    let first = out.join("first.jsonl");
    weft_ok(&[
        "train",
        "--config",
        &cfg,
        "--quiet",
        "--set",
        "train.steps=2",
        "--set",
        &ckpt,
        "--set",
        &path_set("train.metrics", &first),
    ]);
    let runs: [(&str, Vec<String>); 3] = [
        ("train.trace", vec![path_set("train.trace", &fifo)]),
        ("train.metrics", vec![path_set("train.metrics", &fifo)]),
        (
            "train.metrics",
            vec![path_set("train.metrics", &fifo), ckpt.clone(), "--resume".into()],
        ),
    ];
    for (key, sets) in runs {
        let mut args = vec!["train", "--config", &cfg, "--quiet", "--set", "train.steps=4"];
        for s in &sets {
            if s.starts_with("--") {
                args.push(s);
            } else {
                args.extend(["--set", s]);
            }
        }
        // opening the FIFO for writing would wait for a reader for ever
        let run = common::output_within(weft_command(&args), 60, &format!("{sets:?}"));
        let err = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(1), "{sets:?}: {err}");
        // the trace is written once, at the end: a FIFO is no place for it; the metrics' FIFO
        // is a stream that no process reads
        let why = match key {
            "train.trace" => "a FIFO, not a regular file",
            _ => "a FIFO that no process reads",
        };
        assert!(err.contains(key) && err.contains(why), "{sets:?}: {err}");
    }
    // a FIFO that a process reads is written to: the metrics on a pipe, through /dev/stdout
    let run = weft_command(&[
        "train",
        "--config",
        &cfg,
        "--quiet",
        "--set",
        "train.steps=3",
        "--set",
        "train.log_every=1",
        "--set",
        "train.metrics=\"/dev/stdout\"",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .output()
    .unwrap();
    let out_text = String::from_utf8_lossy(&run.stdout);
    assert_eq!(run.status.code(), Some(0), "{}", String::from_utf8_lossy(&run.stderr));
    let records: Vec<serde_json::Value> = out_text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|v: &serde_json::Value| v.get("step").is_some())
        .collect();
    assert!(records.iter().any(|r| r["step"] == 3), "{out_text}");
}

#[test]
fn problems_with_the_data_are_found_before_the_first_step() {
    let out = temp_dir("data-checks");
    // a validation split too short for one window of block_size characters
    let text = out.join("short.txt");
    std::fs::write(&text, "abcdefghij".repeat(20)).unwrap();
    let t = path_set("data.path", &text);
    let metrics = out.join("m.jsonl");
    let m = path_set("train.metrics", &metrics);
    #[rustfmt::skip]
    fails_with(&small_run(&["--quiet", "--set", &t, "--set", "data.val_fraction=0.05", "--set", "train.eval_every=5",
        "--set", &m]), &["train.eval_every = 5", "validation split cannot give a batch"]);
    assert!(!metrics.exists());
    // a label past the model's classes, named by file, line and value
    let csv = out.join("labels.csv");
    let mut rows = String::from("a,b,label\n");
    for i in 0..20 {
        let label = if i == 13 { 42 } else { i % 3 };
        rows.push_str(&format!("{}.5,{}.25,{label}\n", i % 5, i % 7));
    }
    std::fs::write(&csv, rows).unwrap();
    let cfg = out.join("run.toml");
    std::fs::write(&cfg, csv_config(&csv, 3, 1.0)).unwrap();
    let err = fails_with(
        &["train", "--config", cfg.to_str().unwrap(), "--quiet"],
        &["labels.csv"],
    );
    assert!(
        err.contains(":15: column 3") && err.contains("label 42") && err.contains("3 classes"),
        "{err}"
    );
}

/// A run config for an mlp on a CSV file of two features and `classes` classes.
fn csv_config(csv: &Path, classes: usize, feature_scale: f64) -> String {
    format!(
        "[model]\nkind = \"mlp\"\nin_features = 2\nhidden = [8]\nout_features = {classes}\nactivation = \"relu\"\n\n\
         [data]\nkind = \"csv\"\npath = {:?}\nlabel_column = -1\nbatch_size = 4\nval_fraction = 0.25\n\
         feature_scale = {feature_scale:e}\n\n[optim]\nkind = \"adam\"\nlr = 0.01\n\n[train]\nsteps = 6\nlog_every = 1\n",
        csv.to_str().unwrap()
    )
}

/// A CSV of `rows` rows of two features and a label in `0..classes`.
fn write_csv(path: &Path, rows: usize, classes: usize) {
    let mut text = String::from("x,y,label\n");
    for i in 0..rows {
        text.push_str(&format!(
            "{:.3},{:.3},{}\n",
            (i % 7) as f64 / 7.0,
            (i % 5) as f64 / 5.0,
            i % classes
        ));
    }
    std::fs::write(path, text).unwrap();
}

#[test]
fn non_finite_losses_and_gradients_stop_the_run_or_are_skipped() {
    let out = temp_dir("nonfinite");
    // 8 features of 0 or 16, scaled by 1e38: infinite inputs
    let csv = out.join("d.csv");
    let mut text = String::from("a,b,c,d,e,f,g,h,label\n");
    for i in 0..40 {
        let row: Vec<&str> = (0..8)
            .map(|j| if (i * 7 + j * 3) % 5 == 0 { "16" } else { "0" })
            .collect();
        text.push_str(&format!("{},{}\n", row.join(","), i % 3));
    }
    std::fs::write(&csv, text).unwrap();
    let cfg = out.join("run.toml");
    std::fs::write(
        &cfg,
        csv_config(&csv, 3, 1e38).replace("in_features = 2", "in_features = 8"),
    )
    .unwrap();
    let dir = out.join("ckpt");
    let set = path_set("train.checkpoint_dir", &dir);
    let c = cfg.to_str().unwrap();
    fails_with(
        &["train", "--config", c, "--quiet", "--set", &set],
        &["step 1:", "is NaN", "train.skip_nonfinite = true"],
    );
    assert!(
        weft_train::checkpoint::list(&dir).unwrap().is_empty(),
        "no checkpoint of NaN weights"
    );
    // skipped: every step counted, and the checkpoint holds the finite initial weights
    let metrics = out.join("m.jsonl");
    let m = path_set("train.metrics", &metrics);
    #[rustfmt::skip]
    weft_ok(&["train", "--config", c, "--quiet", "--set", &set, "--set", &m, "--set", "train.skip_nonfinite=true",
        "--set", "train.overwrite=true"]);
    let records = read_metrics(&metrics);
    assert_eq!(
        records.last().unwrap()["skipped_steps"].as_u64(),
        Some(6),
        "{records:?}"
    );
    assert!(records.iter().all(|r| r["skipped"] == serde_json::json!(true)));
    let saved = weft_train::checkpoint::read(&dir.join("step-00000006")).unwrap();
    for (name, t) in &saved.params {
        assert!(t.to_vec_f64().iter().all(|v| v.is_finite()), "{name}");
    }
}

#[test]
fn the_digits_at_feature_scale_1e38_stop_naming_the_first_non_finite_gradient() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    if !repo.join("../shared/data/digits.csv.gz").exists() {
        eprintln!("skipped: ../shared/data/digits.csv.gz is absent");
        return;
    }
    let cfg = repo.join("examples/digits_mlp.toml");
    // the loss stays finite (the ReLUs turn the NaN pre-activations into zeros), the gradients do not
    fails_with(
        &[
            "train",
            "--config",
            cfg.to_str().unwrap(),
            "--quiet",
            "--set",
            "data.feature_scale=1e38",
        ],
        &[
            "step 1: the gradient norm is NaN",
            "the gradient of layers.0.weight holds NaN",
        ],
    );
}

#[test]
fn classification_runs_log_accuracy_and_progress_shows_the_time_left() {
    let out = temp_dir("accuracy");
    let csv = out.join("d.csv");
    write_csv(&csv, 40, 3);
    let cfg = out.join("run.toml");
    std::fs::write(&cfg, csv_config(&csv, 3, 1.0)).unwrap();
    let metrics = out.join("m.jsonl");
    let m = path_set("train.metrics", &metrics);
    #[rustfmt::skip]
    let run = weft_ok(&["train", "--config", cfg.to_str().unwrap(), "--set", &m, "--set", "train.eval_every=3"]);
    let evals: Vec<f64> = read_metrics(&metrics)
        .iter()
        .filter_map(|r| r["val_accuracy"].as_f64())
        .collect();
    assert_eq!(evals.len(), 2, "after steps 3 and 6");
    assert!(evals.iter().all(|a| (0.0..=1.0).contains(a)), "{evals:?}");
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains("val accuracy"), "{err}");
    // steps numbered from 1, as in the metrics file and the checkpoint names; the time left
    // from the second step on
    assert!(err.contains("step      1/6 |"), "{err}");
    assert!(err.contains("step      6/6 |") && err.contains("| eta 0s"), "{err}");
}

#[test]
fn paths_given_with_set_resolve_against_the_working_directory() {
    let out = temp_dir("cwd");
    let cwd = out.join("here");
    std::fs::create_dir_all(&cwd).unwrap();
    let run = weft_command(&[
        "train",
        "--config",
        &gpt_fixture(),
        "--quiet",
        "--set",
        "train.steps=2",
        "--set",
        "train.metrics=m.jsonl",
        "--set",
        "train.checkpoint_dir=ckpt",
    ])
    .current_dir(&cwd)
    .output()
    .unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert_eq!(read_metrics(&cwd.join("m.jsonl")).len(), 2);
    assert!(weft_train::checkpoint::is_complete(&cwd.join("ckpt/step-00000002")));
    assert!(!fixtures().join("gpt_adamw/m.jsonl").exists());
}

#[test]
fn unset_removes_a_key_the_new_optimizer_does_not_take() {
    let cfg = fixtures().join("mlp_sgd/run.toml");
    let cfg = cfg.to_str().unwrap();
    #[rustfmt::skip]
    fails_with(&["train", "--config", cfg, "--quiet", "--set", "optim.kind=adam", "--set", "train.steps=2"],
        &["optim.momentum"]);
    #[rustfmt::skip]
    weft_ok(&["train", "--config", cfg, "--quiet", "--unset", "optim.momentum", "--unset", "optim.nesterov",
        "--set", "optim.kind=adam", "--set", "train.steps=2"]);
    fails_with(
        &["train", "--config", cfg, "--quiet", "--unset", "optim.betas"],
        &["--unset", "optim.betas", "no key betas"],
    );
}

#[test]
fn impossible_sizes_are_refused_with_the_estimate() {
    // each would need terabytes: refused before anything is allocated, with the estimate (a
    // single buffer too large for the machine is an error of its own, tested in weft-core's
    // alloc_errors.rs)
    for (set, what) in [
        ("data.batch_size=100000000", "activations 223.8 TB"),
        ("model.block_size=100000000", "parameters 51.2 GB"),
        ("model.n_embd=65536", "parameters 824.7 GB"),
    ] {
        let out = weft(&["train", "--quiet", "--set", set]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{set}: {err}");
        assert_eq!(err.lines().count(), 1, "{set}: one line: {err}");
        for n in ["weft: error: ", "needs about", "per rank", "available", what] {
            assert!(err.contains(n), "{set}: {n:?} in {err}");
        }
    }
}

#[test]
fn a_thread_count_over_the_limit_or_malformed_is_one_error_line() {
    for (value, why) in [
        ("100000", "is more than the limit of 1024 compute threads"),
        ("0", "is not a positive integer"),
        ("many", "is not a positive integer"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_weft"))
            .args(["train", "--quiet", "--set", "train.steps=1"])
            .env("WEFT_TRACK_DIR", common::test_runs_dir())
            .env("WEFT_NUM_THREADS", value)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(
            err.contains(&format!("weft: error: WEFT_NUM_THREADS={value:?} {why}")),
            "{err}"
        );
    }
}

#[test]
fn a_text_without_new_lines_samples_from_its_first_character() {
    let out = temp_dir("no-newline");
    let text = out.join("t.txt");
    std::fs::write(&text, "abcabcabd".repeat(300)).unwrap();
    let t = path_set("data.path", &text);
    #[rustfmt::skip]
    let run = weft_ok(&small_run(&["--quiet", "--set", &t, "--set", "train.steps=3", "--set", "train.sample_tokens=20"]));
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(stdout.contains("--- sample (20 characters) ---\na"), "{stdout}");
}
