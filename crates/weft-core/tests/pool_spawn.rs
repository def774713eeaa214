//! The compute pool survives a system that refuses some of its workers: it runs every task with
//! the workers that started, after one warning line. The refusal is real: a child process whose
//! address space is capped a few thread stacks above what it uses asks for 1024 threads.
#![cfg(all(target_os = "linux", target_env = "gnu"))]

use std::sync::atomic::{AtomicUsize, Ordering};

/// Set in the child's environment.
const CHILD: &str = "WEFT_TEST_POOL_CHILD";

/// This process's virtual memory size in bytes (`VmSize` of /proc/self/status).
fn vm_size() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmSize:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[test]
fn a_pool_whose_workers_cannot_all_start_runs_with_those_that_did() {
    if std::env::var_os(CHILD).is_some() {
        let hits: Vec<AtomicUsize> = (0..10_000).map(|_| AtomicUsize::new(0)).collect();
        // room for about twenty 2 MiB thread stacks, not for 1023
        let cap = vm_size() + (48 << 20);
        let lim = libc::rlimit {
            rlim_cur: cap,
            rlim_max: cap,
        };
        // SAFETY: a plain system call on this process.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &lim) }, 0);
        weft_core::cpu::pool::run(hits.len(), |i| {
            hits[i].fetch_add(1, Ordering::Relaxed);
        });
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
        let threads = weft_core::cpu::pool::threads();
        assert!(threads < weft_core::cpu::threads::MAX_THREADS, "{threads}");
        // reported to the parent through stdout (run with --nocapture)
        println!("pool threads: {threads}");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "a_pool_whose_workers_cannot_all_start_runs_with_those_that_did",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("WEFT_NUM_THREADS", weft_core::cpu::threads::MAX_THREADS.to_string())
        .env("WEFT_MALLOC_DEFAULTS", "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("compute threads")).collect();
    assert_eq!(warnings.len(), 1, "one warning line:\n{stderr}");
    assert!(
        warnings[0].starts_with("weft: could start only ") && warnings[0].contains("of 1024"),
        "{stderr}"
    );
    let threads: usize = stdout
        .lines()
        .find_map(|l| {
            l.split_once("pool threads: ")?
                .1
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no thread count in:\n{stdout}"));
    assert!(warnings[0].contains(&format!("running with {threads}")), "{stderr}");
}
