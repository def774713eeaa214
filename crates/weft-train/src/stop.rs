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
//! (A person's second Ctrl-C reaches the launcher, whose second signal kills the workers.)
//!
//! Nor is a repeat of the process's parent-death signal (`PR_SET_PDEATHSIG`, which `weft
//! pipeline` and `weft sweep` set on their step and trial processes) a second request when it
//! comes within [`ECHO`] of the first, or once the parent it had at [`install`] is gone: the
//! kernel sends that signal each time the process is handed to a new parent, and a parent with
//! several threads (a pipeline runs each step on a thread of its own) hands its children from
//! the thread that started them to another of its threads, then to init, as its threads die,
//! each time with the signal. A pipeline killed outright thus sent its train step two or three
//! SIGTERMs, the second of which ended it without its stop checkpoint. The repeat is also
//! ignored after a SIGTERM from the parent itself (a pruned trial whose sweep was then killed):
//! the process is already stopping. A library user who does not call [`install`] keeps the
//! process's own handling, and can ask for a stop with [`request`].

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};

static SIGNAL: AtomicI32 = AtomicI32::new(0);
static COUNT: AtomicUsize = AtomicUsize::new(0);
/// When the first signal came (`CLOCK_MONOTONIC`, nanoseconds).
static FIRST_AT: AtomicU64 = AtomicU64::new(0);
/// Whether this process is a worker of `weft launch` (`WEFT_LAUNCHED=1`).
static LAUNCHED: AtomicBool = AtomicBool::new(false);
/// The process's parent-death signal when [`install`] ran (0: none).
static DEATH_SIGNAL: AtomicI32 = AtomicI32::new(0);
/// Its parent's pid when [`install`] ran.
static PARENT: AtomicI32 = AtomicI32::new(0);

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
    let repeat = Repeat {
        sig,
        first: SIGNAL.load(Ordering::SeqCst),
        since_first: now_ns().saturating_sub(FIRST_AT.load(Ordering::SeqCst)),
        launched: LAUNCHED.load(Ordering::SeqCst),
        death_signal: DEATH_SIGNAL.load(Ordering::SeqCst),
        parent: PARENT.load(Ordering::SeqCst),
        // SAFETY: getppid is async-signal-safe
        parent_now: unsafe { libc::getppid() },
    };
    if repeat.is_echo() {
        return;
    }
    // the second signal: stop now, as the signal would have without a handler
    // SAFETY: signal and raise are async-signal-safe.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// A signal that came after the first, and what tells whether it repeats the first.
struct Repeat {
    sig: i32,
    /// The first signal.
    first: i32,
    /// Nanoseconds since the first.
    since_first: u64,
    /// A worker of `weft launch`.
    launched: bool,
    /// The process's parent-death signal (0: none).
    death_signal: i32,
    /// The parent's pid when the handlers were installed, and now.
    parent: i32,
    parent_now: i32,
}

impl Repeat {
    /// Whether the signal repeats the first request rather than asking for a stop now: in a
    /// launched worker, the same signal within [`ECHO`]; in a process with a parent-death
    /// signal, that signal again within [`ECHO`] or once its parent is gone (see the module's
    /// docs).
    fn is_echo(&self) -> bool {
        let soon = self.since_first < ECHO;
        if self.sig != self.first {
            return false;
        }
        if self.launched && soon {
            return true;
        }
        self.death_signal == self.sig && (soon || self.parent_now != self.parent)
    }
}

/// Installs the SIGINT and SIGTERM handlers (for the rest of the process's life). A signal that
/// was ignored when the process started (`nohup`, a background job) stays ignored.
pub fn install() -> std::io::Result<()> {
    LAUNCHED.store(std::env::var("WEFT_LAUNCHED").is_ok_and(|v| v == "1"), Ordering::SeqCst);
    let mut death: libc::c_int = 0;
    // SAFETY: PR_GET_PDEATHSIG writes the signal number into `death`; getppid cannot fail
    unsafe {
        if libc::prctl(libc::PR_GET_PDEATHSIG, &mut death as *mut libc::c_int) != 0 {
            death = 0;
        }
        PARENT.store(libc::getppid(), Ordering::SeqCst);
    }
    DEATH_SIGNAL.store(death, Ordering::SeqCst);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn repeat(sig: i32, since_first: u64, launched: bool, death_signal: i32, parent_now: i32) -> Repeat {
        Repeat {
            sig,
            first: libc::SIGTERM,
            since_first,
            launched,
            death_signal,
            parent: 100,
            parent_now,
        }
    }

    /// The kernel's parent-death SIGTERM, sent again as a dying pipeline hands its train step
    /// from thread to thread (its parent's pid unchanged, within milliseconds) and then to init
    /// (another parent, whenever that is), repeats the first request; a second SIGTERM to a
    /// process without that signal, or while its parent lives and after the echo window, is a
    /// request to stop now, as is another signal.
    #[test]
    fn a_repeated_parent_death_signal_is_not_a_second_request() {
        let (term, ms) = (libc::SIGTERM, 1_000_000);
        // handed to another thread of the dying pipeline, then to init
        assert!(repeat(term, 5 * ms, false, term, 100).is_echo());
        assert!(repeat(term, 5 * ms, false, term, 1).is_echo());
        // the parent gone, however late (a pruned trial whose sweep was killed later)
        assert!(repeat(term, 30_000 * ms, false, term, 1).is_echo());
        // a person's second SIGTERM while the parent lives, after the echo window
        assert!(!repeat(term, 3_000 * ms, false, term, 100).is_echo());
        // no parent-death signal: a second SIGTERM stops now, as ever
        assert!(!repeat(term, 5 * ms, false, 0, 1).is_echo());
        // another signal (Ctrl-C after SIGTERM) stops now
        assert!(!repeat(libc::SIGINT, 5 * ms, false, term, 1).is_echo());
        // a launched worker's echo, as before
        assert!(repeat(term, 5 * ms, true, 0, 100).is_echo());
        assert!(!repeat(term, 3_000 * ms, true, 0, 100).is_echo());
    }
}
