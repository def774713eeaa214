//! A checkpoint folder belongs to one run, through the binary: a new run is refused where another
//! run's checkpoints or metrics are (and replaces them with `train.overwrite`), pruning keeps
//! other runs' checkpoints, a folder in use is refused naming its holder and freed when it dies,
//! a save on a full disk leaves no temporary folder, `--resume` says what it does, and a run
//! refused before it starts removes nothing with `train.overwrite`.

mod common;

use std::process::Stdio;

use common::{
    fails_with, gpt_fixture, names, path_set, read_metrics, small_run, temp_dir, wait_for, weft, weft_command, weft_ok,
    KillOnDrop,
};

#[test]
fn a_checkpoint_folder_holds_one_runs_checkpoints() {
    let out = temp_dir("one-run");
    let dir = out.join("ckpt");
    let set = path_set("train.checkpoint_dir", &dir);
    let first = out.join("first.jsonl");
    let m1 = path_set("train.metrics", &first);
    let cfg = gpt_fixture();
    #[rustfmt::skip]
    weft_ok(&["train", "--config", &cfg, "--quiet", "--set", "train.steps=10", "--set", "train.checkpoint_every=5",
        "--set", &set, "--set", &m1]);
    let before = names(&dir);
    let first_text = std::fs::read_to_string(&first).unwrap();
    // a new run into the same folder is refused, naming what is there and the ways out
    let second = out.join("second.jsonl");
    let m2 = path_set("train.metrics", &second);
    #[rustfmt::skip]
    fails_with(&["train", "--config", &cfg, "--quiet", "--set", "train.steps=3", "--set", &set, "--set", &m2],
        &["holds checkpoints of another run", "step-00000005", "--resume", "train.overwrite"]);
    assert_eq!(names(&dir), before, "nothing removed");
    assert!(!second.exists(), "refused before its first step");
    // so is a new run into another run's metrics file, which stays as it was
    let other = path_set("train.checkpoint_dir", &out.join("other"));
    #[rustfmt::skip]
    fails_with(&["train", "--config", &cfg, "--quiet", "--set", "train.steps=3", "--set", &other, "--set", &m1],
        &["train.metrics", "another run's records"]);
    assert_eq!(std::fs::read_to_string(&first).unwrap(), first_text);
    // with train.overwrite the new run removes the old checkpoints and replaces the metrics
    #[rustfmt::skip]
    let run = weft_ok(&["train", "--config", &cfg, "--quiet", "--set", "train.steps=3", "--set", &set, "--set", &m1,
        "--set", "train.overwrite=true"]);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        err.contains("removed 3 checkpoint folder(s)") || err.contains("removed 2 checkpoint folder(s)"),
        "{err}"
    );
    assert_eq!(names(&dir), [".lock", "step-00000003"]);
    assert_eq!(read_metrics(&first).len(), 3);
}

#[test]
fn pruning_keeps_other_runs_checkpoints() {
    let out = temp_dir("prune");
    let cfg = gpt_fixture();
    // another run's checkpoint, copied in beside this run's (as a person might)
    let other = out.join("other");
    let o = path_set("train.checkpoint_dir", &other);
    weft_ok(&[
        "train",
        "--config",
        &cfg,
        "--quiet",
        "--set",
        "train.steps=2",
        "--set",
        &o,
    ]);
    let dir = out.join("ckpt");
    let set = path_set("train.checkpoint_dir", &dir);
    #[rustfmt::skip]
    weft_ok(&["train", "--config", &cfg, "--quiet", "--set", "train.steps=4", "--set", "train.checkpoint_every=2",
        "--set", "train.keep_checkpoints=1", "--set", &set]);
    let foreign = dir.join("step-00000001");
    std::fs::create_dir_all(&foreign).unwrap();
    for f in std::fs::read_dir(other.join("step-00000002")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, foreign.join(f.file_name().unwrap())).unwrap();
    }
    #[rustfmt::skip]
    weft_ok(&["train", "--config", &cfg, "--quiet", "--resume", "--set", "train.steps=8",
        "--set", "train.checkpoint_every=2", "--set", "train.keep_checkpoints=1", "--set", &set]);
    assert_eq!(names(&dir), [".lock", "step-00000001", "step-00000008"]);
}

#[test]
fn a_folder_in_use_is_refused_naming_its_holder_and_freed_when_it_dies() {
    let out = temp_dir("in-use");
    let set = path_set("train.checkpoint_dir", &out.join("ckpt"));
    let metrics = out.join("m.jsonl");
    let m = path_set("train.metrics", &metrics);
    #[rustfmt::skip]
    let mut first = KillOnDrop(weft_command(&small_run(&["--quiet", "--set", "train.steps=1000000",
        "--set", "train.log_every=1", "--set", &set, "--set", &m]))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap());
    assert!(
        wait_for(120, || common::last_logged_step(&metrics) > 0),
        "the first run started"
    );
    #[rustfmt::skip]
    let err = fails_with(&small_run(&["--quiet", "--resume", "--set", "train.steps=5", "--set", &set]),
        &["is in use by another run", &format!("pid {}", first.0.id())]);
    assert!(err.contains("took it"), "{err}");
    // killed, it leaves no stale lock: the folder can be resumed at once
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    #[rustfmt::skip]
    weft_ok(&small_run(&["--quiet", "--resume", "--set", "train.steps=5", "--set", &set]));
}

#[test]
fn a_failed_save_leaves_no_temporary_folder_and_metrics_keep_whole_lines() {
    use std::os::unix::process::CommandExt;
    let out = temp_dir("full-disk");
    let dir = out.join("ckpt");
    let metrics = out.join("m.jsonl");
    let set = path_set("train.checkpoint_dir", &dir);
    let m = path_set("train.metrics", &metrics);
    let cfg = gpt_fixture();
    // a disk that fills up: files may not grow past 6000 bytes (a checkpoint file needs more;
    // the metrics file reaches it after some 20 records)
    let limited = |args: &[&str]| {
        let mut cmd = weft_command(args);
        // SAFETY: setrlimit and signal are async-signal-safe; nothing else runs in the child.
        unsafe {
            cmd.pre_exec(|| {
                let lim = libc::rlimit {
                    rlim_cur: 6000,
                    rlim_max: 6000,
                };
                libc::setrlimit(libc::RLIMIT_FSIZE, &lim);
                // a write past the limit fails with EFBIG instead of killing the process
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                Ok(())
            });
        }
        cmd.output().unwrap()
    };
    let run = limited(&["train", "--config", &cfg, "--quiet", "--set", &m, "--set", &set]);
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{err}");
    assert!(err.contains("safetensors"), "the failed file is named: {err}");
    assert!(
        err.contains("cannot write to") && err.contains("m.jsonl"),
        "the metrics warning: {err}"
    );
    assert_eq!(names(&dir), [".lock"], "no temporary folder left");
    let text = std::fs::read_to_string(&metrics).unwrap();
    assert!(text.len() <= 6000 && text.ends_with('\n'), "{} bytes", text.len());
    for line in text.lines() {
        serde_json::from_str::<serde_json::Value>(line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    }
}

#[test]
fn resume_says_what_it_does_and_refuses_other_text() {
    let out = temp_dir("resume-says");
    // nothing to resume: one line, and the run starts at step 0
    let missing = path_set("train.checkpoint_dir", &out.join("not-yet"));
    // records already in the metrics file (of an attempt killed before its first checkpoint, or
    // of another run) are kept beside it
    let metrics = out.join("m.jsonl");
    std::fs::write(&metrics, "{\"step\": 1, \"loss\": 9.0}\n").unwrap();
    let m = path_set("train.metrics", &metrics);
    #[rustfmt::skip]
    let run = weft_ok(&small_run(&["--quiet", "--resume", "--set", "train.steps=3", "--set", &missing, "--set", &m]));
    assert_eq!(read_metrics(&metrics).len(), 3);
    let aside = out.join("m.jsonl.1");
    assert_eq!(
        std::fs::read_to_string(&aside).unwrap(),
        "{\"step\": 1, \"loss\": 9.0}\n"
    );
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        err.contains("kept the records already in") && err.contains("m.jsonl.1"),
        "{err}"
    );
    assert!(
        err.contains("holds no checkpoint to resume; starting at step 0"),
        "{err}"
    );
    // text with another character set than the checkpoint's
    let set = path_set("train.checkpoint_dir", &out.join("ckpt"));
    weft_ok(&small_run(&["--quiet", "--set", "train.steps=3", "--set", &set]));
    let text = out.join("other.txt");
    std::fs::write(&text, "the same words, other letters: ÅÄÖ åäö ".repeat(400)).unwrap();
    let t = path_set("data.path", &text);
    #[rustfmt::skip]
    fails_with(&small_run(&["--quiet", "--resume", "--set", "train.steps=6", "--set", &set, "--set", &t]),
        &["tokenizer", "Å"]);
}

/// `train.overwrite` removes the folder's earlier checkpoints only once the run starts: a run
/// refused for its model config (named with the config file, before the folder is claimed) or
/// for a checkpoint to start from that does not load (after the claim) leaves them; before,
/// both removed them and then failed, leaving only the lock.
#[test]
fn overwrite_removes_nothing_for_a_run_that_is_refused() {
    let out = temp_dir("overwrite-refused");
    let cfg = common::write_tiny_mlp(&out, "steps = 2\n");
    let cfg = cfg.to_str().unwrap();
    let dir = out.join("ckpt");
    let set = path_set("train.checkpoint_dir", &dir);
    weft_ok(&["train", "--config", cfg, "--quiet", "--set", &set]);
    let before = names(&dir);
    assert_eq!(before, [".lock", "step-00000002"]);
    let overwrite = [
        "train",
        "--config",
        cfg,
        "--quiet",
        "--set",
        &set,
        "--set",
        "train.overwrite=true",
    ];
    // a model config the model refuses
    let mut args = overwrite.to_vec();
    args.extend(["--set", "model.activation=\"swish\""]);
    let err = fails_with(
        &args,
        &["config: ", "mlp.toml: model.activation: \"swish\" is not one of"],
    );
    assert!(!err.contains("removed"), "{err}");
    assert_eq!(names(&dir), before);
    // a checkpoint to start from whose weights are damaged: found when it is loaded, after the
    // folder is claimed
    let other = out.join("other");
    weft_ok(&[
        "train",
        "--config",
        cfg,
        "--quiet",
        "--set",
        &path_set("train.checkpoint_dir", &other),
    ]);
    let shard = other.join("step-00000002/model-rank-00000.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&shard, bytes).unwrap();
    let mut args = overwrite.to_vec();
    args.extend(["--resume-from", other.to_str().unwrap()]);
    let run = weft(&args);
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{err}");
    assert!(
        err.contains("does not match its checksum") && !err.contains("removed"),
        "{err}"
    );
    assert_eq!(names(&dir), before);
    // a run that starts removes them, and says so
    let mut args = overwrite.to_vec();
    args.extend(["--set", "train.steps=3"]);
    let run = weft_ok(&args);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains("train.overwrite: removed 1 checkpoint folder(s)"), "{err}");
    assert_eq!(names(&dir), [".lock", "step-00000003"]);
    // continuing a checkpoint of its own folder: the checkpoint it starts from is kept (it was
    // removed after being loaded, and the run continued without it)
    let mut args = overwrite.to_vec();
    let own = dir.join("step-00000003");
    args.extend(["--set", "train.steps=5", "--resume-from", own.to_str().unwrap()]);
    let run = weft_ok(&args);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!err.contains("removed"), "{err}");
    assert_eq!(names(&dir), [".lock", "step-00000003", "step-00000005"]);
}
