//! The rendezvous key-value store (torchrun's c10d store): served by the launcher, or by rank 0
//! when ranks start without it (Slurm, mpirun), at `MASTER_ADDR:MASTER_PORT`. Ranks publish their
//! addresses in it and wait for each other's. Every connection first passes the token handshake
//! ([`crate::auth`]), each on a thread of its own ([`crate::accept`]); one that fails is refused
//! and logged, and the store goes on serving. A client waits for each reply at most the time the
//! request asks the store to wait plus [`REPLY_TIMEOUT`], so a store that stops answering (its
//! host hung, the network cut without a reset) is an error naming it, not a wait forever.
//!
//! Protocol after the handshake: requests `[op u8][key bytes][value bytes]`, replies
//! `[status u8][value bytes]` (byte strings length-prefixed, see `wire`).

use std::collections::HashMap;
use std::io::{BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::accept::{accept_loop, Pending};
use crate::auth::{client_handshake, server_handshake, Token};
use crate::error::{io, Error, Result};
use crate::wire::{read_bytes, read_u64, read_u8, write_bytes};

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_ADD: u8 = 3;
const OP_ON_CLOSE: u8 = 4;
const OP_CLAIM: u8 = 5;
/// How many keys one connection may ask the store to set when it closes.
const MAX_ON_CLOSE: usize = 4096;
const ST_OK: u8 = 0;
const ST_TIMEOUT: u8 = 1;
const ST_BAD: u8 = 2;
/// Largest key or value the store accepts.
pub const MAX_VALUE: usize = 16 << 20;
const ROLE: &str = "store";
/// How long a client waits for the store's reply beyond the wait it asked for: long enough for
/// a store host paused a while (a debugger attached, swapping), short of forever.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Default)]
struct Table {
    map: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    changed: Condvar,
}

/// A running store; stops accepting when dropped.
pub struct StoreServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl StoreServer {
    /// Listens on `bind` (e.g. `0.0.0.0:29500`, or port 0 for any free port).
    pub fn start(bind: &str, token: Token) -> Result<StoreServer> {
        let listener = TcpListener::bind(bind).map_err(|e| io(format!("store: cannot listen on {bind}"), e))?;
        let addr = listener.local_addr().map_err(|e| io("store", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let table = Arc::new(Table::default());
        let token = Arc::new(token);
        let stop2 = stop.clone();
        std::thread::Builder::new()
            .name("weft-store".into())
            .spawn(move || {
                accept_loop(
                    listener,
                    format!("the store at {addr}"),
                    "weft-store-conn",
                    || stop2.load(Ordering::SeqCst),
                    move |conn, by, pending| serve(conn, by, pending, &table, &token),
                )
            })
            .map_err(|e| io("store: cannot start its thread", e))?;
        Ok(StoreServer { addr, stop })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // wake the accept loop so it sees the flag
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
    }
}

/// TCP keepalive on a client's connection: a peer whose host lost power or whose network was
/// cut sends no FIN, and without probes its connection (and what is marked when it closes:
/// `set_on_close`, `claim`) would stay open for ever. Probes after 10 s idle, every 5 s, 3
/// unanswered: such a peer is gone about 25 s later (Linux; elsewhere the system's defaults).
fn keepalive(conn: &TcpStream) {
    use std::os::fd::AsRawFd;
    let fd = conn.as_raw_fd();
    let set = |level: libc::c_int, name: libc::c_int, value: libc::c_int| {
        // SAFETY: a valid socket descriptor and a c_int option value of its size.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        }
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    #[cfg(target_os = "linux")]
    {
        set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 10);
        set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 5);
        set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3);
    }
}

fn serve(mut conn: TcpStream, by: Instant, pending: Pending, table: &Table, token: &Token) {
    let peer = conn.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
    if let Err(e) = server_handshake(&mut conn, token, ROLE, by) {
        pending.refused(format!("weft store: refused a connection from {peer}: {e}"));
        return;
    }
    drop(pending);
    let _ = conn.set_nodelay(true);
    keepalive(&conn);
    let Ok(read_half) = conn.try_clone() else { return };
    let mut r = BufReader::new(read_half);
    let mut w = BufWriter::new(conn);
    let mut on_close = OnClose {
        table,
        keys: Vec::new(),
    };
    // the loop ends when the client disconnects or sends garbage
    while let Ok(op) = read_u8(&mut r) {
        let (Ok(key), Ok(val)) = (
            read_bytes(&mut r, MAX_VALUE, "store"),
            read_bytes(&mut r, MAX_VALUE, "store"),
        ) else {
            return;
        };
        let (status, out) = match op {
            OP_SET => {
                table.map.lock().unwrap().insert(key, val);
                table.changed.notify_all();
                (ST_OK, Vec::new())
            }
            OP_GET => match <[u8; 8]>::try_from(val.as_slice()) {
                Ok(ms) => {
                    let deadline = crate::deadline::after(Duration::from_millis(u64::from_le_bytes(ms)));
                    let mut map = table.map.lock().unwrap();
                    loop {
                        if let Some(v) = map.get(&key) {
                            break (ST_OK, v.clone());
                        }
                        let now = Instant::now();
                        if now >= deadline {
                            break (ST_TIMEOUT, Vec::new());
                        }
                        map = table.changed.wait_timeout(map, deadline - now).unwrap().0;
                    }
                }
                Err(_) => (ST_BAD, Vec::new()),
            },
            OP_ADD => match <[u8; 8]>::try_from(val.as_slice()) {
                Ok(d) => {
                    let mut map = table.map.lock().unwrap();
                    let new = counter(&map, &key).wrapping_add(i64::from_le_bytes(d));
                    map.insert(key, new.to_le_bytes().to_vec());
                    table.changed.notify_all();
                    (ST_OK, new.to_le_bytes().to_vec())
                }
                Err(_) => (ST_BAD, Vec::new()),
            },
            OP_ON_CLOSE if on_close.keys.len() < MAX_ON_CLOSE => {
                on_close.keys.push(OnCloseKey::Set(key));
                (ST_OK, Vec::new())
            }
            // counted up and the on-close keys asked for in one request: a client killed at any
            // moment leaves either neither or both
            OP_CLAIM if on_close.keys.len() < MAX_ON_CLOSE => {
                let mut map = table.map.lock().unwrap();
                let new = counter(&map, &key).wrapping_add(1);
                map.insert(key, new.to_le_bytes().to_vec());
                table.changed.notify_all();
                on_close.keys.push(OnCloseKey::Claim { prefix: val, n: new });
                (ST_OK, new.to_le_bytes().to_vec())
            }
            _ => (ST_BAD, Vec::new()),
        };
        if w.write_all(&[status]).is_err() || write_bytes(&mut w, &out).is_err() || w.flush().is_err() {
            return;
        }
    }
}

/// The integer at `key` (0 when unset or not an integer).
fn counter(map: &HashMap<Vec<u8>, Vec<u8>>, key: &[u8]) -> i64 {
    map.get(key)
        .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
        .map_or(0, i64::from_le_bytes)
}

/// What the store does when a connection ends.
enum OnCloseKey {
    /// Sets the key to `1` ([`StoreClient::set_on_close`]).
    Set(Vec<u8>),
    /// Sets `{prefix}{n}` to `1` and counts `{prefix}count` up ([`StoreClient::claim`]).
    Claim { prefix: Vec<u8>, n: i64 },
}

/// The keys the store sets when the connection that asked for them ends, however it ends
/// ([`StoreClient::set_on_close`], [`StoreClient::claim`]).
struct OnClose<'a> {
    table: &'a Table,
    keys: Vec<OnCloseKey>,
}

impl Drop for OnClose<'_> {
    fn drop(&mut self) {
        if self.keys.is_empty() {
            return;
        }
        let mut map = self.table.map.lock().unwrap_or_else(|e| e.into_inner());
        for key in self.keys.drain(..) {
            match key {
                OnCloseKey::Set(key) => {
                    map.insert(key, b"1".to_vec());
                }
                OnCloseKey::Claim { prefix, n } => {
                    let mut left = prefix.clone();
                    left.extend_from_slice(n.to_string().as_bytes());
                    map.insert(left, b"1".to_vec());
                    let mut count = prefix;
                    count.extend_from_slice(b"count");
                    let new = counter(&map, &count).wrapping_add(1);
                    map.insert(count, new.to_le_bytes().to_vec());
                }
            }
        }
        self.table.changed.notify_all();
    }
}

/// The two halves of a client's connection.
type Halves = (BufReader<TcpStream>, BufWriter<TcpStream>);

/// A connection to the store. Calls are serialized; share it behind an `Arc`. A call that fails
/// on the connection (no reply in time, the connection lost) leaves it unusable: its replies
/// would no longer match the requests, so later calls fail at once, naming the first failure.
pub struct StoreClient {
    conn: Mutex<std::result::Result<Halves, String>>,
    addr: String,
    reply_timeout: Duration,
    local: std::net::IpAddr,
}

impl StoreClient {
    /// Connects to the store at `addr` (`host:port`), retrying until `timeout` (the server may
    /// still be starting), then runs the token handshake.
    pub fn connect(addr: &str, token: &Token, timeout: Duration) -> Result<StoreClient> {
        let deadline = crate::deadline::after(timeout);
        let what = format!("the store at {addr}");
        // A name that does not resolve yet (a Kubernetes service or a Slurm node still coming
        // up) is retried like a refused connection, until the deadline.
        let mut last;
        let mut conn = loop {
            let attempt = match addr.to_socket_addrs() {
                Ok(addrs) => {
                    last = "no address answered".into();
                    addrs
                        .into_iter()
                        .find_map(|a| TcpStream::connect_timeout(&a, Duration::from_secs(2)).ok())
                }
                Err(e) => {
                    last = format!("cannot resolve {addr}: {e}");
                    None
                }
            };
            match attempt {
                Some(c) => break c,
                None if Instant::now() >= deadline => {
                    return Err(Error::Timeout(format!(
                        "could not connect to {what} within {:.0} s ({last}; is MASTER_ADDR:MASTER_PORT right, and \
                         the launcher or rank 0 running?)",
                        timeout.as_secs_f64()
                    )))
                }
                None => {
                    if let Some(e) = crate::interrupt::stopped(&format!("connecting to {what}")) {
                        return Err(e);
                    }
                    std::thread::sleep(Duration::from_millis(100))
                }
            }
        };
        client_handshake(&mut conn, token, ROLE, &what)?;
        let _ = conn.set_nodelay(true);
        let local = conn.local_addr().map_err(|e| io(&what, e))?.ip();
        let read_half = conn.try_clone().map_err(|e| io(&what, e))?;
        conn.set_write_timeout(Some(REPLY_TIMEOUT)).map_err(|e| io(&what, e))?;
        Ok(StoreClient {
            conn: Mutex::new(Ok((BufReader::new(read_half), BufWriter::new(conn)))),
            addr: addr.to_string(),
            reply_timeout: REPLY_TIMEOUT,
            local,
        })
    }

    /// This client with replies awaited `reply_timeout` beyond the wait a request asks for
    /// (default [`REPLY_TIMEOUT`]).
    pub fn with_reply_timeout(mut self, reply_timeout: Duration) -> StoreClient {
        self.reply_timeout = reply_timeout;
        self
    }

    /// This side's address on the connection: the interface that routes to the store, which
    /// ranks publish for their peers.
    pub fn local_ip(&self) -> std::net::IpAddr {
        self.local
    }

    /// Sends one request and reads its reply, waiting at most `wait` (what the request asks the
    /// store to wait) plus the reply timeout.
    fn call(&self, op: u8, key: &str, val: &[u8], wait: Duration) -> Result<(u8, Vec<u8>)> {
        let what = format!("store at {}", self.addr);
        let mut g = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let (r, w) = match &mut *g {
            Ok(halves) => halves,
            Err(first) => {
                return Err(Error::Io(format!(
                    "{what}: the connection failed earlier ({first}); no further requests are sent on it"
                )))
            }
        };
        let limit = wait.saturating_add(self.reply_timeout);
        let timed = |e: std::io::Error| match e.kind() {
            // not `Error::Timeout`, which callers read as "the key was not set in time"
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Error::Io(format!(
                "the {what} did not answer within {:.0} s (its host hung, or the network to it is cut?)",
                limit.as_secs_f64()
            )),
            std::io::ErrorKind::UnexpectedEof
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::BrokenPipe => Error::Io(format!(
                "the {what} closed the connection (the process serving it exited or was killed)"
            )),
            _ => io(&what, e),
        };
        let exchanged = (|| -> Result<(u8, Vec<u8>)> {
            r.get_ref().set_read_timeout(Some(limit)).map_err(|e| io(&what, e))?;
            w.write_all(&[op]).map_err(timed)?;
            write_bytes(w, key.as_bytes()).map_err(timed)?;
            write_bytes(w, val).map_err(timed)?;
            w.flush().map_err(timed)?;
            let status = read_u8(r).map_err(timed)?;
            let len = read_u64(r).map_err(timed)?;
            if len > MAX_VALUE as u64 {
                return Err(Error::Io(format!(
                    "{what}: a reply of {len} bytes exceeds the limit of {MAX_VALUE}"
                )));
            }
            let mut out = vec![0u8; len as usize];
            r.read_exact(&mut out).map_err(timed)?;
            Ok((status, out))
        })();
        let (status, out) = match exchanged {
            Ok(reply) => reply,
            Err(e) => {
                *g = Err(e.to_string());
                return Err(e);
            }
        };
        if status == ST_BAD {
            return Err(Error::Invalid(format!("{what} rejected a request for key {key:?}")));
        }
        Ok((status, out))
    }

    /// Sets `key` to `value`.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.call(OP_SET, key, value, Duration::ZERO).map(|_| ())
    }

    /// The value of `key`, waiting up to `timeout` for some rank to set it.
    pub fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        // asked in slices when a stop check is set, looking at it between them
        let deadline = crate::deadline::after(timeout);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let wait = if crate::interrupt::is_set() {
                left.min(crate::interrupt::SLICE)
            } else {
                left
            };
            let ms = wait.as_millis().min(u64::MAX as u128) as u64;
            if let (ST_OK, v) = self.call(OP_GET, key, &ms.to_le_bytes(), wait)? {
                return Ok(v);
            }
            if let Some(e) = crate::interrupt::stopped(&format!("waiting for store key {key:?}")) {
                return Err(e);
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout(format!(
                    "store key {key:?} was not set within {:.0} s (a rank did not arrive)",
                    timeout.as_secs_f64()
                )));
            }
        }
    }

    /// Asks the store to set `key` to `1` when this connection closes, however it closes (this
    /// process exits or is killed, the client is dropped): how its peers learn that it is gone.
    /// At most 4096 keys per connection.
    pub fn set_on_close(&self, key: &str) -> Result<()> {
        self.call(OP_ON_CLOSE, key, &[], Duration::ZERO)
            .map(|_| ())
            .map_err(|e| match e {
                // a store of an older weft answers requests it does not know this way too
                Error::Invalid(m) => Error::Invalid(format!(
                    "{m} to be set when this connection closes: this connection asked for {MAX_ON_CLOSE} such keys \
                 already, or the store is an older weft's that does not know the request (run the same weft on \
                 every node)"
                )),
                e => e,
            })
    }

    /// Counts the integer at `key` up by one and returns the new value `n`, and asks the store,
    /// in the same request, to set `{left}{n}` to `1` and count `{left}count` up by one when this
    /// connection closes, however it closes. So a claim never outlives its claimant unmarked,
    /// even one killed right after it: the live claims are the value at `key` minus the value at
    /// `{left}count`. Counts towards the 4096 keys of [`StoreClient::set_on_close`].
    pub fn claim(&self, key: &str, left: &str) -> Result<i64> {
        let (_, v) = self
            .call(OP_CLAIM, key, left.as_bytes(), Duration::ZERO)
            .map_err(|e| match e {
                Error::Invalid(m) => Error::Invalid(format!(
                "{m} (a claim): this connection asked for {MAX_ON_CLOSE} keys to be set when it closes already, or \
                 the store is an older weft's that does not know the request (run the same weft on every node)"
            )),
                e => e,
            })?;
        let b = <[u8; 8]>::try_from(v.as_slice())
            .map_err(|_| Error::Io(format!("store at {}: malformed reply to a claim", self.addr)))?;
        Ok(i64::from_le_bytes(b))
    }

    /// Adds `delta` to the integer at `key` (0 when unset) and returns the new value.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let (_, v) = self.call(OP_ADD, key, &delta.to_le_bytes(), Duration::ZERO)?;
        let b = <[u8; 8]>::try_from(v.as_slice())
            .map_err(|_| Error::Io(format!("store at {}: malformed reply to add", self.addr)))?;
        Ok(i64::from_le_bytes(b))
    }

    /// Waits until `n` callers have reached the barrier named `name`.
    pub fn barrier(&self, name: &str, n: usize, timeout: Duration) -> Result<()> {
        let arrived = self.add(&format!("{name}/count"), 1)?;
        if arrived == n as i64 {
            self.set(&format!("{name}/done"), b"1")?;
        }
        self.get(&format!("{name}/done"), timeout).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_close_keys_are_set_when_the_connection_ends() {
        let token = Token::generate().unwrap();
        let server = StoreServer::start("127.0.0.1:0", token.clone()).unwrap();
        let addr = server.addr().to_string();
        let (a, b) = (
            StoreClient::connect(&addr, &token, Duration::from_secs(10)).unwrap(),
            StoreClient::connect(&addr, &token, Duration::from_secs(10)).unwrap(),
        );
        a.set_on_close("gone/a").unwrap();
        a.set("x", b"1").unwrap();
        assert!(matches!(
            b.get("gone/a", Duration::from_millis(1)),
            Err(Error::Timeout(_))
        ));
        drop(a);
        assert_eq!(b.get("gone/a", Duration::from_secs(10)).unwrap(), b"1");
        assert_eq!(b.get("x", Duration::from_secs(1)).unwrap(), b"1");
        // past the limit, the refusal says what may be wrong
        for i in 0..MAX_ON_CLOSE {
            b.set_on_close(&format!("gone/b{i}")).unwrap();
        }
        let e = b.set_on_close("gone/one-more").unwrap_err().to_string();
        assert!(
            e.contains("asked for 4096 such keys already, or the store is an older weft's"),
            "{e}"
        );
        assert!(b.claim("c", "c/left/").is_err());
    }

    /// A claim and its on-close keys come in one request: the claims of connections that
    /// closed are marked (`left/<n>`) and counted (`left/count`), and only those.
    #[test]
    fn claims_are_marked_when_their_connection_ends() {
        let token = Token::generate().unwrap();
        let server = StoreServer::start("127.0.0.1:0", token.clone()).unwrap();
        let addr = server.addr().to_string();
        let connect = || StoreClient::connect(&addr, &token, Duration::from_secs(10)).unwrap();
        let (a, b, watcher) = (connect(), connect(), connect());
        assert_eq!(a.claim("n", "n/left/").unwrap(), 1);
        assert_eq!(b.claim("n", "n/left/").unwrap(), 2);
        assert_eq!(watcher.add("n/left/count", 0).unwrap(), 0);
        drop(a);
        assert_eq!(watcher.get("n/left/1", Duration::from_secs(10)).unwrap(), b"1");
        assert_eq!(watcher.add("n/left/count", 0).unwrap(), 1);
        assert!(matches!(
            watcher.get("n/left/2", Duration::from_millis(1)),
            Err(Error::Timeout(_))
        ));
        assert_eq!(watcher.claim("n", "n/left/").unwrap(), 3);
        drop(b);
        assert_eq!(watcher.get("n/left/2", Duration::from_secs(10)).unwrap(), b"1");
        assert_eq!(watcher.add("n/left/count", 0).unwrap(), 2);
        assert_eq!(watcher.add("n", 0).unwrap(), 3);
    }
}
