//! The compute pool's first kernel runs on its workers too. A worker reads the job counter when
//! it starts; it once read it after the caller had already posted the first job, took that job
//! for one it had seen and waited for the next, so a process whose whole work is one kernel
//! (`weft data prepare` of one file: one job of 1 MiB pieces) ran it on the calling thread
//! alone. Checked in a child process with two threads, whose first pool use is the kernel below.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Set in the child's environment.
const CHILD: &str = "WEFT_TEST_POOL_FIRST_JOB_CHILD";

#[test]
fn the_first_kernel_after_the_pool_starts_runs_on_two_threads() {
    if std::env::var_os(CHILD).is_some() {
        let started = AtomicUsize::new(0);
        let threads = std::sync::Mutex::new(Vec::new());
        // each task waits (at most 10 s) until both have started: only two threads can do that
        weft_core::cpu::pool::run(2, |_| {
            started.fetch_add(1, Ordering::SeqCst);
            threads.lock().unwrap().push(std::thread::current().id());
            let t = Instant::now();
            while started.load(Ordering::SeqCst) < 2 && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        let threads = threads.into_inner().unwrap();
        assert_eq!(weft_core::cpu::pool::threads(), 2);
        assert_ne!(threads[0], threads[1], "both tasks ran on one thread");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "the_first_kernel_after_the_pool_starts_runs_on_two_threads",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("WEFT_NUM_THREADS", "2")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
