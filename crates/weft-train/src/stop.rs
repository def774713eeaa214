//! Stopping a run cleanly on SIGINT (Ctrl-C) or SIGTERM (what Slurm preemption, spot
//! reclamation and Kubernetes eviction send): the trainer finishes the step it is in, writes a
//! checkpoint (every rank together) and returns, and `weft train` exits 130 or 143.
//!
//! [`install`] sets handlers that only record the signal; [`Trainer::fit`](crate::Trainer::fit)
//! polls [`requested`] after every step. A second signal ends the process at once, with the
//! signal's default action, except in a worker of `weft launch` when it is the same signal
//! within [`ECHO`] of the first: Slurm's `scancel` (and a node's shutdown) send SIGTERM to every
//! process of the job, the launcher and its workers alike, and the launcher passes its own on,
//! so each worker gets the one request twice, the second while it writes its stop checkpoint.
//! (A person's second Ctrl-C reaches the launcher, whose second signal kills the workers.) A
//! library user who does not call [`install`] keeps the process's own handling, and can ask
//! for a stop with [`request`].

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};

static SIGNAL: AtomicI32 = AtomicI32::new(0);
static COUNT: AtomicUsize = AtomicUsize::new(0);
/// When the first signal came (`CLOCK_MONOTONIC`, nanoseconds).
static FIRST_AT: AtomicU64 = AtomicU64::new(0);
/// Whether this process is a worker of `weft launch` (`WEFT_LAUNCHED=1`).
static LAUNCHED: AtomicBool = AtomicBool::new(false);

/// How soon after the first a second signal of the same number is the same request, passed on
/// twice, in a launched worker: nanoseconds.
pub const ECHO: u64 = 2_000_000_000;

/// `CLOCK_MONOTONIC` in nanoseconds (async-signal-safe).
fn now_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes only `t` and is async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    (t.tv_sec as u64).saturating_mul(1_000_000_000) + t.tv_nsec as u64
}

extern "C" fn on_signal(sig: libc::c_int) {
    if COUNT.fetch_add(1, Ordering::SeqCst) == 0 {
        FIRST_AT.store(now_ns(), Ordering::SeqCst);
        SIGNAL.store(sig, Ordering::SeqCst);
        return;
    }
    let echo = LAUNCHED.load(Ordering::SeqCst)
        && SIGNAL.load(Ordering::SeqCst) == sig
        && now_ns().saturating_sub(FIRST_AT.load(Ordering::SeqCst)) < ECHO;
    if echo {
        return;
    }
    // the second signal: stop now, as the signal would have without a handler
    // SAFETY: signal and raise are async-signal-safe.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// Installs the SIGINT and SIGTERM handlers (for the rest of the process's life). A signal that
/// was ignored when the process started (`nohup`, a background job) stays ignored.
pub fn install() -> std::io::Result<()> {
    LAUNCHED.store(std::env::var("WEFT_LAUNCHED").is_ok_and(|v| v == "1"), Ordering::SeqCst);
    for sig in [libc::SIGINT, libc::SIGTERM] {
        weft_dist::signal::catch(sig, on_signal)?;
    }
    Ok(())
}

/// The signal that asked the run to stop, if any (its number: 2 for SIGINT, 15 for SIGTERM).
pub fn requested() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Asks the run to stop after its current step, as signal `sig` would.
pub fn request(sig: i32) {
    let _ = SIGNAL.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
}
