//! What keeps a driver's child processes tied to it, and one driver per sweep or pipeline:
//! children that die with their parent (also when it is killed with SIGKILL, which no handler
//! sees) and an exclusive lock on a folder.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};

/// Has the kernel send `SIGTERM` to the process `cmd` starts when the thread that starts it
/// ends (Linux's `PR_SET_PDEATHSIG`). A driver starts and waits for its children on one
/// thread, so that thread ends when the driver does: killed, the children hear of it and stop
/// cleanly (the trainer ends its step and marks its run) instead of running on unsupervised.
/// A parent gone before the child set the signal is caught too (the child exits at once).
///
/// The kernel sends the signal each time the child is handed to a new parent, so a child of a
/// parent with several threads (`weft pipeline` runs each step on its own thread) can get it two
/// or three times as those threads die, in an order nothing here controls: `weft train` takes a
/// repeat of its parent-death signal as the same request (`weft_train::stop`), not as the
/// second signal that stops it at once.
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    // SAFETY: getpid is async-signal-safe
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe functions
    // (prctl, getppid, _exit)
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                libc::_exit(143);
            }
            Ok(())
        })
    }
}

/// An exclusive lock on a folder (`flock` on its `.lock` file), held while this value lives;
/// the kernel releases it when the process ends, however it ends.
#[derive(Debug)]
pub struct FolderLock {
    _file: File,
}

impl FolderLock {
    /// Takes the lock on `dir` (made if missing) without waiting: an error naming `what` and
    /// the lock file when another process holds it.
    pub fn take(dir: &Path, what: &str) -> Result<FolderLock> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let path: PathBuf = dir.join(".lock");
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|source| Error::Io {
                path: path.clone(),
                source,
            })?;
        // SAFETY: flock on a descriptor this value owns
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(Error::State(format!(
                    "{what} is being run by another process (it holds {})",
                    path.display()
                )));
            }
            return Err(Error::Io { path, source: e });
        }
        Ok(FolderLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_is_locked_once_until_the_lock_is_dropped() {
        let dir = std::env::temp_dir().join(format!("weft-lock-{}", std::process::id()));
        let first = FolderLock::take(&dir, "sweep \"a\"").unwrap();
        let e = FolderLock::take(&dir, "sweep \"a\"").unwrap_err().to_string();
        assert!(e.contains("sweep \"a\" is being run by another process"), "{e}");
        drop(first);
        FolderLock::take(&dir, "sweep \"a\"").unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
