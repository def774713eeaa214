//! Point-to-point messages of a [`ProcessGroup`]: `send` and `recv` under a tag, in order per
//! (peer, tag), GPU tensors through host copies as for the collectives.

use std::sync::mpsc;

use weft_core::Tensor;

use super::{bytes_of, check_contiguous, host_copy, with_bytes_mut, Job, ProcessGroup, Work, WorkKind};
use crate::collectives::{describe, op_code, Kind};
use crate::error::{Error, Result};
use crate::mesh::{Header, MAX_FRAME};
use crate::reduce::{copy_into, dtype_code};

impl ProcessGroup {
    fn p2p_stream(&self, tag: u32) -> u64 {
        (self.inner.id as u64) << 32 | 1 << 31 | tag as u64
    }

    fn check_tag(tag: u32) -> Result<()> {
        if tag >= 1 << 31 {
            return Err(Error::Invalid(format!("tag {tag} is too large (below 2^31)")));
        }
        Ok(())
    }

    /// Sends `t` to group rank `dst` under `tag`. Messages with one (peer, tag) arrive in order.
    pub fn send(&self, t: &Tensor, dst: usize, tag: u32) -> Result<Work> {
        if let Some(h) = host_copy(t)? {
            return self.send(&h, dst, tag);
        }
        self.check_peer("send", dst)?;
        Self::check_tag(tag)?;
        if dst == self.rank() {
            return Err(Error::Invalid(format!("send: rank {dst} cannot send to itself")));
        }
        let bytes = t.numel() * t.dtype().size_in_bytes();
        if bytes as u64 > MAX_FRAME {
            return Err(Error::Invalid(format!(
                "send: {bytes} bytes exceed the message limit of {MAX_FRAME}"
            )));
        }
        let seq = {
            let mut s = self.inner.send_seq.lock().unwrap();
            let e = s.entry((dst, tag)).or_insert(0);
            *e += 1;
            *e - 1
        };
        let h = Header {
            stream: self.p2p_stream(tag),
            seq,
            op: op_code(Kind::Send, None),
            dtype: dtype_code(t.dtype()),
            count: t.numel() as u64,
        };
        let (inner, t2) = (self.inner.clone(), t.clone());
        let peer = self.inner.ranks[dst];
        let (tx, rx) = mpsc::channel();
        let what = format!("rank {}: send to rank {peer} (tag {tag})", self.global_rank());
        let what2 = what.clone();
        let job: Job = Box::new(move || {
            let r = bytes_of(&t2)
                .and_then(|b| inner.world.mesh.send(peer, &h, &b))
                .map_err(|e| match e {
                    Error::PeerFailed(m) => Error::PeerFailed(format!("{what2} failed: {m}")),
                    other => other,
                });
            let _ = tx.send(r);
            Ok(())
        });
        self.inner
            .sends
            .lock()
            .unwrap()
            .send(job)
            .map_err(|_| Error::PeerFailed(format!("{what}: the group's thread is gone")))?;
        Ok(Work {
            kind: WorkKind::Queued(rx, what),
        })
    }

    /// Receives into `t` the next message from group rank `src` under `tag`; the data lands in
    /// `t` when [`Work::wait`] is called. The message must have `t`'s dtype and size.
    pub fn recv(&self, t: &Tensor, src: usize, tag: u32) -> Result<Work> {
        if let Some(h) = host_copy(t)? {
            return Ok(self.recv(&h, src, tag)?.then_copy_back(t, h));
        }
        self.check_peer("recv", src)?;
        Self::check_tag(tag)?;
        check_contiguous("recv", t)?;
        if src == self.rank() {
            return Err(Error::Invalid(format!("recv: rank {src} cannot receive from itself")));
        }
        let seq = {
            let mut s = self.inner.recv_seq.lock().unwrap();
            let e = s.entry((src, tag)).or_insert(0);
            *e += 1;
            *e - 1
        };
        let (inner, t2, stream) = (self.inner.clone(), t.clone(), self.p2p_stream(tag));
        let peer = self.inner.ranks[src];
        Ok(Work {
            kind: WorkKind::Deferred(Box::new(move || {
                let mesh = &inner.world.mesh;
                let what = format!("recv from rank {peer} (tag {tag}, message #{seq})");
                let f = mesh.recv(peer, stream, |h| h.seq == seq, &what)?;
                let (dt, n) = (dtype_code(t2.dtype()), t2.numel() as u64);
                if f.header.dtype != dt || f.header.count != n {
                    return Err(Error::Mismatch(format!(
                        "rank {}: {what} expects {}, but rank {peer} sent {}",
                        mesh.rank,
                        describe(f.header.op, dt, n),
                        describe(f.header.op, f.header.dtype, f.header.count)
                    )));
                }
                with_bytes_mut(&t2, |b| copy_into(b, &f.payload, t2.dtype(), peer))?
            })),
        })
    }
}
