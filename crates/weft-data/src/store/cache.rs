//! [`CachedSource`]: any [`ObjectSource`] read through fixed-size blocks kept in an on-disk cache,
//! with read-ahead on a background thread.
//!
//! Object `name` is cut into blocks of [`CacheOptions::block_size`] bytes (the last one shorter).
//! A read fetches the blocks it covers that the cache lacks, one inner `read_range` per block, and
//! stores them; the object's length is cached too, so an object read once is served again with the
//! store unreachable. Blocks are keyed by the inner source's URL for the object
//! ([`ObjectSource::describe`]), [`CacheOptions::version`], the block size and the block index:
//! **objects are assumed not to change under their URL within one version** (dataset shards are
//! written once). A dataset rewritten in place gets another version (the token datasets of a run
//! use a hash of their `index.json`), so its blocks are never served from the old ones, and the
//! old version's blocks age out of the one folder under its one size limit. Read small files that
//! may be rewritten (an `index.json`) from the store itself.
//!
//! Read-ahead: after a read that starts where the previous read of the same object ended, the
//! next [`CacheOptions::read_ahead`] blocks are queued for the background thread; and
//! [`CachedSource::prefetch`] queues any byte range (a dataset that knows its future windows says
//! so). A block being fetched by one thread is waited for, not fetched twice, within a process.
//! Read-ahead errors are dropped: the read that needs the block fetches it again and reports.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::disk::{DiskCache, Lookup, HEADER};
use crate::error::{invalid, Result};
use crate::objects::{check_range, ObjectSource};

/// Byte ranges queued for read-ahead at most; older hints are dropped past this.
const QUEUE_CAP: usize = 256;

/// How a [`CachedSource`] caches.
#[derive(Debug, Clone)]
pub struct CacheOptions {
    /// The cache folder; shared safely by processes on this machine. Default
    /// `$XDG_CACHE_HOME/weft/objects`, else `$HOME/.cache/weft/objects`, else
    /// `<temp dir>/weft-cache/objects`.
    pub dir: PathBuf,
    /// Most bytes the folder's entries may take (least recently used evicted), at least one block
    /// and its 20-byte header. Default 10 GiB.
    pub limit_bytes: u64,
    /// Block size in bytes. Default 4 MiB.
    pub block_size: u64,
    /// Blocks fetched ahead after a sequential read (0: none). Default 4.
    pub read_ahead: usize,
    /// A label for the version of the objects, mixed into every cache key: objects cached under
    /// one version are never served under another. Default empty.
    pub version: String,
}

impl Default for CacheOptions {
    fn default() -> CacheOptions {
        CacheOptions {
            dir: default_dir(),
            limit_bytes: 10 << 30,
            block_size: 4 << 20,
            read_ahead: 4,
            version: String::new(),
        }
    }
}

/// The user's cache folder for weft's object blocks (see [`CacheOptions::dir`]).
pub fn default_dir() -> PathBuf {
    default_dir_from().0
}

/// The default cache folder and what it was made from (for messages).
fn default_dir_from() -> (PathBuf, &'static str) {
    let from = |var: &str| std::env::var_os(var).map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(x) = from("XDG_CACHE_HOME") {
        return (x.join("weft").join("objects"), "$XDG_CACHE_HOME");
    }
    if let Some(h) = from("HOME") {
        return (h.join(".cache").join("weft").join("objects"), "$HOME");
    }
    (
        std::env::temp_dir().join("weft-cache").join("objects"),
        "the temporary folder",
    )
}

/// The error of a cache folder `dir` that could not be created: which folder it is, and the key
/// that chooses it.
fn uncreatable(dir: &std::path::Path, e: std::io::Error) -> crate::error::Error {
    let (default, from) = default_dir_from();
    let whose = if dir == default {
        format!("the default block cache folder (from {from}; set data.cache_dir to choose another)")
    } else {
        "the block cache folder (data.cache_dir)".to_string()
    };
    invalid(format!("{}: cannot create {whose}: {e}", dir.display()))
}

/// Counters of a [`CachedSource`]'s work since it was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Blocks served from the cache folder.
    pub hits: u64,
    /// Blocks fetched from the inner source (by reads or read-ahead).
    pub fetched: u64,
    /// Of those, blocks fetched by the read-ahead thread.
    pub fetched_ahead: u64,
    /// Cached blocks that failed their checksum (removed and fetched again).
    pub corrupt: u64,
}

/// An [`ObjectSource`] in front of another, caching its blocks on disk (see the module docs).
pub struct CachedSource {
    shared: Arc<Shared>,
}

struct Shared {
    inner: Arc<dyn ObjectSource>,
    disk: DiskCache,
    block: u64,
    read_ahead: usize,
    version: String,
    lens: Mutex<HashMap<String, u64>>,
    last_end: Mutex<HashMap<String, u64>>,
    inflight: Mutex<HashSet<String>>,
    inflight_cv: Condvar,
    queue: Mutex<Queue>,
    queue_cv: Condvar,
    hits: AtomicU64,
    fetched: AtomicU64,
    fetched_ahead: AtomicU64,
    corrupt: AtomicU64,
    /// Whether a store into the folder failed and was warned about (once).
    unwritable: AtomicBool,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<(String, Range<u64>)>,
    busy: bool,
    stop: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl CachedSource {
    /// `inner` cached as `options` say; starts the read-ahead thread.
    pub fn new(inner: Arc<dyn ObjectSource>, options: CacheOptions) -> Result<CachedSource> {
        // an entry is a block and its header: a limit of exactly one block cached none
        let entry = options.block_size.saturating_add(HEADER as u64);
        if options.block_size == 0 || options.limit_bytes < entry {
            let gib = |bytes: u64| bytes as f64 / (1u64 << 30) as f64;
            let need = (gib(entry) * 1e6).ceil() / 1e6;
            return Err(invalid(format!(
                "data.cache_gb: the block cache's size limit ({} bytes, {:.6} GiB) must hold at least \
                 one block of data.cache_block_mb ({} bytes, at least 1) and its {HEADER}-byte header: \
                 raise data.cache_gb to {need} or more, or lower data.cache_block_mb (cache folder {})",
                options.limit_bytes,
                gib(options.limit_bytes),
                options.block_size,
                options.dir.display()
            )));
        }
        let disk =
            DiskCache::new(options.dir.clone(), options.limit_bytes).map_err(|e| uncreatable(&options.dir, e))?;
        let shared = Arc::new(Shared {
            inner,
            disk,
            block: options.block_size,
            read_ahead: options.read_ahead,
            version: options.version,
            lens: Mutex::default(),
            last_end: Mutex::default(),
            inflight: Mutex::default(),
            inflight_cv: Condvar::new(),
            queue: Mutex::default(),
            queue_cv: Condvar::new(),
            hits: AtomicU64::new(0),
            fetched: AtomicU64::new(0),
            fetched_ahead: AtomicU64::new(0),
            corrupt: AtomicU64::new(0),
            unwritable: AtomicBool::new(false),
        });
        let worker = shared.clone();
        std::thread::Builder::new()
            .name("weft-read-ahead".into())
            .spawn(move || worker.work())
            .map_err(|e| invalid(format!("cannot start the read-ahead thread: {e}")))?;
        Ok(CachedSource { shared })
    }

    /// Queues bytes `range` of `name` for the background thread to bring into the cache (clamped
    /// to the object; errors are dropped). Returns at once.
    pub fn prefetch(&self, name: &str, range: Range<u64>) {
        self.shared.enqueue(name, range);
    }

    /// Waits until the read-ahead queue is empty and the background thread is idle.
    pub fn wait_prefetched(&self) {
        let mut q = lock(&self.shared.queue);
        while !q.jobs.is_empty() || q.busy {
            q = self.shared.queue_cv.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// What was served from where so far.
    pub fn stats(&self) -> CacheStats {
        let s = &self.shared;
        CacheStats {
            hits: s.hits.load(Ordering::Relaxed),
            fetched: s.fetched.load(Ordering::Relaxed),
            fetched_ahead: s.fetched_ahead.load(Ordering::Relaxed),
            corrupt: s.corrupt.load(Ordering::Relaxed),
        }
    }

    /// The cache folder's entries, in bytes (at most the limit after each insertion).
    pub fn cached_bytes(&self) -> u64 {
        self.shared.disk.size()
    }

    /// The cache folder.
    pub fn dir(&self) -> &std::path::Path {
        self.shared.disk.dir()
    }
}

impl Drop for CachedSource {
    /// Stops the read-ahead thread after the block it is fetching (not waited for).
    fn drop(&mut self) {
        let mut q = lock(&self.shared.queue);
        q.stop = true;
        q.jobs.clear();
        self.shared.queue_cv.notify_all();
    }
}

impl Shared {
    /// The cache key prefix of `name`: a hash of its URL and the version.
    fn object_key(&self, name: &str) -> String {
        let mut h = Sha256::new();
        h.update(self.inner.describe(name).as_bytes());
        if !self.version.is_empty() {
            h.update([0u8]);
            h.update(self.version.as_bytes());
        }
        h.finalize()[..16].iter().map(|b| format!("{b:02x}")).collect()
    }

    fn len(&self, name: &str) -> Result<u64> {
        if let Some(&n) = lock(&self.lens).get(name) {
            return Ok(n);
        }
        let key = format!("{}-len", self.object_key(name));
        let cached = match self.disk.get(&key, 8) {
            Lookup::Hit(b) if b.len() == 8 => Some(u64::from_le_bytes(b[..8].try_into().unwrap_or_default())),
            Lookup::Hit(_) => {
                self.disk.remove(&key);
                None
            }
            Lookup::Miss | Lookup::Corrupt => None,
        };
        let n = match cached {
            Some(n) => n,
            None => {
                let n = self.inner.len(name)?;
                self.keep(&key, &n.to_le_bytes());
                n
            }
        };
        lock(&self.lens).insert(name.to_string(), n);
        Ok(n)
    }

    /// Stores entry `key`. A full or read-only cache folder costs speed, not correctness: the
    /// first failure is warned about, and reads go on from the store.
    fn keep(&self, key: &str, payload: &[u8]) {
        if let Err(e) = self.disk.put(key, payload) {
            if !self.unwritable.swap(true, Ordering::Relaxed) {
                weft_core::errln!(
                    "weft: warning: block cache: cannot store blocks: {e}; blocks not cached are read from the store (further failures are not reported)"
                );
            }
        }
    }

    fn block_key(&self, name: &str, idx: u64) -> String {
        format!("{}-{}-{idx}", self.object_key(name), self.block)
    }

    /// Block `idx` of `name` (object length `len`), from the cache or the inner source.
    fn block(&self, name: &str, idx: u64, len: u64, ahead: bool) -> Result<Vec<u8>> {
        let start = idx * self.block;
        let want = (start + self.block).min(len) - start;
        let key = self.block_key(name, idx);
        loop {
            match self.disk.get(&key, want) {
                Lookup::Hit(b) if b.len() as u64 == want => {
                    self.hits.fetch_add(1, Ordering::Relaxed);
                    return Ok(b);
                }
                Lookup::Hit(_) | Lookup::Corrupt => {
                    self.disk.remove(&key);
                    self.corrupt.fetch_add(1, Ordering::Relaxed);
                }
                Lookup::Miss => {}
            }
            let mut inflight = lock(&self.inflight);
            if inflight.contains(&key) {
                // another thread is fetching it: wait, then look in the cache again
                while inflight.contains(&key) {
                    inflight = self
                        .inflight_cv
                        .wait_timeout(inflight, Duration::from_secs(1))
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                continue;
            }
            inflight.insert(key.clone());
            break;
        }
        let got = self.inner.read_range(name, start..start + want);
        if let Ok(b) = &got {
            self.fetched.fetch_add(1, Ordering::Relaxed);
            if ahead {
                self.fetched_ahead.fetch_add(1, Ordering::Relaxed);
            }
            self.keep(&key, b);
        }
        lock(&self.inflight).remove(&key);
        self.inflight_cv.notify_all();
        got
    }

    fn read_range(&self, name: &str, range: Range<u64>) -> Result<Vec<u8>> {
        let len = self.len(name)?;
        check_range(&self.inner.describe(name), &range, len)?;
        // fallibly: a range from a damaged index or a length a server made up must be an error,
        // not an allocation that aborts the process
        let mut out = Vec::new();
        let want = usize::try_from(range.end - range.start).unwrap_or(usize::MAX);
        out.try_reserve_exact(want).map_err(|_| {
            crate::error::invalid(format!(
                "{}: bytes {}..{} do not fit in memory",
                self.inner.describe(name),
                range.start,
                range.end
            ))
        })?;
        if range.is_empty() {
            return Ok(out);
        }
        let (first, last) = (range.start / self.block, (range.end - 1) / self.block);
        for idx in first..=last {
            let b = self.block(name, idx, len, false)?;
            let off = idx * self.block;
            let lo = (range.start.max(off) - off) as usize;
            let hi = (range.end.min(off + b.len() as u64) - off) as usize;
            out.extend_from_slice(&b[lo..hi]);
        }
        let prev = lock(&self.last_end).insert(name.to_string(), range.end);
        if self.read_ahead > 0 && prev == Some(range.start) {
            let from = (last + 1) * self.block;
            let to = ((last + 1 + self.read_ahead as u64) * self.block).min(len);
            if from < to {
                self.enqueue(name, from..to);
            }
        }
        Ok(out)
    }

    fn enqueue(&self, name: &str, range: Range<u64>) {
        if range.is_empty() {
            return;
        }
        let mut q = lock(&self.queue);
        if q.stop || q.jobs.iter().any(|(n, r)| n == name && *r == range) {
            return;
        }
        if q.jobs.len() >= QUEUE_CAP {
            q.jobs.pop_front();
        }
        q.jobs.push_back((name.to_string(), range));
        self.queue_cv.notify_all();
    }

    /// The read-ahead thread: fetch queued ranges' missing blocks until told to stop.
    fn work(&self) {
        loop {
            let (name, range) = {
                let mut q = lock(&self.queue);
                q.busy = false;
                self.queue_cv.notify_all();
                loop {
                    if q.stop {
                        return;
                    }
                    if let Some(job) = q.jobs.pop_front() {
                        q.busy = true;
                        break job;
                    }
                    q = self.queue_cv.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            let Ok(len) = self.len(&name) else { continue };
            let end = range.end.min(len);
            if range.start >= end {
                continue;
            }
            for idx in range.start / self.block..=(end - 1) / self.block {
                if lock(&self.queue).stop {
                    return;
                }
                if self.disk.contains(&self.block_key(&name, idx)) {
                    continue;
                }
                if self.block(&name, idx, len, true).is_err() {
                    break;
                }
            }
        }
    }
}

impl ObjectSource for CachedSource {
    fn read_range(&self, name: &str, range: Range<u64>) -> Result<Vec<u8>> {
        self.shared.read_range(name, range)
    }

    fn read(&self, name: &str) -> Result<Vec<u8>> {
        let len = self.shared.len(name)?;
        if len > super::MAX_WHOLE_OBJECT {
            return Err(crate::error::invalid(format!(
                "{}: {len} bytes, over the {} bytes weft reads of one object whole",
                self.describe(name),
                super::MAX_WHOLE_OBJECT
            )));
        }
        self.shared.read_range(name, 0..len)
    }

    fn len(&self, name: &str) -> Result<u64> {
        self.shared.len(name)
    }

    fn describe(&self, name: &str) -> String {
        self.shared.inner.describe(name)
    }

    fn forget(&self, name: &str, range: Range<u64>) -> bool {
        let s = &self.shared;
        lock(&s.lens).remove(name);
        s.disk.remove(&format!("{}-len", s.object_key(name)));
        if !range.is_empty() {
            for idx in range.start / s.block..=(range.end - 1) / s.block {
                s.disk.remove(&s.block_key(name, idx));
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::{LocalFolder, ObjectSink};

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("weft-cache-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn reads_across_blocks_match_the_source_and_survive_its_loss() {
        let root = tmpdir("src");
        let src = LocalFolder::new(&root);
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        src.put("obj.bin", &data).unwrap();
        let opts = CacheOptions {
            dir: tmpdir("dir"),
            limit_bytes: 1 << 20,
            block_size: 64,
            read_ahead: 0,
            version: String::new(),
        };
        let c = CachedSource::new(Arc::new(src), opts.clone()).unwrap();
        for r in [0..1000u64, 10..20, 60..70, 63..64, 64..65, 999..1000, 5..5, 130..900] {
            assert_eq!(
                c.read_range("obj.bin", r.clone()).unwrap(),
                &data[r.start as usize..r.end as usize],
                "{r:?}"
            );
        }
        assert_eq!(c.len("obj.bin").unwrap(), 1000);
        assert!(c
            .read_range("obj.bin", 990..1001)
            .unwrap_err()
            .to_string()
            .contains("past the end"));
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = c.read_range("obj.bin", 20..10).unwrap_err().to_string();
        assert!(
            reversed.contains("reversed") && reversed.contains("obj.bin"),
            "{reversed}"
        );
        // the source goes away; a new cache over the same folder still serves the object
        std::fs::remove_dir_all(&root).unwrap();
        let c2 = CachedSource::new(Arc::new(LocalFolder::new(&root)), opts.clone()).unwrap();
        assert_eq!(c2.read("obj.bin").unwrap(), data);
        assert_eq!(c2.stats().fetched, 0);
        std::fs::remove_dir_all(&opts.dir).unwrap();
    }

    #[test]
    fn two_versions_of_an_object_share_one_folder_and_one_limit() {
        let root = tmpdir("ver-src");
        let src = Arc::new(LocalFolder::new(&root));
        let old: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        let new: Vec<u8> = old.iter().map(|b| b ^ 0x5a).collect();
        // room for exactly one version: 10 blocks of 100 bytes and the length, headers included
        let entry = |payload: u64| payload + 20;
        let limit = 10 * entry(100) + entry(8);
        let dir = tmpdir("ver-dir");
        let opts = |version: &str| CacheOptions {
            dir: dir.clone(),
            limit_bytes: limit,
            block_size: 100,
            read_ahead: 0,
            version: version.into(),
        };
        src.put("obj.bin", &old).unwrap();
        let v1 = CachedSource::new(src.clone(), opts("v1")).unwrap();
        assert_eq!(v1.read("obj.bin").unwrap(), old);
        assert_eq!(v1.cached_bytes(), limit);
        drop(v1);
        // the first version's entries are the least recently used from here on
        let past = std::time::SystemTime::now() - Duration::from_secs(100);
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let f = std::fs::File::options().write(true).open(e.path()).unwrap();
            f.set_modified(past).unwrap();
        }
        // the object rewritten in place, read as another version through the same folder
        src.put("obj.bin", &new).unwrap();
        let v2 = CachedSource::new(src.clone(), opts("v2")).unwrap();
        assert_eq!(v2.dir(), dir.as_path(), "one folder for every version");
        assert_eq!(v2.read("obj.bin").unwrap(), new, "served from the old version's blocks");
        assert_eq!(v2.stats().fetched, 10);
        assert!(v2.cached_bytes() <= limit, "{} > {limit}", v2.cached_bytes());
        assert!(
            std::fs::read_dir(&dir).unwrap().flatten().all(|e| e.path().is_file()),
            "no folder per version"
        );
        // the old version's blocks were evicted to make room: reading it fetches all again
        let again = CachedSource::new(src.clone(), opts("v1")).unwrap();
        assert_eq!(again.read("obj.bin").unwrap(), new);
        assert_eq!(again.stats().fetched, 10);
        assert!(again.cached_bytes() <= limit);
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&root).unwrap();
    }
}
