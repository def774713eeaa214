//! Helpers for tests that run the `weft` binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;

/// The repository's root: where these tests were built, or `WEFT_TEST_REPO` (test binaries
/// carried to another machine, such as the GPU checks of tools/cuda/device-check.sh).
pub fn repo() -> PathBuf {
    match std::env::var_os("WEFT_TEST_REPO") {
        Some(r) => PathBuf::from(r),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."),
    }
}

/// The `weft` binary under test: Cargo's, or `WEFT_TEST_BIN` (as [`repo`]).
pub fn weft_bin() -> PathBuf {
    std::env::var_os("WEFT_TEST_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_weft")), PathBuf::from)
}

/// The training fixtures written by `tools/reference/make_train_fixtures.py`.
pub fn fixtures() -> PathBuf {
    repo().join("crates/weft-train/tests/fixtures")
}

/// A free TCP port on the loopback interface (bound and released), never one this test process
/// was given before: the system may hand the same free port to two tests that ask at once.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// A fresh empty folder under the system temp dir.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weft-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `--set`s that make the built-in gpt small enough to run hundreds of steps a second.
pub const SMALL_GPT: [&str; 10] = [
    "--set",
    "model.n_layer=1",
    "--set",
    "model.n_embd=32",
    "--set",
    "model.n_head=2",
    "--set",
    "model.block_size=32",
    "--set",
    "data.batch_size=8",
];

/// `weft` with `args` on 2 compute threads, to start; runs it records go to a run store in
/// the temp dir (`WEFT_TRACK_DIR`), not `weft-runs/` of the working directory (this crate's
/// folder).
pub fn weft_command(args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(weft_bin());
    cmd.args(args)
        .env("WEFT_NUM_THREADS", "2")
        .env("WEFT_TRACK_DIR", test_runs_dir());
    cmd
}

/// The run store this test process's `weft` runs record into (`WEFT_TRACK_DIR`): a folder of
/// the temp dir, so that tests never write `weft-runs/` into this crate's folder.
pub fn test_runs_dir() -> PathBuf {
    std::env::temp_dir().join(format!("weft-test-runs-{}", std::process::id()))
}

/// Runs `weft` with `args` on 2 compute threads.
pub fn weft(args: &[&str]) -> Output {
    weft_command(args).output().expect("the weft binary runs")
}

/// Waits (polling, up to `secs` seconds) until `ready` holds; whether it did.
pub fn wait_for(secs: u64, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while std::time::Instant::now() < deadline {
        if ready() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    ready()
}

/// Runs `cmd` (its stdout and stderr captured, read as they come) to its end, or kills it after
/// `secs` seconds and fails the test naming `what`: for commands that must not wait for ever
/// (on a FIFO, say).
pub fn output_within(mut cmd: std::process::Command, secs: u64, what: &str) -> Output {
    use std::process::Stdio;
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(secs)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // SAFETY: a signal to the child this function started
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("{what}: still running after {secs} s");
        }
    }
}

/// Makes a FIFO at `path`.
#[cfg(unix)]
pub fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o600) },
        0,
        "mkfifo {}",
        path.display()
    );
}

/// The `step` of the last record of a metrics file that has one (0 when none can be read).
pub fn last_logged_step(metrics: &Path) -> u64 {
    std::fs::read_to_string(metrics)
        .unwrap_or_default()
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|r| r["step"].as_u64())
        .unwrap_or(0)
}

/// Runs `weft` and panics with its stderr unless it succeeds.
pub fn weft_ok(args: &[&str]) -> Output {
    let out = weft(args);
    assert!(
        out.status.success(),
        "weft {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The JSON objects of a metrics file.
pub fn read_metrics(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Checks the metrics file of a run of fixture `case` against PyTorch's record: one line per
/// step, losses within 1e-4 relative, learning rates exact, pre-clipping gradient norms within
/// 1e-4 relative. Returns the largest relative loss difference.
pub fn check_against_pytorch(case: &str, metrics: &Path) -> f64 {
    let dir = fixtures().join(case);
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let losses = expected["losses"].as_array().unwrap();
    let lrs = expected["lrs"].as_array().unwrap();
    let norms = expected["grad_norms"].as_array().unwrap();
    let got = read_metrics(metrics);
    assert_eq!(got.len(), losses.len(), "{case}: one metrics line per step");
    assert!(got.len() >= 40, "{case}: at least 40 steps");
    let mut worst = 0.0f64;
    for (i, rec) in got.iter().enumerate() {
        assert_eq!(
            rec["step"].as_u64(),
            Some(i as u64 + 1),
            "{case}: steps are numbered from 1"
        );
        let (l, e) = (rec["loss"].as_f64().unwrap(), losses[i].as_f64().unwrap());
        let rel = (l - e).abs() / e.abs();
        worst = worst.max(rel);
        assert!(
            rel <= 1e-4,
            "{case} step {i}: loss {l} vs PyTorch {e} (relative {rel:.2e})"
        );
        let (lr, elr) = (rec["lr"].as_f64().unwrap(), lrs[i].as_f64().unwrap());
        assert!(
            (lr - elr).abs() <= 1e-15 * elr.abs(),
            "{case} step {i}: lr {lr} vs PyTorch {elr}"
        );
        if let Some(en) = norms[i].as_f64() {
            let n = rec["grad_norm"].as_f64().unwrap();
            assert!(
                (n - en).abs() <= 1e-4 * en,
                "{case} step {i}: grad norm {n} vs PyTorch {en}"
            );
        }
        assert!(rec["step_ms"].as_f64().unwrap() > 0.0);
    }
    eprintln!("{case}: {} steps, max relative loss difference {worst:.2e}", got.len());
    worst
}

/// `weft launch --nproc-per-node RANKS -- weft train --config CONFIG --quiet [--set S]...`
/// (`config` `None`: the built-in run), extra flags such as `--resume` in `flags`. Workers that
/// are stopped after another's failure get 5 s (not the default 30) to exit.
pub fn launch_train(ranks: usize, config: Option<&Path>, flags: &[&str], sets: &[impl AsRef<str>]) -> Output {
    let bin = weft_bin();
    let bin = bin.to_str().unwrap();
    let n = ranks.to_string();
    let mut args = vec![
        "launch",
        "--nproc-per-node",
        &n,
        "--stop-timeout",
        "5",
        "--",
        bin,
        "train",
        "--quiet",
    ];
    if let Some(c) = config {
        args.extend(["--config", c.to_str().unwrap()]);
    }
    args.extend(flags);
    for s in sets {
        args.extend(["--set", s.as_ref()]);
    }
    weft(&args)
}

/// [`launch_train`], panicking with its stderr unless it succeeds.
pub fn launch_train_ok(ranks: usize, config: Option<&Path>, flags: &[&str], sets: &[impl AsRef<str>]) -> Output {
    let out = launch_train(ranks, config, flags, sets);
    assert!(
        out.status.success(),
        "weft launch ({ranks} ranks, {flags:?}, {:?}) failed:\n{}",
        sets.iter().map(|s| s.as_ref()).collect::<Vec<_>>(),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `section.key="path"`: a config override naming a file.
pub fn path_set(key: &str, path: &Path) -> String {
    format!("{key}={:?}", path.to_str().unwrap())
}

/// The logged losses of a metrics file, in order.
pub fn losses(metrics: &Path) -> Vec<f64> {
    read_metrics(metrics)
        .iter()
        .filter_map(|r| r["loss"].as_f64())
        .collect()
}

/// Two loss curves of the same length agree within `tol` relative at every step.
pub fn assert_same_curve(a: &[f64], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: number of steps");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * x.abs(), "{what} step {i}: {x} vs {y}");
    }
}

/// Resumes the run of `config` in one process from checkpoint folder `step_dir`
/// (`.../step-NNNNNNNN`), copied alone into `scratch` (so nothing newer beside it is picked);
/// returns the losses logged after resuming.
pub fn resume_in_one_process(config: &Path, step_dir: &Path, scratch: &Path) -> Vec<f64> {
    let copy = scratch.join("ckpt").join(step_dir.file_name().unwrap());
    std::fs::create_dir_all(&copy).unwrap();
    for f in std::fs::read_dir(step_dir).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, copy.join(f.file_name().unwrap())).unwrap();
    }
    let metrics = scratch.join("one-process.jsonl");
    let _ = std::fs::remove_file(&metrics);
    let dir = path_set("train.checkpoint_dir", &scratch.join("ckpt"));
    let m = path_set("train.metrics", &metrics);
    #[rustfmt::skip]
    weft_ok(&["train", "--config", config.to_str().unwrap(), "--quiet", "--resume", "--set", &dir, "--set", &m]);
    losses(&metrics)
}

/// The sample the built-in run prints after training on `ranks` ranks with `layout` and `run`
/// overrides (the launcher's `[rank0]: ` prefixes removed).
pub fn sample_of_built_in_run(ranks: usize, layout: &[&str], run: &[&str]) -> String {
    let sets: Vec<&str> = run.iter().chain(layout).copied().collect();
    let out = if ranks == 1 {
        let mut args = vec!["train", "--quiet"];
        for s in &sets {
            args.extend(["--set", s]);
        }
        weft_ok(&args)
    } else {
        launch_train_ok(ranks, None, &[], &sets)
    };
    let stdout = String::from_utf8_lossy(&out.stdout).replace("[rank0]: ", "");
    let (_, sample) = stdout
        .split_once("--- sample (")
        .unwrap_or_else(|| panic!("no sample in:\n{stdout}"));
    sample.to_string()
}

/// `weft train` on the small built-in gpt ([`SMALL_GPT`]) with `extra` arguments.
pub fn small_run<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["train"];
    args.extend(SMALL_GPT);
    args.extend(extra);
    args
}

/// The gpt fixture's run config.
pub fn gpt_fixture() -> String {
    fixture_config("gpt_adamw").to_str().unwrap().to_string()
}

/// The run config of the weft-train fixture `case` (`gpt_adamw`, `llama_gqa_adamw`, ...).
pub fn fixture_config(case: &str) -> PathBuf {
    fixtures().join(case).join("run.toml")
}

/// Trains fixture `case` as [`train_config`] trains a config.
pub fn train_fixture(case: &str, ranks: usize, metrics: &Path, flags: &[&str], sets: &[impl AsRef<str>]) -> Output {
    train_config(&fixture_config(case), ranks, metrics, flags, sets)
}

/// Trains `config` on `ranks` ranks (one process when 1, else through the launcher) with
/// `flags` (`--resume`) and `--set`s, its metrics written to `metrics` (removed first); the run's
/// output, after checking that it succeeded.
pub fn train_config(config: &Path, ranks: usize, metrics: &Path, flags: &[&str], sets: &[impl AsRef<str>]) -> Output {
    let _ = std::fs::remove_file(metrics);
    let mut all = vec![path_set("train.metrics", metrics)];
    all.extend(sets.iter().map(|s| s.as_ref().to_string()));
    if ranks > 1 {
        return launch_train_ok(ranks, Some(config), flags, &all);
    }
    let mut args = vec!["train", "--config", config.to_str().unwrap(), "--quiet"];
    args.extend(flags);
    for s in &all {
        args.extend(["--set", s.as_str()]);
    }
    weft_ok(&args)
}

/// Runs `args`, which must fail with exit status 1 and a last stderr line that holds every
/// `needle`; that line.
pub fn fails_with(args: &[&str], needles: &[&str]) -> String {
    let out = weft(args);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "weft {args:?}:\n{err}");
    let last = err.trim().lines().last().unwrap_or_default().to_string();
    assert!(last.starts_with("weft: error: "), "{err}");
    for n in needles {
        assert!(last.contains(n), "{n:?} in {last:?}");
    }
    last
}

/// The entries of a folder, by name.
pub fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Runs `weft checkpoint consolidate CKPT -o FILE`.
pub fn consolidate(ckpt: &Path, file: &Path) -> Output {
    weft(&[
        "checkpoint",
        "consolidate",
        ckpt.to_str().unwrap(),
        "-o",
        file.to_str().unwrap(),
    ])
}

/// [`consolidate`], which must succeed.
pub fn consolidate_ok(ckpt: &Path, file: &Path) -> Output {
    let out = consolidate(ckpt, file);
    assert!(
        out.status.success(),
        "consolidate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A child process killed (and reaped) when this is dropped, so that a failing test leaves no
/// long run behind.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether a CUDA device can be used; when not, writes one line saying `case` was skipped (past
/// the test harness's capture, so that it shows).
#[allow(dead_code)]
pub fn cuda_or_skip(case: &str) -> bool {
    use std::io::Write;
    match weft_core::cuda::device_count() {
        Ok(n) if n > 0 => true,
        other => {
            let why = other.map_or_else(|e| e.to_string(), |_| "no CUDA device".to_string());
            let _ = writeln!(std::io::stderr(), "skipped {case}: {why}");
            false
        }
    }
}

/// Writes a 40-row CSV of 2 features and 3 classes (`dir/d.csv`) and a config of a tiny mlp
/// (2 -> 8 -> 3, adam) reading it (`dir/mlp.toml`, its `[train]` section `train`, e.g.
/// `"steps = 6\n"`); the config's path.
pub fn write_tiny_mlp(dir: &Path, train: &str) -> PathBuf {
    let mut text = String::from("x,y,label\n");
    for i in 0..40 {
        text.push_str(&format!(
            "{:.3},{:.3},{}\n",
            (i % 7) as f64 / 7.0,
            (i % 5) as f64 / 5.0,
            i % 3
        ));
    }
    std::fs::write(dir.join("d.csv"), text).unwrap();
    let config = format!(
        "[model]\nkind = \"mlp\"\nin_features = 2\nhidden = [8]\nout_features = 3\nactivation = \"relu\"\n\n\
         [data]\nkind = \"csv\"\npath = \"d.csv\"\nlabel_column = -1\nbatch_size = 4\nval_fraction = 0.25\n\n\
         [optim]\nkind = \"adam\"\nlr = 0.01\n\n[train]\n{train}"
    );
    let path = dir.join("mlp.toml");
    std::fs::write(&path, config).unwrap();
    path
}

/// `sha256:HEX` of a file's bytes (as the run store records data digests).
pub fn sha256_of(path: &Path) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(std::fs::read(path).unwrap());
    format!("sha256:{}", d.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// `weft` with `args` recording into the run store `runs` (`WEFT_TRACK_DIR`), as
/// [`weft_command`] starts it.
pub fn weft_with_store(runs: &Path, args: &[&str]) -> Output {
    weft_command(args)
        .env("WEFT_TRACK_DIR", runs)
        .output()
        .expect("the weft binary runs")
}

/// [`weft_with_store`], which must succeed; its stdout.
pub fn weft_ok_with_store(runs: &Path, args: &[&str]) -> String {
    let out = weft_with_store(runs, args);
    assert!(
        out.status.success(),
        "weft {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A tiny gpt (2 layers, 32 wide, block 16) of the built-in run, every step logged, no sample:
/// `--set`s for tests that train many short runs. Its schedule (cosine, 50 warmup steps, decay
/// over 1000) does not depend on `train.steps`, so the first steps of a short run are those of
/// a longer one.
pub const TINY_GPT: [&str; 7] = [
    "model.n_layer=2",
    "model.n_embd=32",
    "model.n_head=2",
    "model.block_size=16",
    "data.batch_size=4",
    "train.log_every=1",
    "train.sample_tokens=0",
];

/// `weft ARGS` run in `cwd` with 2 threads, its run store in `cwd/weft-runs` (whatever
/// `WEFT_TRACK_DIR` says) unless `track.dir` says otherwise.
pub fn weft_in(cwd: &Path, args: &[&str]) -> Output {
    std::process::Command::new(weft_bin())
        .args(args)
        .current_dir(cwd)
        .env("WEFT_NUM_THREADS", "2")
        .env_remove("WEFT_TRACK_DIR")
        .output()
        .unwrap()
}

/// `out`'s stdout, after checking that it succeeded (its stderr in the panic, with `what`).
pub fn ok_stdout(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The pids of processes whose command line holds `needle`.
pub fn pids_with(needle: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            pids.push(pid);
        }
    }
    pids
}

/// Whether `pid` is a process that has not ended (a zombie has).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}
