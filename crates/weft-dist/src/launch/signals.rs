//! The launcher's handlers for SIGINT, SIGTERM and SIGHUP: the handler only records the signal;
//! every loop of the launcher (starting the workers, watching them, stopping them, waiting for
//! the store or a rendezvous round) polls [`received`], and the signal is forwarded to the
//! workers started so far.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{Error, Result};

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
            // SAFETY: sigaction on zeroed, then filled, structs; the handler only touches atomics.
            unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                    return Err(sig_error(sig));
                }
                if old.sa_sigaction == libc::SIG_IGN {
                    continue;
                }
                let mut new: libc::sigaction = std::mem::zeroed();
                new.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
                new.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut new.sa_mask);
                if libc::sigaction(sig, &new, &mut old) != 0 {
                    return Err(sig_error(sig));
                }
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

fn sig_error(sig: libc::c_int) -> Error {
    Error::Io(format!(
        "cannot install a handler for {}: {}",
        signal_name(sig),
        std::io::Error::last_os_error()
    ))
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

/// `SIGKILL` for 9, `signal 64` for a number without a name here.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGCHLD => "SIGCHLD",
        libc::SIGCONT => "SIGCONT",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}
