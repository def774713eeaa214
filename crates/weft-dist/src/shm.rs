//! Shared-memory channels between two ranks on one host: a pair of single-producer,
//! single-consumer byte rings in one mapped file under /dev/shm (unlinked as soon as both sides
//! have it mapped, so nothing is left behind if a process dies). Frames go through the rings with
//! the same format as over TCP, without system calls on the data path: a side that finds its
//! ring empty (or full) spins briefly, then sleeps on a futex that the other side wakes.
//!
//! The TCP connection between the two ranks stays open beside the rings: it carries aborts and
//! tells, by closing, that the peer's process is gone.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};

/// Bytes of ring data per direction.
pub(crate) const RING_BYTES: usize = 4 << 20;
const CTL_BYTES: usize = 4096;

/// Control block at the start of each ring (its own page; fields on separate cache lines).
#[repr(C)]
struct Ctl {
    head: AtomicU64,
    _p0: [u8; 56],
    tail: AtomicU64,
    _p1: [u8; 56],
    head_seq: AtomicU32,
    reader_waiting: AtomicU32,
    _p2: [u8; 56],
    tail_seq: AtomicU32,
    writer_waiting: AtomicU32,
    _p3: [u8; 56],
    /// Set by the writer when it is done (its process is leaving): the reader drains, then stops.
    closed: AtomicU32,
}

/// One mapped file holding both rings.
pub(crate) struct Segment {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is shared memory accessed only through atomics and the SPSC protocol.
unsafe impl Send for Segment {}
unsafe impl Sync for Segment {}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: base/len came from a successful mmap.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

fn segment_len() -> usize {
    2 * (CTL_BYTES + RING_BYTES)
}

impl Segment {
    /// Creates and maps a new segment at `path` (space reserved up front, so a full /dev/shm is
    /// an error here rather than a crash later).
    pub fn create(path: &str) -> Result<Segment> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| Error::Io(format!("cannot create {path}: {e}")))?;
        // SAFETY: fd is valid for the duration of the call.
        let rc = unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, segment_len() as libc::off_t) };
        if rc != 0 {
            let _ = std::fs::remove_file(path);
            return Err(Error::Io(format!(
                "cannot reserve {} MiB in {path}: {}",
                segment_len() >> 20,
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        Self::map(&f, path)
    }

    /// Maps the segment another rank created at `path`.
    pub fn open(path: &str) -> Result<Segment> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| Error::Io(format!("cannot open {path}: {e}")))?;
        let len = f.metadata().map_err(|e| Error::Io(format!("{path}: {e}")))?.len();
        if len != segment_len() as u64 {
            return Err(Error::Io(format!("{path} has {len} bytes, expected {}", segment_len())));
        }
        Self::map(&f, path)
    }

    fn map(f: &std::fs::File, path: &str) -> Result<Segment> {
        let len = segment_len();
        // SAFETY: mapping a file we opened read-write, of at least `len` bytes.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::Io(format!(
                "cannot map {path}: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(Segment {
            base: p as *mut u8,
            len,
        })
    }

    fn ring(self: &Arc<Self>, which: usize, peer_gone: Arc<AtomicBool>) -> Ring {
        let off = which * (CTL_BYTES + RING_BYTES);
        Ring {
            _seg: self.clone(),
            // SAFETY: both offsets lie inside the mapping; Ctl fits in its page and is made of
            // atomics, valid for any bit pattern (the file starts zeroed).
            ctl: unsafe { self.base.add(off) as *const Ctl },
            data: unsafe { self.base.add(off + CTL_BYTES) },
            peer_gone,
        }
    }

    /// The ring this side writes (`lower`: whether this rank is the lower of the pair) and the
    /// one it reads.
    pub fn rings(self: &Arc<Self>, lower: bool, peer_gone: Arc<AtomicBool>) -> (Ring, Ring) {
        let (out, inn) = if lower { (0, 1) } else { (1, 0) };
        (self.ring(out, peer_gone.clone()), self.ring(inn, peer_gone))
    }
}

/// One direction of a pair. The writing side uses it as `Write`, the reading side as `Read`.
pub(crate) struct Ring {
    /// Keeps the mapping alive while the ring is in use.
    _seg: Arc<Segment>,
    ctl: *const Ctl,
    data: *mut u8,
    /// Set when the TCP connection to the peer closed (its process is gone).
    peer_gone: Arc<AtomicBool>,
}

// SAFETY: see Segment; each Ring has one user (the writer mutex or the reader thread).
unsafe impl Send for Ring {}

const SPINS: u32 = 200;
const NAP: Duration = Duration::from_millis(50);

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: a futex wait on a valid, aligned u32 in shared memory.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0,
        )
    };
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: a futex wake on a valid, aligned u32 in shared memory.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0,
        )
    };
}

impl Ring {
    fn ctl(&self) -> &Ctl {
        // SAFETY: points into the live mapping held by self.seg.
        unsafe { &*self.ctl }
    }

    /// Marks the writer done; the reader drains what is left and then sees end of stream.
    pub fn close(&self) {
        let c = self.ctl();
        c.closed.store(1, Ordering::SeqCst);
        c.head_seq.fetch_add(1, Ordering::SeqCst);
        futex_wake(&c.head_seq);
    }

    /// Bytes the writer can put into the ring now without waiting for the reader.
    pub fn free_bytes(&self) -> usize {
        let c = self.ctl();
        let (head, tail) = (c.head.load(Ordering::Relaxed), c.tail.load(Ordering::Acquire));
        RING_BYTES - (head - tail) as usize
    }

    /// Waits until `ready()` or until woken through `seq`; `flag` tells the other side to wake us.
    fn wait(&self, seq: &AtomicU32, flag: &AtomicU32, ready: impl Fn() -> bool) {
        for _ in 0..SPINS {
            if ready() {
                return;
            }
            std::hint::spin_loop();
        }
        let s = seq.load(Ordering::SeqCst);
        flag.store(1, Ordering::SeqCst);
        if !ready() {
            futex_wait(seq, s, NAP);
        }
        flag.store(0, Ordering::SeqCst);
    }
}

/// The bytes between `tail` and `head`, which both sides of a ring keep at most [`RING_BYTES`]
/// apart; other values (the shared file written by something else) are an error rather than a
/// copy outside the ring.
fn used(head: u64, tail: u64) -> std::io::Result<usize> {
    match head.checked_sub(tail) {
        Some(n) if n <= RING_BYTES as u64 => Ok(n as usize),
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("the shared-memory ring with the peer is corrupt (head {head}, tail {tail})"),
        )),
    }
}

impl Write for Ring {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let c = self.ctl();
        loop {
            let head = c.head.load(Ordering::Relaxed);
            let tail = c.tail.load(Ordering::Acquire);
            let free = RING_BYTES - used(head, tail)?;
            if free > 0 {
                let n = free.min(buf.len());
                let at = (head % RING_BYTES as u64) as usize;
                let first = n.min(RING_BYTES - at);
                // SAFETY: [at, at + first) and [0, n - first) lie in the ring; the reader does
                // not touch bytes between tail and tail + RING_BYTES - (head - tail).
                unsafe {
                    std::ptr::copy_nonoverlapping(buf.as_ptr(), self.data.add(at), first);
                    std::ptr::copy_nonoverlapping(buf.as_ptr().add(first), self.data, n - first);
                }
                c.head.store(head + n as u64, Ordering::Release);
                c.head_seq.fetch_add(1, Ordering::SeqCst);
                if c.reader_waiting.load(Ordering::SeqCst) != 0 {
                    futex_wake(&c.head_seq);
                }
                return Ok(n);
            }
            if self.peer_gone.load(Ordering::SeqCst) {
                return Err(std::io::Error::new(std::io::ErrorKind::BrokenPipe, "peer is gone"));
            }
            self.wait(&c.tail_seq, &c.writer_waiting, || {
                c.tail.load(Ordering::Acquire) != tail || self.peer_gone.load(Ordering::SeqCst)
            });
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Read for Ring {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let c = self.ctl();
        loop {
            let tail = c.tail.load(Ordering::Relaxed);
            let head = c.head.load(Ordering::Acquire);
            let avail = used(head, tail)?;
            if avail > 0 {
                let n = avail.min(buf.len());
                let at = (tail % RING_BYTES as u64) as usize;
                let first = n.min(RING_BYTES - at);
                // SAFETY: [tail, tail + n) was published by the writer (head), inside the ring.
                unsafe {
                    std::ptr::copy_nonoverlapping(self.data.add(at), buf.as_mut_ptr(), first);
                    std::ptr::copy_nonoverlapping(self.data, buf.as_mut_ptr().add(first), n - first);
                }
                c.tail.store(tail + n as u64, Ordering::Release);
                c.tail_seq.fetch_add(1, Ordering::SeqCst);
                if c.writer_waiting.load(Ordering::SeqCst) != 0 {
                    futex_wake(&c.tail_seq);
                }
                return Ok(n);
            }
            // empty: end of stream once the writer closed or its process is gone
            if c.closed.load(Ordering::SeqCst) != 0 || self.peer_gone.load(Ordering::SeqCst) {
                return Ok(0);
            }
            self.wait(&c.head_seq, &c.reader_waiting, || {
                c.head.load(Ordering::Acquire) != head
                    || c.closed.load(Ordering::SeqCst) != 0
                    || self.peer_gone.load(Ordering::SeqCst)
            });
        }
    }
}

/// What identifies a host for shared memory: the same kernel (boot id), the same host name and
/// the same network namespace (so ranks in separate namespaces, as in the two-"host" test,
/// talk over TCP through their interfaces).
pub(crate) fn host_key() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let netns = std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let boot = read("/proc/sys/kernel/random/boot_id");
    if boot.is_empty() || !std::path::Path::new("/dev/shm").is_dir() {
        // no way to share memory here: a key no other rank has
        return format!("pid{}-{:?}", std::process::id(), std::time::SystemTime::now());
    }
    format!("{boot}|{}|{netns}", read("/proc/sys/kernel/hostname"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_positions_further_apart_than_the_ring_are_an_error() {
        assert_eq!(used(10, 10).unwrap(), 0);
        assert_eq!(used(RING_BYTES as u64 + 5, 5).unwrap(), RING_BYTES);
        for (head, tail) in [(5, 10), (RING_BYTES as u64 + 6, 5), (u64::MAX, 0)] {
            let e = used(head, tail).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
            assert!(e.to_string().contains("corrupt"), "{e}");
        }
    }
}
