//! The compute pool: `num_threads() - 1` worker threads that, with the calling thread, run the
//! tasks of one parallel kernel at a time.
//!
//! A training step is a chain of short kernels (tens of microseconds each on the speed-target
//! GPT), so what matters is how fast an idle worker joins the next one. Workers therefore spin
//! for a while after a kernel ([`SPIN`], first busy-waiting, then yielding the core) before they
//! park, as OpenMP runtimes do; a kernel started while they spin is picked up within
//! nanoseconds instead of a futex wake-up (tens of microseconds on a virtual machine). The caller
//! never waits for a worker to wake: it claims tasks itself from a shared counter, so a late
//! worker only takes fewer tasks.
//!
//! One kernel runs on the pool at a time. A kernel started on another thread while the pool is
//! busy, or from inside a task (nested parallelism), runs its tasks on its own thread.

use std::any::Any;
use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle worker keeps looking for the next kernel before it parks.
const SPIN: Duration = Duration::from_millis(2);
/// The first part of [`SPIN`], busy-waiting; the rest yields the core between looks.
const BUSY: Duration = Duration::from_micros(50);

/// One kernel's tasks: `f(i)` for `i in 0..tasks`, claimed through `next`.
struct Job {
    /// The caller's closure with its lifetime erased: the caller does not return before `done`
    /// reaches `tasks`, and a task index is only run after it was claimed below `tasks`.
    f: *const (dyn Fn(usize) + Sync),
    tasks: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    panic: Mutex<Option<Box<dyn Any + Send>>>,
}

// SAFETY: `f` points to a `Sync` closure that outlives every use (see `Job::f`).
unsafe impl Send for Job {}
unsafe impl Sync for Job {}

impl Job {
    /// Claims and runs tasks until none are left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.tasks {
                return;
            }
            // SAFETY: `i < tasks`, so the caller is still waiting on `done` and `f` is alive.
            let f = unsafe { &*self.f };
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(i))) {
                let mut slot = self.panic.lock().unwrap_or_else(|e| e.into_inner());
                slot.get_or_insert(p);
            }
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

struct Pool {
    /// Workers started (the calling thread is the pool's other thread).
    workers: usize,
    /// Held by the thread whose kernel runs on the pool.
    submit: Mutex<()>,
    /// The current job, and its number (`epoch`).
    slot: Mutex<Option<Arc<Job>>>,
    epoch: AtomicU64,
    /// Parked workers wait here for the next epoch.
    wake: Condvar,
    parked: AtomicUsize,
}

static POOL: OnceLock<Pool> = OnceLock::new();

thread_local! {
    /// Set on pool workers and on a caller while it runs its kernel's tasks.
    static IN_TASK: Cell<bool> = const { Cell::new(false) };
}

fn pool() -> &'static Pool {
    POOL.get_or_init(|| {
        let wanted = super::threads::num_threads().saturating_sub(1);
        let mut workers = 0;
        while workers < wanted {
            let spawned = std::thread::Builder::new()
                .name(format!("weft-compute-{}", workers + 1))
                .spawn(worker);
            if let Err(e) = spawned {
                // the system refuses more threads (its limits on threads or memory): the pool
                // runs with the workers it got, and later kernels only take longer
                crate::errln!(
                    "weft: could start only {} of {} compute threads ({e}); running with {}",
                    workers + 1,
                    wanted + 1,
                    workers + 1
                );
                break;
            }
            workers += 1;
        }
        Pool {
            workers,
            submit: Mutex::new(()),
            slot: Mutex::new(None),
            epoch: AtomicU64::new(0),
            wake: Condvar::new(),
            parked: AtomicUsize::new(0),
        }
    })
}

fn worker() {
    IN_TASK.with(|t| t.set(true));
    let pool = loop {
        // the pool is being initialized by the thread that spawned us
        if let Some(p) = POOL.get() {
            break p;
        }
        std::thread::yield_now();
    };
    // the epoch the pool was made with: a job posted before this thread got here (the caller
    // posts its first one right after starting the workers) is still picked up
    let mut seen = 0;
    loop {
        let start = Instant::now();
        let mut looks = 0u32;
        while pool.epoch.load(Ordering::Acquire) == seen {
            looks = looks.wrapping_add(1);
            if !looks.is_multiple_of(64) {
                std::hint::spin_loop();
                continue;
            }
            let idle = start.elapsed();
            if idle < BUSY {
                std::hint::spin_loop();
            } else if idle < SPIN {
                std::thread::yield_now();
            } else {
                let mut slot = pool.slot.lock().unwrap_or_else(|e| e.into_inner());
                pool.parked.fetch_add(1, Ordering::SeqCst);
                while pool.epoch.load(Ordering::Acquire) == seen {
                    slot = pool.wake.wait(slot).unwrap_or_else(|e| e.into_inner());
                }
                pool.parked.fetch_sub(1, Ordering::SeqCst);
                break;
            }
        }
        let job = {
            let slot = pool.slot.lock().unwrap_or_else(|e| e.into_inner());
            seen = pool.epoch.load(Ordering::Acquire);
            slot.clone()
        };
        if let Some(job) = job {
            job.work();
        }
    }
}

/// Runs `f(i)` for every `i in 0..tasks` on the compute pool (the calling thread included) and
/// returns when all have finished. Tasks are claimed in order, one at a time, so give each a
/// similar amount of work and make several per thread when their cost varies. A panic in a task
/// is re-raised here once every task has finished.
pub fn run(tasks: usize, f: impl Fn(usize) + Sync) {
    if tasks == 0 {
        return;
    }
    // on the calling thread too, every task runs and the first panic is re-raised after them
    let serial = || {
        let mut first = None;
        for i in 0..tasks {
            if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(i))) {
                first.get_or_insert(p);
            }
        }
        if let Some(p) = first {
            std::panic::resume_unwind(p);
        }
    };
    if tasks == 1 || IN_TASK.with(|t| t.get()) {
        return serial();
    }
    let pool = pool();
    if pool.workers == 0 {
        return serial();
    }
    let Ok(_turn) = pool.submit.try_lock() else {
        // another thread's kernel holds the pool
        return serial();
    };
    let f: &(dyn Fn(usize) + Sync) = &f;
    // SAFETY: only the lifetime is erased; see `Job::f` for why the pointer never dangles.
    let f: *const (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
    let job = Arc::new(Job {
        f,
        tasks,
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        panic: Mutex::new(None),
    });
    {
        let mut slot = pool.slot.lock().unwrap_or_else(|e| e.into_inner());
        *slot = Some(job.clone());
        pool.epoch.fetch_add(1, Ordering::AcqRel);
    }
    if pool.parked.load(Ordering::SeqCst) > 0 {
        pool.wake.notify_all();
    }
    IN_TASK.with(|t| t.set(true));
    job.work();
    IN_TASK.with(|t| t.set(false));
    let mut looks = 0u32;
    while job.done.load(Ordering::Acquire) < tasks {
        looks = looks.wrapping_add(1);
        if looks.is_multiple_of(1024) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    *pool.slot.lock().unwrap_or_else(|e| e.into_inner()) = None;
    let panic = job.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(p) = panic {
        std::panic::resume_unwind(p);
    }
}

/// A mutable slice cut into chunks of `chunk` elements (the last may be shorter) that the tasks
/// of one [`run`] take one each.
pub struct Chunks<'a, T> {
    ptr: *mut T,
    len: usize,
    chunk: usize,
    _slice: PhantomData<&'a mut [T]>,
}

// SAFETY: tasks take disjoint chunks (see `Chunks::take`); T crosses threads as with `&mut [T]`.
unsafe impl<T: Send> Send for Chunks<'_, T> {}
unsafe impl<T: Send> Sync for Chunks<'_, T> {}

impl<'a, T> Chunks<'a, T> {
    /// `data` in chunks of `chunk` elements (`chunk` > 0).
    pub fn new(data: &'a mut [T], chunk: usize) -> Self {
        Chunks {
            ptr: data.as_mut_ptr(),
            len: data.len(),
            chunk: chunk.max(1),
            _slice: PhantomData,
        }
    }

    /// Number of chunks.
    pub fn count(&self) -> usize {
        self.len.div_ceil(self.chunk)
    }

    /// Chunk `i` (empty past the end).
    ///
    /// # Safety
    /// Each chunk must be taken at most once while the returned slices live (as one task of a
    /// [`run`] per index guarantees).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn take(&self, i: usize) -> &'a mut [T] {
        let start = (i * self.chunk).min(self.len);
        let end = (start + self.chunk).min(self.len);
        // SAFETY: in bounds of the original slice, and disjoint per index (the caller's promise).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), end - start) }
    }
}

/// `f(i, chunk_i)` for each `chunk`-element chunk of `data`, on the pool.
pub fn for_each_chunk<T: Send>(data: &mut [T], chunk: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let chunks = Chunks::new(data, chunk);
    // SAFETY: `run` calls each index once.
    run(chunks.count(), |i| f(i, unsafe { chunks.take(i) }));
}

/// [`for_each_chunk`] with tasks that can fail: every task runs, and the error of the first
/// chunk (by index) that failed is returned, so the result does not depend on the thread count.
pub fn try_for_each_chunk<T: Send, E: Send>(
    data: &mut [T],
    chunk: usize,
    f: impl Fn(usize, &mut [T]) -> Result<(), E> + Sync,
) -> Result<(), E> {
    let first: Mutex<Option<(usize, E)>> = Mutex::new(None);
    for_each_chunk(data, chunk, |i, c| {
        if let Err(e) = f(i, c) {
            let mut slot = first.lock().unwrap_or_else(|e| e.into_inner());
            if slot.as_ref().is_none_or(|(j, _)| i < *j) {
                *slot = Some((i, e));
            }
        }
    });
    match first.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some((_, e)) => Err(e),
        None => Ok(()),
    }
}

/// `f(i)` for every `i in 0..tasks` on the pool, the results in task order (per-task partial
/// sums, per-parameter results).
pub fn map<R: Send>(tasks: usize, f: impl Fn(usize) -> R + Sync) -> Vec<R> {
    let mut out: Vec<Option<R>> = (0..tasks).map(|_| None).collect();
    let slots = Chunks::new(&mut out, 1);
    // SAFETY: `run` calls each index once, so each task writes its own slot.
    run(tasks, |i| unsafe { slots.take(i)[0] = Some(f(i)) });
    out.into_iter().map(|r| r.expect("every task ran")).collect()
}

/// The threads kernels run on: the workers started (at most `threads::num_threads() - 1`,
/// fewer when the system refused some) and the calling thread. Starts the pool.
pub fn threads() -> usize {
    pool().workers + 1
}

/// Whether the calling thread is running a pool task (kernels it starts run on it alone).
pub fn in_task() -> bool {
    IN_TASK.with(|t| t.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_task_runs_once() {
        let hits: Vec<AtomicUsize> = (0..1000).map(|_| AtomicUsize::new(0)).collect();
        for _ in 0..50 {
            run(hits.len(), |i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
        }
        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 50));
    }

    #[test]
    fn chunks_cover_the_slice() {
        let mut v = vec![0usize; 1003];
        for_each_chunk(&mut v, 100, |i, c| c.iter_mut().for_each(|x| *x += i + 1));
        for (j, x) in v.iter().enumerate() {
            assert_eq!(*x, j / 100 + 1);
        }
    }

    #[test]
    fn map_returns_the_results_in_task_order() {
        assert_eq!(map(100, |i| i * i), (0..100).map(|i| i * i).collect::<Vec<_>>());
        assert!(map(0, |i| i).is_empty());
    }

    #[test]
    fn nested_runs_and_concurrent_callers_finish() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..20 {
                        run(8, |_| {
                            run(8, |_| {
                                total.fetch_add(1, Ordering::Relaxed);
                            })
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 4 * 20 * 64);
    }

    /// Also when the pool is busy with another thread's kernel (tests run side by side), so the
    /// tasks run on the calling thread: that path stopped at the panic (7 of 64 ran).
    #[test]
    fn a_panicking_task_panics_the_caller_after_the_rest_finish() {
        // 64 tasks of which task 7 panics: whether the caller panicked, and how many others ran
        let run_64 = || {
            let done = AtomicUsize::new(0);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run(64, |i| {
                    if i == 7 {
                        panic!("task 7");
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                })
            }));
            (r.is_err(), done.load(Ordering::Relaxed))
        };
        assert_eq!(run_64(), (true, 63));
        // with the pool held, as another thread's kernel holds it
        let held = pool().submit.lock().unwrap_or_else(|e| e.into_inner());
        let on_caller = run_64();
        drop(held);
        assert_eq!(on_caller, (true, 63));
    }
}
