//! The process's one compute pool, sized by `WEFT_NUM_THREADS` (default: all cores).

use std::sync::OnceLock;

static THREADS: OnceLock<usize> = OnceLock::new();

/// Number of compute threads; the first call sizes rayon's global pool.
///
/// `WEFT_NUM_THREADS` must be a positive integer when set; anything else falls back to the core
/// count with a warning on stderr (the variable comes from outside, so it must not panic).
pub fn num_threads() -> usize {
    *THREADS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
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
        // Fails only if someone built the global pool first; then we use theirs.
        let _ = rayon::ThreadPoolBuilder::new().num_threads(n).build_global();
        rayon::current_num_threads()
    })
}

/// Ensures the pool is sized before a parallel kernel runs.
#[inline]
pub fn init() {
    let _ = num_threads();
}
