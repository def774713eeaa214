//! A launcher's thread that talks to the store while the workers run ([`Watch`]): it says the
//! launcher is alive, and it looks at the keys through which the other launchers speak (a
//! round's `failed`, the job's [`FATAL`]), so the launcher's own loop reads what it saw without
//! ever waiting on the store. It also tells how long ago the store last answered and whether it
//! can still be asked: how the launchers of the other nodes notice that node 0's launcher, which
//! serves the store, was killed or stopped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::store::StoreClient;

/// Set (once, by the first launcher that finds one) to why the whole job must fail at once,
/// with no restart: a node's launcher given other settings than node 0's, or two launchers
/// given the same `--node-rank`.
pub(super) const FATAL: &str = "weft/launch/fatal";
/// Counted up by the launchers that would set [`FATAL`]: only the first one sets it.
const FATAL_BY: &str = "weft/launch/fatal-by";
/// How often the watch looks at the store.
pub(super) const LOOK_EVERY: Duration = Duration::from_millis(100);
/// How long node 0's launcher, failing the job for good, keeps serving the store before it
/// exits, so that the other launchers (which look every [`LOOK_EVERY`]) read why there.
const FATAL_GRACE: Duration = Duration::from_secs(1);

/// The value of `key` if some launcher set it (asking the store for at most a millisecond).
pub(super) fn peek(store: &StoreClient, key: &str) -> Result<Option<String>> {
    match store.get(key, Duration::from_millis(1)) {
        Ok(v) => Ok(Some(String::from_utf8_lossy(&v).into_owned())),
        Err(Error::Timeout(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Fails the job on every node for `why` ([`FATAL`]), unless another launcher did first.
pub(super) fn set_fatal(store: &StoreClient, why: &str) -> Result<()> {
    if store.add(FATAL_BY, 1)? == 1 {
        store.set(FATAL, why.as_bytes())?;
    }
    Ok(())
}

/// Node 0's launcher (`serves_store`), failing the job for good ([`FATAL`], or a round's
/// failure with no restart left): keeps serving the store a moment, so the other launchers read
/// why too (they would see a lost store otherwise).
pub(super) fn linger(serves_store: bool) {
    if serves_store {
        std::thread::sleep(FATAL_GRACE);
    }
}

/// What the watch saw.
struct Seen {
    fatal: Option<String>,
    failed: Option<String>,
    /// When the store last answered a request of the watch.
    answered: Instant,
    /// Why the store can no longer be asked (its connection closed or did not answer).
    broken: Option<String>,
}

/// The thread; it stops when dropped (at its next look: one waiting for the store's answer is
/// left to end on its own).
pub(super) struct Watch {
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
}

impl Watch {
    /// Starts looking at [`FATAL`], and at `failed` when given, every [`LOOK_EVERY`]; with
    /// `alive = Some((key, every))` it also counts `key` up every `every` (the launcher's
    /// heartbeat, which node 0's launcher watches).
    pub(super) fn start(
        store: Arc<StoreClient>,
        failed: Option<String>,
        alive: Option<(String, Duration)>,
    ) -> Result<Watch> {
        let seen = Arc::new(Mutex::new(Seen {
            fatal: None,
            failed: None,
            answered: Instant::now(),
            broken: None,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen2, stop2) = (seen.clone(), stop.clone());
        std::thread::Builder::new()
            .name("weft-launch-watch".into())
            .spawn(move || {
                if let Err(e) = look(&store, failed.as_deref(), alive, &seen2, &stop2) {
                    lock(&seen2).broken = Some(e.to_string());
                }
            })
            .map_err(|e| crate::error::io("weft launch: cannot start the thread that watches the store", e))?;
        Ok(Watch { seen, stop })
    }

    /// Why the job fails on every node, once some launcher said so.
    pub(super) fn fatal(&self) -> Option<String> {
        lock(&self.seen).fatal.clone()
    }

    /// What failed in the round, once some launcher said so.
    pub(super) fn failed(&self) -> Option<String> {
        lock(&self.seen).failed.clone()
    }

    /// How long ago the store last answered, and why it can no longer be asked, if so.
    pub(super) fn store(&self) -> (Duration, Option<String>) {
        let seen = lock(&self.seen);
        (seen.answered.elapsed(), seen.broken.clone())
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(|e| e.into_inner())
}

/// The watch's loop, until `stop` or the store cannot be asked (the error).
fn look(
    store: &StoreClient,
    failed: Option<&str>,
    alive: Option<(String, Duration)>,
    seen: &Mutex<Seen>,
    stop: &AtomicBool,
) -> Result<()> {
    let mut next_beat = Instant::now();
    loop {
        if let Some((key, every)) = &alive {
            if Instant::now() >= next_beat && !stop.load(Ordering::SeqCst) {
                store.add(key, 1)?;
                lock(seen).answered = Instant::now();
                next_beat = Instant::now() + *every;
            }
        }
        for (key, fatal) in [(Some(FATAL), true), (failed, false)] {
            let Some(key) = key.filter(|_| !stop.load(Ordering::SeqCst)) else {
                continue;
            };
            let value = peek(store, key)?;
            let mut seen = lock(seen);
            seen.answered = Instant::now();
            let slot = if fatal { &mut seen.fatal } else { &mut seen.failed };
            if slot.is_none() {
                *slot = value;
            }
        }
        let next = Instant::now() + LOOK_EVERY;
        while Instant::now() < next {
            if stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Token;
    use crate::store::StoreServer;

    #[test]
    fn the_watch_sees_what_other_launchers_set() {
        let token = Token::generate().unwrap();
        let server = StoreServer::start("127.0.0.1:0", token.clone()).unwrap();
        let addr = server.addr().to_string();
        let connect = || Arc::new(StoreClient::connect(&addr, &token, Duration::from_secs(10)).unwrap());
        let (mine, other) = (connect(), connect());
        let beat = Some(("r/alive".to_string(), Duration::from_millis(50)));
        let watch = Watch::start(mine, Some("r/failed".into()), beat).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!((watch.fatal(), watch.failed()), (None, None));
        assert!(other.add("r/alive", 0).unwrap() >= 2);
        other.set("r/failed", b"rank 3 failed").unwrap();
        set_fatal(&other, "first").unwrap();
        set_fatal(&other, "second").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while (watch.failed().is_none() || watch.fatal().is_none()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(watch.failed().unwrap(), "rank 3 failed");
        assert_eq!(watch.fatal().unwrap(), "first");
        let (since, broken) = watch.store();
        assert!(
            since < Duration::from_secs(5) && broken.is_none(),
            "{since:?} {broken:?}"
        );
    }
}
