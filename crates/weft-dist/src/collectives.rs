//! The collective algorithms, on the raw bytes of one buffer per rank, over the mesh.
//!
//! Choice by size (as Gloo chooses): small all-reduces use recursive doubling (power-of-two
//! groups) or a binomial reduce plus broadcast; large ones a ring reduce-scatter then ring
//! all-gather, moving `2 (n-1)/n` of the buffer per rank, with each ring step sent in segments
//! so the receiver reduces one segment while the next is on the wire. Broadcast is a binomial tree
//! when small and a pipelined chain when large. Every algorithm leaves bitwise-identical results
//! on every rank (each element's final value is computed once and copied, or computed with the
//! same commutative pairs). When the group spans several hosts and some host holds more than
//! one of its ranks, the all-reduce is hierarchical (inside hosts, then across them).

use weft_core::DType;

use crate::error::{Error, Result};
use crate::mesh::{Absorb, Frame, Header, Mesh, PostId, PostOutcome};
use crate::reduce::{copy_into, dtype_code, dtype_name, reduce_into, scale_avg, ReduceOp};

/// Up to this many bytes an all-reduce or broadcast counts as small (latency-bound).
pub(crate) const SMALL_BYTES: usize = 64 << 10;
/// Largest frame a large transfer is cut into.
pub(crate) const SEGMENT_BYTES: usize = 1 << 20;

/// Operation codes carried in every frame's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    AllReduce = 1,
    ReduceScatter = 2,
    AllGather = 3,
    Broadcast = 4,
    Reduce = 5,
    AllToAll = 6,
    Barrier = 7,
    Send = 8,
}

const KIND_NAMES: [&str; 9] = [
    "?",
    "all_reduce",
    "reduce_scatter",
    "all_gather",
    "broadcast",
    "reduce",
    "all_to_all",
    "barrier",
    "send",
];

pub(crate) fn op_code(kind: Kind, reduce: Option<ReduceOp>) -> u8 {
    (kind as u8) << 3 | reduce.map_or(0, |r| r.code())
}

/// `all_reduce(sum, f32 x 1024)` from a header's fields.
pub(crate) fn describe(op: u8, dtype: u8, count: u64) -> String {
    let kind = KIND_NAMES.get((op >> 3) as usize).copied().unwrap_or("?");
    let red = match (op >> 3, op & 7) {
        (1 | 2 | 5, 0) => "sum, ",
        (1 | 2 | 5, 1) => "avg, ",
        (1 | 2 | 5, 2) => "max, ",
        (1 | 2 | 5, 3) => "min, ",
        _ => "",
    };
    format!("{kind}({red}{} x {count})", dtype_name(dtype))
}

/// One collective call in flight: who takes part and what every frame must say.
pub(crate) struct Ctx<'a> {
    pub mesh: &'a Mesh,
    /// Global ranks of the group, in group order.
    pub ranks: &'a [usize],
    /// This rank's index in `ranks`.
    pub me: usize,
    pub group: u32,
    pub stream: u64,
    pub seq: u64,
    pub op: u8,
    pub dtype: DType,
    pub count: u64,
}

impl<'a> Ctx<'a> {
    fn n(&self) -> usize {
        self.ranks.len()
    }

    fn esize(&self) -> usize {
        self.dtype.size_in_bytes()
    }

    fn header(&self) -> Header {
        Header {
            stream: self.stream,
            seq: self.seq,
            op: self.op,
            dtype: dtype_code(self.dtype),
            count: self.count,
        }
    }

    /// This call, for messages: `all_reduce(sum, f32 x 1024) #7 of group 0`.
    pub fn what(&self) -> String {
        format!(
            "{} #{} of group {}",
            describe(self.op, dtype_code(self.dtype), self.count),
            self.seq,
            self.group
        )
    }

    fn send(&self, to: usize, payload: &[u8]) -> Result<()> {
        self.mesh
            .send(self.ranks[to], &self.header(), payload)
            .map_err(|e| Error::PeerFailed(format!("rank {}: {} failed: {e}", self.mesh.rank, self.what())))
    }

    /// The next frame from group rank `from`, which must belong to this very call.
    fn recv(&self, from: usize) -> Result<Vec<u8>> {
        let peer = self.ranks[from];
        let f = self.mesh.recv(peer, self.stream, |_| true, &self.what())?;
        self.check(from, f)
    }

    /// The payload of frame `f` from group rank `from`, checked to belong to this very call.
    fn check(&self, from: usize, f: Frame) -> Result<Vec<u8>> {
        let peer = self.ranks[from];
        let (mine, theirs) = (self.header(), f.header);
        if theirs != mine {
            return Err(Error::Mismatch(format!(
                "mismatched collectives: rank {} called {}, but rank {peer} called {} #{} at that point",
                self.mesh.rank,
                self.what(),
                describe(theirs.op, theirs.dtype, theirs.count),
                theirs.seq
            )));
        }
        Ok(f.payload)
    }

    fn send_segments(&self, to: usize, buf: &[u8]) -> Result<()> {
        for seg in segments(buf.len(), self.esize()) {
            self.send(to, &buf[seg])?;
        }
        Ok(())
    }

    fn recv_segments(&self, from: usize, dst: &mut [u8], reduce: Option<ReduceOp>) -> Result<()> {
        let len = dst.len();
        // SAFETY: `dst` is borrowed mutably until `finish` returns.
        unsafe { self.post_recv(from, dst.as_mut_ptr(), 0..len, reduce) }.finish()
    }

    /// Posts receives from group rank `from` for the segments of `range` of the buffer at
    /// `base`: the reader thread fills them (reducing with `reduce`) as the frames arrive.
    ///
    /// # Safety
    /// `base[range]` must stay valid, and untouched by the caller, until the returned
    /// [`Posted`] is finished or dropped.
    unsafe fn post_recv(
        &self,
        from: usize,
        base: *mut u8,
        range: std::ops::Range<usize>,
        reduce: Option<ReduceOp>,
    ) -> Posted<'_, 'a> {
        let absorb = Absorb {
            dtype: self.dtype,
            reduce,
        };
        let peer = self.ranks[from];
        let items = segments(range.len(), self.esize())
            .into_iter()
            .map(|seg| {
                let at = range.start + seg.start;
                // SAFETY: inside `base[range]`, which the caller keeps for the post.
                let id = unsafe { self.mesh.post(peer, self.header(), base.add(at), seg.len(), absorb) };
                (at..at + seg.len(), id)
            })
            .collect();
        Posted {
            c: self,
            from,
            base,
            reduce,
            items,
            next: 0,
        }
    }

    fn absorb(&self, dst: &mut [u8], src: &[u8], from: usize, reduce: Option<ReduceOp>) -> Result<()> {
        let peer = self.ranks[from];
        match reduce {
            Some(op) => reduce_into(dst, src, self.dtype, op, peer),
            None => copy_into(dst, src, self.dtype, peer),
        }
    }

    /// Sends `buf[send]` to `to` while receiving `buf[recv]` from `from` (disjoint ranges),
    /// segment by segment.
    fn exchange(
        &self,
        buf: &mut [u8],
        send: std::ops::Range<usize>,
        to: usize,
        recv: std::ops::Range<usize>,
        from: usize,
        reduce: Option<ReduceOp>,
    ) -> Result<()> {
        debug_assert!(send.end <= recv.start || recv.end <= send.start, "disjoint ranges");
        let base = buf.as_mut_ptr();
        // SAFETY: `buf` stays borrowed until `finish`; only `recv` is written through the posts
        // and only `send` (disjoint) is read below.
        let posted = unsafe { self.post_recv(from, base, recv, reduce) };
        for s in segments(send.len(), self.esize()) {
            // SAFETY: inside `buf[send]`, which nobody writes while the posts are live.
            let piece = unsafe { std::slice::from_raw_parts(base.add(send.start + s.start), s.len()) };
            self.send(to, piece)?;
        }
        posted.finish()
    }
}

/// Receives posted by [`Ctx::post_recv`], finished in order. Dropping it (on an error path)
/// withdraws the ones not yet filled, waiting for any the reader is writing into, so the buffer
/// is free again once it is gone.
pub(crate) struct Posted<'c, 'a> {
    c: &'c Ctx<'a>,
    from: usize,
    base: *mut u8,
    reduce: Option<ReduceOp>,
    /// Byte range of each segment in the buffer, and its post.
    items: Vec<(std::ops::Range<usize>, PostId)>,
    /// Items before this one are finished.
    next: usize,
}

impl Posted<'_, '_> {
    /// Waits until the next segment is in the buffer and returns its byte range. A segment
    /// whose post was withdrawn (frames were queued ahead of it: it came before the post, or
    /// with another header) is received from the queue with the usual checks.
    fn wait_next(&mut self) -> Result<std::ops::Range<usize>> {
        let c = self.c;
        let (range, id) = self.items[self.next].clone();
        // finished whatever the outcome: wait_post returns only once the reader is done with it
        let outcome = c.mesh.wait_post(id, &c.what());
        self.next += 1;
        if let PostOutcome::Queued(frame) = outcome? {
            let p = c.check(self.from, frame)?;
            // SAFETY: the segment's post is finished, so the caller's buffer is ours again.
            let dst = unsafe { std::slice::from_raw_parts_mut(self.base.add(range.start), range.len()) };
            c.absorb(dst, &p, self.from, self.reduce)?;
        }
        Ok(range)
    }

    fn finish(mut self) -> Result<()> {
        while self.next < self.items.len() {
            self.wait_next()?;
        }
        Ok(())
    }
}

impl Drop for Posted<'_, '_> {
    fn drop(&mut self) {
        for (_, id) in &self.items[self.next..] {
            self.c.mesh.withdraw(*id);
        }
    }
}

/// Byte ranges of at most [`SEGMENT_BYTES`] (whole elements) covering `len` bytes; one empty
/// range for an empty buffer, so that both sides exchange exactly one frame.
fn segments(len: usize, esize: usize) -> Vec<std::ops::Range<usize>> {
    let step = (SEGMENT_BYTES / esize).max(1) * esize;
    if len == 0 {
        return std::iter::once(0..0).collect();
    }
    (0..len).step_by(step).map(|s| s..(s + step).min(len)).collect()
}

/// Byte range of chunk `i` when `count` elements are cut into `n` nearly equal chunks.
fn chunk(i: usize, n: usize, count: usize, esize: usize) -> std::ops::Range<usize> {
    (i * count / n) * esize..((i + 1) * count / n) * esize
}

pub(crate) fn all_reduce(c: &Ctx, buf: &mut [u8], op: ReduceOp) -> Result<()> {
    let n = c.n();
    let hosts = {
        let mut h: Vec<usize> = c.ranks.iter().map(|&g| c.mesh.host_of[g]).collect();
        h.sort_unstable();
        h.dedup();
        h.len()
    };
    if hosts > 1 && hosts < n {
        hierarchical_all_reduce(c, buf, op)?;
    } else {
        flat_all_reduce(c, buf, op)?;
    }
    if op == ReduceOp::Avg {
        scale_avg(buf, c.dtype, n);
    }
    Ok(())
}

/// All-reduce among every rank of `c` as equals (`Avg` sums; the caller divides).
fn flat_all_reduce(c: &Ctx, buf: &mut [u8], op: ReduceOp) -> Result<()> {
    let n = c.n();
    if n == 1 {
        return Ok(());
    }
    if buf.len() <= SMALL_BYTES {
        if n.is_power_of_two() {
            recursive_doubling(c, buf, op)
        } else {
            reduce(c, buf, 0, op)?;
            broadcast(c, buf, 0)
        }
    } else {
        ring_reduce_scatter(c, buf, op)?;
        let (count, es) = (buf.len() / c.esize(), c.esize());
        ring_all_gather(c, buf, |i| chunk(i, n, count, es))
    }
}

/// Ranks on several hosts, some sharing one: reduce inside each host onto its first rank (shared
/// memory), all-reduce among those leaders (the network), broadcast inside each host. The
/// network carries each host's data once instead of once per rank.
fn hierarchical_all_reduce(c: &Ctx, buf: &mut [u8], op: ReduceOp) -> Result<()> {
    let host = |g: usize| c.mesh.host_of[g];
    let me = c.ranks[c.me];
    let local: Vec<usize> = c.ranks.iter().copied().filter(|&g| host(g) == host(me)).collect();
    let mut leaders: Vec<usize> = Vec::new();
    for &g in c.ranks {
        if !leaders.iter().any(|&l| host(l) == host(g)) {
            leaders.push(g);
        }
    }
    let sub = |ranks: &[usize]| {
        let me = ranks.iter().position(|&g| g == c.ranks[c.me]).expect("member");
        (ranks.to_vec(), me)
    };
    let (lr, lme) = sub(&local);
    let lc = Ctx {
        ranks: &lr,
        me: lme,
        ..*c
    };
    reduce(&lc, buf, 0, op)?;
    if lme == 0 {
        let (gr, gme) = sub(&leaders);
        flat_all_reduce(
            &Ctx {
                ranks: &gr,
                me: gme,
                ..*c
            },
            buf,
            op,
        )?;
    }
    broadcast(&lc, buf, 0)
}

fn recursive_doubling(c: &Ctx, buf: &mut [u8], op: ReduceOp) -> Result<()> {
    let mut mask = 1;
    while mask < c.n() {
        let partner = c.me ^ mask;
        c.send(partner, buf)?;
        let p = c.recv(partner)?;
        c.absorb(buf, &p, partner, Some(op))?;
        mask <<= 1;
    }
    Ok(())
}

/// Ring reduce-scatter in place: afterwards chunk `me` of `buf` holds the reduction of every
/// rank's chunk `me` (other chunks hold partial sums).
fn ring_reduce_scatter(c: &Ctx, buf: &mut [u8], op: ReduceOp) -> Result<()> {
    let (n, me, es) = (c.n(), c.me, c.esize());
    let count = buf.len() / es;
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    for s in 0..n - 1 {
        let send = chunk((me + 2 * n - s - 1) % n, n, count, es);
        let recv = chunk((me + 2 * n - s - 2) % n, n, count, es);
        c.exchange(buf, send, next, recv, prev, Some(op))?;
    }
    Ok(())
}

/// Ring all-gather in place: chunk `i` (byte range `range(i)`) of `buf` starts valid on rank
/// `i` only and ends valid everywhere.
fn ring_all_gather(c: &Ctx, buf: &mut [u8], range: impl Fn(usize) -> std::ops::Range<usize>) -> Result<()> {
    let (n, me) = (c.n(), c.me);
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    for s in 0..n - 1 {
        let send = range((me + n - s) % n);
        let recv = range((me + 2 * n - s - 1) % n);
        c.exchange(buf, send, next, recv, prev, None)?;
    }
    Ok(())
}

/// `input` (`n` chunks of `out.len()` bytes) reduced chunk-wise; chunk `me` lands in `out`.
///
/// A ring as in [`ring_reduce_scatter`], without writing `input`: each step's partial sum goes
/// into one of two chunk-sized scratch buffers (kept by the calling thread between calls), the
/// last one into `out`.
pub(crate) fn reduce_scatter(c: &Ctx, input: &[u8], out: &mut [u8], op: ReduceOp) -> Result<()> {
    let (n, me, k) = (c.n(), c.me, out.len());
    let src = |i: usize| &input[i * k..(i + 1) * k];
    out.copy_from_slice(src(me));
    if n > 1 {
        thread_local! {
            static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        SCRATCH.with(|scratch| -> Result<()> {
            let mut scratch = scratch.borrow_mut();
            let need = if n > 2 { 2 * k } else { 0 };
            if scratch.len() < need {
                scratch.resize(need, 0);
            }
            let (mut a, mut b) = scratch[..need].split_at_mut(need / 2);
            let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
            for s in 0..n - 1 {
                let send_chunk = (me + 2 * n - s - 1) % n;
                let recv_chunk = (me + 2 * n - s - 2) % n;
                let last = s == n - 2;
                let target: &mut [u8] = if last { &mut *out } else { &mut *b };
                if !last {
                    target.copy_from_slice(src(recv_chunk));
                }
                let len = target.len();
                // SAFETY: `target` is borrowed mutably until `finish`, and read by nobody else.
                let posted = unsafe { c.post_recv(prev, target.as_mut_ptr(), 0..len, Some(op)) };
                let sent: &[u8] = if s == 0 { src(send_chunk) } else { &*a };
                for seg in segments(sent.len(), c.esize()) {
                    c.send(next, &sent[seg])?;
                }
                posted.finish()?;
                std::mem::swap(&mut a, &mut b);
            }
            Ok(())
        })?;
    }
    if op == ReduceOp::Avg {
        scale_avg(out, c.dtype, n);
    }
    Ok(())
}

/// `buf` holds `n` chunks; this rank's own chunk is already in place.
pub(crate) fn all_gather(c: &Ctx, buf: &mut [u8]) -> Result<()> {
    let n = c.n();
    if n == 1 {
        return Ok(());
    }
    let k = buf.len() / n;
    ring_all_gather(c, buf, |i| i * k..(i + 1) * k)
}

pub(crate) fn broadcast(c: &Ctx, buf: &mut [u8], root: usize) -> Result<()> {
    let n = c.n();
    if n == 1 {
        return Ok(());
    }
    let rel = (c.me + n - root) % n;
    let abs = |r: usize| (r + root) % n;
    if buf.len() <= SMALL_BYTES {
        // binomial tree: receive from the parent, then send to the children
        let mut mask = 1;
        while mask < n {
            if rel & mask != 0 {
                c.recv_segments(abs(rel - mask), buf, None)?;
                break;
            }
            mask <<= 1;
        }
        mask >>= 1;
        while mask > 0 {
            if rel + mask < n {
                c.send_segments(abs(rel + mask), buf)?;
            }
            mask >>= 1;
        }
        return Ok(());
    }
    // pipelined chain root -> root+1 -> ...: each segment is forwarded as soon as it arrives
    if rel == 0 {
        return c.send_segments(abs(1), buf);
    }
    let (base, len) = (buf.as_mut_ptr(), buf.len());
    // SAFETY: `buf` stays borrowed until the posts are finished; a segment is read (to forward
    // it) only after its post is.
    let mut posted = unsafe { c.post_recv(abs(rel - 1), base, 0..len, None) };
    for _ in 0..posted.items.len() {
        let seg = posted.wait_next()?;
        if rel + 1 < n {
            // SAFETY: this segment's post is finished; nobody writes it any more.
            let piece = unsafe { std::slice::from_raw_parts(base.add(seg.start), seg.len()) };
            c.send(abs(rel + 1), piece)?;
        }
    }
    Ok(())
}

/// Binomial-tree reduction to `root` (the other ranks' buffers end with partial results).
pub(crate) fn reduce(c: &Ctx, buf: &mut [u8], root: usize, op: ReduceOp) -> Result<()> {
    let n = c.n();
    let rel = (c.me + n - root) % n;
    let abs = |r: usize| (r + root) % n;
    let mut mask = 1;
    while mask < n {
        if rel & mask == 0 {
            let src = rel | mask;
            if src < n {
                c.recv_segments(abs(src), buf, Some(op))?;
            }
        } else {
            c.send_segments(abs(rel & !mask), buf)?;
            break;
        }
        mask <<= 1;
    }
    Ok(())
}

/// Like [`reduce`], with the average taken on the root.
pub(crate) fn reduce_to_root(c: &Ctx, buf: &mut [u8], root: usize, op: ReduceOp) -> Result<()> {
    reduce(c, buf, root, op)?;
    if op == ReduceOp::Avg && c.me == root {
        scale_avg(buf, c.dtype, c.n());
    }
    Ok(())
}

/// Chunk `j` of `input` goes to rank `j`, whose chunk arrives in chunk `me` of its `out`.
pub(crate) fn all_to_all(c: &Ctx, input: &[u8], out: &mut [u8]) -> Result<()> {
    let n = c.n();
    let k = input.len() / n;
    out[c.me * k..(c.me + 1) * k].copy_from_slice(&input[c.me * k..(c.me + 1) * k]);
    let base = out.as_mut_ptr();
    // SAFETY: `out` stays borrowed until every post is finished; each peer's chunk is distinct.
    let posted: Vec<Posted> = (1..n)
        .map(|d| (c.me + n - d) % n)
        .map(|j| unsafe { c.post_recv(j, base, j * k..(j + 1) * k, None) })
        .collect();
    for j in (1..n).map(|d| (c.me + d) % n) {
        c.send_segments(j, &input[j * k..(j + 1) * k])?;
    }
    for p in posted {
        p.finish()?;
    }
    Ok(())
}

/// Dissemination barrier: log2(n) rounds of one empty message.
pub(crate) fn barrier(c: &Ctx) -> Result<()> {
    let n = c.n();
    let mut dist = 1;
    while dist < n {
        c.send((c.me + dist) % n, &[])?;
        c.recv((c.me + n - dist) % n)?;
        dist *= 2;
    }
    Ok(())
}
