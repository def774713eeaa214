//! Output paths (`train.metrics`, `train.trace`): whether they can be written, checked before a
//! run's first step and leaving what is there as it was, and the metrics' stream opened without
//! waiting on a FIFO nobody reads.

use std::io;
use std::path::{Path, PathBuf};

/// Symbolic links followed to a missing target before giving up (Linux's own limit).
const MAX_LINKS: usize = 40;

/// What an output does with a FIFO at its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fifo {
    /// Written to as a stream for the whole run (the metrics): taken, and opened by
    /// [`open_for_append`], which fails when no process reads it. Not opened here: opening
    /// and closing it would end the reader's input (its next read finds the end of file).
    Stream,
    /// Written once, at the end (the trace): refused.
    Refused,
}

/// Checks that `path` can be written, leaving it as it was: an existing file or character
/// device (`/dev/null`) is opened for appending; a FIFO as `fifo` says; a folder, a socket or a
/// block device is refused; a new file is created and removed, and where `path` is a link to
/// nothing, the file it leads to is (the link stays).
pub(crate) fn probe_writable(path: &Path, fifo: Fifo) -> io::Result<()> {
    let mut path = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match std::fs::metadata(&path) {
            Ok(m) if m.is_dir() => return Err(io::Error::other("it is a folder")),
            Ok(m) if m.is_file() || is_char_device(&m) => {
                return std::fs::OpenOptions::new().append(true).open(&path).map(drop);
            }
            Ok(m) if is_fifo(&m) && fifo == Fifo::Stream => return Ok(()),
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

/// `path` opened (created if missing) for appending. A FIFO is opened without waiting for a
/// reader (an error saying none reads it, where opening it blocking would wait for ever), and
/// then set back to blocking writes, as a pipe is.
pub(crate) fn open_for_append(path: &Path) -> io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = match options.open(path) {
        Ok(f) => f,
        #[cfg(unix)]
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
            return Err(io::Error::other(
                "it is a FIFO that no process reads (writing to it would wait for one for ever)",
            ))
        }
        Err(e) => return Err(e),
    };
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        let fd = file.as_raw_fd();
        // SAFETY: fcntl on a descriptor this function owns, reading then setting its status flags
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(file)
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

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn folder(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("weft-writable-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    /// A reader that takes the FIFO's whole input, as `cat fifo > log` does: the probe does not
    /// open the FIFO (a probe that opened and closed it ended the reader's input, and the run's
    /// own open then waited for ever), and the stream opened after it reaches the reader.
    #[test]
    fn a_fifo_streams_to_its_reader_and_is_refused_without_one() {
        use std::io::{Read, Write};
        let d = folder("fifo");
        let fifo = d.join("fifo");
        mkfifo(&fifo);
        let e = open_for_append(&fifo).unwrap_err().to_string();
        assert!(e.contains("a FIFO that no process reads"), "{e}");
        let e = probe_writable(&fifo, Fifo::Refused).unwrap_err().to_string();
        assert!(e.contains("a FIFO, not a regular file"), "{e}");
        let path = fifo.clone();
        let reader = std::thread::spawn(move || {
            let mut all = String::new();
            std::fs::File::open(&path).unwrap().read_to_string(&mut all).unwrap();
            all
        });
        // the reader is in its blocking open until a writer comes; then it reads to the end
        probe_writable(&fifo, Fifo::Stream).unwrap();
        let mut out = loop {
            match open_for_append(&fifo) {
                Ok(f) => break f,
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        };
        probe_writable(&fifo, Fifo::Stream).unwrap();
        out.write_all(b"a record\n").unwrap();
        drop(out);
        assert_eq!(reader.join().unwrap(), "a record\n");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_link_to_nothing_stays_a_link() {
        let d = folder("link");
        let link = d.join("metrics.jsonl");
        std::os::unix::fs::symlink("elsewhere/m.jsonl", &link).unwrap();
        probe_writable(&link, Fifo::Stream).unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert!(!d.join("elsewhere/m.jsonl").exists(), "the probe's file was removed");
        assert!(d.join("elsewhere").is_dir());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
