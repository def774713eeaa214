//! The process's one compute pool, sized by `WEFT_NUM_THREADS` (default: the cores divided by
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

/// Number of compute threads; the first call sizes rayon's global pool.
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
                    eprintln!("weft: WEFT_NUM_THREADS={v:?} is not a positive integer; using {cores} threads");
                    cores
                }
            },
            Err(_) => cores,
        };
        keep_freed_memory();
        // The main thread, which runs the program's ops, is one of the pool's threads: its
        // kernels then run on it and the others, without waking a pool thread and parking
        // itself for every kernel (measured on the speed-target GPT: median step 61.4 -> 52.9
        // ms over 10 alternating runs on a loaded 2-core machine, docs/benchmarks.md). Only the
        // main thread (a thread that may exit, such as a test's, must not be a pool thread) and
        // only with a second thread (other threads' kernels need a thread that always serves
        // the pool).
        let mut builder = rayon::ThreadPoolBuilder::new().num_threads(n);
        if n > 1 && std::thread::current().name() == Some("main") {
            builder = builder.use_current_thread();
        }
        // Fails only if someone built the global pool first; then we use theirs.
        let _ = builder.build_global();
        rayon::current_num_threads()
    })
}

/// Ensures the pool is sized before a parallel kernel runs.
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
