//! The per-run metric summary (`metric_summary`: last, min, max and count of each run's keys,
//! kept by the writer): what `list_runs`, `run_detail` and so `weft runs list`, its filters and
//! sorts and the dashboard read must equal a direct query over the metric rows, for runs written
//! in many small flushes, by concurrent writers, and for a store written before the table
//! existed (filled when it is opened).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection};
use weft_track::filter::{sort_runs, Filter};
use weft_track::{NewRun, RunSummary, RunWriter, Status, Store, WriterOptions, STORE_FILE};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weft-track-summary-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `(last, last_step, min, max, count)` of each `(run, key)`, straight from the metric rows.
type Direct = BTreeMap<(i64, String), (f64, i64, f64, f64, i64)>;

fn direct(dir: &Path) -> Direct {
    direct_in(&Connection::open(dir.join(STORE_FILE)).unwrap())
}

fn direct_in(conn: &Connection) -> Direct {
    let mut stmt = conn
        .prepare(
            "SELECT run_id, key, (SELECT m.value FROM metrics m WHERE m.run_id = g.run_id AND m.key = g.key
                                  ORDER BY m.step DESC, m.rowid DESC LIMIT 1),
                    MAX(step), MIN(value), MAX(value), count(*)
             FROM metrics g GROUP BY run_id, key",
        )
        .unwrap();
    let rows = stmt
        .query_map([], |r| {
            Ok((
                (r.get(0)?, r.get(1)?),
                (r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?),
            ))
        })
        .unwrap();
    rows.collect::<rusqlite::Result<_>>().unwrap()
}

/// Records run `name` of `experiment` in flushes of 5 rows: `steps` steps of `loss` (falling, the
/// last step logged twice: the second value is its last), `acc` from step 3, an infinite
/// `gnorm` at one step, and `late` logged with steps going backwards (its last value is at its
/// largest step, written first).
fn write_run(dir: &Path, experiment: &str, name: &str, seed: u64, steps: u64) -> i64 {
    let options = WriterOptions {
        batch: 5,
        flush_every: Duration::from_millis(2),
        ..Default::default()
    };
    let run = NewRun {
        experiment: experiment.into(),
        name: Some(name.into()),
        params: vec![("optim.lr".into(), format!("{}", 1e-4 * (1 + seed % 7) as f64))],
        ..Default::default()
    };
    let w = RunWriter::start(dir, run, options).unwrap();
    let x = (seed % 13) as f64;
    for s in 1..=steps {
        w.log(s, "loss", (x + 1.0) / s as f64);
        if s >= 3 {
            w.log(s, "acc", ((s * 7 + seed) % 11) as f64);
        }
        if s == 4 {
            w.log(s, "gnorm", f64::INFINITY);
        } else if s % 2 == 0 {
            w.log(s, "gnorm", -(s as f64) * x);
        }
    }
    w.log(steps, "loss", x / 100.0);
    for s in (1..=steps).rev() {
        w.log(s, "late", s as f64 + x);
    }
    let id = w.id();
    w.end(Status::Finished, None).unwrap();
    id
}

/// Checks every run's list values and details against the metric rows, and that filters and
/// sorts over `list_runs` give what they give over the direct values.
fn check(dir: &Path) {
    let want = direct(dir);
    assert!(!want.is_empty());
    let store = Store::open(dir).unwrap();
    let runs = store.list_runs(None).unwrap();
    let mut seen = 0;
    for r in &runs {
        let detail = store.run_detail(r.id).unwrap();
        let keys: Vec<String> = want
            .keys()
            .filter(|(id, _)| *id == r.id)
            .map(|(_, k)| k.clone())
            .collect();
        assert_eq!(store.metric_keys(r.id).unwrap(), keys, "run {}", r.id);
        assert_eq!(r.last.len(), keys.len(), "run {}", r.id);
        assert_eq!(detail.metrics.len(), keys.len(), "run {}", r.id);
        for k in keys {
            let (last, last_step, min, max, count) = want[&(r.id, k.clone())];
            assert_eq!(r.last[&k], last, "run {} {k}", r.id);
            assert_eq!(detail.summary.last[&k], last, "run {} {k}", r.id);
            let m = &detail.metrics[&k];
            assert_eq!(
                (m.last, m.last_step, m.min, m.max, m.count),
                (last, last_step, min, max, count)
            );
            seen += 1;
        }
    }
    assert_eq!(seen, want.len());
    // one experiment's list holds its runs with the same values
    let one = store.list_runs(Some("b")).unwrap();
    assert!(!one.is_empty());
    for r in &one {
        assert_eq!(r.experiment, "b");
        assert_eq!(Some(r), runs.iter().find(|x| x.id == r.id));
    }
    // filters and sorts: the same runs, in the same order, as over the direct values
    let mut reference: Vec<RunSummary> = runs.clone();
    for r in &mut reference {
        r.last = want
            .iter()
            .filter(|((id, _), _)| *id == r.id)
            .map(|((_, k), v)| (k.clone(), v.0))
            .collect();
    }
    let ids = |rs: &[RunSummary]| rs.iter().map(|r| r.id).collect::<Vec<_>>();
    for expr in [
        "metrics.loss < 0.05",
        "metrics.acc >= 5 and optim.lr < 5e-4",
        "metrics.gnorm > 1e300",
    ] {
        let f = Filter::parse(expr).unwrap();
        let got: Vec<RunSummary> = runs.iter().filter(|r| f.matches(r)).cloned().collect();
        let want: Vec<RunSummary> = reference.iter().filter(|r| f.matches(r)).cloned().collect();
        assert_eq!(ids(&got), ids(&want), "{expr}");
    }
    for key in ["metrics.loss", "-metrics.acc", "metrics.late", "-metrics.gnorm"] {
        let (mut got, mut want) = (runs.clone(), reference.clone());
        sort_runs(&mut got, key);
        sort_runs(&mut want, key);
        assert_eq!(ids(&got), ids(&want), "{key}");
    }
}

#[test]
fn list_and_detail_values_equal_a_direct_query_over_the_metrics() {
    let dir = temp_dir("direct");
    for i in 0..12u64 {
        let experiment = if i % 3 == 0 { "b" } else { "a" };
        write_run(&dir, experiment, &format!("r{i}"), i, 10 + i * 3);
    }
    // a run with no metrics has none in the list
    let w = RunWriter::start(&dir, NewRun::default(), WriterOptions::default()).unwrap();
    let empty = w.id();
    w.end(Status::Finished, None).unwrap();
    check(&dir);
    let store = Store::open(&dir).unwrap();
    let r = store
        .list_runs(None)
        .unwrap()
        .into_iter()
        .find(|r| r.id == empty)
        .unwrap();
    assert!(r.last.is_empty());
    // a deleted run leaves no summary behind
    let mut store = store;
    let gone = store.list_runs(Some("b")).unwrap()[0].id;
    store.delete_run(gone).unwrap();
    let conn = Connection::open(dir.join(STORE_FILE)).unwrap();
    let left: i64 = conn
        .query_row(
            "SELECT count(*) FROM metric_summary WHERE run_id = ?1",
            params![gone],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(left, 0);
    drop(conn);
    check(&dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Turns the store in `dir` into one as the code before the summary wrote it: no
/// `metric_summary`, schema version 1.
fn make_version_1(dir: &Path) {
    let conn = Connection::open(dir.join(STORE_FILE)).unwrap();
    conn.execute_batch("DROP TABLE metric_summary; UPDATE meta SET value = '1' WHERE key = 'schema_version';")
        .unwrap();
}

fn schema_version(dir: &Path) -> String {
    let conn = Connection::open(dir.join(STORE_FILE)).unwrap();
    conn.query_row("SELECT value FROM meta WHERE key = 'schema_version'", [], |r| r.get(0))
        .unwrap()
}

#[test]
fn a_store_written_before_the_summary_gets_it_when_opened() {
    let dir = temp_dir("migrate");
    for i in 0..6u64 {
        write_run(&dir, if i % 2 == 0 { "a" } else { "b" }, &format!("r{i}"), i, 12 + i);
    }
    make_version_1(&dir);
    // opened by several at once: one fills the table, the others wait for it
    let openers: Vec<_> = (0..4)
        .map(|_| {
            let dir = dir.clone();
            std::thread::spawn(move || drop(Store::open(&dir).unwrap()))
        })
        .collect();
    for t in openers {
        t.join().unwrap();
    }
    assert_eq!(schema_version(&dir), "2");
    check(&dir);
    // and a writer goes on from the filled summary
    write_run(&dir, "b", "after", 5, 20);
    check(&dir);
    // a writer starting on the old store fills it too (it opens the store first)
    make_version_1(&dir);
    write_run(&dir, "a", "first", 3, 9);
    assert_eq!(schema_version(&dir), "2");
    check(&dir);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn concurrent_writers_keep_the_summary_right() {
    let dir = temp_dir("concurrent");
    drop(Store::open(&dir).unwrap());
    let writers: Vec<_> = (0..8u64)
        .map(|i| {
            let dir = dir.clone();
            std::thread::spawn(move || {
                write_run(&dir, if i % 2 == 0 { "a" } else { "b" }, &format!("w{i}"), i, 150);
            })
        })
        .collect();
    // read while they write, the summary agrees with the rows: the writer changes both in one
    // transaction
    std::thread::sleep(Duration::from_millis(50));
    for _ in 0..20 {
        let mut conn = Connection::open(dir.join(STORE_FILE)).unwrap();
        conn.busy_timeout(Duration::from_secs(30)).unwrap();
        let tx = conn.transaction().unwrap();
        let rows = direct_in(&tx);
        let mut stmt = tx
            .prepare("SELECT run_id, key, last, last_step, min, max, count FROM metric_summary")
            .unwrap();
        let summary: Direct = stmt
            .query_map([], |r| {
                Ok((
                    (r.get(0)?, r.get(1)?),
                    (r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?),
                ))
            })
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(summary, rows);
        drop(stmt);
        drop(tx);
        std::thread::sleep(Duration::from_millis(10));
    }
    for t in writers {
        t.join().unwrap();
    }
    check(&dir);
    let store = Store::open(&dir).unwrap();
    assert_eq!(store.list_runs(None).unwrap().len(), 8);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_value_added_to_an_ended_run_keeps_the_summary_right() {
    let dir = temp_dir("add-metric");
    let id = write_run(&dir, "b", "a", 3, 8);
    let mut store = Store::open(&dir).unwrap();
    // a later step becomes the last value, an earlier one only the count and range
    store.add_metric(id, 8, "eval/val_loss", 1.25).unwrap();
    store.add_metric(id, 20, "loss", -5.0).unwrap();
    store.add_metric(id, 2, "acc", 99.0).unwrap();
    // made again at the same step: replaced, not added beside
    store.add_metric(id, 8, "eval/val_loss", 1.5).unwrap();
    store.add_metric(id, 8, "eval/val_loss", 1.25).unwrap();
    drop(store);
    check(&dir);
    let store = Store::open(&dir).unwrap();
    let detail = store.run_detail(id).unwrap();
    let loss = &detail.metrics["loss"];
    assert_eq!((loss.last, loss.last_step, loss.min), (-5.0, 20, -5.0));
    assert_eq!(detail.metrics["acc"].max, 99.0);
    assert_eq!(detail.metrics["eval/val_loss"].count, 1);
    drop(store);
    let mut store = Store::open(&dir).unwrap();
    let unknown = store.add_metric(999, 1, "loss", 1.0).unwrap_err().to_string();
    assert!(unknown.contains("no run with id 999"), "{unknown}");
    let nan = store.add_metric(id, 1, "loss", f64::NAN).unwrap_err().to_string();
    assert!(nan.contains("not a finite number"), "{nan}");
}
