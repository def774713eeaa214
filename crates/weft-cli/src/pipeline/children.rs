//! The step processes a pipeline has running, so that a signal to the pipeline reaches them and
//! none outlives it. Every step process runs in a process group of its own (a command step's
//! shell and what it starts, a train step's `weft train`, a sweep step's `weft sweep`), is
//! registered while it runs, and dies with the pipeline when the pipeline is killed outright
//! ([`weft_tune::children::die_with_parent`]: SIGKILL included; the kernel may repeat that
//! SIGTERM as this process's threads die, which `weft train` takes as the one request it is:
//! docs/registry.md, "Stopping"). SIGINT and SIGTERM to the pipeline are caught: the main loop
//! sends SIGTERM to every registered group (a second signal: SIGKILL), starts nothing more and
//! waits for the running steps to end.

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::Mutex;

/// The process groups of the step processes running now (each group's id is its leader's pid).
static RUNNING: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());
static SIGNAL: AtomicI32 = AtomicI32::new(0);
static SIGNALS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
    SIGNALS.fetch_add(1, Ordering::SeqCst);
}

/// Catches SIGINT and SIGTERM for the pipeline's life (counted; the main loop passes them on).
pub(super) fn catch_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to atomics, which is async-signal-safe.
        unsafe {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
}

/// The last signal caught and how many have been, once one has.
pub(super) fn caught() -> Option<(i32, usize)> {
    let n = SIGNALS.load(Ordering::SeqCst);
    (n > 0).then(|| (SIGNAL.load(Ordering::SeqCst), n))
}

/// Sends `sig` to the process group of every step process running now.
pub(super) fn signal_all(sig: libc::c_int) {
    let running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
    for &group in running.iter() {
        // SAFETY: kill with the group of a child this process started and has not reaped
        unsafe {
            libc::kill(-(group as libc::pid_t), sig);
        }
    }
}

/// Runs `cmd` to its end as a step process (see the module docs), its output captured when
/// `capture` (else inherited: empty in the result). Refused once the pipeline was signalled.
pub(super) fn run(mut cmd: Command, capture: bool) -> std::io::Result<Output> {
    weft_tune::children::die_with_parent(&mut cmd);
    // (a process group of its own is not the terminal's: it would stop reading a tty's input)
    cmd.process_group(0).stdin(Stdio::null());
    if capture {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    let child = {
        // under the lock: a signal's sweep over the groups sees this one, or this sees the signal
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((sig, _)) = caught() {
            return Err(std::io::Error::other(format!(
                "the pipeline is stopping (signal {sig})"
            )));
        }
        let child = cmd.spawn()?;
        running.insert(child.id());
        child
    };
    let id = child.id();
    let out = if capture {
        child.wait_with_output()
    } else {
        let mut child = child;
        child.wait().map(|status| Output {
            status,
            stdout: Vec::new(),
            stderr: Vec::new(),
        })
    };
    RUNNING.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    out
}
