//! Where datasets' files live: a local folder or an object store, seen through two small traits.
//!
//! A dataset names its files relative to a root (`index.json`, `train-00000.bin`); an
//! [`ObjectSource`] reads them (whole, or a byte range of one) and an [`ObjectSink`] writes them
//! (each object whole or not at all). [`LocalFolder`] is both, over a folder of this machine;
//! object stores (`s3://`, `gs://`, `az://`, `http(s)://`, `file://`) implement them in
//! the `store` module.

use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::error::{invalid, Error, Result};

/// Reads the objects under one root.
pub trait ObjectSource: Send + Sync {
    /// Bytes `range` of object `name` (relative to the root). Errors, naming the object, when it
    /// is missing or shorter than `range.end`.
    fn read_range(&self, name: &str, range: Range<u64>) -> Result<Vec<u8>>;

    /// The whole object `name`.
    fn read(&self, name: &str) -> Result<Vec<u8>>;

    /// The object's length in bytes.
    fn len(&self, name: &str) -> Result<u64>;

    /// The object's full path or URL, for messages.
    fn describe(&self, name: &str) -> String;

    /// Drops what a cache in front of the objects keeps of `name` (its length, and its bytes
    /// in `range`), so the next read asks the store; `true` when there was such a cache. A
    /// reader whose check fails on what it read (a checksum, the length an index lists) calls
    /// it and reads once more, so a damaged cache is not taken for a damaged object, nor kept.
    fn forget(&self, _name: &str, _range: Range<u64>) -> bool {
        false
    }
}

/// Writes objects under one root.
pub trait ObjectSink: Send + Sync {
    /// Writes object `name` whole: a reader sees the old object (or none) or the new one, never
    /// part of it; a failed write leaves nothing new behind.
    fn put(&self, name: &str, bytes: &[u8]) -> Result<()>;

    /// The object's full path or URL, for messages.
    fn describe(&self, name: &str) -> String;
}

/// A folder of this machine as an object source and sink.
#[derive(Debug, Clone)]
pub struct LocalFolder {
    root: PathBuf,
}

impl LocalFolder {
    /// The folder `root` (created by the first [`ObjectSink::put`] if missing).
    pub fn new(root: impl Into<PathBuf>) -> LocalFolder {
        LocalFolder { root: root.into() }
    }

    /// The folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `root/name`, refusing names that would leave the folder (absolute, or with `..`).
    fn path(&self, name: &str) -> Result<PathBuf> {
        let rel = Path::new(name);
        if name.is_empty()
            || rel.is_absolute()
            || rel.components().any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(invalid(format!(
                "{}: object name {name:?} must be a relative path inside the folder",
                self.root.display()
            )));
        }
        Ok(self.root.join(rel))
    }
}

/// Checks that byte range `range` of an object of `len` bytes (`what`: its path or URL, for the
/// message) is neither reversed nor past the end.
pub(crate) fn check_range(what: &str, range: &Range<u64>, len: u64) -> Result<()> {
    if range.end < range.start {
        return Err(invalid(format!(
            "{what}: byte range {}..{} is reversed",
            range.start, range.end
        )));
    }
    if range.end > len {
        return Err(invalid(format!(
            "{what}: byte range {}..{} is past the end of the object ({len} bytes)",
            range.start, range.end
        )));
    }
    Ok(())
}

fn io_error(path: PathBuf, source: std::io::Error) -> Error {
    Error::Io { path, source }
}

impl ObjectSource for LocalFolder {
    fn read_range(&self, name: &str, range: Range<u64>) -> Result<Vec<u8>> {
        use std::io::{Read, Seek, SeekFrom};
        let path = self.path(name)?;
        let (mut f, meta) = crate::files::open_regular(&path)?;
        let len = meta.len();
        check_range(&path.display().to_string(), &range, len)?;
        let n = usize::try_from(range.end - range.start)
            .map_err(|_| invalid(format!("{}: byte range too large", path.display())))?;
        let mut buf = Vec::new();
        buf.try_reserve_exact(n)
            .map_err(|_| invalid(format!("{}: cannot allocate {n} bytes", path.display())))?;
        buf.resize(n, 0);
        f.seek(SeekFrom::Start(range.start))
            .and_then(|_| f.read_exact(&mut buf))
            .map_err(|e| io_error(path, e))?;
        Ok(buf)
    }

    /// Refuses an object that is not a regular file (a link to `/dev/zero`, a pipe) before
    /// reading it.
    fn read(&self, name: &str) -> Result<Vec<u8>> {
        crate::files::read(&self.path(name)?)
    }

    fn len(&self, name: &str) -> Result<u64> {
        Ok(crate::files::check_regular(&self.path(name)?)?.len())
    }

    fn describe(&self, name: &str) -> String {
        self.root.join(name).display().to_string()
    }
}

impl ObjectSink for LocalFolder {
    fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
        let path = self.path(name)?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io_error(parent.to_path_buf(), e))?;
        }
        weft_core::io::atomic::write(&path, bytes)?;
        Ok(())
    }

    fn describe(&self, name: &str) -> String {
        ObjectSource::describe(self, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_reads_back_what_it_wrote_whole_and_by_range() {
        let dir = std::env::temp_dir().join(format!("weft-objects-{}", std::process::id()));
        let f = LocalFolder::new(&dir);
        f.put("sub/a.bin", b"0123456789").unwrap();
        assert_eq!(f.read("sub/a.bin").unwrap(), b"0123456789");
        assert_eq!(f.read_range("sub/a.bin", 2..5).unwrap(), b"234");
        assert_eq!(f.len("sub/a.bin").unwrap(), 10);
        let past = f.read_range("sub/a.bin", 8..11).unwrap_err().to_string();
        assert!(past.contains("past the end") && past.contains("a.bin"), "{past}");
        #[allow(clippy::reversed_empty_ranges)]
        let reversed = f.read_range("sub/a.bin", 5..2).unwrap_err().to_string();
        assert!(
            reversed.contains("reversed") && reversed.contains("a.bin"),
            "{reversed}"
        );
        let missing = f.read("nope.bin").unwrap_err().to_string();
        assert!(missing.contains("nope.bin"), "{missing}");
        for bad in ["../x", "/etc/passwd", ""] {
            assert!(f.read(bad).is_err(), "{bad}");
            assert!(f.put(bad, b"x").is_err(), "{bad}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    #[allow(clippy::reversed_empty_ranges)]
    fn ranges_are_checked_against_the_length() {
        assert!(check_range("x", &(0..10), 10).is_ok());
        assert!(check_range("x", &(10..10), 10).is_ok());
        assert!(check_range("x", &(0..0), 0).is_ok());
        let past = check_range("s3://b/x", &(5..11), 10).unwrap_err().to_string();
        assert_eq!(
            past,
            "s3://b/x: byte range 5..11 is past the end of the object (10 bytes)"
        );
        let reversed = check_range("s3://b/x", &(4..3), 10).unwrap_err().to_string();
        assert_eq!(reversed, "s3://b/x: byte range 4..3 is reversed");
        // reversed is named first, even past the end
        assert!(check_range("x", &(20..12), 10)
            .unwrap_err()
            .to_string()
            .contains("reversed"));
    }
}
