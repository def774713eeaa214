//! What a long-lived reader does when the store's file is deleted or replaced under it, and
//! files and rows it must name rather than misread: an unreadable schema version, an empty
//! file, and damaged rows read by export, the event stream and the experiment list.

use std::path::{Path, PathBuf};

use weft_track::{Error, NewRun, RunWriter, Status, Store, WriterOptions, STORE_FILE};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weft-track-files-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn record(dir: &Path, name: &str) -> i64 {
    let run = NewRun {
        experiment: "exp".into(),
        name: Some(name.into()),
        ..Default::default()
    };
    let w = RunWriter::start(dir, run, WriterOptions::default()).unwrap();
    for s in 1..=3 {
        w.log(s, "loss", 1.0 / s as f64);
    }
    let id = w.id();
    w.end(Status::Finished, None).unwrap();
    id
}

fn names(store: &Store) -> Vec<String> {
    store.list_runs(None).unwrap().into_iter().map(|r| r.name).collect()
}

#[test]
fn a_store_deleted_and_made_again_under_a_reader_is_opened_again() {
    let dir = temp_dir("replaced").join("weft-runs");
    record(&dir, "old");
    // `weft ui` holds the store open for writing (it marks stale runs)
    let mut store = Store::open_existing(&dir).unwrap();
    assert!(!store.is_read_only());
    assert!(!store.refresh().unwrap(), "nothing changed");
    assert_eq!(names(&store), ["old"]);
    // `rm -rf weft-runs`: the connection still reads the deleted file; refreshing says the
    // store is gone, naming it
    std::fs::remove_dir_all(&dir).unwrap();
    let e = store.refresh().unwrap_err().to_string();
    assert!(
        e.contains(&dir.join(STORE_FILE).display().to_string()) && e.contains("deleted or moved"),
        "{e}"
    );
    // a new run makes a new store there: the reader opens it and sees only the new run
    record(&dir, "new");
    assert!(store.refresh().unwrap(), "a new file at the path");
    assert_eq!(names(&store), ["new"]);
    assert!(!store.refresh().unwrap());
    // another store's file moved into its place
    let elsewhere = dir.parent().unwrap().join("elsewhere");
    record(&elsewhere, "moved-in");
    drop(Store::open(&elsewhere).unwrap());
    std::fs::rename(elsewhere.join(STORE_FILE), dir.join(STORE_FILE)).unwrap();
    for leftover in ["runs.db-wal", "runs.db-shm"] {
        let _ = std::fs::remove_file(dir.join(leftover));
    }
    assert!(store.refresh().unwrap());
    assert_eq!(names(&store), ["moved-in"]);
    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}

#[test]
fn an_unreadable_schema_version_is_named_as_such() {
    for (n, value) in ["'two'", "'99999999999999999999'", "'0'", "x'0102'"].iter().enumerate() {
        let dir = temp_dir(&format!("version-{n}"));
        record(&dir, "a");
        let conn = rusqlite::Connection::open(dir.join(STORE_FILE)).unwrap();
        conn.execute(
            &format!("UPDATE meta SET value = {value} WHERE key = 'schema_version'"),
            [],
        )
        .unwrap();
        drop(conn);
        for e in [Store::open(&dir).err(), Store::open_read_only(&dir).err()] {
            let e = e.unwrap_or_else(|| panic!("{value} opened"));
            let msg = e.to_string();
            assert!(matches!(e, Error::Corrupt { .. }), "{msg}");
            assert!(
                msg.contains("schema_version is ") && msg.contains("not a version number"),
                "{value}: {msg}"
            );
            assert!(!msg.contains("holds no schema_version"), "{msg}");
            assert!(msg.contains(&dir.join(STORE_FILE).display().to_string()), "{msg}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    // none at all is still said so
    let dir = temp_dir("version-missing");
    record(&dir, "a");
    let conn = rusqlite::Connection::open(dir.join(STORE_FILE)).unwrap();
    conn.execute("DELETE FROM meta WHERE key = 'schema_version'", [])
        .unwrap();
    drop(conn);
    let e = Store::open(&dir).err().unwrap().to_string();
    assert!(e.contains("holds no schema_version"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_empty_file_is_no_store_to_read_but_a_writer_starts_one_in_it() {
    let dir = temp_dir("empty");
    let file = dir.join(STORE_FILE);
    std::fs::write(&file, b"").unwrap();
    // `weft runs list` made it an empty store and listed nothing
    let e = Store::open_existing(&dir)
        .err()
        .expect("an empty file opened")
        .to_string();
    assert!(
        e.contains(&file.display().to_string()) && e.contains("empty file (0 bytes)"),
        "{e}"
    );
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 0, "left as it was");
    // a run recorded there makes it a store (as SQLite takes an empty file for a new database)
    record(&dir, "a");
    assert_eq!(names(&Store::open_existing(&dir).unwrap()), ["a"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A store of two runs with one row edited by `sql` (given the runs' ids).
fn damaged(n: &str, sql: impl Fn(&[i64]) -> String) -> (PathBuf, Vec<i64>) {
    let dir = temp_dir(&format!("damaged-{n}"));
    let ids = vec![record(&dir, "a"), record(&dir, "b")];
    let conn = rusqlite::Connection::open(dir.join(STORE_FILE)).unwrap();
    conn.execute(&sql(&ids), []).unwrap();
    (dir, ids)
}

#[test]
fn damaged_rows_read_by_export_and_the_experiment_list_are_named() {
    // a metric value turned into text: `weft runs export` (csv and tensorboard)
    let (dir, ids) = damaged("metric", |ids| {
        format!(
            "UPDATE metrics SET value = 'many' WHERE run_id = {} AND step = 2",
            ids[1]
        )
    });
    let store = Store::open_existing(&dir).unwrap();
    let want = format!(
        "run {}'s row in table metrics is damaged: column value holds text",
        ids[1]
    );
    let csv = store.metric_rows(ids[1]).unwrap_err().to_string();
    let out = dir.join("tb");
    let tb = weft_track::tensorboard::export_run(&store, ids[1], &out)
        .unwrap_err()
        .to_string();
    for e in [csv, tb] {
        assert!(e.contains(&want), "{e}");
        assert!(e.contains(&format!("weft runs delete {}", ids[1])), "{e}");
        assert!(e.contains(&dir.join(STORE_FILE).display().to_string()), "{e}");
    }
    assert_eq!(store.metric_rows(ids[0]).unwrap().len(), 3, "the other run reads");
    let _ = std::fs::remove_dir_all(&dir);

    // an experiment's name turned into a blob: the experiment list and the run table
    let (dir, ids) = damaged("experiment", |_| "UPDATE experiments SET name = x'ff00'".into());
    let store = Store::open_existing(&dir).unwrap();
    let e = store.experiments().unwrap_err().to_string();
    assert!(
        e.contains("experiment 1's row in table experiments is damaged: column name holds blob"),
        "{e}"
    );
    let e = store.list_runs(None).unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "run {}'s row in table experiments is damaged: column name holds blob",
            ids[0]
        )),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "ui")]
#[test]
fn a_damaged_heartbeat_read_by_the_event_stream_is_named() {
    let (dir, ids) = damaged("heartbeat", |ids| {
        format!("UPDATE runs SET heartbeat = 'soon' WHERE id = {}", ids[0])
    });
    let store = Store::open_existing(&dir).unwrap();
    let e = store.run_status(ids[0]).unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "run {}'s row in table runs is damaged: column heartbeat holds text",
            ids[0]
        )),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
