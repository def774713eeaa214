//! A store another connection holds locked past the busy timeout while a run writes: what the
//! run's writer keeps, and what `RunWriter::end` reports.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use weft_track::{NewRun, OpenOptions, RunWriter, Status, Store, WriterOptions, STORE_FILE};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weft-track-busy-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const BUSY: Duration = Duration::from_millis(200);

/// A writer whose store waits `BUSY` for a lock, flushing and beating every 20 ms.
fn writer(dir: &Path) -> RunWriter {
    writer_batching(dir, 10_000)
}

/// [`writer`] writing once `batch` records wait.
fn writer_batching(dir: &Path, batch: usize) -> RunWriter {
    writer_spilling(dir, batch, WriterOptions::default().spill_at)
}

/// [`writer_batching`] moving records to its spill file past `spill_at` while the store is locked.
fn writer_spilling(dir: &Path, batch: usize, spill_at: usize) -> RunWriter {
    let run = NewRun {
        experiment: "e".into(),
        name: Some("r".into()),
        ..Default::default()
    };
    let options = WriterOptions {
        batch,
        flush_every: Duration::from_millis(20),
        heartbeat: Duration::from_millis(20),
        spill_at,
    };
    let open = OpenOptions {
        busy_timeout: BUSY,
        ..Default::default()
    };
    RunWriter::start_with(dir, run, options, open).unwrap()
}

/// Another program's write transaction on the store, held until `ROLLBACK`.
fn hold_lock(dir: &Path) -> Connection {
    let holder = Connection::open(dir.join(STORE_FILE)).unwrap();
    holder.busy_timeout(Duration::from_secs(10)).unwrap();
    holder
        .execute_batch("BEGIN IMMEDIATE; UPDATE runs SET name = name;")
        .unwrap();
    holder
}

fn metric_count(dir: &Path, id: i64) -> i64 {
    let conn = Connection::open(dir.join(STORE_FILE)).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    conn.query_row("SELECT count(*) FROM metrics WHERE run_id = ?1", [id], |r| r.get(0))
        .unwrap()
}

/// Waits (up to 5 s) until run `id` has `n` metric rows; whether it got them.
fn wait_for_rows(dir: &Path, id: i64, n: i64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if metric_count(dir, id) == n {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Steps 0 to 4 logged and written through `w`, then the store locked by another connection
/// (the lock held until the returned connection rolls back).
fn five_written_then_locked(dir: &Path, w: &RunWriter) -> Connection {
    for s in 0..5 {
        w.log(s, "loss", s as f64);
    }
    assert!(wait_for_rows(dir, w.id(), 5));
    hold_lock(dir)
}

#[test]
fn a_store_busy_past_the_timeout_loses_nothing_and_end_reports_no_loss() {
    let dir = temp_dir("outlived");
    let w = writer(&dir);
    let holder = five_written_then_locked(&dir, &w);
    // logged while the lock is held: flushes and heartbeats fail after the busy timeout, several
    // times over
    for s in 5..20 {
        w.log(s, "loss", s as f64);
    }
    let ckpt = dir.join("ckpt");
    std::fs::create_dir_all(&ckpt).unwrap();
    w.artifact("checkpoint", &ckpt);
    std::thread::sleep(BUSY * 5);
    assert_eq!(metric_count(&dir, w.id()), 5);
    holder.execute_batch("ROLLBACK").unwrap();
    // the kept batch is written by a later flush without anything new logged
    assert!(wait_for_rows(&dir, w.id(), 20), "{} rows", metric_count(&dir, w.id()));
    w.log(20, "loss", 20.0);
    w.end(Status::Finished, None).expect("nothing was lost");

    let store = Store::open(&dir).unwrap();
    let steps: Vec<i64> = store.metric_rows(w.id()).unwrap().iter().map(|r| r.0).collect();
    assert_eq!(steps, (0..=20).collect::<Vec<_>>());
    let detail = store.run_detail(w.id()).unwrap();
    assert_eq!(detail.summary.status, "finished");
    assert_eq!(detail.error, None);
    assert_eq!(detail.artifacts.len(), 1);
    assert_eq!(detail.metrics["loss"].count, 21);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn records_still_unwritten_at_the_end_are_reported_lost() {
    let dir = temp_dir("lost");
    let w = writer(&dir);
    let holder = five_written_then_locked(&dir, &w);
    for s in 5..10 {
        w.log(s, "loss", s as f64);
    }
    // the lock outlives the run: its last batch and its status cannot be written
    let e = w.end(Status::Finished, None).expect_err("the last batch was lost");
    assert!(e.to_string().contains("locked"), "{e}");
    holder.execute_batch("ROLLBACK").unwrap();

    assert_eq!(metric_count(&dir, w.id()), 5);
    let store = Store::open(&dir).unwrap();
    assert_eq!(store.run_detail(w.id()).unwrap().summary.status, "running");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Records logged while the store is locked, many more than a batch: `end` waits a few busy
/// timeouts, not one per record.
const MANY: u64 = 100;

#[test]
fn a_full_batch_kept_while_the_store_is_locked_waits_its_retry_and_loses_nothing() {
    let dir = temp_dir("full-kept");
    let w = writer_batching(&dir, 8);
    let holder = five_written_then_locked(&dir, &w);
    for s in 5..5 + MANY {
        w.log(s, "loss", s as f64);
    }
    std::thread::sleep(BUSY * 3);
    let released = Instant::now();
    holder.execute_batch("ROLLBACK").unwrap();
    // the kept batch (all of them, received meanwhile) is written at its next retry
    assert!(
        wait_for_rows(&dir, w.id(), 5 + MANY as i64),
        "{} rows",
        metric_count(&dir, w.id())
    );
    assert!(released.elapsed() < BUSY * 25, "{:?}", released.elapsed());
    w.end(Status::Finished, None).expect("nothing was lost");
    let detail = Store::open(&dir).unwrap().run_detail(w.id()).unwrap();
    assert_eq!(detail.summary.status, "finished");
    assert_eq!(detail.metrics["loss"].count, 5 + MANY as i64);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_full_batch_still_locked_at_the_end_is_reported_lost_after_a_few_busy_timeouts() {
    let dir = temp_dir("full-lost");
    let w = writer_batching(&dir, 8);
    let holder = five_written_then_locked(&dir, &w);
    for s in 5..5 + MANY {
        w.log(s, "loss", s as f64);
    }
    // one flush attempt per retry and one at the end, not one per record (100 x 200 ms: 19 s
    // before; the bound leaves room for a loaded machine)
    let t = Instant::now();
    let e = w.end(Status::Finished, None).expect_err("the last batch was lost");
    assert!(t.elapsed() < BUSY * 40, "end took {:?}", t.elapsed());
    assert!(e.to_string().contains("locked"), "{e}");
    holder.execute_batch("ROLLBACK").unwrap();
    assert_eq!(metric_count(&dir, w.id()), 5);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Run `id`'s spill file in the store `dir`.
fn spill_file(dir: &Path, id: i64) -> PathBuf {
    dir.join(format!("{STORE_FILE}.run-{id}.spill"))
}

#[test]
fn records_past_spill_at_while_locked_wait_in_a_file_and_are_all_written_in_order_once_free() {
    let dir = temp_dir("spilled");
    let w = writer_spilling(&dir, 8, 16);
    let holder = five_written_then_locked(&dir, &w);
    // values whose bits a decimal round trip would not keep, a NaN, and a second key
    let value = |s: u64| (s as f64 * 0.1).sin();
    for s in 5..5 + MANY {
        w.log(s, "loss", if s == 50 { f64::NAN } else { value(s) });
        w.log(s, "lr/λ", 1.0 / 3.0);
    }
    let spill = spill_file(&dir, w.id());
    // 32 bytes a "loss" record, 33 a "lr/λ" one: all but the last few of the 200 left memory
    let deadline = Instant::now() + Duration::from_secs(5);
    let size = || std::fs::metadata(&spill).map_or(0, |m| m.len());
    while size() < 150 * 33 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(size() >= 150 * 33, "spill file {}: {} bytes", spill.display(), size());
    assert_eq!(metric_count(&dir, w.id()), 5);
    holder.execute_batch("ROLLBACK").unwrap();
    // the spilled records (the oldest) and those in memory are written at the next retry
    let rows = 5 + 2 * MANY as i64 - 1;
    assert!(wait_for_rows(&dir, w.id(), rows), "{} rows", metric_count(&dir, w.id()));
    assert!(!spill.exists(), "the spill file outlived its records");
    w.end(Status::Finished, None).expect("nothing was lost");

    let store = Store::open(&dir).unwrap();
    let detail = store.run_detail(w.id()).unwrap();
    assert_eq!(detail.summary.status, "finished");
    assert_eq!(detail.metrics["loss"].count, 5 + MANY as i64 - 1);
    assert_eq!(detail.metrics["lr/λ"].count, MANY as i64);
    assert_eq!(detail.summary.tags.get("nan_step.loss").map(String::as_str), Some("50"));
    let conn = Connection::open(dir.join(STORE_FILE)).unwrap();
    let mut q = conn
        .prepare("SELECT step, value FROM metrics WHERE run_id = ?1 AND key = 'loss' ORDER BY rowid")
        .unwrap();
    let loss: Vec<(i64, f64)> = q
        .query_map([w.id()], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let want: Vec<(i64, f64)> = (0..5)
        .map(|s| (s, s as f64))
        .chain((5..5 + MANY).filter(|&s| s != 50).map(|s| (s as i64, value(s))))
        .collect();
    let bits = |v: &[(i64, f64)]| v.iter().map(|&(s, x)| (s, x.to_bits())).collect::<Vec<_>>();
    assert_eq!(bits(&loss), bits(&want), "written in the order logged, bit for bit");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn spilled_records_still_locked_at_the_end_are_reported_lost_and_their_file_removed() {
    let dir = temp_dir("spilled-lost");
    let w = writer_spilling(&dir, 8, 16);
    let holder = five_written_then_locked(&dir, &w);
    for s in 5..5 + MANY {
        w.log(s, "loss", s as f64);
    }
    let spill = spill_file(&dir, w.id());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !spill.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(spill.exists(), "nothing spilled");
    let e = w
        .end(Status::Finished, None)
        .expect_err("the spilled records were lost");
    assert!(e.to_string().contains("locked"), "{e}");
    assert!(!spill.exists(), "the spill file outlived the run");
    holder.execute_batch("ROLLBACK").unwrap();
    assert_eq!(metric_count(&dir, w.id()), 5);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn records_that_cannot_be_spilled_wait_in_memory_and_lose_nothing() {
    let dir = temp_dir("unspillable");
    let w = writer_spilling(&dir, 8, 16);
    // a folder where the spill file would go: every append fails
    let spill = spill_file(&dir, w.id());
    std::fs::create_dir_all(&spill).unwrap();
    let holder = five_written_then_locked(&dir, &w);
    for s in 5..5 + MANY {
        w.log(s, "loss", s as f64);
    }
    std::thread::sleep(BUSY * 3);
    holder.execute_batch("ROLLBACK").unwrap();
    assert!(
        wait_for_rows(&dir, w.id(), 5 + MANY as i64),
        "{} rows",
        metric_count(&dir, w.id())
    );
    w.end(Status::Finished, None).expect("nothing was lost");
    assert!(spill.is_dir(), "the writer removed what it did not make");
    let _ = std::fs::remove_dir_all(&dir);
}
