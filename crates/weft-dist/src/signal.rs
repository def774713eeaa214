//! Signals: catching one with a handler that only records it (the launcher's forwarding and the
//! trainer's clean stop both work this way), and naming one in messages.

/// Makes `handler` catch `sig` (with `SA_RESTART`, so interrupted system calls resume), unless
/// the signal is ignored (as under `nohup`, or SIGINT for a background job): then it stays
/// ignored and `None` is returned. Otherwise the disposition it replaced, to restore later.
/// `handler` must do only async-signal-safe work (atomics, `signal`, `raise`).
pub fn catch(sig: libc::c_int, handler: extern "C" fn(libc::c_int)) -> std::io::Result<Option<libc::sigaction>> {
    // SAFETY: sigaction on zeroed, then filled, structs; `old` is written by the kernel.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if old.sa_sigaction == libc::SIG_IGN {
            return Ok(None);
        }
        let mut new: libc::sigaction = std::mem::zeroed();
        new.sa_sigaction = handler as libc::sighandler_t;
        new.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut new.sa_mask);
        if libc::sigaction(sig, &new, &mut old) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Some(old))
    }
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
