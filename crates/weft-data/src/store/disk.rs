//! The on-disk cache folder: checksummed entries, written atomically, evicted least recently used
//! first down to a size limit. Several processes may share one folder.
//!
//! An entry is one file `KEY.blk`: the 8-byte magic `WEFTBLK1`, the CRC-32 of the payload (u32,
//! little-endian), the payload's length in bytes (u64, little-endian), then the payload. A write
//! goes to a unique temporary file in the same folder and is renamed into place, so a reader sees
//! a whole entry or none. A reader opens only a regular file (links not followed) of the entry's
//! length, reads no more than that, and checks magic, length and checksum; an entry that fails is
//! removed and treated as absent. Reading an entry sets its modification time to now; eviction
//! removes the entries with the oldest modification times until the folder's entries fit
//! [`LOW_WATER`] of the limit, so that the folder is not listed again at the next store.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::error::{Error, Result};

const MAGIC: &[u8; 8] = b"WEFTBLK1";
/// Bytes an entry takes besides its payload.
pub(crate) const HEADER: usize = 8 + 4 + 8;
const SUFFIX: &str = ".blk";
/// Temporary files older than this are leftovers of a process that died mid-write.
const STALE_TMP: Duration = Duration::from_secs(3600);

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// What looking an entry up found.
#[derive(Debug)]
pub(crate) enum Lookup {
    /// A whole, checksum-verified payload.
    Hit(Vec<u8>),
    /// No entry.
    Miss,
    /// An entry that failed its check (now removed).
    Corrupt,
}

/// A cache folder with a size limit in bytes (the entries' file sizes, headers included).
#[derive(Debug)]
pub(crate) struct DiskCache {
    dir: PathBuf,
    limit: u64,
    /// The entries' total as this process last counted it plus what it stored since: the folder
    /// is listed (to evict) when this passes the limit, or after [`RECOUNT_EVERY`] stores (other
    /// processes sharing the folder add entries too), not at every store. Listing it at every
    /// store made opening a dataset of 20,000 shards (a length entry each) take 584 s.
    approx: AtomicU64,
    stores: AtomicU64,
    /// Times the folder was listed to evict (for tests).
    listings: AtomicU64,
    /// Entries found not to be regular files and warned about (once each, the first
    /// [`WARN_NOT_FILES`]).
    warned: Mutex<HashSet<String>>,
}

/// Entries that are not regular files warned about, at most, by one cache.
const WARN_NOT_FILES: usize = 5;

/// Stores between two counts of the folder.
const RECOUNT_EVERY: u64 = 256;

/// What eviction leaves of the limit, in tenths: entries are removed until they take at most 90% of
/// it. Evicting only down to the limit made every store of a full cache list (and stat) the whole
/// folder again: with 20,000 entries, 40 ms a store, a 100-step run 43.6 s -> 131 s.
const LOW_WATER: u64 = 9;

fn io_err(path: &Path, e: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source: e,
    }
}

impl DiskCache {
    /// The folder `dir` (created if missing) with at most `limit` bytes of entries; the error is
    /// the folder's creation's (the caller names the folder and where it came from).
    pub(crate) fn new(dir: PathBuf, limit: u64) -> std::io::Result<DiskCache> {
        std::fs::create_dir_all(&dir)?;
        let cache = DiskCache {
            dir,
            limit,
            approx: AtomicU64::new(0),
            stores: AtomicU64::new(0),
            listings: AtomicU64::new(0),
            warned: Mutex::default(),
        };
        cache.approx.store(cache.size(), Ordering::Relaxed);
        Ok(cache)
    }

    /// The folder.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}{SUFFIX}"))
    }

    /// The entry `key`, whose payload is `payload_len` bytes, checked; a corrupt entry is
    /// removed. Only a regular file of exactly the entry's length is opened, and no more than
    /// that is read: an entry that is a FIFO made the read wait for ever, a link to `/dev/zero`
    /// read without end. Anything else (a link, a pipe, a device, a directory, a file of another
    /// length) is corrupt: removed where it can be (a directory is left alone), with a warning
    /// once for each entry that is no regular file, and the block is fetched again.
    pub(crate) fn get(&self, key: &str, payload_len: u64) -> Lookup {
        let path = self.path(key);
        let expected = HEADER as u64 + payload_len;
        // not followed: a link is no entry this cache wrote
        use weft_core::io::regular::{open_regular, Regular};
        let file = match open_regular(&path, false) {
            Ok(Regular::File(file, meta)) if meta.len() == expected => file,
            Ok(Regular::File(..)) => {
                let _ = std::fs::remove_file(&path);
                return Lookup::Corrupt;
            }
            Ok(Regular::Other(kind)) => {
                self.not_a_file(key, &path, &kind);
                return Lookup::Corrupt;
            }
            Ok(Regular::Missing) | Err(_) => return Lookup::Miss,
        };
        let mut bytes = Vec::new();
        if bytes.try_reserve_exact(expected as usize).is_err() {
            return Lookup::Miss;
        }
        if file.take(expected).read_to_end(&mut bytes).is_err() {
            return Lookup::Miss;
        }
        match decode(&bytes) {
            Some(payload) if payload as u64 == payload_len => {
                // least recently used is judged by modification time
                if let Ok(f) = std::fs::File::options().write(true).open(&path) {
                    let _ = f.set_modified(SystemTime::now());
                }
                bytes.drain(..HEADER);
                debug_assert_eq!(bytes.len(), payload);
                Lookup::Hit(bytes)
            }
            _ => {
                let _ = std::fs::remove_file(&path);
                Lookup::Corrupt
            }
        }
    }

    /// Entry `key` at `path` is a `kind`, not a regular file: removed (a directory cannot be),
    /// with a warning the first time this cache meets it, for the first [`WARN_NOT_FILES`]
    /// such entries (a folder of 20,000 of them would print as many lines).
    fn not_a_file(&self, key: &str, path: &Path, kind: &std::fs::FileType) {
        let removed = !kind.is_dir() && std::fs::remove_file(path).is_ok();
        let nth = {
            let Ok(mut warned) = self.warned.lock() else { return };
            if warned.len() >= WARN_NOT_FILES || !warned.insert(key.to_string()) {
                return;
            }
            warned.len()
        };
        let kind = if kind.is_symlink() {
            "a symbolic link"
        } else {
            weft_core::io::atomic::describe(kind)
        };
        let what = if removed {
            "removed; the block is read from the store"
        } else {
            "left as it is; the block is read from the store each time"
        };
        let more = if nth == WARN_NOT_FILES {
            " (further entries that are not files are handled the same, without a warning)"
        } else {
            ""
        };
        weft_core::errln!(
            "weft: warning: block cache: {} is {kind}, not a cache entry: {what}{more}",
            path.display()
        );
    }

    /// Stores `payload` as entry `key` (atomically), then evicts when past the limit. A payload
    /// larger than the limit is not stored. Returns whether it was stored.
    pub(crate) fn put(&self, key: &str, payload: &[u8]) -> Result<bool> {
        let size = (HEADER + payload.len()) as u64;
        if size > self.limit {
            return Ok(false);
        }
        let path = self.path(key);
        let tmp = self.dir.join(format!(
            ".tmp-{}-{}-{key}",
            std::process::id(),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            let mut header = [0u8; HEADER];
            header[..8].copy_from_slice(MAGIC);
            header[8..12].copy_from_slice(&crc32fast::hash(payload).to_le_bytes());
            header[12..].copy_from_slice(&(payload.len() as u64).to_le_bytes());
            f.write_all(&header)?;
            f.write_all(payload)?;
            drop(f);
            std::fs::rename(&tmp, &path)
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(io_err(&path, e));
        }
        let total = self.approx.fetch_add(size, Ordering::Relaxed) + size;
        let stores = self.stores.fetch_add(1, Ordering::Relaxed) + 1;
        if total > self.limit || stores.is_multiple_of(RECOUNT_EVERY) {
            self.evict(key)?;
        }
        Ok(true)
    }

    /// Whether entry `key` exists as a regular file (unchecked otherwise; a link is not one).
    pub(crate) fn contains(&self, key: &str) -> bool {
        std::fs::symlink_metadata(self.path(key)).is_ok_and(|m| m.file_type().is_file())
    }

    /// Removes entry `key` if present.
    pub(crate) fn remove(&self, key: &str) {
        let _ = std::fs::remove_file(self.path(key));
    }

    /// When the entries total more than the limit, removes the least recently used until they
    /// total at most [`LOW_WATER`] tenths of it, sparing `newest` (the entry just stored, which
    /// alone fits the limit). Temporary files left by dead writers are swept too.
    fn evict(&self, newest: &str) -> Result<()> {
        self.listings.fetch_add(1, Ordering::Relaxed);
        let mut entries = Vec::new();
        let mut total = 0u64;
        let rd = std::fs::read_dir(&self.dir).map_err(|e| io_err(&self.dir, e))?;
        let now = SystemTime::now();
        for ent in rd.flatten() {
            let name = ent.file_name();
            let Some(name) = name.to_str() else { continue };
            let Ok(meta) = ent.metadata() else { continue };
            let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            if name.starts_with(".tmp-") {
                if now.duration_since(mtime).unwrap_or_default() > STALE_TMP {
                    let _ = std::fs::remove_file(ent.path());
                }
                continue;
            }
            if !name.ends_with(SUFFIX) || !meta.is_file() {
                continue;
            }
            total += meta.len();
            entries.push((mtime, name.to_string(), meta.len()));
        }
        if total > self.limit {
            let low = self.limit / 10 * LOW_WATER + self.limit % 10 * LOW_WATER / 10;
            let newest = format!("{newest}{SUFFIX}");
            entries.sort();
            for (_, name, len) in entries {
                if total <= low {
                    break;
                }
                if name == newest {
                    continue;
                }
                // another process may have removed it already; either way it no longer counts
                let _ = std::fs::remove_file(self.dir.join(&name));
                total = total.saturating_sub(len);
            }
        }
        self.approx.store(total, Ordering::Relaxed);
        Ok(())
    }

    /// The entries' total size in bytes (for tests and reports).
    pub(crate) fn size(&self) -> u64 {
        std::fs::read_dir(&self.dir)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.file_name().to_str().is_some_and(|n| n.ends_with(SUFFIX)))
                    .filter_map(|e| e.metadata().ok())
                    .filter(|m| m.is_file())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    }
}

/// The payload's length if `bytes` is a whole, valid entry.
fn decode(bytes: &[u8]) -> Option<usize> {
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return None;
    }
    let crc = u32::from_le_bytes(bytes[8..12].try_into().ok()?);
    let len = u64::from_le_bytes(bytes[12..HEADER].try_into().ok()?);
    let payload = &bytes[HEADER..];
    (payload.len() as u64 == len && crc32fast::hash(payload) == crc).then_some(payload.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("weft-disk-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn entries_round_trip_and_corruption_is_caught() {
        let dir = tmpdir("rt");
        let c = DiskCache::new(dir.clone(), 1 << 20).unwrap();
        assert!(matches!(c.get("a", 13), Lookup::Miss));
        assert!(c.put("a", b"payload bytes").unwrap());
        assert!(matches!(c.get("a", 13), Lookup::Hit(ref b) if b == b"payload bytes"));
        // flip one payload byte
        let p = dir.join("a.blk");
        let mut raw = std::fs::read(&p).unwrap();
        let last = raw.len() - 1;
        raw[last] ^= 1;
        std::fs::write(&p, &raw).unwrap();
        assert!(matches!(c.get("a", 13), Lookup::Corrupt));
        assert!(!p.exists(), "a corrupt entry is removed");
        // a truncated entry is caught too
        c.put("b", b"0123456789").unwrap();
        let p = dir.join("b.blk");
        let raw = std::fs::read(&p).unwrap();
        std::fs::write(&p, &raw[..raw.len() - 3]).unwrap();
        assert!(matches!(c.get("b", 10), Lookup::Corrupt));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn eviction_removes_least_recently_used_first() {
        let dir = tmpdir("lru");
        let entry = (HEADER + 100) as u64;
        let c = DiskCache::new(dir.clone(), 10 * entry).unwrap();
        let old = SystemTime::now() - Duration::from_secs(100);
        for i in 0..10u8 {
            let k = format!("k{i}");
            c.put(&k, &[i; 100]).unwrap();
            let f = std::fs::File::options()
                .write(true)
                .open(dir.join(format!("{k}.blk")))
                .unwrap();
            f.set_modified(old + Duration::from_secs(i.into())).unwrap();
        }
        // reading k0 makes it the most recently used
        assert!(matches!(c.get("k0", 100), Lookup::Hit(_)));
        // one over the limit: evicted down to 90% of it, the two least recently used
        c.put("k10", &[10; 100]).unwrap();
        assert_eq!(c.size(), 9 * entry);
        for k in ["k1", "k2"] {
            assert!(
                matches!(c.get(k, 100), Lookup::Miss),
                "{k} was among the least recently used"
            );
        }
        for i in [0, 3, 4, 5, 6, 7, 8, 9, 10] {
            assert!(matches!(c.get(&format!("k{i}"), 100), Lookup::Hit(_)), "k{i}");
        }
        assert!(!c.put("huge", &[0; 1200]).unwrap(), "larger than the limit: not stored");
        // a limit of one entry keeps the entry just stored
        let one = DiskCache::new(tmpdir("lru-one"), entry).unwrap();
        for k in ["a", "b", "c"] {
            assert!(one.put(k, &[1; 100]).unwrap());
            assert!(matches!(one.get(k, 100), Lookup::Hit(_)), "{k}");
            assert_eq!(one.size(), entry);
        }
        std::fs::remove_dir_all(one.dir()).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_full_cache_is_not_listed_at_every_store() {
        // a full cache of 100 entries, then 1,000 stores more: evicting down to 90% lists the
        // folder about once per 10 stores (it listed it at every one, 40 ms each with 20,000
        // entries)
        let dir = tmpdir("listings");
        let entry = (HEADER + 100) as u64;
        let c = DiskCache::new(dir.clone(), 100 * entry).unwrap();
        for i in 0..1100u32 {
            assert!(c.put(&format!("e{i}"), &[7; 100]).unwrap());
        }
        assert!(c.size() <= 100 * entry && c.size() >= 90 * entry, "{}", c.size());
        let listings = c.listings.load(Ordering::Relaxed);
        assert!(
            listings <= 120,
            "{listings} listings for 1,000 stores into a full cache"
        );
        assert!(c.contains("e1099") && !c.contains("e0"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Runs `f` on another thread; a failure when it has not returned within 10 s (a read of a
    /// FIFO waits for a writer for ever).
    fn within_10s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the lookup did not return within 10 s")
    }

    #[test]
    fn an_entry_that_is_not_a_regular_file_of_its_length_is_not_read() {
        use std::os::unix::fs::symlink;
        let dir = tmpdir("kinds");
        let c = std::sync::Arc::new(DiskCache::new(dir.clone(), 1 << 20).unwrap());
        c.put("good", b"0123456789").unwrap();
        // a FIFO: opening it for reading waits for a writer (the run hung before its first step)
        let fifo = dir.join("fifo.blk");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        // links: to /dev/zero (read without end), and to a whole, valid entry
        symlink("/dev/zero", dir.join("zero.blk")).unwrap();
        symlink(dir.join("good.blk"), dir.join("link.blk")).unwrap();
        std::fs::create_dir(dir.join("folder.blk")).unwrap();
        // a valid entry with bytes after it: only its own length is ever read
        let mut long = std::fs::read(dir.join("good.blk")).unwrap();
        long.extend_from_slice(&[7; 1000]);
        std::fs::write(dir.join("long.blk"), &long).unwrap();
        for key in ["fifo", "zero", "link", "folder", "long"] {
            let c2 = c.clone();
            let got = within_10s(move || c2.get(key, 10));
            assert!(matches!(got, Lookup::Corrupt), "{key}: {got:?}");
            assert!(!c.contains(key), "{key}");
        }
        for gone in ["fifo", "zero", "link", "long"] {
            assert!(
                std::fs::symlink_metadata(dir.join(format!("{gone}.blk"))).is_err(),
                "{gone} removed"
            );
        }
        assert!(dir.join("folder.blk").is_dir(), "a directory is left alone");
        assert!(dir.join("good.blk").is_file(), "a link's target is not touched");
        // the one warning per entry was taken; a second lookup of the folder is quiet and corrupt
        assert!(c.warned.lock().unwrap().contains("folder"));
        assert!(matches!(c.get("folder", 10), Lookup::Corrupt));
        // asked for another length, a good entry is not served
        assert!(matches!(c.get("good", 11), Lookup::Corrupt));
        c.put("good", b"0123456789").unwrap();
        assert!(matches!(c.get("good", 10), Lookup::Hit(ref b) if b == b"0123456789"));
        // the size counts regular files only
        assert_eq!(c.size(), (HEADER + 10) as u64);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
