//! Accepting connections on a listener that strangers can reach (the store's, each rank's): each
//! connection's token handshake runs on a thread of its own, so a connection that says nothing
//! holds only its own thread, for at most [`HANDSHAKE_TIMEOUT`]; at most [`MAX_PENDING`]
//! connections are in their handshake at once (a new one past that closes the oldest: a peer
//! that knows the token finishes in milliseconds, so it is never the oldest for long, while
//! connections opened to crowd it out are); and an accept that fails (the process is out of file
//! descriptors) is retried after a pause, not in a loop that holds a core.

use std::collections::VecDeque;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::auth::HANDSHAKE_TIMEOUT;

/// The most connections one listener holds in their handshake at once.
pub const MAX_PENDING: usize = 64;

/// How long the accept loop pauses after a failed accept.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// The connections in their handshake, oldest first: a number and a handle to close it by.
type InHandshake = Arc<Mutex<VecDeque<(u64, TcpStream)>>>;

/// A connection's place among those in their handshake; dropping it (after the handshake, or
/// with the connection) frees the place.
pub(crate) struct Pending {
    id: u64,
    all: InHandshake,
    said: Arc<Refusals>,
}

impl Pending {
    /// Says on stderr that a connection was refused (`line`), at most [`SAID_PER_MINUTE`] such
    /// lines a minute per listener: a flood of strangers printed a line each.
    pub(crate) fn refused(&self, line: String) {
        self.said.say(line);
    }
}

/// Refusal lines said per listener and minute; the rest are counted and the count said.
const SAID_PER_MINUTE: u32 = 10;

/// The refusals a listener said in the current minute, and those it did not.
#[derive(Default)]
struct Refusals(Mutex<Option<(Instant, u32, u32)>>);

impl Refusals {
    fn say(&self, line: String) {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let (since, said, held) = g.get_or_insert((now, 0, 0));
        if now.duration_since(*since) >= Duration::from_secs(60) {
            if *held > 0 {
                weft_core::errln!("weft: ... and {held} more refused connections in that minute");
            }
            (*since, *said, *held) = (now, 0, 0);
        }
        if *said < SAID_PER_MINUTE {
            *said += 1;
            if *said == SAID_PER_MINUTE {
                weft_core::errln!("{line} (more refusals this minute are counted, not shown)");
            } else {
                weft_core::errln!("{line}");
            }
        } else {
            *held += 1;
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut all = self.all.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|(id, _)| *id != self.id);
    }
}

/// Accepts connections on `listener` until `stop` returns true (checked after each accept: wake
/// the loop with a connection of its own to stop it). Each accepted connection is handed to
/// `handle` on a new thread named `thread`, with the deadline of its handshake and its
/// [`Pending`] place, which `handle` drops once the handshake is over. `who` names the listener
/// in the lines said on stderr: each kind of problem once until the listener is healthy again.
pub(crate) fn accept_loop<F>(
    listener: TcpListener,
    who: String,
    thread: &'static str,
    stop: impl Fn() -> bool,
    handle: F,
) where
    F: Fn(TcpStream, Instant, Pending) + Send + Sync + 'static,
{
    let handle = Arc::new(handle);
    let pending: InHandshake = Arc::default();
    let said: Arc<Refusals> = Arc::default();
    let (full_said, error_said) = (AtomicBool::new(false), AtomicBool::new(false));
    let mut next_id = 0u64;
    for conn in listener.incoming() {
        if stop() {
            return;
        }
        let conn = match conn {
            Ok(c) => {
                error_said.store(false, Ordering::Relaxed);
                c
            }
            Err(e) => {
                if !error_said.swap(true, Ordering::Relaxed) {
                    weft_core::errln!("weft: {who}: accepting a connection failed: {e}; retrying every 100 ms");
                }
                std::thread::sleep(ACCEPT_PAUSE);
                continue;
            }
        };
        let Ok(handle_to_close) = conn.try_clone() else {
            continue;
        };
        next_id += 1;
        {
            let mut all = pending.lock().unwrap_or_else(|e| e.into_inner());
            if all.len() >= MAX_PENDING {
                if let Some((_, oldest)) = all.pop_front() {
                    let from = oldest.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
                    if !full_said.swap(true, Ordering::Relaxed) {
                        weft_core::errln!(
                            "weft: {who}: {MAX_PENDING} connections are in their handshake at once; closing the \
                             oldest of them as new ones come (the first from {from})"
                        );
                    }
                    let _ = oldest.shutdown(Shutdown::Both);
                }
            } else if all.is_empty() {
                full_said.store(false, Ordering::Relaxed);
            }
            all.push_back((next_id, handle_to_close));
        }
        let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
        let place = Pending {
            id: next_id,
            all: pending.clone(),
            said: said.clone(),
        };
        let handle = handle.clone();
        let spawned = std::thread::Builder::new()
            .name(thread.into())
            .spawn(move || handle(conn, deadline, place));
        if let Err(e) = spawned {
            // the connection and its place went with the closure
            if !error_said.swap(true, Ordering::Relaxed) {
                weft_core::errln!("weft: {who}: cannot start a thread for a connection: {e}; closing it");
            }
            std::thread::sleep(ACCEPT_PAUSE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_past_ten_a_minute_are_counted_not_said() {
        let r = Refusals::default();
        for i in 0..25 {
            r.say(format!("refused connection {i}"));
        }
        let g = r.0.lock().unwrap();
        let (_, said, held) = g.unwrap();
        assert_eq!((said, held), (SAID_PER_MINUTE, 15));
    }
}
