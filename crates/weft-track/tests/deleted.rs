//! A run deleted from the store while it runs: its writer says so (and writes nothing more for
//! it) rather than failing every batch on a foreign key; and `Store::run_is_live`, which tells
//! `weft runs delete` that a run is still being recorded.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use weft_track::{Error, NewRun, RunWriter, Status, Store, WriterOptions, STORE_FILE};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weft-track-deleted-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(name: &str) -> NewRun {
    NewRun {
        experiment: "exp".into(),
        name: Some(name.into()),
        ..Default::default()
    }
}

/// Rows of any table still naming run `id` (none once it is deleted).
fn rows_of(dir: &std::path::Path, id: i64) -> i64 {
    let conn = rusqlite::Connection::open(dir.join(STORE_FILE)).unwrap();
    ["metrics", "metric_summary", "tags", "params", "artifacts"]
        .iter()
        .map(|t| {
            conn.query_row(&format!("SELECT count(*) FROM {t} WHERE run_id = ?1"), [id], |r| {
                r.get::<_, i64>(0)
            })
            .unwrap()
        })
        .sum()
}

fn assert_says_deleted(e: Error, id: i64) {
    let msg = e.to_string();
    assert!(matches!(e, Error::UnknownRun(_)), "{msg}");
    assert!(
        msg.contains(&format!("run {id} was deleted from the store while it ran")),
        "{msg}"
    );
    assert!(!msg.contains("FOREIGN KEY"), "{msg}");
}

#[test]
fn a_run_deleted_while_it_writes_says_so_and_writes_nothing_more() {
    let dir = temp_dir("mid-run");
    let often = WriterOptions {
        batch: 4,
        flush_every: Duration::from_millis(5),
        ..WriterOptions::default()
    };
    let w = RunWriter::start(&dir, run("a"), often).unwrap();
    let id = w.id();
    w.log(1, "loss", 1.0);
    let mut store = Store::open_existing(&dir).unwrap();
    // the first value written (a flush), however long the machine takes
    let t = Instant::now();
    while store.metric_rows(id).unwrap().is_empty() {
        assert!(t.elapsed() < Duration::from_secs(60), "never flushed");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(store.run_is_live(id).unwrap());
    store.delete_run(id).unwrap();
    // batches after the deletion: each failed on the metrics' foreign key, and the end said
    // only "FOREIGN KEY constraint failed"
    for s in 2..100 {
        w.log(s, "loss", 1.0 / s as f64);
    }
    w.artifact("trace", &dir.join("trace.json"));
    assert_says_deleted(w.end(Status::Finished, None).unwrap_err(), id);
    assert!(!store.has_run(id).unwrap());
    assert_eq!(rows_of(&dir, id), 0);
    // no spill file or other leftover beside the store
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".spill"))
        .collect();
    files.sort();
    assert!(files.is_empty(), "{files:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_run_deleted_after_its_last_flush_says_so_at_its_end() {
    let dir = temp_dir("at-end");
    // nothing flushed or beaten before the end: the end finds the run gone
    let quiet = WriterOptions {
        flush_every: Duration::from_secs(3600),
        heartbeat: Duration::from_secs(3600),
        ..WriterOptions::default()
    };
    let w = RunWriter::start(&dir, run("a"), quiet.clone()).unwrap();
    w.log(1, "loss", 1.0);
    Store::open_existing(&dir).unwrap().delete_run(w.id()).unwrap();
    assert_says_deleted(w.end(Status::Finished, None).unwrap_err(), w.id());
    assert_eq!(rows_of(&dir, w.id()), 0);
    // nothing waiting at all: the status alone (it was written to no row, and said nothing)
    let w = RunWriter::start(&dir, run("b"), quiet).unwrap();
    Store::open_existing(&dir).unwrap().delete_run(w.id()).unwrap();
    assert_says_deleted(w.end(Status::Finished, None).unwrap_err(), w.id());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_run_is_live_while_running_with_a_fresh_heartbeat() {
    let dir = temp_dir("live");
    let quiet = WriterOptions {
        flush_every: Duration::from_secs(3600),
        heartbeat: Duration::from_secs(3600),
        ..WriterOptions::default()
    };
    let ended = RunWriter::start(&dir, run("ended"), quiet.clone()).unwrap();
    ended.end(Status::Finished, None).unwrap();
    let w = RunWriter::start(&dir, run("running"), quiet).unwrap();
    let store = Store::open_existing(&dir).unwrap();
    assert!(store.run_is_live(w.id()).unwrap());
    assert!(!store.run_is_live(ended.id()).unwrap());
    assert!(matches!(store.run_is_live(w.id() + 100), Err(Error::UnknownRun(_))));
    // running, but its heartbeat stopped (its process died): not live
    let conn = rusqlite::Connection::open(dir.join(STORE_FILE)).unwrap();
    conn.execute("UPDATE runs SET heartbeat = 0 WHERE id = ?1", [w.id()])
        .unwrap();
    assert!(!store.run_is_live(w.id()).unwrap());
    // a damaged heartbeat is named
    conn.execute("UPDATE runs SET heartbeat = 'soon' WHERE id = ?1", [w.id()])
        .unwrap();
    let e = store.run_is_live(w.id()).unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "run {}'s row in table runs is damaged: column heartbeat holds text",
            w.id()
        )),
        "{e}"
    );
    drop(w);
    let _ = std::fs::remove_dir_all(&dir);
}
