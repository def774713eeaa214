//! Prefetcher: order, bounded lookahead, early drop, errors and panics.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weft_data::{Prefetcher, Split, TextDataset};

#[test]
fn delivers_every_step_in_order() {
    let p: Prefetcher<usize> = Prefetcher::new(5..50, 2, |s| {
        // uneven work so the producer and consumer interleave differently
        std::thread::sleep(Duration::from_micros((s % 3) as u64 * 200));
        Ok(s * 10)
    })
    .unwrap();
    let got: Vec<usize> = p.map(Result::unwrap).collect();
    assert_eq!(got, (5..50).map(|s| s * 10).collect::<Vec<_>>());
    let mut empty: Prefetcher<usize> = Prefetcher::new(3..3, 2, Ok).unwrap();
    assert!(empty.next().is_none());
}

#[test]
fn prefetched_text_batches_equal_direct_ones() {
    let text: String = (0..500).map(|i| format!("{i} bottles of beer\n")).collect();
    let d = Arc::new(TextDataset::from_text(&text, 0.1).unwrap());
    let dp = d.clone();
    let p = Prefetcher::new(10..20, weft_data::prefetch::DEFAULT_AHEAD, move |s| {
        dp.batch(Split::Train, 4, 16, 7, s)
    })
    .unwrap();
    for (s, batch) in (10..20).zip(p) {
        let (x, y) = batch.unwrap();
        let (dx, dy) = d.batch(Split::Train, 4, 16, 7, s).unwrap();
        assert_eq!(x.to_vec::<i64>().unwrap(), dx.to_vec::<i64>().unwrap());
        assert_eq!(y.to_vec::<i64>().unwrap(), dy.to_vec::<i64>().unwrap());
    }
}

/// Waits (up to 10 s) until `counter` reaches `n`, then checks that it stays there.
fn settles_at(counter: &AtomicUsize, n: usize) {
    let t = Instant::now();
    while counter.load(Ordering::SeqCst) < n && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(counter.load(Ordering::SeqCst), n);
}

#[test]
fn stays_a_bounded_number_of_steps_ahead() {
    let produced = Arc::new(AtomicUsize::new(0));
    let count = produced.clone();
    let mut p: Prefetcher<usize> = Prefetcher::new(0..1000, 3, move |s| {
        count.fetch_add(1, Ordering::SeqCst);
        Ok(s)
    })
    .unwrap();
    settles_at(&produced, 3);
    assert_eq!(p.next().unwrap().unwrap(), 0);
    settles_at(&produced, 4);
    assert_eq!(p.next_step(), 1);
    let mut one: Prefetcher<usize> = Prefetcher::new(0..1000, 1, Ok).unwrap();
    assert_eq!(one.next().unwrap().unwrap(), 0);
}

#[test]
fn dropping_early_stops_the_thread_promptly() {
    let last = Arc::new(Mutex::new(None));
    let seen = last.clone();
    let mut p: Prefetcher<usize> = Prefetcher::new(0..usize::MAX, 2, move |s| {
        *seen.lock().unwrap() = Some(s);
        std::thread::sleep(Duration::from_millis(5));
        Ok(s)
    })
    .unwrap();
    for s in 0..3 {
        assert_eq!(p.next().unwrap().unwrap(), s);
    }
    let t = Instant::now();
    drop(p);
    assert!(t.elapsed() < Duration::from_secs(2), "drop took {:?}", t.elapsed());
    // the thread has exited: nothing is produced any more
    let after = *last.lock().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(*last.lock().unwrap(), after);
    assert!(after.unwrap() <= 5, "produced up to step {after:?}");
}

#[test]
fn an_error_is_delivered_in_order_and_ends_the_stream() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let p: Prefetcher<usize, String> = Prefetcher::new(0..10, 2, move |s| {
        c.fetch_add(1, Ordering::SeqCst);
        if s == 4 {
            Err(format!("step {s} failed"))
        } else {
            Ok(s)
        }
    })
    .unwrap();
    let items: Vec<Result<usize, String>> = p.collect();
    assert_eq!(
        items,
        vec![Ok(0), Ok(1), Ok(2), Ok(3), Err("step 4 failed".to_string())]
    );
    assert_eq!(calls.load(Ordering::SeqCst), 5, "nothing is produced after the error");
}

#[test]
fn dataset_errors_pass_through() {
    let d = TextDataset::from_text("abcdef", 0.0).unwrap();
    let mut p = Prefetcher::new(0..3, 2, move |s| d.batch(Split::Train, 1, 10, 0, s)).unwrap();
    let msg = p.next().unwrap().unwrap_err().to_string();
    assert!(msg.contains("train") && msg.contains("6 tokens"), "{msg}");
    assert!(p.next().is_none());
}

#[test]
fn a_panic_in_the_producer_reaches_the_consumer() {
    let mut p: Prefetcher<usize> =
        Prefetcher::new(0..10, 2, |s| if s == 2 { panic!("boom at {s}") } else { Ok(s) }).unwrap();
    assert_eq!(p.next().unwrap().unwrap(), 0);
    assert_eq!(p.next().unwrap().unwrap(), 1);
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.next())).unwrap_err();
    assert_eq!(panic.downcast_ref::<String>().map(String::as_str), Some("boom at 2"));
    assert!(p.next().is_none());
}
