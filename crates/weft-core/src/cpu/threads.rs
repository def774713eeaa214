//! The size of the process's one compute pool (`super::pool`), set by `WEFT_NUM_THREADS` (default:
//! the cores divided by the ranks sharing this host, so that ranks started by `weft launch`,
//! torchrun, srun or mpirun do not oversubscribe it), at most [`MAX_THREADS`].

use std::sync::OnceLock;

static THREADS: OnceLock<usize> = OnceLock::new();

/// Ranks of the job on this host, from the launcher's, OpenMPI's or Slurm's variables (1 when
/// none is set or valid).
fn local_ranks() -> usize {
    [
        "LOCAL_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "SLURM_NTASKS_PER_NODE",
    ]
    .iter()
    .find_map(|k| std::env::var(k).ok()?.trim().parse::<usize>().ok().filter(|&n| n > 0))
    .unwrap_or(1)
}

/// The most compute threads a process runs (the calling thread included).
///
/// Each thread beyond the first is a pool worker with its own stack (2 MiB reserved) that spins
/// for 2 ms after every kernel, so threads past the cores only add contention; and a count in
/// the tens of thousands (a typo such as `WEFT_NUM_THREADS=100000`) runs into the system's
/// limits on threads and memory and takes the process down. 1024 is above the hardware threads
/// of the largest machines weft targets (two-socket servers have a few hundred), leaving room
/// for deliberate oversubscription, and it is a fixed number rather than a multiple of this
/// machine's cores, so a value that works on one machine works on every other.
pub const MAX_THREADS: usize = 1024;

/// The default thread count: the cores divided by the ranks sharing this host (at least 1).
fn default_threads() -> usize {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    (cores / local_ranks()).max(1)
}

/// The thread count `WEFT_NUM_THREADS` asks for (`value`; `default` when unset or empty), or
/// why it cannot be used: not a positive integer, or above [`MAX_THREADS`]. The message names
/// the variable, the value and the limit.
pub fn parse_num_threads(value: Option<&str>, default: usize) -> Result<usize, String> {
    let Some(v) = value.filter(|v| !v.trim().is_empty()) else {
        return Ok(default);
    };
    match v.trim().parse::<usize>() {
        Ok(n) if n > MAX_THREADS => Err(format!(
            "WEFT_NUM_THREADS={v:?} is more than the limit of {MAX_THREADS} compute threads"
        )),
        Ok(n) if n > 0 => Ok(n),
        // a number too large for usize is over the limit too
        Err(e) if *e.kind() == std::num::IntErrorKind::PosOverflow => Err(format!(
            "WEFT_NUM_THREADS={v:?} is more than the limit of {MAX_THREADS} compute threads"
        )),
        _ => Err(format!(
            "WEFT_NUM_THREADS={v:?} is not a positive integer (1 to {MAX_THREADS} compute threads)"
        )),
    }
}

/// `WEFT_NUM_THREADS` as a string (a value that is not UTF-8 is shown as far as it reads).
fn env_value() -> Option<String> {
    std::env::var_os("WEFT_NUM_THREADS").map(|v| v.to_string_lossy().into_owned())
}

/// Number of compute threads: the calling thread and the workers of [`super::pool`].
///
/// Fixed by the first call of this function or [`try_init`]. Here `WEFT_NUM_THREADS` must be a
/// positive integer when set; a malformed value falls back to the default (the cores divided by
/// the ranks on this host) and a value above [`MAX_THREADS`] to the limit, each with a warning
/// on stderr (the variable comes from outside, so it must not panic). Programs that want such a
/// value refused call [`try_init`] first.
pub fn num_threads() -> usize {
    *THREADS.get_or_init(|| {
        let default = default_threads();
        let value = env_value();
        let n = match parse_num_threads(value.as_deref(), default) {
            Ok(n) => n,
            Err(e) => {
                let n = match value.as_deref().map(|v| v.trim().parse::<u128>()) {
                    Some(Ok(n)) if n > MAX_THREADS as u128 => MAX_THREADS,
                    _ => default,
                };
                crate::errln!("weft: {e}; using {n} threads");
                n
            }
        };
        keep_freed_memory();
        n
    })
}

/// Reads the thread count and sets the allocator options now (both happen anyway on the first
/// parallel kernel; the pool's workers start then), warning on a bad `WEFT_NUM_THREADS` as
/// [`num_threads`] does.
#[inline]
pub fn init() {
    let _ = num_threads();
}

/// [`init`] that refuses a bad `WEFT_NUM_THREADS` instead of warning: a value that is not a
/// positive integer, or above [`MAX_THREADS`], is an error naming the variable, the value and
/// the limit, and nothing is set. Returns the thread count. Once the count is fixed (by an
/// earlier call of this function or of [`num_threads`]) it is returned as it is.
pub fn try_init() -> Result<usize, String> {
    if let Some(&n) = THREADS.get() {
        return Ok(n);
    }
    let n = parse_num_threads(env_value().as_deref(), default_threads())?;
    Ok(*THREADS.get_or_init(|| {
        keep_freed_memory();
        n
    }))
}

/// Tells glibc's allocator to serve large buffers from the heap and keep freed memory instead of
/// returning it to the kernel. Without this every large tensor is a fresh `mmap` whose pages fault
/// in on first touch (measured: a 32 MiB buffer costs ~19 ms of page faults on the development
/// machine, more than the kernel that fills it); with it, a training step reuses the previous
/// step's memory, as PyTorch's caching allocators do. `WEFT_MALLOC_DEFAULTS=1` leaves glibc as is.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        if std::env::var_os("WEFT_MALLOC_DEFAULTS").is_some_and(|v| v == "1") {
            return;
        }
        // SAFETY: mallopt only changes allocator parameters; it is safe to call at any time.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30);
            libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
            libc::mallopt(libc::M_TOP_PAD, 64 << 20);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thread_count_is_a_positive_integer_up_to_the_limit() {
        assert_eq!(parse_num_threads(None, 6), Ok(6));
        assert_eq!(parse_num_threads(Some(" "), 6), Ok(6));
        assert_eq!(parse_num_threads(Some("3"), 6), Ok(3));
        assert_eq!(parse_num_threads(Some(" 8 "), 6), Ok(8));
        assert_eq!(parse_num_threads(Some("1024"), 6), Ok(MAX_THREADS));
        for (v, why) in [
            ("100000", "more than the limit of 1024"),
            ("99999999999999999999999", "more than the limit of 1024"),
            ("0", "not a positive integer"),
            ("-2", "not a positive integer"),
            ("four", "not a positive integer"),
            ("2.5", "not a positive integer"),
        ] {
            let e = parse_num_threads(Some(v), 6).unwrap_err();
            assert!(
                e.starts_with(&format!("WEFT_NUM_THREADS={v:?} ")) && e.contains(why),
                "{v}: {e}"
            );
        }
    }
}
