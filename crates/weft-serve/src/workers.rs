//! A model version's workers: how many of its jobs (a forward of one request or of a batch, or
//! one decode step of its generations) run at once. TorchServe's `workers`, as threads of this
//! process rather than processes: every worker runs the version's one model instance, which
//! weft's models allow (`weft_models::Model` is `Send + Sync`; a forward in eval mode under
//! `no_grad` only reads the parameters: grad mode is per thread, llama's rotary tables are
//! behind a lock, and a kernel started while the compute pool is busy runs on its caller's
//! thread), so the parameters are held once whatever the count.
//!
//! A job takes a worker ([`Workers::acquire`] on a blocking thread, [`Workers::acquire_async`]
//! on the async threads) and gives it back when its [`Busy`] guard drops. Scaling up lets
//! waiting jobs start at once; scaling down stops workers after their current job (no job is
//! cut short): jobs wait until fewer than the new count are busy.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// The most workers one version may have (`workers=` above it: 400).
pub const MAX_WORKERS: usize = 64;

/// The workers of one model version.
#[derive(Debug)]
pub struct Workers {
    state: Mutex<State>,
    /// Blocking waiters (jobs on the blocking pool, the decode thread).
    freed: Condvar,
    /// Async waiters (the batcher, scaling calls waiting for a drain).
    notify: tokio::sync::Notify,
    /// The most jobs that ran at once since the version loaded or the last [`Workers::drained`].
    peak: AtomicUsize,
}

#[derive(Debug, Clone, Copy)]
struct State {
    /// Workers wanted: at most this many jobs start.
    target: usize,
    /// Jobs running now (above `target` for a while after scaling down).
    busy: usize,
}

/// A worker held by a running job; given back when dropped (a job that panics gives it back
/// while unwinding).
#[derive(Debug)]
pub struct Busy {
    workers: Arc<Workers>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut s = self.workers.lock();
        s.busy -= 1;
        drop(s);
        self.workers.freed.notify_all();
        self.workers.notify.notify_waiters();
    }
}

impl Workers {
    /// `n` workers (at least 1).
    pub fn new(n: usize) -> Arc<Workers> {
        Arc::new(Workers {
            state: Mutex::new(State {
                target: n.max(1),
                busy: 0,
            }),
            freed: Condvar::new(),
            notify: tokio::sync::Notify::new(),
            peak: AtomicUsize::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // every change is whole before the lock is released
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a worker if one is free now.
    fn try_take(self: &Arc<Self>, s: &mut State) -> Option<Busy> {
        if s.busy >= s.target {
            return None;
        }
        s.busy += 1;
        self.peak.fetch_max(s.busy, Ordering::Relaxed);
        Some(Busy { workers: self.clone() })
    }

    /// Takes a worker if one is free now (the lock is not held past this call).
    fn take_now(self: &Arc<Self>) -> Option<Busy> {
        self.try_take(&mut self.lock())
    }

    /// Whether at most the wanted number of workers are busy; if so, restarts the peak from the
    /// jobs running.
    fn settled(&self) -> bool {
        let s = self.lock();
        let settled = s.busy <= s.target;
        if settled {
            self.peak.store(s.busy, Ordering::Relaxed);
        }
        settled
    }

    /// Waits (blocking the thread) for a free worker and takes it.
    pub fn acquire(self: &Arc<Self>) -> Busy {
        let mut s = self.lock();
        loop {
            if let Some(b) = self.try_take(&mut s) {
                return b;
            }
            s = self.freed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Waits (without blocking the thread) for a free worker and takes it.
    pub async fn acquire_async(self: &Arc<Self>) -> Busy {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(b) = self.take_now() {
                return b;
            }
            notified.await;
        }
    }

    /// Sets the number of workers to `n` (at least 1). Jobs running beyond `n` finish; no new
    /// one starts until fewer than `n` are busy. Returns the previous count.
    pub fn scale(&self, n: usize) -> usize {
        let mut s = self.lock();
        let before = s.target;
        s.target = n.max(1);
        drop(s);
        self.freed.notify_all();
        self.notify.notify_waiters();
        before
    }

    /// Waits until at most the wanted number of workers are busy (after scaling down: until the
    /// stopped workers' current jobs have ended), then restarts the peak from the jobs running.
    pub async fn drained(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.settled() {
                return;
            }
            notified.await;
        }
    }

    /// The number of workers wanted now.
    pub fn count(&self) -> usize {
        self.lock().target
    }

    /// Jobs running now.
    pub fn busy(&self) -> usize {
        self.lock().busy
    }

    /// The most jobs that ran at once since the version loaded or the last [`Workers::drained`]
    /// returned (a scaling call answered).
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    /// Starts a thread that takes a worker, reports it, and holds it until released.
    fn hold(w: &Arc<Workers>) -> (mpsc::Receiver<()>, mpsc::Sender<()>, std::thread::JoinHandle<()>) {
        let (started_tx, started) = mpsc::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        let w = w.clone();
        let t = std::thread::spawn(move || {
            let _busy = w.acquire();
            started_tx.send(()).unwrap();
            let _ = release_rx.recv();
        });
        (started, release, t)
    }

    #[test]
    fn two_workers_run_two_jobs_at_once_and_scaling_down_waits_for_the_current_job() {
        let w = Workers::new(2);
        let (a_started, a_release, a) = hold(&w);
        let (b_started, b_release, b) = hold(&w);
        // both run while neither is released: two at once
        a_started.recv().unwrap();
        b_started.recv().unwrap();
        assert_eq!((w.busy(), w.peak()), (2, 2));
        // down to 1: both current jobs go on; a third job waits until one ends and the other too
        assert_eq!(w.scale(1), 2);
        let (c_started, c_release, c) = hold(&w);
        assert!(
            c_started.recv_timeout(Duration::from_millis(100)).is_err(),
            "started over the count"
        );
        a_release.send(()).unwrap();
        a.join().unwrap();
        assert!(
            c_started.recv_timeout(Duration::from_millis(100)).is_err(),
            "started beside b"
        );
        b_release.send(()).unwrap();
        b.join().unwrap();
        c_started.recv().unwrap();
        assert_eq!((w.busy(), w.count()), (1, 1));
        c_release.send(()).unwrap();
        c.join().unwrap();
        assert_eq!(w.busy(), 0);
    }

    #[test]
    fn async_waiters_start_when_a_worker_frees_and_drained_waits_for_the_excess() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let w = Workers::new(2);
            let one = w.acquire_async().await;
            let two = w.acquire_async().await;
            w.scale(1);
            let w2 = w.clone();
            let drained = tokio::spawn(async move { w2.drained().await });
            let w3 = w.clone();
            let third = tokio::spawn(async move { w3.acquire_async().await });
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(!drained.is_finished() && !third.is_finished());
            drop(one);
            drained.await.unwrap();
            assert_eq!(w.peak(), 1, "the peak restarts from the jobs running once drained");
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(!third.is_finished(), "one worker, still busy");
            drop(two);
            let held = third.await.unwrap();
            assert_eq!(w.busy(), 1);
            drop(held);
            assert_eq!(w.busy(), 0);
        });
    }

    #[test]
    fn a_panicking_job_gives_its_worker_back() {
        let w = Workers::new(1);
        let w2 = w.clone();
        let r = std::thread::spawn(move || {
            let _busy = w2.acquire();
            panic!("boom");
        })
        .join();
        assert!(r.is_err());
        assert_eq!(w.busy(), 0);
        drop(w.acquire());
    }
}
