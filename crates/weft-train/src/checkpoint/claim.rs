//! A checkpoint folder belongs to one run at a time.
//!
//! Before its first step a run *claims* its `checkpoint_dir`: the folder is created and checked
//! writable (by every rank: each writes its own files), and the job's rank 0 takes an exclusive
//! `flock` on `DIR/.lock` for the run's life (released by the kernel when the process ends, so
//! a killed run never leaves a stale lock). A second run into the same folder is refused while
//! the first holds it, naming the holder (pid, host, age) from the lock file.
//!
//! A fresh run (not resuming) into a folder that holds checkpoints (`step-*`, or temporary
//! `.tmp-step-*` folders) is refused, because the two runs' checkpoints would mix: pruning would
//! weigh one against the other and a later `--resume` would pick the newest of either. With
//! `overwrite` it removes them, and says so, but only once the run is known to start
//! ([`Claim::clear_earlier`], before its first step or save): a run refused after the claim (a
//! model that does not build, a checkpoint to start from that does not load) leaves them.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::io;
use crate::error::{Error, Result};

/// The lock file's name inside a checkpoint folder.
pub const LOCK: &str = ".lock";

/// How long a claim waits for a lock that is held before it names the holder.
const LOCK_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// How the run that claims a folder treats the checkpoints already in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimMode {
    /// Continues the run whose checkpoints are there (`--resume`).
    Resume,
    /// Starts a new run: the folder must hold no checkpoint, unless `overwrite` (they are
    /// removed).
    Fresh { overwrite: bool },
}

/// Claims `dir` for a run of the ranks of `group` (`None`: a single process): every rank
/// checks that it can write there, the group's rank 0 takes the lock and applies `mode`, and
/// every rank fails if any did.
pub fn claim(dir: &Path, group: Option<&weft_dist::ProcessGroup>, mode: ClaimMode) -> Result<Claim> {
    let lock = group.is_none_or(|g| g.rank() == 0);
    crate::job::agree(group, Claim::acquire(dir, lock, mode), "claiming train.checkpoint_dir")
}

/// A claimed checkpoint folder: the lock is held while this lives (on the rank that took it).
#[derive(Debug)]
pub struct Claim {
    /// The locked file (rank 0 only); closing it releases the lock.
    _lock: Option<File>,
    /// A fresh run's folder claimed with `overwrite` (on every rank), until
    /// [`Claim::clear_earlier`] has removed the checkpoints in it.
    overwrite: Option<PathBuf>,
    /// Set by [`Claim::keep_earlier`]: the run continues its own checkpoints.
    keep: bool,
}

impl Claim {
    /// Claims `dir` for a run: creates it, checks that files can be written in it, and, when
    /// `lock` (the job's rank 0, or a single process), takes its lock and applies `mode`.
    pub fn acquire(dir: &Path, lock: bool, mode: ClaimMode) -> Result<Claim> {
        let key = "train.checkpoint_dir";
        if dir.exists() && !dir.is_dir() {
            return Err(Error::Config(format!("{key}: {} is not a folder", dir.display())));
        }
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::Config(format!("{key}: cannot create {}: {e}", dir.display())))?;
        check_writable(dir).map_err(|e| Error::Config(format!("{key}: {e}")))?;
        let overwrite = (mode == ClaimMode::Fresh { overwrite: true }).then(|| dir.to_path_buf());
        if !lock {
            return Ok(Claim {
                _lock: None,
                overwrite,
                keep: false,
            });
        }
        let file = take_lock(dir)?;
        if let ClaimMode::Fresh { overwrite } = mode {
            let found = checkpoint_folders(dir)?;
            if !found.is_empty() && !overwrite {
                let names: Vec<String> = found
                    .iter()
                    .take(3)
                    .map(|p| p.file_name().unwrap_or_default().to_string_lossy().into_owned())
                    .collect();
                let more = if found.len() > 3 {
                    format!(" and {} more", found.len() - 3)
                } else {
                    String::new()
                };
                return Err(Error::Config(format!(
                    "{key}: {} holds checkpoints of another run ({}{more}); continue that run with --resume, \
                     start this one in another folder, or set train.overwrite = true to remove them",
                    dir.display(),
                    names.join(", ")
                )));
            }
        }
        Ok(Claim {
            _lock: Some(file),
            overwrite,
            keep: false,
        })
    }

    /// A fresh run with `overwrite` that is about to start (its first step, or its first save)
    /// removes the checkpoint folders its folder holds, once, and says so: on the rank that holds
    /// the lock, once every rank of `group` has come this far (a rank that failed before, say
    /// loading its part of a `--resume-from` checkpoint, has not: then nothing is removed), every
    /// rank failing if the removal failed. Nothing for any other claim, or after the first
    /// call; after [`Claim::keep_earlier`] the agreements still run (every rank runs them alike,
    /// whatever each decided) and the lock's rank keeps the checkpoints.
    pub fn clear_earlier(&mut self, group: Option<&weft_dist::ProcessGroup>) -> Result<()> {
        let Some(dir) = self.overwrite.take() else {
            return Ok(());
        };
        crate::job::agree(group, Ok(()), "train.overwrite: starting the run")?;
        let removed = match (&self._lock, self.keep) {
            (Some(_), false) => remove_checkpoint_folders(&dir),
            _ => Ok(()),
        };
        crate::job::agree(group, removed, "train.overwrite: removing the earlier checkpoints")
    }

    /// The run continues a checkpoint of its own folder (`--resume-from` one of them): the
    /// earlier checkpoints are that run's, and [`Claim::clear_earlier`] leaves them (on the lock's
    /// rank, which removes them; its collectives run on every rank either way).
    pub fn keep_earlier(&mut self) {
        self.keep = true;
    }
}

/// Removes the `step-*` and `.tmp-step-*` folders of `dir`, and says how many.
fn remove_checkpoint_folders(dir: &Path) -> Result<()> {
    let found = checkpoint_folders(dir)?;
    if found.is_empty() {
        return Ok(());
    }
    for p in &found {
        std::fs::remove_dir_all(p).map_err(|e| io(p, e))?;
    }
    weft_core::errln!(
        "weft: train.overwrite: removed {} checkpoint folder(s) of an earlier run from {}",
        found.len(),
        dir.display()
    );
    Ok(())
}

/// Creates and removes a file in `dir`: the cheapest proof that a checkpoint can be written.
/// Ranks on several hosts probe one shared folder at once: the name holds the host and the pid.
fn check_writable(dir: &Path) -> std::result::Result<(), String> {
    let probe = dir.join(format!(".write-test-{}-{}", host_name(), std::process::id()));
    File::create(&probe).map_err(|e| format!("cannot write in {}: {e}", dir.display()))?;
    std::fs::remove_file(&probe).map_err(|e| format!("cannot remove a file in {}: {e}", dir.display()))
}

/// `step-*` and `.tmp-step-*` entries of `dir`, sorted.
fn checkpoint_folders(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| io(dir, e))? {
        let entry = entry.map_err(|e| io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("step-") || name.starts_with(".tmp-step-") {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

/// What the lock file says about its holder.
#[derive(serde::Serialize, serde::Deserialize)]
struct Holder {
    pid: u32,
    host: String,
    /// Seconds since the Unix epoch when the run took the lock.
    since: u64,
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// This machine's host name (empty if unknown).
pub(crate) fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for its whole length; gethostname NUL-terminates what fits.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Opens `DIR/.lock` and takes an exclusive, non-blocking `flock` on it, then records this
/// process as the holder. Another holder is named in the error.
fn take_lock(dir: &Path) -> Result<File> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    let path = dir.join(LOCK);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| Error::Config(format!("train.checkpoint_dir: cannot open {}: {e}", path.display())))?;
    // A lock can outlive its holder by a moment: a process that forks (starting any child) lends
    // the child its descriptors until the child's exec closes them. A holder gets a short grace.
    let deadline = std::time::Instant::now() + LOCK_GRACE;
    let locked = loop {
        // SAFETY: flock on a file descriptor this File owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            break Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) || std::time::Instant::now() >= deadline {
            break Err(err);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    if let Err(err) = locked {
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(Error::Config(format!(
                "train.checkpoint_dir: cannot lock {}: {err}",
                path.display()
            )));
        }
        let mut text = String::new();
        let _ = file.read_to_string(&mut text);
        let who = match serde_json::from_str::<Holder>(&text) {
            Ok(h) => format!(
                "pid {} on {}, which took it {} s ago",
                h.pid,
                if h.host.is_empty() { "an unknown host" } else { &h.host },
                now_secs().saturating_sub(h.since)
            ),
            Err(_) => "a process that has not yet said who it is".to_string(),
        };
        return Err(Error::Config(format!(
            "train.checkpoint_dir: {} is in use by another run ({who}); wait for it to end, or give this run \
             another folder",
            dir.display()
        )));
    }
    let holder = Holder {
        pid: std::process::id(),
        host: host_name(),
        since: now_secs(),
    };
    let json = serde_json::to_string(&holder).map_err(|e| io(&path, e))?;
    file.set_len(0)
        .and_then(|_| file.rewind())
        .and_then(|_| file.write_all(json.as_bytes()))
        .map_err(|e| io(&path, e))?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("weft-claim-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_second_claim_is_refused_while_the_first_lives() {
        let dir = temp("lock");
        let first = Claim::acquire(&dir, true, ClaimMode::Resume).unwrap();
        let e = Claim::acquire(&dir, true, ClaimMode::Resume).unwrap_err().to_string();
        assert!(e.contains("in use by another run"), "{e}");
        assert!(e.contains(&format!("pid {}", std::process::id())), "{e}");
        // ranks other than 0 only check that they can write
        Claim::acquire(&dir, false, ClaimMode::Resume).unwrap();
        drop(first);
        Claim::acquire(&dir, true, ClaimMode::Resume).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_fresh_run_does_not_mix_with_another_runs_checkpoints() {
        let dir = temp("fresh");
        std::fs::create_dir_all(dir.join("step-00000010")).unwrap();
        std::fs::create_dir_all(dir.join(".tmp-step-00000020-abc")).unwrap();
        let e = Claim::acquire(&dir, true, ClaimMode::Fresh { overwrite: false })
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("step-00000010") && e.contains("--resume") && e.contains("overwrite"),
            "{e}"
        );
        assert!(dir.join("step-00000010").exists(), "nothing is removed");
        Claim::acquire(&dir, true, ClaimMode::Resume).unwrap();
        let mut claim = Claim::acquire(&dir, true, ClaimMode::Fresh { overwrite: true }).unwrap();
        // claimed, not yet cleared: the run may still be refused
        assert!(
            dir.join("step-00000010").exists(),
            "removed before the run was known to start"
        );
        claim.clear_earlier(None).unwrap();
        assert!(!dir.join("step-00000010").exists() && !dir.join(".tmp-step-00000020-abc").exists());
        // once: a checkpoint the run writes after is its own
        std::fs::create_dir_all(dir.join("step-00000030")).unwrap();
        claim.clear_earlier(None).unwrap();
        assert!(dir.join("step-00000030").exists());
        drop(claim);
        // a claim dropped before the run started removes nothing
        let claim = Claim::acquire(&dir, true, ClaimMode::Fresh { overwrite: true }).unwrap();
        drop(claim);
        assert!(dir.join("step-00000030").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_is_not_a_checkpoint_folder() {
        let dir = temp("file");
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("f");
        std::fs::write(&file, b"x").unwrap();
        let e = Claim::acquire(&file, true, ClaimMode::Resume).unwrap_err().to_string();
        assert!(e.contains("is not a folder"), "{e}");
        let e = Claim::acquire(&file.join("sub"), true, ClaimMode::Resume)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot create"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
