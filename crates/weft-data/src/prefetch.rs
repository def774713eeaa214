//! Batches built a few steps ahead on a background thread.
//!
//! Since every batch is a pure function of its step, prefetching changes only when a batch is built,
//! never which batch a step gets.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::error::{invalid, Error, Result};

/// Runs `produce(step)` for each step of a range on a background thread, at most `ahead` results
/// ahead of the consumer, and hands the results over in step order (as an [`Iterator`] of
/// `Result<T, E>`).
///
/// After the first `Err` the thread stops: that error is the last item. A panic in `produce` is
/// re-raised on the consumer's thread by the next call to `next`. Dropping the prefetcher stops the
/// thread and waits for it: at once if it is waiting for room, else once the `produce` call in flight
/// returns.
pub struct Prefetcher<T: Send + 'static, E: Send + 'static = Error> {
    rx: Option<Receiver<std::result::Result<T, E>>>,
    handle: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    next_step: usize,
    end: usize,
}

/// The `ahead` that [`Prefetcher::new`] callers usually want: one batch being consumed while the
/// next two are ready or in progress.
pub const DEFAULT_AHEAD: usize = 2;

impl<T: Send + 'static, E: Send + 'static> Prefetcher<T, E> {
    /// Starts the background thread on `steps` (for example `resume_step..total_steps`), building
    /// at most `ahead` (at least 1) results the consumer has not yet taken. Errors only if the
    /// thread cannot be started.
    pub fn new<F>(steps: Range<usize>, ahead: usize, mut produce: F) -> Result<Prefetcher<T, E>>
    where
        F: FnMut(usize) -> std::result::Result<T, E> + Send + 'static,
    {
        // A rendezvous channel (capacity 0) already lets one finished result wait in `send`.
        let (tx, rx) = sync_channel(ahead.max(1) - 1);
        let stop = Arc::new(AtomicBool::new(false));
        let (next_step, end) = (steps.start, steps.end.max(steps.start));
        let thread_stop = stop.clone();
        let handle = std::thread::Builder::new()
            .name("weft-prefetch".into())
            .spawn(move || {
                for step in steps {
                    if thread_stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let result = produce(step);
                    let failed = result.is_err();
                    if tx.send(result).is_err() || failed {
                        return;
                    }
                }
            })
            .map_err(|e| invalid(format!("cannot start the prefetch thread: {e}")))?;
        Ok(Prefetcher {
            rx: Some(rx),
            handle: Some(handle),
            stop,
            next_step,
            end,
        })
    }

    /// The step whose result the next call to `next` returns (the range's end once exhausted).
    pub fn next_step(&self) -> usize {
        self.next_step
    }
}

impl<T: Send + 'static, E: Send + 'static> Iterator for Prefetcher<T, E> {
    type Item = std::result::Result<T, E>;

    /// The result for [`Prefetcher::next_step`], waiting for it if needed; `None` after the last step
    /// or after an error was returned.
    fn next(&mut self) -> Option<Self::Item> {
        if self.next_step >= self.end {
            return None;
        }
        match self.rx.as_ref()?.recv() {
            Ok(result) => {
                self.next_step = if result.is_err() { self.end } else { self.next_step + 1 };
                Some(result)
            }
            Err(_) => {
                // the thread ended before the last step without an error result: it panicked
                self.next_step = self.end;
                if let Some(Err(panic)) = self.handle.take().map(JoinHandle::join) {
                    std::panic::resume_unwind(panic);
                }
                None
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.end - self.next_step))
    }
}

impl<T: Send + 'static, E: Send + 'static> Drop for Prefetcher<T, E> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // dropping the receiver wakes a thread blocked in `send`
        drop(self.rx.take());
        if let Some(handle) = self.handle.take() {
            // a panic there was the consumer's to see through `next`; do not panic in drop
            let _ = handle.join();
        }
    }
}

impl<T: Send + 'static, E: Send + 'static> std::fmt::Debug for Prefetcher<T, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetcher")
            .field("next_step", &self.next_step)
            .field("end", &self.end)
            .finish()
    }
}
