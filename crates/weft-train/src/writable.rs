//! Whether an output path (`train.metrics`, `train.trace`) can be written, checked before a
//! run's first step and leaving what is there as it was.

use std::io;
use std::path::{Path, PathBuf};

/// Symbolic links followed to a missing target before giving up (Linux's own limit).
const MAX_LINKS: usize = 40;

/// Checks that `path` can be written, leaving it as it was: an existing file or character
/// device (`/dev/null`) is opened for appending; a FIFO only where a process reads it (a pipe
/// behind `/dev/stdout`: opening one nobody reads would wait for ever); a folder, a socket or a
/// block device is refused; a new file is created and removed, and where `path` is a link to
/// nothing, the file it leads to is (the link stays).
pub(crate) fn probe_writable(path: &Path) -> io::Result<()> {
    let mut path = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match std::fs::metadata(&path) {
            Ok(m) if m.is_dir() => return Err(io::Error::other("it is a folder")),
            Ok(m) if m.is_file() || is_char_device(&m) => {
                return std::fs::OpenOptions::new().append(true).open(&path).map(drop);
            }
            Ok(m) if is_fifo(&m) => return fifo_has_reader(&path),
            Ok(m) => {
                let kind = weft_core::io::atomic::describe(&m.file_type());
                return Err(io::Error::other(format!("it is {kind}, not a regular file")));
            }
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            Err(_) => {}
        }
        match std::fs::read_link(&path) {
            // a link to nothing: what it leads to is what a write would create
            Ok(target) => path = beside(&path, target),
            Err(_) => {
                if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::File::create(&path)?;
                return std::fs::remove_file(&path);
            }
        }
    }
    Err(io::Error::other("more than 40 levels of symbolic links"))
}

/// A link's `target`, relative to the folder of the link at `link`.
fn beside(link: &Path, target: PathBuf) -> PathBuf {
    match link.parent() {
        Some(dir) if target.is_relative() => dir.join(target),
        _ => target,
    }
}

#[cfg(unix)]
fn is_char_device(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::FileTypeExt;
    m.file_type().is_char_device()
}

#[cfg(not(unix))]
fn is_char_device(_: &std::fs::Metadata) -> bool {
    false
}

#[cfg(unix)]
fn is_fifo(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::FileTypeExt;
    m.file_type().is_fifo()
}

#[cfg(not(unix))]
fn is_fifo(_: &std::fs::Metadata) -> bool {
    false
}

/// A FIFO opened for writing without waiting: that fails (`ENXIO`) when no process reads it.
#[cfg(unix)]
fn fifo_has_reader(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => Err(io::Error::other(
            "it is a FIFO that no process reads (writing to it would wait for one for ever)",
        )),
        Err(e) => Err(e),
    }
}

#[cfg(not(unix))]
fn fifo_has_reader(_: &Path) -> io::Result<()> {
    Err(io::Error::other("it is a FIFO, not a regular file"))
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn folder(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("weft-writable-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_fifo_is_taken_only_while_a_process_reads_it() {
        let d = folder("fifo");
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = probe_writable(&fifo).unwrap_err().to_string();
        assert!(e.contains("a FIFO that no process reads"), "{e}");
        // a reader (opened without waiting for a writer)
        use std::os::unix::fs::OpenOptionsExt;
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        probe_writable(&fifo).unwrap();
        drop(reader);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_link_to_nothing_stays_a_link() {
        let d = folder("link");
        let link = d.join("metrics.jsonl");
        std::os::unix::fs::symlink("elsewhere/m.jsonl", &link).unwrap();
        probe_writable(&link).unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert!(!d.join("elsewhere/m.jsonl").exists(), "the probe's file was removed");
        assert!(d.join("elsewhere").is_dir());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
