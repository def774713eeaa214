//! Fallible allocation of tensor-sized buffers.
//!
//! `vec![x; n]` and `Vec::with_capacity(n)` abort the process when the allocator refuses a buffer
//! ("memory allocation of N bytes failed", exit 134), and a size whose byte count overflows
//! panics. Sizes often come from outside input (a config's batch size or width, a file's header),
//! so every tensor-sized buffer of `weft-core` is allocated here instead, and an impossible size
//! is an [`Error::OutOfMemory`] naming the op and the bytes.
//!
//! Two checks per buffer, one comparison and one `try_reserve_exact`:
//!
//! 1. No single buffer may be larger than the machine's memory ([`machine_memory`]). Linux
//!    overcommits: a reservation far above what the machine can back succeeds, and the process is
//!    killed later, when the pages are touched. Refusing it up front turns that into an error.
//! 2. `Vec::try_reserve_exact`, which fails (instead of aborting) when the allocator refuses.
//!
//! Nothing here fills memory: [`uninit`] keeps the kernels' uninitialized outputs (see
//! `crate::cpu::assume_init`).

use std::mem::MaybeUninit;
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// Bytes of memory this process can have at most: the lower of the machine's RAM (`MemTotal` in
/// `/proc/meminfo`) and its cgroup's limit (`memory.max` of cgroup v2, `memory.limit_in_bytes` of
/// v1, on the process's cgroup and each one above it). Read once and cached. `None` where unknown
/// (other systems, or Linux without `/proc`).
pub fn machine_memory() -> Option<u64> {
    static MEMORY: OnceLock<Option<u64>> = OnceLock::new();
    *MEMORY.get_or_init(read_machine_memory)
}

#[cfg(target_os = "linux")]
fn read_machine_memory() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        kb.checked_mul(1024)
    });
    let cgroup = cgroup_limit();
    match (total, cgroup) {
        (Some(t), Some(c)) => Some(t.min(c)),
        (t, c) => t.or(c),
    }
}

#[cfg(not(target_os = "linux"))]
fn read_machine_memory() -> Option<u64> {
    None
}

/// Memory the kernel says can be allocated now without swapping (`MemAvailable`), lowered to
/// what the tightest cgroup of this process leaves (its limit less its usage). Read afresh at
/// every call; `None` where neither can be read.
pub fn available_memory() -> Option<u64> {
    available_now()
}

#[cfg(target_os = "linux")]
fn available_now() -> Option<u64> {
    let available = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        kb.checked_mul(1024)
    });
    let read = |f: &std::path::Path| std::fs::read_to_string(f).ok()?.trim().parse::<u64>().ok();
    let headroom = cgroup_files()
        .iter()
        .filter_map(|(limit, usage)| Some(read(limit)?.saturating_sub(read(usage)?)))
        .min();
    match (available, headroom) {
        (Some(a), Some(h)) => Some(a.min(h)),
        (a, h) => a.or(h),
    }
}

#[cfg(not(target_os = "linux"))]
fn available_now() -> Option<u64> {
    None
}

/// The `(limit, usage)` files of the cgroups this process is in (v2 `memory.max` and
/// `memory.current`, v1 `memory.limit_in_bytes` and `memory.usage_in_bytes`): the mount's root
/// (the container's own cgroup inside one) and the process's cgroup from `/proc/self/cgroup`
/// with its ancestors.
#[cfg(target_os = "linux")]
fn cgroup_files() -> Vec<(std::path::PathBuf, std::path::PathBuf)> {
    const V2: (&str, &str, &str) = ("/sys/fs/cgroup", "memory.max", "memory.current");
    const V1: (&str, &str, &str) = (
        "/sys/fs/cgroup/memory",
        "memory.limit_in_bytes",
        "memory.usage_in_bytes",
    );
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut dirs = vec![
        (std::path::PathBuf::from(V2.0), V2),
        (std::path::PathBuf::from(V1.0), V1),
    ];
    for line in own.lines() {
        // "0::/path" (v2) or "N:memory:/path" (v1, possibly "memory,other")
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let kind = if controllers.is_empty() {
            V2
        } else if controllers.split(',').any(|c| c == "memory") {
            V1
        } else {
            continue;
        };
        let mut dir = std::path::PathBuf::from(format!("{}{path}", kind.0));
        while dir.starts_with(kind.0) && dir.as_os_str().len() > kind.0.len() {
            dirs.push((dir.clone(), kind));
            if !dir.pop() {
                break;
            }
        }
    }
    dirs.into_iter()
        .map(|(dir, (_, limit, usage))| (dir.join(limit), dir.join(usage)))
        .collect()
}

/// The lowest memory limit of the cgroups this process is in. "max" (v2) means none; v1's
/// "none" is a huge number, which `min` passes over.
#[cfg(target_os = "linux")]
fn cgroup_limit() -> Option<u64> {
    cgroup_files()
        .iter()
        .filter_map(|(f, _)| std::fs::read_to_string(f).ok()?.trim().parse::<u64>().ok())
        .min()
}

/// `bytes` in decimal units with one decimal ("51.2 GB").
pub fn human_bytes(bytes: u128) -> String {
    const UNITS: [&str; 8] = ["kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"];
    if bytes < 1000 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1000.0;
    let mut unit = 0;
    while v >= 999.95 && unit + 1 < UNITS.len() {
        v /= 1000.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// The reason part of an [`Error::OutOfMemory`] message.
pub(crate) fn why(memory: Option<u64>) -> String {
    match memory {
        Some(m) => format!("more than this machine's {} of memory", human_bytes(m as u128)),
        None => "out of memory".to_string(),
    }
}

/// Fails unless one buffer of `n` elements of `T` may be allocated: its byte count fits in the
/// address space and is at most [`machine_memory`]. Returns the byte count. For a buffer built
/// by code that cannot fail (a `Vec` from another library), checked before it is built.
pub fn check<T>(op: &'static str, n: usize) -> Result<usize> {
    let bytes = n as u128 * std::mem::size_of::<T>() as u128;
    check_bytes(op, bytes)?;
    Ok(bytes as usize)
}

/// [`check`] for a byte count.
pub fn check_bytes(op: &'static str, bytes: u128) -> Result<()> {
    let memory = machine_memory();
    if let Some(m) = memory.filter(|&m| bytes > m as u128) {
        return Err(Error::OutOfMemory {
            op,
            bytes,
            memory: Some(m),
        });
    }
    if bytes > isize::MAX as u128 {
        return Err(Error::OutOfMemory { op, bytes, memory });
    }
    Ok(())
}

/// An empty `Vec` with room for exactly `n` elements (to `extend` without reallocating).
pub fn with_capacity<T>(op: &'static str, n: usize) -> Result<Vec<T>> {
    let bytes = check::<T>(op, n)?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
        op,
        bytes: bytes as u128,
        memory: None,
    })?;
    Ok(v)
}

/// A buffer of `n` elements for a kernel that writes every one of them: no zero fill (which, done
/// by the thread that allocates, is serial work in front of each parallel kernel). Once written,
/// `crate::cpu::assume_init` turns it into a `Vec<T>`.
pub fn uninit<T>(op: &'static str, n: usize) -> Result<Vec<MaybeUninit<T>>> {
    let mut v = with_capacity(op, n)?;
    // SAFETY: the capacity is at least n, and MaybeUninit needs no initialization.
    unsafe { v.set_len(n) };
    Ok(v)
}

/// `n` copies of `value`.
pub fn filled<T: Clone>(op: &'static str, n: usize, value: T) -> Result<Vec<T>> {
    let mut v = with_capacity(op, n)?;
    v.resize(n, value);
    Ok(v)
}

/// The `n` items of `items` in a `Vec` allocated here (`items` must yield `n` items; more would
/// grow the `Vec` infallibly).
pub fn collect<T>(op: &'static str, n: usize, items: impl IntoIterator<Item = T>) -> Result<Vec<T>> {
    let mut v = with_capacity(op, n)?;
    v.extend(items);
    debug_assert_eq!(v.len(), n);
    Ok(v)
}

/// A copy of `src`.
pub fn copy<T: Copy>(op: &'static str, src: &[T]) -> Result<Vec<T>> {
    let mut v = with_capacity(op, src.len())?;
    v.extend_from_slice(src);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_decimal_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(51_200_000_000), "51.2 GB");
        assert_eq!(human_bytes(999_999), "1.0 MB");
        assert_eq!(human_bytes(4_398_046_511_104), "4.4 TB");
        assert!(human_bytes(u128::MAX).ends_with(" YB"));
    }

    #[test]
    fn impossible_sizes_are_errors_naming_the_op_and_the_bytes() {
        // a byte count past the address space, whatever the machine
        let e = with_capacity::<u64>("test_op", usize::MAX).unwrap_err();
        let bytes = usize::MAX as u128 * 8;
        assert!(
            matches!(e, Error::OutOfMemory { op: "test_op", bytes: b, .. } if b == bytes),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(
            msg.starts_with("test_op: cannot allocate ") && msg.contains(&format!("({bytes} bytes)")),
            "{msg}"
        );
        assert!(uninit::<f32>("u", usize::MAX / 2).is_err());
        assert!(filled::<u8>("f", usize::MAX, 0).is_err());
    }

    #[test]
    fn more_than_the_machine_has_is_refused_up_front() {
        let Some(m) = machine_memory() else {
            return; // not known here: only the allocator's refusal applies
        };
        assert!(m > 1 << 20, "{m}");
        let n = (m / 4 + 1) as usize;
        let msg = uninit::<f32>("matmul", n).unwrap_err().to_string();
        let want = format!(
            "matmul: cannot allocate {} ({} bytes): more than this machine's {} of memory",
            human_bytes(n as u128 * 4),
            n as u128 * 4,
            human_bytes(m as u128)
        );
        assert_eq!(msg, want);
        // and a buffer that fits is allocated as asked, uninitialized or filled
        assert_eq!(uninit::<f32>("matmul", 1000).unwrap().len(), 1000);
        assert_eq!(filled("fill", 3, 7i64).unwrap(), vec![7, 7, 7]);
        assert_eq!(collect("c", 3, (0..3).map(|i| i * 2)).unwrap(), vec![0, 2, 4]);
        assert_eq!(copy("c", &[1u8, 2]).unwrap(), vec![1, 2]);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn available_memory_is_some_and_at_most_the_machines() {
        let (available, total) = (available_memory().unwrap(), machine_memory().unwrap());
        assert!(available > 0 && available <= total, "{available} of {total}");
    }
}
