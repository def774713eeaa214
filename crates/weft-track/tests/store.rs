//! The run store: concurrent writers (threads and processes), heartbeats, batching, and files it
//! must refuse.

use std::path::{Path, PathBuf};
use std::time::Duration;

use weft_track::{Error, NewRun, OpenOptions, RunWriter, Status, Store, WriterOptions, STORE_FILE};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weft-track-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn new_run(name: &str) -> NewRun {
    NewRun {
        experiment: "exp".into(),
        name: Some(name.into()),
        params: vec![("optim.lr".into(), "0.001".into()), ("model.kind".into(), "gpt".into())],
        tags: vec![("team".into(), "a".into())],
        ..Default::default()
    }
}

/// Records `steps` steps of two metrics with small batches (many transactions).
fn write_run(dir: &Path, name: &str, steps: u64) {
    let small = WriterOptions {
        batch: 7,
        flush_every: Duration::from_millis(5),
        ..Default::default()
    };
    let w = RunWriter::start(dir, new_run(name), small).unwrap();
    for s in 1..=steps {
        w.log(s, "loss", 1.0 / s as f64);
        w.log(s, "lr", 0.001);
    }
    w.end(Status::Finished, None).unwrap();
}

fn count_metrics(dir: &Path) -> usize {
    let store = Store::open(dir).unwrap();
    store
        .list_runs(None)
        .unwrap()
        .iter()
        .map(|r| store.metric_rows(r.id).unwrap().len())
        .sum()
}

#[test]
fn concurrent_writer_threads_lose_nothing() {
    let dir = temp_dir("threads");
    let threads: Vec<_> = (0..6)
        .map(|i| {
            let dir = dir.clone();
            std::thread::spawn(move || write_run(&dir, &format!("t{i}"), 300))
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let store = Store::open(&dir).unwrap();
    let runs = store.list_runs(Some("exp")).unwrap();
    assert_eq!(runs.len(), 6);
    for r in &runs {
        assert_eq!(r.status, "finished");
        assert_eq!(store.metric_rows(r.id).unwrap().len(), 600, "{}", r.name);
        assert_eq!(r.last["loss"], 1.0 / 300.0);
        assert_eq!(r.params["optim.lr"], "0.001");
        assert_eq!(r.tags["team"], "a");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The child side of the multi-process tests (does nothing unless started by them).
#[test]
fn child_process() {
    let (Ok(dir), Ok(what)) = (std::env::var("WEFT_TRACK_CHILD_DIR"), std::env::var("WEFT_TRACK_CHILD")) else {
        return;
    };
    let dir = PathBuf::from(dir);
    match what.as_str() {
        "abort" => {
            let w = RunWriter::start(&dir, new_run("doomed"), WriterOptions::default()).unwrap();
            w.log(1, "loss", 2.0);
            std::process::abort();
        }
        name => write_run(&dir, name, 400),
    }
}

fn child(dir: &Path, what: &str) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process", "--test-threads", "1"])
        .env("WEFT_TRACK_CHILD_DIR", dir)
        .env("WEFT_TRACK_CHILD", what)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn concurrent_writer_processes_lose_nothing() {
    let dir = temp_dir("processes");
    // eight writing processes: seven children and this one
    let mut kids: Vec<_> = (0..7).map(|i| child(&dir, &format!("p{i}"))).collect();
    write_run(&dir, "here", 400);
    for k in &mut kids {
        assert!(k.wait().unwrap().success());
    }
    assert_eq!(count_metrics(&dir), 8 * 800);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_run_whose_process_died_is_marked_killed() {
    let dir = temp_dir("killed");
    let status = child(&dir, "abort").wait().unwrap();
    assert!(!status.success());
    // a fresh heartbeat: still counted as running
    let store = Store::open(&dir).unwrap();
    assert_eq!(store.list_runs(None).unwrap()[0].status, "running");
    drop(store);
    std::thread::sleep(Duration::from_millis(300));
    let quick = OpenOptions {
        stale_after: Duration::from_millis(200),
        ..Default::default()
    };
    let store = Store::open_with(&dir, quick).unwrap();
    let run = &store.list_runs(None).unwrap()[0];
    assert_eq!(run.status, "killed");
    let detail = store.run_detail(run.id).unwrap();
    assert!(detail.error.unwrap().contains("heartbeat"));
    assert_eq!(detail.summary.end_time, Some(detail.heartbeat));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn batches_wait_until_close_and_are_written_then() {
    let dir = temp_dir("batch");
    let slow = WriterOptions {
        batch: usize::MAX,
        flush_every: Duration::from_secs(3600),
        heartbeat: Duration::from_secs(3600),
        ..Default::default()
    };
    let w = RunWriter::start(&dir, new_run("b"), slow).unwrap();
    for s in 0..1000 {
        w.log(s, "loss", s as f64);
    }
    w.artifact("checkpoint", Path::new("/tmp/ck/step-1000"));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        count_metrics(&dir),
        0,
        "nothing is written before a batch fills or the run ends"
    );
    w.end(Status::Failed, Some("boom".into())).unwrap();
    assert_eq!(count_metrics(&dir), 1000);
    let store = Store::open(&dir).unwrap();
    let d = store.run_detail(w.id()).unwrap();
    assert_eq!(d.summary.status, "failed");
    assert_eq!(d.error.as_deref(), Some("boom"));
    assert_eq!(
        d.artifacts,
        vec![("checkpoint".to_string(), "/tmp/ck/step-1000".to_string())]
    );
    let m = &d.metrics["loss"];
    assert_eq!(
        (m.count, m.min, m.max, m.last, m.last_step),
        (1000, 0.0, 999.0, 999.0, 999)
    );
    // a dropped writer records that the run ended without a status
    let w = RunWriter::start(&dir, new_run("b"), WriterOptions::default()).unwrap();
    assert_eq!(w.name(), "b-2");
    let id = w.id();
    drop(w);
    let d = Store::open(&dir).unwrap().run_detail(id).unwrap();
    assert_eq!(d.summary.status, "failed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_newer_schema_is_refused_naming_the_file() {
    let dir = temp_dir("newer");
    drop(Store::open(&dir).unwrap());
    let file = dir.join(STORE_FILE);
    let conn = rusqlite::Connection::open(&file).unwrap();
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'", [])
        .unwrap();
    drop(conn);
    let e = Store::open(&dir).err().unwrap();
    assert!(matches!(e, Error::NewerSchema { found: 99, .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains(&file.display().to_string()) && msg.contains("99"), "{msg}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_corrupt_or_foreign_file_is_named() {
    let dir = temp_dir("corrupt");
    let file = dir.join(STORE_FILE);
    std::fs::write(&file, vec![b'x'; 8192]).unwrap();
    let e = Store::open(&dir).err().unwrap();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    assert!(e.to_string().contains(&file.display().to_string()), "{e}");
    assert!(RunWriter::start(&dir, new_run("x"), WriterOptions::default()).is_err());
    // a SQLite database of something else
    std::fs::remove_file(&file).unwrap();
    let conn = rusqlite::Connection::open(&file).unwrap();
    conn.execute("CREATE TABLE other (x)", []).unwrap();
    drop(conn);
    let e = Store::open(&dir).err().unwrap();
    assert!(
        matches!(e, Error::Corrupt { .. }) && e.to_string().contains("not a weft run store"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn runs_are_found_by_id_or_name_and_deleted_and_ids_are_never_given_twice() {
    let dir = temp_dir("find");
    write_run(&dir, "a", 3);
    write_run(&dir, "b", 3);
    let mut store = Store::open(&dir).unwrap();
    let a = store.find_run("a").unwrap();
    assert_eq!(store.find_run(&a.to_string()).unwrap(), a);
    assert_eq!(store.find_run("exp/a").unwrap(), a);
    assert!(store
        .find_run("nope")
        .unwrap_err()
        .to_string()
        .contains("no run \"nope\""));
    store.delete_run(a).unwrap();
    assert!(store.find_run("a").is_err());
    assert_eq!(store.list_runs(None).unwrap().len(), 1);
    assert_eq!(count_metrics(&dir), 6);
    // the newest run deleted: the next run still gets a new id, never b's again
    let b = store.find_run("b").unwrap();
    store.delete_run(b).unwrap();
    drop(store);
    write_run(&dir, "c", 3);
    let store = Store::open(&dir).unwrap();
    let c = store.find_run("c").unwrap();
    assert!(c > b && c > a, "ids a {a}, b {b}, then c {c}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_ended_run_can_be_marked_pruned() {
    let dir = temp_dir("pruned");
    write_run(&dir, "trial-1", 3);
    let store = Store::open(&dir).unwrap();
    let id = store.find_run("exp/trial-1").unwrap();
    store.set_status(id, Status::Pruned, Some("rung 0 (step 4)")).unwrap();
    let run = store.run_detail(id).unwrap();
    assert_eq!(run.summary.status, "pruned");
    assert_eq!(run.error.as_deref(), Some("rung 0 (step 4)"));
    assert!(matches!(
        store.set_status(id + 100, Status::Pruned, None),
        Err(Error::UnknownRun(_))
    ));
}

#[test]
fn nan_values_are_left_out_and_everything_else_of_the_flush_is_kept() {
    let dir = temp_dir("nan");
    let w = RunWriter::start(&dir, new_run("nan"), WriterOptions::default()).unwrap();
    w.log(1, "loss", 2.0);
    w.log(2, "loss", f64::NAN);
    w.log(2, "val_loss", f64::INFINITY);
    w.log(3, "loss", 1.0);
    w.end(Status::Finished, None).unwrap();
    let store = Store::open(&dir).unwrap();
    let run = &store.list_runs(Some("exp")).unwrap()[0];
    assert_eq!(run.status, "finished");
    let rows: Vec<(i64, String, f64)> = store
        .metric_rows(run.id)
        .unwrap()
        .into_iter()
        .map(|(step, key, value, _)| (step, key, value))
        .collect();
    assert_eq!(
        rows,
        vec![
            (1, "loss".to_string(), 2.0),
            (3, "loss".to_string(), 1.0),
            (2, "val_loss".to_string(), f64::INFINITY)
        ]
    );
    // a status set after the end keeps the end time; one set on a run without it gives one
    store.set_status(run.id, Status::Pruned, Some("stopped")).unwrap();
    assert!(store.list_runs(Some("exp")).unwrap()[0].end_time.is_some());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn run_folders_stay_inside_the_store() {
    let dir = Path::new("/store");
    assert_eq!(weft_track::run_folder(dir, "..", "a/b"), Path::new("/store/_../a_b"));
    assert_eq!(weft_track::run_folder(dir, "e", "."), Path::new("/store/e/_."));
    assert_eq!(weft_track::run_folder(dir, "e", ""), Path::new("/store/e/_"));
}

#[test]
fn a_damaged_row_is_named_by_its_run_table_and_column() {
    // each damage in a store of its own: two runs of 3 steps, then one row edited by hand
    let damaged = |n: usize, sql: &dyn Fn(&[i64]) -> String| {
        let dir = temp_dir(&format!("damaged-row-{n}"));
        write_run(&dir, "a", 3);
        write_run(&dir, "b", 3);
        let ids: Vec<i64> = Store::open(&dir)
            .unwrap()
            .list_runs(None)
            .unwrap()
            .iter()
            .map(|r| r.id)
            .collect();
        let conn = rusqlite::Connection::open(dir.join(STORE_FILE)).unwrap();
        conn.execute(&sql(&ids), []).unwrap();
        (dir, ids)
    };
    // (the edit, given the runs' ids; what the error says after the table name; whose run)
    type Case<'a> = (&'a dyn Fn(&[i64]) -> String, &'a str, usize);
    let cases: [Case; 3] = [
        (
            &|ids| format!("UPDATE runs SET start_time = 'yesterday' WHERE id = {}", ids[1]),
            "runs is damaged: column start_time holds text",
            1,
        ),
        (
            &|ids| format!("UPDATE params SET value = x'00ff' WHERE run_id = {}", ids[0]),
            "params is damaged: column value holds blob",
            0,
        ),
        (
            &|ids| format!("UPDATE metric_summary SET last = 'many' WHERE run_id = {}", ids[0]),
            "metric_summary is damaged: column last holds text",
            0,
        ),
    ];
    for (n, (sql, want, which)) in cases.into_iter().enumerate() {
        let (dir, ids) = damaged(n, sql);
        let e = Store::open(&dir).unwrap().list_runs(None).unwrap_err().to_string();
        let want = format!("run {}'s row in table {want}", ids[which]);
        assert!(
            e.contains(&dir.join(STORE_FILE).display().to_string()) && e.contains(&want),
            "{e}"
        );
        assert!(e.contains(&format!("weft runs delete {}", ids[which])), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
    // one run's detail names its own damage
    let (dir, ids) = damaged(3, &|ids| {
        format!("UPDATE runs SET heartbeat = 'soon' WHERE id = {}", ids[0])
    });
    let e = Store::open(&dir).unwrap().run_detail(ids[0]).unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "run {}'s row in table runs is damaged: column heartbeat holds text",
            ids[0]
        )),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn reads_do_not_wait_for_a_write_lock_another_process_holds() {
    let dir = temp_dir("held-lock");
    write_run(&dir, "a", 3);
    // another program holds a write transaction (for as long as it likes)
    let holder = rusqlite::Connection::open(dir.join(STORE_FILE)).unwrap();
    holder
        .execute_batch("BEGIN IMMEDIATE; UPDATE runs SET name = name;")
        .unwrap();
    let t = std::time::Instant::now();
    // opening checked the schema and marked stale runs under the write lock: 30 s, then
    // "database is locked"
    let store = Store::open(&dir).unwrap();
    assert_eq!(store.list_runs(None).unwrap().len(), 1);
    assert_eq!(store.mark_stale_unless_busy().unwrap(), 0);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    holder.execute_batch("ROLLBACK").unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_store_of_this_version_missing_a_later_table_gets_it_at_open() {
    // run_inputs came without a new schema version: a store made before it has version 2 and no
    // such table, and must get it at its next open (the open that skips the write lock for a
    // store of this version would leave it out)
    let dir = temp_dir("late-table");
    write_run(&dir, "a", 2);
    let conn = rusqlite::Connection::open(dir.join(STORE_FILE)).unwrap();
    conn.execute_batch("DROP TABLE run_inputs;").unwrap();
    drop(conn);
    let store = Store::open(&dir).unwrap();
    let id = store.list_runs(None).unwrap()[0].id;
    assert!(store.run_detail(id).unwrap().inputs.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
