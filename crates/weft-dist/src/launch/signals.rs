//! The launcher's handlers for SIGINT, SIGTERM and SIGHUP: the handler only records the signal;
//! every loop of the launcher (starting the workers, watching them, stopping them, waiting for
//! the store or a rendezvous round) polls [`received`], and the signal is forwarded to the
//! workers started so far.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{Error, Result};
use crate::signal::signal_name;

/// The signals the launcher forwards to its workers.
pub(super) const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// The number of the last signal received (0: none yet).
static LAST: AtomicUsize = AtomicUsize::new(0);
/// How many signals were received since the handlers were installed.
static COUNT: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // only atomics here: they are async-signal-safe
    LAST.store(sig as usize, Ordering::SeqCst);
    COUNT.fetch_add(1, Ordering::SeqCst);
}

/// The installed handlers; the previous ones come back when this is dropped.
pub(super) struct Handlers {
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl Handlers {
    /// Installs the handlers and clears what an earlier launch recorded. A signal that is ignored
    /// at start (as under `nohup`) stays ignored.
    pub(super) fn install() -> Result<Handlers> {
        LAST.store(0, Ordering::SeqCst);
        COUNT.store(0, Ordering::SeqCst);
        let mut handlers = Handlers { previous: Vec::new() };
        for sig in FORWARDED {
            if let Some(old) = crate::signal::catch(sig, on_signal).map_err(|e| sig_error(sig, e))? {
                handlers.previous.push((sig, old));
            }
        }
        Ok(handlers)
    }
}

impl Drop for Handlers {
    fn drop(&mut self) {
        for (sig, old) in &self.previous {
            // SAFETY: restores the disposition sigaction reported before.
            unsafe {
                libc::sigaction(*sig, old, std::ptr::null_mut());
            }
        }
    }
}

fn sig_error(sig: libc::c_int, e: std::io::Error) -> Error {
    Error::Io(format!("cannot install a handler for {}: {e}", signal_name(sig)))
}

/// The last forwarded signal received since [`Handlers::install`], if any.
pub(super) fn received() -> Option<i32> {
    match LAST.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s as i32),
    }
}

/// How many signals were received since [`Handlers::install`].
pub(super) fn count() -> usize {
    COUNT.load(Ordering::SeqCst)
}
