//! Stopping a run cleanly on SIGINT (Ctrl-C) or SIGTERM (what Slurm preemption, spot
//! reclamation and Kubernetes eviction send): the trainer finishes the step it is in, writes a
//! checkpoint (every rank together) and returns, and `weft train` exits 130 or 143.
//!
//! [`install`] sets handlers that only record the signal; [`Trainer::fit`](crate::Trainer::fit)
//! polls [`requested`] after every step. A second signal ends the process at once, with the
//! signal's default action. A library user who does not call [`install`] keeps the process's
//! own handling, and can ask for a stop with [`request`].

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

static SIGNAL: AtomicI32 = AtomicI32::new(0);
static COUNT: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    if COUNT.fetch_add(1, Ordering::SeqCst) > 0 {
        // the second signal: stop now, as the signal would have without a handler
        // SAFETY: signal and raise are async-signal-safe.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
        return;
    }
    SIGNAL.store(sig, Ordering::SeqCst);
}

/// Installs the SIGINT and SIGTERM handlers (for the rest of the process's life). A signal that
/// was ignored when the process started (`nohup`, a background job) stays ignored.
pub fn install() -> std::io::Result<()> {
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
