//! TCP connections between every pair of ranks, and the inbox their messages land in.
//!
//! Each rank listens on a free port and publishes `ip:port` in the store; rank `j` connects to
//! every rank `i < j` and, after the token handshake, says who it is. One reader thread per peer
//! drains its socket into the inbox, keyed by (sender, stream), so sends never wait for the
//! receiver to be ready and a ring step (send right, receive left) cannot deadlock. A closed
//! connection or an abort message marks the peer failed, and anyone waiting on it gets an error
//! naming it instead of hanging; waits end after the job's timeout.

use std::io::{BufReader, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use crate::accept::{accept_loop, Pending};
use crate::auth::{client_handshake, server_handshake, Token};
use crate::error::{io, Error, Result};
use crate::inbox::{read_peer, write_frame, Inbox, Source, ABORT};
pub(crate) use crate::inbox::{Absorb, Frame, Header, PostId, PostOutcome, MAX_FRAME};
use crate::shm::{host_key, Ring, Segment};
use crate::store::StoreClient;

const ROLE: &str = "mesh";
/// Every connection of this rank.
pub(crate) struct Mesh {
    pub rank: usize,
    pub world: usize,
    pub timeout: Duration,
    /// Host index of every rank (ranks with equal indices share memory), numbered in order of
    /// each host's first rank.
    pub host_of: Vec<usize>,
    links: Vec<Option<Link>>,
    inbox: Arc<Inbox>,
}

/// The connection to one peer: TCP always (aborts, and liveness: it closes when the peer's
/// process ends), and shared-memory rings for the data when the peer is on this host.
struct Link {
    tcp: Mutex<TcpStream>,
    shm: Option<Mutex<Ring>>,
    /// Set when the TCP connection closed; stops this side's shared-memory reader once drained.
    gone: Arc<AtomicBool>,
}

impl Mesh {
    /// A mesh of one rank: no connections.
    pub fn single() -> Mesh {
        Mesh {
            rank: 0,
            world: 1,
            timeout: Duration::from_secs(300),
            host_of: vec![0],
            links: vec![None],
            inbox: Arc::default(),
        }
    }

    /// Connects this rank to every other through `store` (keys under `prefix`).
    pub fn connect(
        rank: usize,
        world: usize,
        store: &StoreClient,
        token: &Token,
        prefix: &str,
        options: &crate::Options,
    ) -> Result<Mesh> {
        let timeout = options.timeout;
        same_world_as_rank_0(rank, world, store, prefix, timeout)?;
        // listen where peers are told to connect: the interface that reaches the store (only
        // loopback when the store is on it), unless another address is advertised
        let advertised = std::env::var("WEFT_ADVERTISE_ADDR").ok();
        let bind = match &advertised {
            Some(a) => format!("{}:0", crate::addr::any_interface(a)),
            None => SocketAddr::new(store.local_ip(), 0).to_string(),
        };
        let listener = TcpListener::bind(&bind).map_err(|e| io(format!("cannot listen on {bind}"), e))?;
        let local = listener.local_addr().map_err(|e| io("listening socket", e))?;
        let ip = advertised.unwrap_or_else(|| store.local_ip().to_string());
        store.set(
            &format!("{prefix}mesh/{rank}"),
            crate::addr::host_port(&ip, local.port()).as_bytes(),
        )?;

        // accept the higher ranks on a thread while connecting to the lower ones
        let expected = world - 1 - rank;
        let (tx, rx) = mpsc::channel::<Arrival>();
        let accepting = Arc::new(AtomicBool::new(expected > 0));
        if expected > 0 {
            let (token, accepting) = (token.clone(), accepting.clone());
            std::thread::Builder::new()
                .name("weft-mesh-accept".into())
                .spawn(move || {
                    accept_loop(
                        listener,
                        format!("rank {rank}"),
                        "weft-mesh-conn",
                        || !accepting.load(Ordering::SeqCst),
                        move |s, by, pending| {
                            let arrival = handshake_peer(s, by, &token, &pending);
                            drop(pending);
                            if let Some(arrival) = arrival {
                                let _ = tx.send(arrival);
                            }
                        },
                    )
                })
                .map_err(|e| io("cannot start the accept thread", e))?;
        }
        let mut streams: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
        for (peer, slot) in streams.iter_mut().enumerate().take(rank) {
            let addr = String::from_utf8_lossy(&store.get(&format!("{prefix}mesh/{peer}"), timeout)?).into_owned();
            let sa: SocketAddr = addr
                .parse()
                .map_err(|_| Error::Io(format!("rank {peer} published a malformed address {addr:?}")))?;
            let what = format!("rank {peer} at {addr}");
            let mut s = TcpStream::connect_timeout(&sa, timeout).map_err(|e| io(format!("connecting to {what}"), e))?;
            client_handshake(&mut s, token, ROLE, &what)?;
            s.write_all(&(rank as u64).to_le_bytes()).map_err(|e| io(&what, e))?;
            *slot = Some(s);
        }
        let deadline = crate::deadline::after(timeout);
        let mut got = 0;
        while got < expected {
            let left = deadline.saturating_duration_since(Instant::now());
            let wait = if crate::interrupt::is_set() {
                left.min(crate::interrupt::SLICE)
            } else {
                left
            };
            match rx.recv_timeout(wait) {
                Ok(Arrival { peer, stream, from }) => {
                    if peer <= rank || peer >= world || streams[peer].is_some() {
                        let why = if peer >= world {
                            format!(
                                " (this job has {world} ranks: do all nodes run the same number of processes, \
                                 with the same WORLD_SIZE?)"
                            )
                        } else if peer > rank {
                            " (that rank connected already)".to_string()
                        } else {
                            String::new()
                        };
                        weft_core::errln!(
                            "weft: rank {rank} refused a connection from {from} claiming rank {peer}{why}"
                        );
                        continue;
                    }
                    streams[peer] = Some(stream);
                    got += 1;
                }
                Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {
                    if let Some(e) = crate::interrupt::stopped("waiting for the other ranks to connect") {
                        return Err(e);
                    }
                }
                Err(_) => {
                    let missing: Vec<usize> = (rank + 1..world).filter(|&p| streams[p].is_none()).collect();
                    return Err(Error::Timeout(format!(
                        "rank {rank}: {} did not connect within {:.0} s",
                        some_ranks(&missing),
                        timeout.as_secs_f64()
                    )));
                }
            }
        }
        if accepting.swap(false, Ordering::SeqCst) {
            // wake the accept loop so it sees that it is done and closes the listener
            let _ = TcpStream::connect_timeout(&local, Duration::from_secs(1));
        }
        let (host_of, rings) = shared_memory(rank, world, store, prefix, options)?;
        let inbox = Arc::new(Inbox::default());
        let mut links = Vec::with_capacity(world);
        for ((peer, s), ring) in streams.into_iter().enumerate().zip(rings) {
            let Some(s) = s else {
                links.push(None);
                continue;
            };
            let _ = s.set_nodelay(true);
            s.set_write_timeout(Some(timeout))
                .map_err(|e| io(format!("rank {peer}"), e))?;
            let r = s.try_clone().map_err(|e| io(format!("rank {peer}"), e))?;
            let gone = Arc::new(AtomicBool::new(false));
            let shm = match ring {
                Some(seg) => {
                    let (out, inn) = seg.rings(rank < peer, gone.clone());
                    let (inbox, gone) = (inbox.clone(), gone.clone());
                    std::thread::Builder::new()
                        .name(format!("weft-shm-rx{peer}"))
                        .spawn(move || read_peer(peer, inn, &inbox, Source::SharedMemory(gone)))
                        .map_err(|e| io("cannot start a reader thread", e))?;
                    Some(Mutex::new(out))
                }
                None => None,
            };
            let inbox = inbox.clone();
            let source = match shm {
                Some(_) => Source::TcpBesideSharedMemory(gone.clone()),
                None => Source::Tcp,
            };
            std::thread::Builder::new()
                .name(format!("weft-mesh-rx{peer}"))
                .spawn(move || read_peer(peer, BufReader::with_capacity(1 << 16, r), &inbox, source))
                .map_err(|e| io("cannot start a reader thread", e))?;
            links.push(Some(Link {
                tcp: Mutex::new(s),
                shm,
                gone,
            }));
        }
        Ok(Mesh {
            rank,
            world,
            timeout,
            host_of,
            links,
            inbox,
        })
    }

    /// Whether messages to `peer` go through shared memory.
    pub fn is_shared_memory(&self, peer: usize) -> bool {
        self.links
            .get(peer)
            .and_then(|l| l.as_ref())
            .is_some_and(|l| l.shm.is_some())
    }

    /// Sends one frame to `peer` (a global rank). Errors say what happened to the peer; callers
    /// add which operation was under way.
    pub fn send(&self, peer: usize, h: &Header, payload: &[u8]) -> Result<()> {
        let Some(link) = self.links.get(peer).and_then(|w| w.as_ref()) else {
            return Err(Error::Invalid(format!(
                "rank {}: no connection to rank {peer}",
                self.rank
            )));
        };
        let r = match &link.shm {
            Some(ring) => write_frame(&mut *ring.lock().unwrap(), h, payload),
            None => write_frame(&mut *link.tcp.lock().unwrap(), h, payload),
        };
        r.map_err(|e| {
            // a peer that gave up closes its connections after saying why: report the why, once
            // this side's reader has read up to the end of the connection (bounded wait)
            self.inbox.wait_until_ended(peer, Duration::from_secs(2));
            if let Some((from, why)) = self.inbox.aborted_by() {
                crate::failure::blame(from);
                return Error::PeerFailed(why);
            }
            match e.kind() {
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => {
                    crate::failure::blame(peer);
                    Error::PeerFailed(format!(
                        "rank {peer} closed its connection (its process exited or was killed)"
                    ))
                }
                _ => Error::PeerFailed(format!("sending to rank {peer} failed: {e}")),
            }
        })
    }

    /// Waits for the next frame from `peer` on `stream` whose sequence number satisfies `want`
    /// (frames arrive in order; `want` picks among queued ones). `what` describes the operation
    /// for errors.
    pub fn recv(&self, peer: usize, stream: u64, want: impl Fn(&Header) -> bool, what: &str) -> Result<Frame> {
        self.inbox.recv(self.rank, peer, stream, want, what, self.timeout)
    }

    /// Posts a receive of the next frame from `peer` with `header` into `dst` (see
    /// [`crate::inbox`]); finish it with [`Mesh::wait_post`] or [`Mesh::withdraw`].
    ///
    /// # Safety
    /// `dst[..len]` must stay valid and untouched by the caller until the post is finished.
    pub unsafe fn post(&self, peer: usize, header: Header, dst: *mut u8, len: usize, absorb: Absorb) -> PostId {
        // SAFETY: forwarded from the caller.
        unsafe { self.inbox.post(peer, header, dst, len, absorb) }
    }

    /// Waits for post `id` (see [`crate::inbox::Inbox::wait_post`]).
    pub fn wait_post(&self, id: PostId, what: &str) -> Result<PostOutcome> {
        self.inbox
            .wait_post(self.rank, id, what, self.timeout, &|| self.sever(id.0))
    }

    /// Withdraws post `id`, or waits until the reader has finished writing into it.
    pub fn withdraw(&self, id: PostId) {
        self.inbox.withdraw(id, self.timeout, &|| self.sever(id.0));
    }

    /// Cuts the connection to `peer` (after it stayed silent mid-message past the timeout):
    /// its reader threads stop and mark it failed.
    fn sever(&self, peer: usize) {
        if let Some(link) = self.links.get(peer).and_then(|l| l.as_ref()) {
            link.gone.store(true, Ordering::SeqCst);
            if let Ok(w) = link.tcp.try_lock() {
                let _ = w.shutdown(Shutdown::Both);
            }
        }
    }

    /// Tells every peer this rank gave up (so they fail at once instead of at their timeout),
    /// with `reason`. The abort travels behind the data already sent to the peer: through its
    /// shared-memory ring when the peer has one and the ring has room for it now (else through
    /// TCP, which a peer reads beside the ring and may read first), so the peer still completes
    /// every operation this rank finished sending before it gave up.
    pub fn abort(&self, reason: &str) {
        let h = Header {
            stream: ABORT,
            seq: 0,
            op: 0,
            dtype: 0,
            count: 0,
        };
        let frame_bytes = crate::inbox::HEADER_BYTES + reason.len();
        for link in self.links.iter().flatten() {
            // a send stuck on this peer holds the lock; it fails by itself at the write timeout
            if let Some(Ok(mut ring)) = link.shm.as_ref().map(|r| r.try_lock()) {
                // with room for the whole frame the write does not wait for the peer's reader
                if ring.free_bytes() >= frame_bytes && write_frame(&mut *ring, &h, reason.as_bytes()).is_ok() {
                    continue;
                }
            }
            if let Ok(mut w) = link.tcp.try_lock() {
                let _ = write_frame(&mut *w, &h, reason.as_bytes());
            }
        }
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        for link in self.links.iter().flatten() {
            if let Some(ring) = &link.shm {
                if let Ok(r) = ring.lock() {
                    r.close();
                }
            }
            // stops this side's shared-memory reader
            link.gone.store(true, Ordering::SeqCst);
            if let Ok(w) = link.tcp.lock() {
                let _ = w.shutdown(Shutdown::Both);
            }
        }
    }
}

/// A connection from a higher rank that passed the handshake and said its rank.
struct Arrival {
    peer: usize,
    stream: TcpStream,
    from: String,
}

/// How many ranks [`some_ranks`] names before it counts the rest.
const RANKS_NAMED: usize = 8;

/// `1 rank (5)`, `3 ranks (1, 2, 3)`, `1048575 ranks (1, 2, 3, 4, 5, 6, 7, 8 and 1048567 more)`: a message
/// about many ranks stays one short line.
fn some_ranks(ranks: &[usize]) -> String {
    let named: Vec<String> = ranks.iter().take(RANKS_NAMED).map(|r| r.to_string()).collect();
    let more = match ranks.len().saturating_sub(RANKS_NAMED) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    let noun = if ranks.len() == 1 { "rank" } else { "ranks" };
    format!("{} {noun} ({}{more})", ranks.len(), named.join(", "))
}

/// The token handshake with a connecting peer and the rank it says it is, all by `by`; `None`
/// (said on stderr) when either fails.
fn handshake_peer(mut s: TcpStream, by: Instant, token: &Token, pending: &Pending) -> Option<Arrival> {
    let from = s.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
    if let Err(e) = server_handshake(&mut s, token, ROLE, by) {
        pending.refused(format!("weft: refused a connection from {from}: {e}"));
        return None;
    }
    let mut b = [0u8; 8];
    let said = crate::auth::read_exact_by(&mut s, &mut b, by);
    let _ = s.set_read_timeout(None);
    match said {
        Ok(()) => Some(Arrival {
            peer: usize::try_from(u64::from_le_bytes(b)).unwrap_or(usize::MAX),
            stream: s,
            from,
        }),
        Err(e) => {
            pending.refused(format!("weft: a peer from {from} did not say its rank: {e}"));
            None
        }
    }
}

/// Checks that rank 0 runs with the same world size as this rank: ranks started with different
/// `WORLD_SIZE`s (two nodes' launchers with different `--nproc-per-node`) would otherwise wait
/// for ranks that never come until the timeout, with nothing naming the cause.
fn same_world_as_rank_0(rank: usize, world: usize, store: &StoreClient, prefix: &str, timeout: Duration) -> Result<()> {
    store.set(&format!("{prefix}world/{rank}"), world.to_string().as_bytes())?;
    if rank == 0 {
        return Ok(());
    }
    let theirs = String::from_utf8_lossy(&store.get(&format!("{prefix}world/0"), timeout)?).into_owned();
    if theirs != world.to_string() {
        return Err(Error::Invalid(format!(
            "rank {rank} runs with WORLD_SIZE={world} but rank 0 with {theirs}: every rank of a job must have the \
             same world size (do all nodes run the same number of processes?)"
        )));
    }
    Ok(())
}

/// Every rank's host index, and per peer its shared-memory segment (None: TCP only).
type HostsAndSegments = (Vec<usize>, Vec<Option<Arc<Segment>>>);

/// Finds which ranks share a host and sets up a shared-memory segment with each such peer
/// (when enabled in `options`). Returns every rank's host index and, per peer, its segment (None:
/// TCP only). The lower rank of a pair creates the file and publishes its path; the higher one
/// maps it, unlinks it and acknowledges; a failure on either side leaves that pair on TCP. The
/// creator unlinks the file too once the acknowledgement came, and when it returns early (an
/// error, the peer never came), so a failure anywhere leaves nothing under /dev/shm.
fn shared_memory(
    rank: usize,
    world: usize,
    store: &StoreClient,
    prefix: &str,
    options: &crate::Options,
) -> Result<HostsAndSegments> {
    let timeout = options.timeout;
    let me = options.host_id.clone().unwrap_or_else(host_key);
    store.set(&format!("{prefix}host/{rank}"), me.as_bytes())?;
    let mut keys = Vec::with_capacity(world);
    for r in 0..world {
        keys.push(store.get(&format!("{prefix}host/{r}"), timeout)?);
    }
    let host_of: Vec<usize> = keys
        .iter()
        .map(|k| keys.iter().position(|o| o == k).expect("present"))
        .collect();
    let mut segs: Vec<Option<Arc<Segment>>> = (0..world).map(|_| None).collect();
    if !options.shared_memory {
        return Ok((host_of, segs));
    }
    let local: Vec<usize> = (0..world)
        .filter(|&p| p != rank && host_of[p] == host_of[rank])
        .collect();
    let key = |lo: usize, hi: usize| format!("{prefix}shm/{lo}-{hi}");
    // the files this rank created, unlinked however this function returns (the peer that maps
    // one unlinks it too; whichever comes second finds nothing)
    let mut created = Unlink(Vec::new());
    for &p in local.iter().filter(|&&p| p > rank) {
        let path = format!("/dev/shm/weft-{}-{rank}-{p}-{}", std::process::id(), nonce());
        match Segment::create(&path) {
            Ok(seg) => {
                created.0.push(path.clone());
                segs[p] = Some(Arc::new(seg));
                store.set(&key(rank, p), path.as_bytes())?;
            }
            Err(e) => {
                weft_core::errln!("weft: rank {rank}: shared memory with rank {p} unavailable ({e}); using TCP");
                store.set(&key(rank, p), b"")?;
            }
        }
    }
    for &p in local.iter().filter(|&&p| p < rank) {
        let path = String::from_utf8_lossy(&store.get(&key(p, rank), timeout)?).into_owned();
        let ok = if path.is_empty() {
            false
        } else {
            let opened = Segment::open(&path);
            let _ = std::fs::remove_file(&path);
            match opened {
                Ok(seg) => {
                    segs[p] = Some(Arc::new(seg));
                    true
                }
                Err(e) => {
                    weft_core::errln!("weft: rank {rank}: shared memory with rank {p} unavailable ({e}); using TCP");
                    false
                }
            }
        };
        store.set(&format!("{}/ack", key(p, rank)), if ok { b"1" } else { b"0" })?;
    }
    for &p in local.iter().filter(|&&p| p > rank) {
        let ack = store.get(&format!("{}/ack", key(rank, p)), timeout)?;
        if ack != b"1" {
            segs[p] = None;
        }
    }
    drop(created);
    Ok((host_of, segs))
}

/// Shared-memory files to unlink when dropped.
struct Unlink(Vec<String>);

impl Drop for Unlink {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn nonce() -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rank that created a shared-memory file for a peer that never maps it (the rendezvous
    /// fails, or times out, in between) unlinks it: nothing is left under /dev/shm.
    #[test]
    fn a_segment_the_peer_never_maps_is_not_left_behind() {
        let token = crate::auth::Token::generate().unwrap();
        let server = crate::store::StoreServer::start("127.0.0.1:0", token.clone()).unwrap();
        let store = StoreClient::connect(&server.addr().to_string(), &token, Duration::from_secs(10)).unwrap();
        // ranks 7 and 8 of 9 share a host (the others are elsewhere); rank 8 never comes to map
        // the file rank 7 makes for it
        for r in 0..9 {
            let host = if r >= 7 {
                "here".to_string()
            } else {
                format!("elsewhere-{r}")
            };
            store.set(&format!("t/host/{r}"), host.as_bytes()).unwrap();
        }
        let options = crate::Options {
            timeout: Duration::from_millis(300),
            shared_memory: true,
            host_id: Some("here".into()),
        };
        let ours = format!("weft-{}-7-8-", std::process::id());
        assert!(shared_memory(7, 9, &store, "t/", &options).is_err());
        // the file was made (its path published), then the wait for the peer timed out
        let published = store.get("t/shm/7-8", Duration::from_secs(1)).unwrap();
        let published = String::from_utf8_lossy(&published).into_owned();
        assert!(published.contains(&ours), "{published:?}");
        let left: Vec<String> = std::fs::read_dir("/dev/shm")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(&ours))
                    .collect()
            })
            .unwrap_or_default();
        assert!(left.is_empty(), "left behind: {left:?} (published {published:?})");
    }

    #[test]
    fn many_missing_ranks_make_one_short_line() {
        assert_eq!(some_ranks(&[5]), "1 rank (5)");
        assert_eq!(some_ranks(&[1, 2, 3]), "3 ranks (1, 2, 3)");
        let all: Vec<usize> = (1..1 << 20).collect();
        assert_eq!(
            some_ranks(&all),
            "1048575 ranks (1, 2, 3, 4, 5, 6, 7, 8 and 1048567 more)"
        );
    }
}
