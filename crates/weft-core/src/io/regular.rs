//! Opening a file that must be a regular file: checked before it is opened (opening a FIFO
//! waits for a writer, a device such as `/dev/zero` never ends) and again on what was opened
//! (the path may be replaced in between, so on Linux with glibc it is opened without waiting on a
//! FIFO,
//! and without following a link where links are not followed; elsewhere that second open is a
//! plain one).

use std::fs::{File, FileType, Metadata};
use std::io;
use std::path::Path;

/// What [`open_regular`] found at a path.
#[derive(Debug)]
pub enum Regular {
    /// A regular file, opened for reading, with the metadata of the file opened.
    File(File, Metadata),
    /// Nothing at the path.
    Missing,
    /// Something other than a regular file: its type (a symbolic link when links are not
    /// followed).
    Other(FileType),
}

/// Opens `path` for reading if it is a regular file. With `follow_links`, a symbolic link is
/// followed and what it leads to must be a regular file; without, a link is [`Regular::Other`].
/// Errors are those of reading the path's metadata or opening it, other than "not found".
pub fn open_regular(path: &Path, follow_links: bool) -> io::Result<Regular> {
    let found = if follow_links {
        std::fs::metadata(path)
    } else {
        std::fs::symlink_metadata(path)
    };
    match found {
        Ok(m) if m.is_file() => {}
        Ok(m) => return Ok(Regular::Other(m.file_type())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Regular::Missing),
        Err(e) => return Err(e),
    }
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::os::unix::fs::OpenOptionsExt;
        let no_follow = if follow_links { 0 } else { libc::O_NOFOLLOW };
        options.custom_flags(libc::O_NONBLOCK | no_follow);
    }
    let file = match options.open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Regular::Missing),
        // O_NOFOLLOW on a link that replaced the file in between
        Err(e) if !follow_links => match std::fs::symlink_metadata(path) {
            Ok(m) if !m.is_file() => return Ok(Regular::Other(m.file_type())),
            _ => return Err(e),
        },
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Ok(Regular::Other(meta.file_type()));
    }
    Ok(Regular::File(file, meta))
}

/// The bytes of `path`, at most `cap` of them (symlinks followed): `Ok(None)` when there is no
/// file; an error naming the path when it cannot be used: not a regular file (a FIFO would wait
/// for a writer for ever, a device such as `/dev/zero` never end), longer than `cap`, or
/// unreadable. A FIFO is never opened in blocking mode, and at most `cap + 1` bytes are read.
pub fn read_capped(path: &Path, cap: u64) -> Result<Option<Vec<u8>>, String> {
    use std::io::Read;
    let not_regular = |kind: &std::fs::FileType| {
        format!(
            "{}: is {}, not a regular file",
            path.display(),
            crate::io::atomic::describe(kind)
        )
    };
    let (file, meta) = match open_regular(path, true) {
        Ok(Regular::File(file, meta)) => (file, meta),
        Ok(Regular::Missing) => return Ok(None),
        Ok(Regular::Other(kind)) => return Err(not_regular(&kind)),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    if meta.len() > cap {
        return Err(format!(
            "{}: {} bytes, longer than the {cap} bytes such a file can hold",
            path.display(),
            meta.len()
        ));
    }
    let mut bytes = Vec::new();
    file.take(cap + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    // it grew while being read
    if bytes.len() as u64 > cap {
        return Err(format!(
            "{}: longer than the {cap} bytes such a file can hold",
            path.display()
        ));
    }
    Ok(Some(bytes))
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::io::Read;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("weft-regular-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_regular_file_is_opened_and_read() {
        let d = dir("file");
        std::fs::write(d.join("a"), b"abc").unwrap();
        let Regular::File(mut f, meta) = open_regular(&d.join("a"), false).unwrap() else {
            panic!("a regular file")
        };
        assert_eq!(meta.len(), 3);
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        assert_eq!(s, "abc");
        assert!(matches!(open_regular(&d.join("b"), true).unwrap(), Regular::Missing));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn fifos_devices_folders_and_unfollowed_links_are_not_opened() {
        let d = dir("other");
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // would wait for a writer for ever if it were opened in blocking mode
        assert!(matches!(open_regular(&fifo, true).unwrap(), Regular::Other(k) if !k.is_file()));
        assert!(matches!(
            open_regular(Path::new("/dev/zero"), true).unwrap(),
            Regular::Other(_)
        ));
        assert!(matches!(open_regular(&d, true).unwrap(), Regular::Other(k) if k.is_dir()));
        std::fs::write(d.join("target"), b"x").unwrap();
        std::os::unix::fs::symlink(d.join("target"), d.join("link")).unwrap();
        assert!(matches!(open_regular(&d.join("link"), false).unwrap(), Regular::Other(k) if k.is_symlink()));
        assert!(matches!(
            open_regular(&d.join("link"), true).unwrap(),
            Regular::File(..)
        ));
        std::os::unix::fs::symlink(&fifo, d.join("to-fifo")).unwrap();
        assert!(matches!(
            open_regular(&d.join("to-fifo"), true).unwrap(),
            Regular::Other(_)
        ));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
