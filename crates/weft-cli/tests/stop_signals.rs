//! SIGINT and SIGTERM stop `weft train` cleanly: the step in progress is finished, a checkpoint
//! is written (by every rank together under the launcher), the run says where and exits 130 or
//! 143, and `--resume` continues the curve of the run that was never stopped.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::{last_logged_step, losses, path_set, temp_dir, wait_for, weft_command, weft_ok, SMALL_GPT};

/// `train` arguments of the small run into `out` (checkpoints in `out/ckpt`, metrics in
/// `out/m.jsonl`) with `steps` steps and `extra` arguments.
fn train_args(out: &Path, steps: usize, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["train", "--quiet", "--set", "train.log_every=1"]
        .map(String::from)
        .to_vec();
    args.extend(SMALL_GPT.iter().map(|s| s.to_string()));
    for s in [
        format!("train.steps={steps}"),
        path_set("train.checkpoint_dir", &out.join("ckpt")),
        path_set("train.metrics", &out.join("m.jsonl")),
    ] {
        args.extend(["--set".to_string(), s]);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Sends `sig` to `child` once its metrics show step 20, and waits for it: (exit code, stderr).
fn stop_at_step_20(mut child: Child, metrics: &Path, sig: &str) -> (Option<i32>, String) {
    let started = wait_for(120, || last_logged_step(metrics) >= 20);
    if !started {
        let _ = child.kill();
        panic!("the run did not reach step 20");
    }
    let pid = child.id().to_string();
    assert!(Command::new("kill").args([sig, &pid]).status().unwrap().success());
    let out = child.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The step of `stopped by SIG... after step N` in `stderr`.
fn stopped_after(stderr: &str, sig: &str) -> usize {
    let at = stderr
        .find(&format!("stopped by {sig} after step "))
        .unwrap_or_else(|| panic!("no stop message in:\n{stderr}"));
    let rest = &stderr[at..];
    let n: String = rest["stopped by  after step ".len() + sig.len()..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    n.parse().unwrap()
}

/// Checks the stopped run in `out` against an uninterrupted one: it stopped after step `k`
/// with a complete checkpoint there, and resumed (by `resume`) to `k + 10` its losses equal
/// the uninterrupted run's (by `whole`) bit for bit.
fn continues_the_curve(out: &Path, stderr: &str, k: usize, resume: impl Fn(&[String]), whole: impl Fn(&[String])) {
    let ckpt = out.join("ckpt").join(format!("step-{k:08}"));
    assert!(weft_train::checkpoint::is_complete(&ckpt), "{stderr}");
    assert!(
        stderr.contains(&format!("checkpoint at {}; continue with --resume", ckpt.display())),
        "{stderr}"
    );
    assert_eq!(last_logged_step(&out.join("m.jsonl")), k as u64);
    resume(&train_args(out, k + 10, &["--resume"]));
    let fresh = out.join("whole");
    whole(&train_args(&fresh, k + 10, &[]));
    let (a, b) = (losses(&out.join("m.jsonl")), losses(&fresh.join("m.jsonl")));
    assert_eq!(a.len(), k + 10);
    assert_eq!(a, b, "the stopped and resumed run equals the uninterrupted one");
}

/// Starts the small run alone in a fresh folder `name`, sends it `sig` (`-TERM`) after step 20,
/// and checks it exited with `code`: the folder, its stderr and the step it stopped after.
fn stop_one_process(name: &str, sig: &str, code: i32) -> (std::path::PathBuf, String, usize) {
    let out = temp_dir(name);
    let args = train_args(&out, 1_000_000, &[]);
    let child = weft_command(&refs(&args))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (got, stderr) = stop_at_step_20(child, &out.join("m.jsonl"), sig);
    assert_eq!(got, Some(code), "{stderr}");
    let k = stopped_after(&stderr, &format!("SIG{}", &sig[1..]));
    (out, stderr, k)
}

#[test]
fn sigterm_finishes_the_step_writes_a_checkpoint_and_resume_continues() {
    let (out, stderr, k) = stop_one_process("sigterm", "-TERM", 143);
    let run = |a: &[String]| {
        weft_ok(&refs(a));
    };
    continues_the_curve(&out, &stderr, k, run, run);
}

#[test]
fn sigint_stops_the_same_way_with_exit_130() {
    let (out, _, k) = stop_one_process("sigint", "-INT", 130);
    assert!(weft_train::checkpoint::is_complete(
        &out.join("ckpt").join(format!("step-{k:08}"))
    ));
}

/// `weft launch --nproc-per-node 2 -- weft <args> --set parallel.dp=2`.
fn launched(args: &[String]) -> Command {
    let bin = env!("CARGO_BIN_EXE_weft");
    let mut all = vec!["launch", "--nproc-per-node", "2", "--", bin];
    all.extend(refs(args));
    all.extend(["--set", "parallel.dp=2"]);
    weft_command(&all)
}

#[test]
fn sigterm_to_the_launcher_stops_every_rank_after_the_same_step() {
    let out = temp_dir("sigterm-launch");
    let args = train_args(&out, 1_000_000, &[]);
    let child = launched(&args)
        .env("WEFT_NUM_THREADS", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (code, stderr) = stop_at_step_20(child, &out.join("m.jsonl"), "-TERM");
    assert_eq!(code, Some(143), "{stderr}");
    assert!(!stderr.contains("SIGKILL"), "every rank stopped by itself:\n{stderr}");
    let k = stopped_after(&stderr, "SIGTERM");
    // the checkpoint holds both ranks' parts: it is complete only if both wrote them
    let run = |a: &[String]| {
        let out = launched(a).env("WEFT_NUM_THREADS", "1").output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    continues_the_curve(&out, &stderr, k, run, run);
}

/// The pids of `parent`'s child processes.
fn children_of(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // `pid (comm) state ppid ...`: the fields after the command's closing parenthesis
        let ppid = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(parent) {
            out.push(pid);
        }
    }
    out
}

/// SIGTERM to every process of a launched job at once, as Slurm's `scancel` or a node's
/// shutdown sends it: each worker gets it twice (its own, and the one the launcher passes on),
/// which is one request, not a second signal that ends it in the middle of its stop checkpoint.
#[test]
fn sigterm_to_the_launcher_and_its_workers_at_once_still_stops_cleanly() {
    let out = temp_dir("sigterm-all");
    // steps long enough (tens of milliseconds) that the launcher's copy arrives mid-step
    let wider = [
        "--set",
        "model.n_embd=256",
        "--set",
        "model.n_head=4",
        "--set",
        "model.n_layer=2",
    ];
    let args = train_args(&out, 1_000_000, &wider);
    let child = launched(&args)
        .env("WEFT_NUM_THREADS", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_for(120, || last_logged_step(&out.join("m.jsonl")) >= 20));
    let workers = children_of(child.id());
    assert_eq!(workers.len(), 2, "{workers:?}");
    for pid in workers.iter().chain([child.id()].iter()) {
        // SAFETY: kill of a process of the job this test started
        unsafe { libc::kill(*pid as i32, libc::SIGTERM) };
        // (the workers' handlers have run when the launcher's copy comes)
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let done = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr).into_owned();
    assert_eq!(done.status.code(), Some(143), "{stderr}");
    assert!(!stderr.contains("SIGKILL"), "every rank stopped by itself:\n{stderr}");
    let k = stopped_after(&stderr, "SIGTERM");
    let run = |a: &[String]| {
        let mut a = a.to_vec();
        a.extend(wider.iter().map(|s| s.to_string()));
        let out = launched(&a).env("WEFT_NUM_THREADS", "1").output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    continues_the_curve(&out, &stderr, k, run, run);
}

/// A rank told to stop while it waits for the others to join (rank 1 never comes; and a rank 1
/// whose store never answers) ends at once with 143, saying nothing was trained; it waited out
/// the job's timeout before (300 s by default, 60 s here).
#[test]
fn sigterm_while_joining_the_job_ends_at_once() {
    for rank in ["0", "1"] {
        let port = common::free_port().to_string();
        let mut child = weft_command(&["train", "--quiet", "--set", "train.steps=3"])
            .env("RANK", rank)
            .env("WORLD_SIZE", "2")
            .env("LOCAL_RANK", rank)
            .env("LOCAL_WORLD_SIZE", "2")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", &port)
            .env("WEFT_JOB_TOKEN", "a-token-for-this-test-only")
            .env("WEFT_DIST_TIMEOUT", "60")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // once its SIGTERM handler is in place (on a loaded machine the start can take seconds)
        let caught = || {
            let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap_or_default();
            status
                .lines()
                .find_map(|l| l.strip_prefix("SigCgt:"))
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
                .is_some_and(|mask| mask & (1 << (libc::SIGTERM - 1)) != 0)
        };
        assert!(wait_for(60, caught), "rank {rank} never caught SIGTERM");
        // and well into its wait for the others
        std::thread::sleep(std::time::Duration::from_millis(500));
        let sent = std::time::Instant::now();
        // SAFETY: kill with the pid of a child this test started and has not reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        while child.try_wait().unwrap().is_none() {
            assert!(
                sent.elapsed() < std::time::Duration::from_secs(20),
                "rank {rank} still waits after SIGTERM"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(143), "rank {rank}: {stderr}");
        assert!(
            stderr.contains("stopped by signal 15") && stderr.contains("nothing was trained"),
            "rank {rank}: {stderr}"
        );
    }
}
