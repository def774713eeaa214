//! The size of the process's one compute pool (`super::pool`), set by `WEFT_NUM_THREADS` (default: the cores divided by
//! the ranks sharing this host, so that ranks started by `weft launch`, torchrun, srun or mpirun
//! do not oversubscribe it).

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

/// Number of compute threads: the calling thread and the workers of [`super::pool`].
///
/// `WEFT_NUM_THREADS` must be a positive integer when set; anything else falls back to the core
/// count with a warning on stderr (the variable comes from outside, so it must not panic).
pub fn num_threads() -> usize {
    *THREADS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let cores = (cores / local_ranks()).max(1);
        let n = match std::env::var("WEFT_NUM_THREADS") {
            Ok(v) => match v.trim().parse::<usize>() {
                Ok(n) if n > 0 => n,
                _ => {
                    crate::errln!("weft: WEFT_NUM_THREADS={v:?} is not a positive integer; using {cores} threads");
                    cores
                }
            },
            Err(_) => cores,
        };
        keep_freed_memory();
        n
    })
}

/// Reads the thread count and sets the allocator options now (both happen anyway on the first
/// parallel kernel; the pool's workers start then).
#[inline]
pub fn init() {
    let _ = num_threads();
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
