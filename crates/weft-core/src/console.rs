//! Writing to stdout and stderr without panicking.
//!
//! `println!` panics when stdout cannot be written: a reader that went away (`weft train | head`)
//! or a full disk (`> /dev/full`). A training run must not die of its log, so everything weft
//! prints goes through [`outln!`](crate::outln), [`errln!`](crate::errln) and
//! [`err!`](crate::err) instead: a failed write is dropped and counted ([`lost_writes`]), and the
//! program goes on. The lints `clippy::print_stdout` and `clippy::print_stderr` are denied in
//! every crate so that no `println!` comes back.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};

static LOST: AtomicUsize = AtomicUsize::new(0);

/// Which stream to write to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Writes `args` to `stream` in one locked write (followed by a flush on stdout); returns
/// whether it was written. A failure is counted, never raised.
pub fn write(stream: Stream, args: std::fmt::Arguments<'_>) -> bool {
    // formatted first, so the line goes out in one write and a failure leaves no half of it
    let text = std::fmt::format(args);
    let ok = match stream {
        Stream::Stdout => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes()).and_then(|_| out.flush()).is_ok()
        }
        Stream::Stderr => std::io::stderr().lock().write_all(text.as_bytes()).is_ok(),
    };
    if !ok {
        LOST.fetch_add(1, Ordering::Relaxed);
    }
    ok
}

/// How many writes to stdout or stderr failed since the process started.
pub fn lost_writes() -> usize {
    LOST.load(Ordering::Relaxed)
}

/// `println!` that never panics: a failed write is counted ([`lost_writes`]) and dropped.
#[macro_export]
macro_rules! outln {
    () => {{
        let _ = $crate::console::write($crate::console::Stream::Stdout, format_args!("\n"));
    }};
    ($($arg:tt)*) => {{
        let _ = $crate::console::write($crate::console::Stream::Stdout, format_args!("{}\n", format_args!($($arg)*)));
    }};
}

/// `eprintln!` that never panics: a failed write is counted ([`lost_writes`]) and dropped.
#[macro_export]
macro_rules! errln {
    () => {{
        let _ = $crate::console::write($crate::console::Stream::Stderr, format_args!("\n"));
    }};
    ($($arg:tt)*) => {{
        let _ = $crate::console::write($crate::console::Stream::Stderr, format_args!("{}\n", format_args!($($arg)*)));
    }};
}

/// `eprint!` that never panics (a progress line that rewrites itself with `\r`).
#[macro_export]
macro_rules! err {
    ($($arg:tt)*) => {{
        let _ = $crate::console::write($crate::console::Stream::Stderr, format_args!($($arg)*));
    }};
}

/// `print!` that never panics.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {{
        let _ = $crate::console::write($crate::console::Stream::Stdout, format_args!($($arg)*));
    }};
}
