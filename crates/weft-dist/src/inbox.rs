//! Where messages from peers land: one reader thread per connection moves frames into the
//! inbox, keyed by (sender, stream), or straight into a buffer a collective posted for them.
//!
//! A posted receive (`post`) names the header it expects, a destination and whether to copy or
//! reduce into it. When the next frame of that (sender, stream) arrives with that header, the
//! reader thread reads its payload from the connection directly into the destination (reducing
//! through a small cache-resident staging buffer), instead of into a fresh vector that the
//! collective then copies or reduces from: one pass over the data instead of three, done on the
//! reader thread while the collective's own thread goes on sending.
//!
//! Ordering: frames of one (sender, stream) are numbered as they arrive, and receives of it are
//! numbered as they are taken or posted, both from 0; frame `k` goes to posted receive `k`, or,
//! when it came first (or with another header than the post expects), into the queue, where
//! post `k` then finds it and hands it to the caller (whose checks report a mismatched header).
//! So frames are consumed in the order they were sent, whichever path each takes.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use weft_core::DType;

use crate::error::{Error, Result};
use crate::reduce::{copy_into, reduce_into, ReduceOp};

/// Stream id of abort notices.
pub(crate) const ABORT: u64 = u64::MAX;
/// Largest single frame accepted from a peer (collectives send large tensors in segments).
pub(crate) const MAX_FRAME: u64 = 1 << 31;
/// Bytes a posted reduction reads from the connection at a time (a multiple of every element
/// size, so an element never straddles two reads; small enough to stay in cache).
const STAGING_BYTES: usize = 64 << 10;

/// The fixed part of every message: which stream it belongs to and what the sender was doing,
/// so a receiver can check it matches what it expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    /// `group id << 32 | channel` (see `group`).
    pub stream: u64,
    /// The sender's sequence number of the operation in its stream.
    pub seq: u64,
    /// Operation code (see `group::OpCode`).
    pub op: u8,
    /// dtype code.
    pub dtype: u8,
    /// The operation's element count (the same on every rank for collectives).
    pub count: u64,
}

pub(crate) const HEADER_BYTES: usize = 8 + 8 + 1 + 1 + 8 + 8;

pub(crate) struct Frame {
    pub header: Header,
    pub payload: Vec<u8>,
}

pub(crate) fn write_frame(w: &mut impl Write, h: &Header, payload: &[u8]) -> std::io::Result<()> {
    let mut b = [0u8; HEADER_BYTES];
    b[0..8].copy_from_slice(&h.stream.to_le_bytes());
    b[8..16].copy_from_slice(&h.seq.to_le_bytes());
    b[16] = h.op;
    b[17] = h.dtype;
    b[18..26].copy_from_slice(&h.count.to_le_bytes());
    b[26..34].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    w.write_all(&b)?;
    w.write_all(payload)
}

/// Reads a frame's header and payload length (checked against [`MAX_FRAME`]).
fn read_header(r: &mut impl Read) -> std::io::Result<(Header, usize)> {
    let mut b = [0u8; HEADER_BYTES];
    r.read_exact(&mut b)?;
    let u = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    let len = u(26);
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds the limit of {MAX_FRAME}"),
        ));
    }
    let header = Header {
        stream: u(0),
        seq: u(8),
        op: b[16],
        dtype: b[17],
        count: u(18),
    };
    Ok((header, len as usize))
}

/// A frame's payload of `len` bytes; memory for it is asked for fallibly, so a frame this
/// process cannot hold is an error on the link (naming the peer where it is reported), not an
/// abort of the process.
fn read_payload(r: &mut impl Read, len: usize) -> std::io::Result<Vec<u8>> {
    let mut payload = Vec::new();
    payload.try_reserve_exact(len).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::OutOfMemory,
            format!("no memory for a frame of {len} bytes"),
        )
    })?;
    payload.resize(len, 0);
    r.read_exact(&mut payload)?;
    Ok(payload)
}

/// A queued frame (its arrival number on its (sender, stream), and the frame, or its header
/// while the reader is still reading its payload).
struct Slot {
    index: u64,
    header: Header,
    frame: Option<Frame>,
}

/// What a posted receive does with its payload.
#[derive(Clone, Copy)]
pub(crate) struct Absorb {
    pub dtype: DType,
    /// Reduce into the destination with this op (`Avg` sums), or copy when `None`.
    pub reduce: Option<ReduceOp>,
}

/// A destination the reader thread writes into while the posting thread waits.
struct Post {
    header: Header,
    dst: *mut u8,
    len: usize,
    absorb: Absorb,
    state: PostState,
}

// SAFETY: `dst` is written only by the reader thread that took the post, and the posting thread
// does not touch those bytes, or return, until the post is done or withdrawn (see `Posted`).
unsafe impl Send for Post {}

enum PostState {
    Waiting,
    /// The reader thread is writing into the destination.
    Taken,
    Done(Result<()>),
}

/// A posted receive: (sender, stream, receive number).
pub(crate) type PostId = (usize, u64, u64);

#[derive(Default)]
struct InboxState {
    queues: HashMap<(usize, u64), VecDeque<Slot>>,
    /// Frames arrived per (sender, stream).
    arrived: HashMap<(usize, u64), u64>,
    /// Receives taken or posted per (sender, stream).
    claimed: HashMap<(usize, u64), u64>,
    posts: HashMap<PostId, Post>,
    failed: HashMap<usize, String>,
    /// The first abort received: from which peer, and why.
    aborted: Option<(usize, String)>,
}

#[derive(Default)]
pub(crate) struct Inbox {
    state: Mutex<InboxState>,
    arrived: Condvar,
}

/// How a posted receive ended.
pub(crate) enum PostOutcome {
    /// The payload is in the destination.
    Filled,
    /// Its frame arrived before the post (or with another header than it expected) and was
    /// queued: the caller checks and absorbs it.
    Queued(Frame),
}

impl Inbox {
    fn lock(&self) -> MutexGuard<'_, InboxState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Why waiting on `peer` is pointless now, if it is; the peer whose abort or closed
    /// connection it is goes on record as the cause (`failure::blame`).
    fn broken(st: &InboxState, rank: usize, peer: usize, what: &str) -> Option<Error> {
        if let Some((from, why)) = &st.aborted {
            crate::failure::blame(*from);
            return Some(Error::PeerFailed(format!("rank {rank}: {what} aborted: {why}")));
        }
        let why = st.failed.get(&peer)?;
        crate::failure::blame(peer);
        Some(Error::PeerFailed(format!(
            "rank {rank}: {what} failed: rank {peer} {why}"
        )))
    }

    fn timed_out(rank: usize, peer: usize, what: &str, timeout: Duration) -> Error {
        Error::Timeout(format!(
            "rank {rank}: {what} timed out after {:.0} s waiting for rank {peer}",
            timeout.as_secs_f64()
        ))
    }

    /// Waits for the next frame from `peer` on `stream` whose header satisfies `want` (frames
    /// arrive in order; `want` picks among queued ones). `rank` and `what` (the operation) are
    /// for errors.
    pub fn recv(
        &self,
        rank: usize,
        peer: usize,
        stream: u64,
        want: impl Fn(&Header) -> bool,
        what: &str,
        timeout: Duration,
    ) -> Result<Frame> {
        let deadline = crate::deadline::after(timeout);
        let mut st = self.lock();
        loop {
            if let Some(q) = st.queues.get_mut(&(peer, stream)) {
                if let Some(i) = q.iter().position(|s| want(&s.header)) {
                    if q[i].frame.is_some() {
                        let frame = q.remove(i).and_then(|s| s.frame).expect("checked");
                        *st.claimed.entry((peer, stream)).or_default() += 1;
                        return Ok(frame);
                    }
                }
            }
            if let Some(e) = Self::broken(&st, rank, peer, what) {
                return Err(e);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Self::timed_out(rank, peer, what, timeout));
            }
            st = self
                .arrived
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Posts a receive of the next frame from `peer` with header `header` and `len` payload
    /// bytes into `dst`.
    ///
    /// # Safety
    /// `dst` must stay valid and untouched by anyone else until the post is finished by
    /// [`Inbox::wait_post`] or [`Inbox::withdraw`].
    pub unsafe fn post(&self, peer: usize, header: Header, dst: *mut u8, len: usize, absorb: Absorb) -> PostId {
        let mut st = self.lock();
        let n = st.claimed.entry((peer, header.stream)).or_default();
        let id = (peer, header.stream, *n);
        *n += 1;
        st.posts.insert(
            id,
            Post {
                header,
                dst,
                len,
                absorb,
                state: PostState::Waiting,
            },
        );
        id
    }

    /// Takes frame number `index` of (peer, stream) from the queue: `None` while it has not
    /// arrived, `Some(None)` while its payload is being read.
    fn take_queued(st: &mut InboxState, peer: usize, stream: u64, index: u64) -> Option<Option<Frame>> {
        let q = st.queues.get_mut(&(peer, stream))?;
        let i = q.iter().position(|s| s.index == index)?;
        if q[i].frame.is_none() {
            return Some(None);
        }
        Some(q.remove(i).and_then(|s| s.frame))
    }

    /// Waits until post `id` is filled, or hands over its frame when that was queued. While the
    /// reader thread is writing into the destination, this waits for the reader even past the
    /// timeout; `sever` is called once the timeout passes, to make a reader stuck on a silent
    /// peer give up. `rank` and `what` (the operation) are for errors.
    pub fn wait_post(
        &self,
        rank: usize,
        id: PostId,
        what: &str,
        timeout: Duration,
        sever: &dyn Fn(),
    ) -> Result<PostOutcome> {
        let (peer, stream, index) = id;
        let deadline = crate::deadline::after(timeout);
        let mut severed = false;
        let mut st = self.lock();
        loop {
            let taken = match st.posts.get(&id).map(|p| &p.state) {
                Some(PostState::Done(_)) => {
                    let Some(Post {
                        state: PostState::Done(r),
                        ..
                    }) = st.posts.remove(&id)
                    else {
                        unreachable!("checked")
                    };
                    return r.map(|()| PostOutcome::Filled);
                }
                Some(PostState::Taken) => true,
                // waiting, or withdrawn in favour of the queued frame
                Some(PostState::Waiting) | None => false,
            };
            if taken {
                st = self.wait_for_reader(st, deadline, &mut severed, sever);
                continue;
            }
            match Self::take_queued(&mut st, peer, stream, index) {
                Some(Some(frame)) => {
                    st.posts.remove(&id);
                    return Ok(PostOutcome::Queued(frame));
                }
                // queued, payload still coming: the post will not be used
                Some(None) => {
                    st.posts.remove(&id);
                }
                None => {}
            }
            if let Some(e) = Self::broken(&st, rank, peer, what) {
                st.posts.remove(&id);
                return Err(e);
            }
            if Instant::now() >= deadline {
                st.posts.remove(&id);
                return Err(Self::timed_out(rank, peer, what, timeout));
            }
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(10));
            st = self.arrived.wait_timeout(st, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    /// One wait while a reader thread writes into a post: a short sleep on the condition, or,
    /// once `deadline` has passed, one call of `sever` (the peer stopped mid-message; cutting
    /// its connection makes the reader fail and finish the post).
    fn wait_for_reader<'g>(
        &'g self,
        st: MutexGuard<'g, InboxState>,
        deadline: Instant,
        severed: &mut bool,
        sever: &dyn Fn(),
    ) -> MutexGuard<'g, InboxState> {
        if Instant::now() >= deadline && !*severed {
            *severed = true;
            drop(st);
            sever();
            return self.lock();
        }
        self.arrived
            .wait_timeout(st, Duration::from_millis(10))
            .unwrap_or_else(|e| e.into_inner())
            .0
    }

    /// Withdraws post `id` if it is still waiting; if the reader is writing into it, waits until
    /// it is done (calling `sever` after `timeout`). Afterwards nobody touches its destination.
    pub fn withdraw(&self, id: PostId, timeout: Duration, sever: &dyn Fn()) {
        let deadline = crate::deadline::after(timeout);
        let mut severed = false;
        let mut st = self.lock();
        loop {
            match st.posts.get(&id).map(|p| matches!(p.state, PostState::Taken)) {
                None => return,
                Some(false) => {
                    st.posts.remove(&id);
                    return;
                }
                Some(true) => st = self.wait_for_reader(st, deadline, &mut severed, sever),
            }
        }
    }

    /// Waits, at most `timeout`, until the reader of `peer` has recorded how its connection
    /// ended (closed or broken) or some peer's abort has arrived: a send that failed on a closed
    /// connection then sees an abort the peer wrote before closing, which its reader may not
    /// have taken yet.
    pub fn wait_until_ended(&self, peer: usize, timeout: Duration) {
        let deadline = crate::deadline::after(timeout);
        let mut st = self.lock();
        while st.aborted.is_none() && !st.failed.contains_key(&peer) {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            st = self
                .arrived
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The peer that gave up and why (its words, naming it), if one did.
    pub fn aborted_by(&self) -> Option<(usize, String)> {
        self.lock().aborted.clone()
    }

    /// Marks this rank aborted by `peer` with its reason.
    fn abort_from(&self, peer: usize, why: &str) {
        let mut st = self.lock();
        st.aborted.get_or_insert((peer, format!("rank {peer} gave up: {why}")));
        self.arrived.notify_all();
    }

    fn fail(&self, peer: usize, why: String) {
        let mut st = self.lock();
        st.failed.entry(peer).or_insert(why);
        self.arrived.notify_all();
    }

    /// The reader's decision for the next frame from `peer` (header `h`, `len` payload bytes):
    /// into its posted receive when that exists and expects exactly this frame, else into the
    /// queue as a pending slot (returned as `Err(index)`) to fill.
    fn route(&self, peer: usize, h: &Header, len: usize) -> std::result::Result<(PostId, *mut u8, Absorb), u64> {
        let mut st = self.lock();
        let key = (peer, h.stream);
        let n = st.arrived.entry(key).or_default();
        let index = *n;
        *n += 1;
        let id = (peer, h.stream, index);
        if let Some(post) = st.posts.get_mut(&id) {
            if matches!(post.state, PostState::Waiting) && post.header == *h && post.len == len {
                post.state = PostState::Taken;
                return Ok((id, post.dst, post.absorb));
            }
        }
        st.queues.entry(key).or_default().push_back(Slot {
            index,
            header: *h,
            frame: None,
        });
        Err(index)
    }

    /// Fills the pending slot `index` of (peer, stream).
    fn fill(&self, peer: usize, index: u64, frame: Frame) {
        let mut st = self.lock();
        let q = st.queues.entry((peer, frame.header.stream)).or_default();
        if let Some(slot) = q.iter_mut().find(|s| s.index == index) {
            slot.frame = Some(frame);
        }
        self.arrived.notify_all();
    }

    fn finish_post(&self, id: PostId, r: Result<()>) {
        let mut st = self.lock();
        if let Some(p) = st.posts.get_mut(&id) {
            p.state = PostState::Done(r);
        }
        self.arrived.notify_all();
    }
}

/// Where a reader thread's frames come from.
pub(crate) enum Source {
    /// The only connection to the peer: its end marks the peer failed.
    Tcp,
    /// The TCP connection of a peer whose data comes through shared memory: it carries aborts,
    /// and its end only raises the flag (the peer's process is gone).
    TcpBesideSharedMemory(Arc<AtomicBool>),
    /// The shared-memory ring from the peer, with the flag its TCP reader raises at the end.
    SharedMemory(Arc<AtomicBool>),
}

/// Reads one payload of `len` bytes from `r` into `dst` as `absorb` says. Errors of the data
/// (bool bytes, from [`copy_into`]/[`reduce_into`]) are returned in the inner result, after the
/// whole payload was read; errors of the connection in the outer one.
fn read_into(
    r: &mut impl Read,
    dst: &mut [u8],
    absorb: Absorb,
    peer: usize,
    staging: &mut Vec<u8>,
) -> std::io::Result<Result<()>> {
    if absorb.reduce.is_none() && absorb.dtype != DType::Bool {
        r.read_exact(dst)?;
        return Ok(Ok(()));
    }
    staging.resize(STAGING_BYTES, 0);
    let mut result = Ok(());
    for piece in dst.chunks_mut(STAGING_BYTES) {
        let src = &mut staging[..piece.len()];
        r.read_exact(src)?;
        if result.is_ok() {
            result = match absorb.reduce {
                Some(op) => reduce_into(piece, src, absorb.dtype, op, peer),
                None => copy_into(piece, src, absorb.dtype, peer),
            };
        }
    }
    Ok(result)
}

/// Moves frames from one peer's stream into the inbox (or into posted receives) until the
/// stream ends. The shared-memory reader marks the peer failed only after draining its ring, so
/// frames sent just before a peer exits are never lost, and only after the TCP reader saw the
/// end of its stream (bounded wait), so an abort the peer sent before exiting is reported rather
/// than the exit.
pub(crate) fn read_peer(peer: usize, mut r: impl Read, inbox: &Inbox, source: Source) {
    let mut staging = Vec::new();
    let end = |e: std::io::Error| {
        match &source {
            Source::TcpBesideSharedMemory(gone) => {
                gone.store(true, Ordering::SeqCst);
                return;
            }
            Source::SharedMemory(tcp_done) => {
                let deadline = Instant::now() + Duration::from_secs(2);
                while !tcp_done.load(Ordering::SeqCst) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            Source::Tcp => {}
        }
        let why = if e.kind() == std::io::ErrorKind::UnexpectedEof {
            "closed its connection (its process exited or was killed)".to_string()
        } else {
            format!("connection broke: {e}")
        };
        inbox.fail(peer, why);
    };
    loop {
        let (header, len) = match read_header(&mut r) {
            Ok(x) => x,
            Err(e) => return end(e),
        };
        if header.stream == ABORT {
            match read_payload(&mut r, len) {
                Ok(why) => inbox.abort_from(peer, &String::from_utf8_lossy(&why)),
                Err(e) => return end(e),
            }
            continue;
        }
        match inbox.route(peer, &header, len) {
            Ok((id, dst, absorb)) => {
                // SAFETY: the post's owner keeps `dst[..len]` alive and untouched until the post
                // is done (see `Inbox::post`).
                let dst = unsafe { std::slice::from_raw_parts_mut(dst, len) };
                match read_into(&mut r, dst, absorb, peer, &mut staging) {
                    Ok(result) => inbox.finish_post(id, result),
                    Err(e) => {
                        crate::failure::blame(peer);
                        inbox.finish_post(
                            id,
                            Err(Error::PeerFailed(format!(
                                "rank {peer}: connection broke mid-message: {e}"
                            ))),
                        );
                        return end(e);
                    }
                }
            }
            Err(index) => match read_payload(&mut r, len) {
                Ok(payload) => inbox.fill(peer, index, Frame { header, payload }),
                Err(e) => return end(e),
            },
        }
    }
}
