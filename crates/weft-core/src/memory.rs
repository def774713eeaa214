//! What this machine's memory is, for refusing a request too large for it with a message before
//! anything is allocated (Linux; elsewhere nothing is known and nothing is refused):
//!
//! - [`total`]: the most this process can ever have: `MemTotal` from `/proc/meminfo`, lowered to
//!   the memory limit of its cgroup and of each cgroup above it (v2 `memory.max`, v1
//!   `memory.limit_in_bytes`). `crate::alloc` refuses any single buffer larger than this.
//! - [`available`]: what it can still take now: `MemAvailable` (`MemTotal` on kernels that lack
//!   it), lowered by the room left under each of those limits (less `memory.current` or
//!   `memory.usage_in_bytes`). The trainer's up-front estimate and `weft bench collectives`
//!   check against this.

//!
//! And what this process's tensors hold: [`allocated_bytes`] (host bytes of the storages alive
//! now), [`max_allocated_bytes`] (the most at once since the last [`reset_max_allocated`]), as
//! `torch.cuda.memory_allocated` and `max_memory_allocated` count a device's tensors.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);
static MAX_ALLOCATED: AtomicUsize = AtomicUsize::new(0);

/// Bytes of host memory held by tensor storages alive now: each storage counted once with the
/// size it was made with, however many tensors view it. (A storage whose buffer is swapped in
/// place, as ZeRO-3 does with a parameter it gathers and releases, keeps counting its first
/// size.) GPU buffers are not counted.
pub fn allocated_bytes() -> usize {
    ALLOCATED.load(Ordering::Relaxed)
}

/// The most [`allocated_bytes`] has been since the process started or the last
/// [`reset_max_allocated`].
pub fn max_allocated_bytes() -> usize {
    MAX_ALLOCATED.load(Ordering::Relaxed)
}

/// Starts [`max_allocated_bytes`] again from what is allocated now.
pub fn reset_max_allocated() {
    MAX_ALLOCATED.store(allocated_bytes(), Ordering::Relaxed);
}

/// A storage of `bytes` was made.
pub(crate) fn count_allocated(bytes: usize) {
    let now = ALLOCATED.fetch_add(bytes, Ordering::Relaxed) + bytes;
    MAX_ALLOCATED.fetch_max(now, Ordering::Relaxed);
}

/// A storage that counted `bytes` was dropped.
pub(crate) fn count_freed(bytes: usize) {
    ALLOCATED.fetch_sub(bytes, Ordering::Relaxed);
}

/// Memory this process can still take, in bytes, and where that figure comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Available {
    /// In bytes.
    pub bytes: u64,
    /// Where the figure comes from, for messages: `MemAvailable in /proc/meminfo`, or the
    /// cgroup file that lowered it.
    pub source: String,
}

/// Limits at or above this many bytes mean "no limit" (cgroup v1 writes a huge number).
const NO_LIMIT: u64 = 1 << 60;

/// The memory this process can still take; `None` when the machine does not say (no
/// `/proc/meminfo`).
pub fn available() -> Option<Available> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let mut best = from_meminfo(&meminfo)?;
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    for (dir, limit, usage) in cgroup_files(&cgroups) {
        if let Some(room) = cgroup_room(&dir.join(limit), &dir.join(usage)) {
            if room < best.bytes {
                best = Available {
                    bytes: room,
                    source: format!("{} less {}", dir.join(limit).display(), usage),
                };
            }
        }
    }
    Some(best)
}

/// The most memory this process can have, in bytes (see the module docs); `None` when the
/// machine does not say.
pub fn total() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok();
    let ram = meminfo.as_deref().and_then(|t| field(t, "MemTotal"));
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let limit = cgroup_files(&cgroups)
        .into_iter()
        .filter_map(|(dir, limit, _)| room(&std::fs::read_to_string(dir.join(limit)).ok()?, None))
        .min();
    match (ram, limit) {
        (Some(r), Some(l)) => Some(r.min(l)),
        (r, l) => r.or(l),
    }
}

/// Field `name` (in kB) of a `/proc/meminfo` text, in bytes.
fn field(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?.strip_prefix(':')?;
        let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kib.saturating_mul(1024))
    })
}

/// `MemAvailable` (else `MemTotal`) of a `/proc/meminfo` text, in bytes.
fn from_meminfo(text: &str) -> Option<Available> {
    let (bytes, name) = match field(text, "MemAvailable") {
        Some(b) => (b, "MemAvailable"),
        None => (field(text, "MemTotal")?, "MemTotal"),
    };
    Some(Available {
        bytes,
        source: format!("{name} in /proc/meminfo"),
    })
}

/// The (folder, limit file, usage file) of every memory cgroup this process is in, from its own
/// up to the root, after `/proc/self/cgroup`'s text.
fn cgroup_files(proc_self_cgroup: &str) -> Vec<(PathBuf, &'static str, &'static str)> {
    let mut out = Vec::new();
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let (base, limit, usage) = if controllers.is_empty() {
            (Path::new("/sys/fs/cgroup"), "memory.max", "memory.current")
        } else if controllers.split(',').any(|c| c == "memory") {
            (
                Path::new("/sys/fs/cgroup/memory"),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        } else {
            continue;
        };
        let mut dir = base.join(path.trim_start_matches('/'));
        loop {
            out.push((dir.clone(), limit, usage));
            if dir == base || !dir.pop() {
                break;
            }
        }
    }
    out
}

/// The room under a cgroup's limit: limit less usage, in bytes; `None` without a limit.
fn cgroup_room(limit: &Path, usage: &Path) -> Option<u64> {
    let limit = std::fs::read_to_string(limit).ok()?;
    room(&limit, std::fs::read_to_string(usage).ok().as_deref())
}

/// [`cgroup_room`] on the files' texts (`max`: no limit).
fn room(limit: &str, usage: Option<&str>) -> Option<u64> {
    let limit: u64 = limit.trim().parse().ok().filter(|&l| l < NO_LIMIT)?;
    let usage: u64 = usage.and_then(|u| u.trim().parse().ok()).unwrap_or(0);
    Some(limit.saturating_sub(usage))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields() {
        let text = "MemTotal:       24683664 kB\nMemFree:        19831204 kB\nMemAvailable:   24025428 kB\n";
        let a = from_meminfo(text).unwrap();
        assert_eq!(a.bytes, 24025428 * 1024);
        assert!(a.source.contains("MemAvailable"));
        let old = from_meminfo("MemTotal: 1000 kB\nMemFree: 10 kB\n").unwrap();
        assert_eq!((old.bytes, old.source.contains("MemTotal")), (1024000, true));
        assert_eq!(from_meminfo("nothing here"), None);
    }

    #[test]
    fn cgroup_limits() {
        assert_eq!(room("max\n", Some("123\n")), None);
        assert_eq!(room("9223372036854771712\n", Some("5")), None);
        assert_eq!(room("1000\n", Some("300\n")), Some(700));
        assert_eq!(room("1000", Some("3000")), Some(0));
        assert_eq!(room("1000", None), Some(1000));
        let v2 = cgroup_files("0::/user.slice/job\n");
        let dirs: Vec<_> = v2.iter().map(|(d, l, _)| (d.to_str().unwrap(), *l)).collect();
        assert_eq!(
            dirs,
            [
                ("/sys/fs/cgroup/user.slice/job", "memory.max"),
                ("/sys/fs/cgroup/user.slice", "memory.max"),
                ("/sys/fs/cgroup", "memory.max")
            ]
        );
        let v1 = cgroup_files("4:cpu,cpuacct:/x\n7:memory:/\n");
        assert_eq!(v1.len(), 1);
        assert_eq!(v1[0].0, Path::new("/sys/fs/cgroup/memory"));
        assert_eq!(v1[0].1, "memory.limit_in_bytes");
    }

    #[test]
    fn this_machine_says_something() {
        if Path::new("/proc/meminfo").exists() {
            let (now, most) = (available().unwrap().bytes, total().unwrap());
            assert!(now > 0 && now <= most, "{now} of {most}");
        }
    }
}
