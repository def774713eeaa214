//! Atomic file replacement: the bytes go to a temporary file beside the target, are fsynced, and
//! the temporary file is renamed over the target, so a reader sees the old file or the new one,
//! never half of one.
//!
//! - A symlink at the target is followed (through any chain of links) and its final target is
//!   replaced; the link stays and points at the new file.
//! - An existing target that is not a regular file (a directory, a device node such as
//!   `/dev/null`, a FIFO, a socket) is refused: renaming over it would replace the node itself.
//! - The temporary file is removed on every failure (creating, writing, fsyncing, renaming), so
//!   a full disk leaves no `*.tmp` behind.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Symlinks followed before giving up (Linux's own limit).
const MAX_LINKS: usize = 40;

/// Replaces the file at `path` (or creates it) with `bytes`, atomically (see the module docs).
/// Errors name `path` (and, through a symlink, the file it leads to).
pub fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    write_with(path, |tmp| std::fs::File::create(tmp)?.write_all(bytes))
}

/// [`write`] for a writer that makes the temporary file itself: `fill` creates and writes the
/// file at the path it is given (streaming, so a large file needs no copy in memory); it is
/// then fsynced and renamed over the target as [`write`] does.
pub fn write_with(path: &Path, fill: impl FnOnce(&Path) -> std::io::Result<()>) -> Result<()> {
    let target = resolve(path)?;
    let name = |t: &Path| {
        if t == path {
            path.display().to_string()
        } else {
            format!("{} (a link to {})", path.display(), t.display())
        }
    };
    let Some(file_name) = target.file_name() else {
        return Err(Error::Io(format!("{}: names no file", name(&target))));
    };
    // unique per process and call, so that writers racing on one target never share one
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp_name = file_name.to_os_string();
    tmp_name.push(format!(".{}-{n}.tmp", std::process::id()));
    let tmp = target.with_file_name(tmp_name);
    let attempt = || -> std::io::Result<()> {
        fill(&tmp)?;
        std::fs::OpenOptions::new().write(true).open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, &target)
    };
    attempt().map_err(|e| {
        // the temporary file, if it was created, goes whatever failed
        let _ = std::fs::remove_file(&tmp);
        Error::Io(format!("{}: {e}", name(&target)))
    })
}

/// The file a write to `path` replaces: `path` itself, or the end of the chain of symlinks at
/// `path`. Fails when that is an existing non-regular file, or the chain is too long.
fn resolve(path: &Path) -> Result<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        let meta = match std::fs::symlink_metadata(&p) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(p),
            Err(e) => return Err(Error::Io(format!("{}: {e}", p.display()))),
        };
        let kind = meta.file_type();
        if kind.is_symlink() {
            let link = std::fs::read_link(&p).map_err(|e| Error::Io(format!("{}: {e}", p.display())))?;
            p = match p.parent() {
                Some(dir) if link.is_relative() => dir.join(link),
                _ => link,
            };
            continue;
        }
        if kind.is_file() {
            return Ok(p);
        }
        let shown = if p == path {
            path.display().to_string()
        } else {
            format!("{} (a link to {})", path.display(), p.display())
        };
        return Err(Error::Io(format!(
            "{shown}: is {}, not a regular file; refusing to replace it",
            describe(&kind)
        )));
    }
    Err(Error::Io(format!(
        "{}: more than {MAX_LINKS} levels of symbolic links",
        path.display()
    )))
}

/// "a directory", "a FIFO", ... for a file type that is not a regular file or a symlink (for
/// messages refusing it).
pub fn describe(kind: &std::fs::FileType) -> &'static str {
    if kind.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_char_device() {
            return "a character device";
        }
        if kind.is_block_device() {
            return "a block device";
        }
        if kind.is_fifo() {
            return "a FIFO";
        }
        if kind.is_socket() {
            return "a socket";
        }
    }
    "a special file"
}
