//! Whether the store at `--master-addr:--master-port`, where the other nodes' launchers and
//! every worker connect, is the one this launcher serves (node 0's, on several nodes).
//!
//! A launcher given `--node-rank 0` on a host that `--master-addr` does not name serves a store
//! that nothing connects to, and would wait for the other nodes until its join timeout. So node
//! 0's launcher marks its own store with a random nonce ([`MARK`]) and, from a thread of its own
//! ([`Check`]), connects to `--master-addr:--master-port` as the other nodes do and reads the
//! mark back:
//! - its own mark: all is well, and the check stops;
//! - a store that does not know the job's token, or one that knows it but holds another mark or
//!   none (another launcher's, or a rank 0's): the launcher fails at once ([`Check::other`]);
//! - nothing, or nothing that completes the handshake (a connection refused or timed out, a name
//!   that does not resolve yet, a proxy that closes the connection): no conclusion. The real
//!   node 0 may not be up yet, or the address does not loop back to this host (a NAT address, a
//!   Kubernetes service without hairpin), which is no fault: the check tries again every
//!   [`RECHECK`] until one of the above, or until it is dropped (the other nodes came to this
//!   launcher's store: it is the job's).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::LaunchConfig;
use crate::auth::Token;
use crate::error::{Error, Result};
use crate::store::StoreClient;

/// The key node 0's launcher sets in its own store to a random nonce.
const MARK: &str = "weft/launch/store-mark";
/// How long the check waits, after one try that reached nothing, before the next.
const RECHECK: Duration = Duration::from_secs(1);
/// How long one try waits for a store without a mark to get one (a launcher marks its store
/// right after it starts it).
const MARK_WAIT: Duration = Duration::from_secs(1);
/// How long one try waits for the store's answer to its request (after the handshake, which
/// [`crate::auth::HANDSHAKE_TIMEOUT`] bounds; the connection itself waits at most 2 s per
/// address).
const ANSWER_WAIT: Duration = Duration::from_secs(2);

/// What answered at the master address.
#[derive(Debug, PartialEq)]
enum Answer {
    /// This launcher's own store.
    Own,
    /// Another store: whose, in words (`another launcher's (...)`).
    Other(String),
    /// Nothing that could be told apart: no connection, or one that failed before the store
    /// answered.
    Nothing,
}

/// Connects once to the store at `addr` with `token` and reads [`MARK`]: [`Answer::Own`] when
/// it is `mark`.
fn probe(addr: &str, token: &Token, mark: &str) -> Answer {
    let store = match StoreClient::connect(addr, token, Duration::ZERO) {
        Ok(store) => store.with_reply_timeout(ANSWER_WAIT),
        // it completed the server's half of the handshake, so it is a weft store (or a rank's
        // listener) that does not know this job's token
        Err(Error::Auth(_)) => {
            return Answer::Other("another job's (it does not know this job's WEFT_JOB_TOKEN)".into());
        }
        // refused, timed out, not resolved, or closed before the handshake was done
        Err(_) => return Answer::Nothing,
    };
    // a launcher marks its store right after it starts it: one just started has a moment
    match store.get(MARK, MARK_WAIT) {
        Ok(v) if v == mark.as_bytes() => Answer::Own,
        Ok(_) => Answer::Other("another launcher's (it holds another launcher's mark)".into()),
        // this launcher marked its store before it started checking
        Err(Error::Timeout(_)) => Answer::Other(
            "another launcher's or rank 0's (it holds no launcher's mark: an older weft's launcher, or a rank 0 that \
             serves the store itself)"
                .into(),
        ),
        Err(_) => Answer::Nothing,
    }
}

/// The line node 0's launcher fails with when `whose` store answers at `addr` (`host` is
/// `--master-addr`).
fn refusal(addr: &str, host: &str, whose: &str) -> String {
    format!(
        "--node-rank 0 serves the store, but the store at {addr} (--master-addr and --master-port, where the other \
         nodes connect) is {whose}: start --node-rank 0 on the host that --master-addr names ({host}), and give this \
         host another --node-rank"
    )
}

/// The thread that checks, until it concludes, whether the store at the master address is this
/// launcher's; it stops when dropped (at its next look: a try under way ends on its own).
pub(super) struct Check {
    other: Arc<Mutex<Option<String>>>,
    stop: Arc<AtomicBool>,
}

impl Check {
    /// Marks this launcher's store (`own`, a client of it) with a fresh nonce and starts
    /// checking the store at `--master-addr:port`.
    pub(super) fn start(own: &StoreClient, cfg: &LaunchConfig, token: &Token, port: u16) -> Result<Check> {
        let mut b = [0u8; 16];
        getrandom::fill(&mut b).map_err(|e| Error::Io(format!("no randomness for the store's mark: {e}")))?;
        let mark: String = b.iter().map(|x| format!("{x:02x}")).collect();
        own.set(MARK, mark.as_bytes())?;
        let host = cfg.master_addr.trim().to_string();
        let addr = crate::addr::host_port(&host, port);
        let token = token.clone();
        let other = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let (other2, stop2) = (other.clone(), stop.clone());
        std::thread::Builder::new()
            .name("weft-launch-master".into())
            .spawn(move || loop {
                if stop2.load(Ordering::SeqCst) {
                    return;
                }
                match probe(&addr, &token, &mark) {
                    Answer::Own => return,
                    Answer::Other(whose) => {
                        *other2.lock().unwrap_or_else(|e| e.into_inner()) = Some(refusal(&addr, &host, &whose));
                        return;
                    }
                    Answer::Nothing => {}
                }
                let next = Instant::now() + RECHECK;
                while Instant::now() < next {
                    if stop2.load(Ordering::SeqCst) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
            .map_err(|e| crate::error::io("weft launch: cannot start the thread that checks --master-addr", e))?;
        Ok(Check { other, stop })
    }

    /// The line to fail with, once another store answered at the master address.
    pub(super) fn other(&self) -> Option<String> {
        self.other.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for Check {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Where node 0's launcher (its store bound at `bound`) reaches its own store: on loopback when
/// it listens on every interface, else at the address it listens on.
pub(super) fn own_addr(bound: SocketAddr) -> String {
    if bound.ip().is_unspecified() {
        crate::addr::host_port("127.0.0.1", bound.port())
    } else {
        bound.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreServer;

    fn marked(token: &Token, mark: Option<&str>) -> (StoreServer, String) {
        let server = StoreServer::start("127.0.0.1:0", token.clone()).unwrap();
        let addr = server.addr().to_string();
        if let Some(mark) = mark {
            let c = StoreClient::connect(&addr, token, Duration::from_secs(10)).unwrap();
            c.set(MARK, mark.as_bytes()).unwrap();
        }
        (server, addr)
    }

    #[test]
    fn only_a_store_with_this_launchers_mark_is_its_own() {
        let token = Token::new("tok-master").unwrap();
        let (_own, own) = marked(&token, Some("m1"));
        assert_eq!(probe(&own, &token, "m1"), Answer::Own);
        let (_other, other) = marked(&token, Some("m2"));
        assert!(matches!(probe(&other, &token, "m1"), Answer::Other(w) if w.contains("another launcher's mark")));
        let (_bare, bare) = marked(&token, None);
        assert!(matches!(probe(&bare, &token, "m1"), Answer::Other(w) if w.contains("no launcher's mark")));
        let stranger = Token::new("tok-other").unwrap();
        let (_job, job) = marked(&stranger, Some("m1"));
        assert!(matches!(probe(&job, &token, "m1"), Answer::Other(w) if w.contains("another job's")));
    }

    #[test]
    fn nothing_answering_is_no_conclusion() {
        let token = Token::new("tok-master").unwrap();
        // a port nothing listens on
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let started = Instant::now();
        assert_eq!(probe(&format!("127.0.0.1:{port}"), &token, "m"), Answer::Nothing);
        // something that accepts and closes at once (a proxy with no backend)
        let closing = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = closing.local_addr().unwrap().to_string();
        let t = std::thread::spawn(move || drop(closing.accept()));
        assert_eq!(probe(&addr, &token, "m"), Answer::Nothing);
        t.join().unwrap();
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    }

    #[test]
    fn own_address() {
        assert_eq!(own_addr("0.0.0.0:5".parse().unwrap()), "127.0.0.1:5");
        assert_eq!(own_addr("[::]:5".parse().unwrap()), "127.0.0.1:5");
        assert_eq!(own_addr("127.0.0.2:5".parse().unwrap()), "127.0.0.2:5");
        assert_eq!(own_addr("[::1]:5".parse().unwrap()), "[::1]:5");
    }
}
