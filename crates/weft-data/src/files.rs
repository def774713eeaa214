//! Reading the files that configs and command lines name (datasets, tokenizers): regular files
//! only.
//!
//! A path naming a device, a pipe or a socket (`/dev/zero`, `/dev/stdin`, a FIFO) would be read
//! until memory runs out, or wait for ever; a directory cannot be read at all. Each is refused with
//! one error naming the path (after following symlinks) before anything is read. Standard input,
//! where a command reads it on purpose, is the caller's business and does not go through here.

use std::io::Read;
use std::path::Path;

use crate::error::{invalid, Error, Result};

fn not_a_file(path: &Path, kind: &std::fs::FileType) -> Error {
    let kind = weft_core::io::atomic::describe(kind);
    invalid(format!("{}: not a file ({kind})", path.display()))
}

/// The metadata of `path` (symlinks followed), or an error naming it when it is missing,
/// unreadable, or not a regular file.
pub fn check_regular(path: &Path) -> Result<std::fs::Metadata> {
    let meta = std::fs::metadata(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if !meta.is_file() {
        return Err(not_a_file(path, &meta.file_type()));
    }
    Ok(meta)
}

/// `path` opened for reading, with its metadata, if it is a regular file (symlinks followed):
/// checked before opening (a pipe would wait for a writer) and on what was opened. Errors name
/// the path: missing, unreadable, or not a regular file.
pub fn open_regular(path: &Path) -> Result<(std::fs::File, std::fs::Metadata)> {
    use weft_core::io::regular::{open_regular, Regular};
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    match open_regular(path, true).map_err(io)? {
        Regular::File(file, meta) => Ok((file, meta)),
        Regular::Missing => Err(io(std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"))),
        Regular::Other(kind) => Err(not_a_file(path, &kind)),
    }
}

/// The bytes of the regular file `path`. Errors name the path: missing, unreadable, or not a
/// regular file (a directory, a device such as `/dev/zero`, a pipe), which is refused before
/// anything is read.
pub fn read(path: &Path) -> Result<Vec<u8>> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let (mut file, meta) = open_regular(path)?;
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(usize::try_from(meta.len()).unwrap_or(usize::MAX))
        .map_err(|_| {
            invalid(format!(
                "{}: cannot allocate {} bytes to read it",
                path.display(),
                meta.len()
            ))
        })?;
    file.read_to_end(&mut bytes).map_err(io)?;
    Ok(bytes)
}

/// The text of the regular file `path` (UTF-8). Errors as [`read`], or naming the path when the
/// file is not UTF-8.
pub fn read_to_string(path: &Path) -> Result<String> {
    String::from_utf8(read(path)?).map_err(|e| Error::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not UTF-8 text ({})", e.utf8_error()),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_and_directories_are_refused_by_name_before_reading() {
        // /dev/zero never ends: reading it whole would run out of memory
        if Path::new("/dev/zero").exists() {
            let e = read(Path::new("/dev/zero")).unwrap_err().to_string();
            assert_eq!(e, "/dev/zero: not a file (a character device)");
            let e = read_to_string(Path::new("/dev/zero")).unwrap_err().to_string();
            assert_eq!(e, "/dev/zero: not a file (a character device)");
        }
        let dir = std::env::temp_dir();
        let e = read(&dir).unwrap_err().to_string();
        assert!(e.ends_with("not a file (a directory)"), "{e}");
        let missing = dir.join(format!("weft-files-missing-{}", std::process::id()));
        assert!(read(&missing).unwrap_err().to_string().contains("weft-files-missing"));
    }

    #[test]
    fn regular_files_and_links_to_them_read_whole() {
        let dir = std::env::temp_dir().join(format!("weft-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("a.txt");
        std::fs::write(&f, "h\u{e9}llo").unwrap();
        assert_eq!(read_to_string(&f).unwrap(), "h\u{e9}llo");
        std::fs::write(&f, b"\xff").unwrap();
        let e = read_to_string(&f).unwrap_err().to_string();
        assert!(e.contains("a.txt") && e.contains("not UTF-8 text"), "{e}");
        #[cfg(unix)]
        {
            let link = dir.join("zero");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
            let e = read(&link).unwrap_err().to_string();
            assert!(e.ends_with("zero: not a file (a character device)"), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
