//! How many workers one launcher may start (`--nproc-per-node`): the lowest of a fixed cap and
//! what this process's limits on open files (`RLIMIT_NOFILE`) and on processes
//! (`RLIMIT_NPROC`) leave room for. Checked before anything starts, so a number past it is one
//! clear error instead of a launcher that spends minutes starting workers it cannot watch.

use crate::error::{Error, Result};

/// The most workers one launcher starts, whatever the system allows. Every pair of ranks on a
/// node holds a connection, so 1024 ranks already need over a million sockets between them, and
/// outnumber the cores of the machines weft runs on.
pub const MAX_NPROC_PER_NODE: usize = 1024;
/// Open files the launcher holds per worker: the read ends of its stdout and stderr pipes, and
/// the store's two handles on its connection (node 0).
pub const FILES_PER_WORKER: u64 = 4;
/// Processes and threads each worker costs the launcher's user: the worker itself, the
/// launcher's two output threads for it, and the store's thread for its connection.
pub const TASKS_PER_WORKER: u64 = 4;
/// Open files and tasks left aside for everything else the launcher does.
const RESERVED: u64 = 64;

/// The most workers this launcher can start, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    pub workers: usize,
    /// What sets it, for the error message.
    pub why: String,
}

/// The limit for this process: [`MAX_NPROC_PER_NODE`], lowered by its soft `RLIMIT_NOFILE`
/// and `RLIMIT_NPROC` (the latter only when not root, whom the kernel does not hold to it).
pub fn max_nproc_per_node() -> Limit {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let tasks = if root { None } else { soft_limit(Resource::Tasks) };
    limit_from(soft_limit(Resource::Files), tasks)
}

/// Fails with one line naming the flag, the value, the limit and what sets it when `nproc`
/// workers are more than [`max_nproc_per_node`].
pub(super) fn check(nproc: usize) -> Result<()> {
    let limit = max_nproc_per_node();
    if nproc <= limit.workers {
        return Ok(());
    }
    Err(Error::Invalid(format!(
        "--nproc-per-node {nproc} is above the limit of {} workers on one node: {}",
        limit.workers, limit.why
    )))
}

/// The limit given the soft limits on open files and on processes (`None`: unlimited).
fn limit_from(files: Option<u64>, tasks: Option<u64>) -> Limit {
    let mut limit = Limit {
        workers: MAX_NPROC_PER_NODE,
        why: format!(
            "weft launch starts at most {MAX_NPROC_PER_NODE} (more ranks on one node would outnumber its cores, and \
             their connections to each other would take over a million sockets)"
        ),
    };
    let room = |n: u64, per: u64| (n.saturating_sub(RESERVED) / per).min(usize::MAX as u64) as usize;
    if let Some(n) = files {
        let w = room(n, FILES_PER_WORKER);
        if w < limit.workers {
            limit = Limit {
                workers: w,
                why: format!(
                    "this process may open {n} files (ulimit -n) and the launcher needs {FILES_PER_WORKER} per worker \
                     (its two output pipes and its store connection); raise the limit with `ulimit -n` or start \
                     fewer workers"
                ),
            };
        }
    }
    if let Some(n) = tasks {
        let w = room(n, TASKS_PER_WORKER);
        if w < limit.workers {
            limit = Limit {
                workers: w,
                why: format!(
                    "this user may run {n} processes and threads (ulimit -u) and each worker takes \
                     {TASKS_PER_WORKER} (itself, two output threads and a store thread in the launcher); raise the \
                     limit with `ulimit -u` or start fewer workers"
                ),
            };
        }
    }
    limit
}

enum Resource {
    /// `RLIMIT_NOFILE`.
    Files,
    /// `RLIMIT_NPROC`.
    Tasks,
}

/// The soft limit of `resource`; `None` when unlimited or unknown.
fn soft_limit(resource: Resource) -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    let rc = unsafe {
        match resource {
            Resource::Files => libc::getrlimit(libc::RLIMIT_NOFILE, &mut r),
            Resource::Tasks => libc::getrlimit(libc::RLIMIT_NPROC, &mut r),
        }
    };
    if rc != 0 || r.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    // rlim_t is u64 on 64-bit Linux, not everywhere
    #[allow(clippy::unnecessary_cast)]
    Some(r.rlim_cur as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowest_limit_wins_and_is_named() {
        assert_eq!(limit_from(None, None).workers, MAX_NPROC_PER_NODE);
        assert_eq!(limit_from(Some(1 << 20), Some(1 << 20)).workers, MAX_NPROC_PER_NODE);
        let files = limit_from(Some(1024), Some(1 << 20));
        assert_eq!(files.workers, (1024 - 64) / 4);
        assert!(files.why.contains("ulimit -n"), "{}", files.why);
        let tasks = limit_from(Some(1 << 20), Some(500));
        assert_eq!(tasks.workers, (500 - 64) / 4);
        assert!(tasks.why.contains("ulimit -u"), "{}", tasks.why);
        assert_eq!(limit_from(Some(10), None).workers, 0);
    }

    #[test]
    fn the_check_names_flag_value_and_limit() {
        check(1).unwrap();
        let e = check(100_000).unwrap_err().to_string();
        let limit = max_nproc_per_node().workers;
        assert!(
            e.starts_with(&format!(
                "--nproc-per-node 100000 is above the limit of {limit} workers"
            )),
            "{e}"
        );
    }
}
