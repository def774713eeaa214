//! A resumed run continues its run in the store (`RunWriter::resume`): the metric rows after the
//! resume point go, the summary is recomputed with them, the run is `running` again and ends
//! with every step recorded once; a run that cannot be continued (another store, deleted, its id
//! given again, another experiment, still live) is left as it was.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection};
use weft_track::{
    MetricSummary, NewRun, NotContinued, Resumed, RunRef, RunWriter, Status, Store, WriterOptions, RESUMED_TAG,
    STORE_FILE,
};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weft-track-resume-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn options() -> WriterOptions {
    WriterOptions {
        batch: 3,
        flush_every: Duration::from_millis(2),
        ..Default::default()
    }
}

fn new_run(experiment: &str, params: &[(&str, &str)]) -> NewRun {
    NewRun {
        experiment: experiment.into(),
        name: Some("r".into()),
        command: "weft train".into(),
        host: "h".into(),
        layout: "dp=1 tp=1 pp=1 zero=0".into(),
        params: params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        tags: vec![("team".into(), "nlp".into())],
        ..Default::default()
    }
}

/// The loss logged at `step` by attempt `attempt` (attempts log different values, so a stale
/// row is told from a fresh one).
fn loss(step: u64, attempt: u64) -> f64 {
    10.0 / step as f64 + attempt as f64 * 100.0
}

/// Each key's summary straight from the run's metric rows (as tests/summary.rs checks it).
fn direct(dir: &Path, run: i64) -> BTreeMap<String, MetricSummary> {
    let conn = Connection::open(dir.join(STORE_FILE)).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT key, count(*), (SELECT m.value FROM metrics m WHERE m.run_id = g.run_id AND m.key = g.key
                                    ORDER BY m.step DESC, m.rowid DESC LIMIT 1),
                    MAX(step), MIN(value), MAX(value)
             FROM metrics g WHERE run_id = ?1 GROUP BY run_id, key",
        )
        .unwrap();
    let rows = stmt
        .query_map(params![run], |r| {
            Ok((
                r.get::<_, String>(0)?,
                MetricSummary {
                    count: r.get(1)?,
                    last: r.get(2)?,
                    last_step: r.get(3)?,
                    min: r.get(4)?,
                    max: r.get(5)?,
                },
            ))
        })
        .unwrap();
    rows.collect::<rusqlite::Result<_>>().unwrap()
}

/// `(step, value)` of `key`'s rows of run `id`, by step.
fn rows(store: &Store, id: i64, key: &str) -> Vec<(i64, f64)> {
    store
        .metric_rows(id)
        .unwrap()
        .into_iter()
        .filter(|r| r.1 == key)
        .map(|r| (r.0, r.2))
        .collect()
}

fn continued(r: Resumed) -> RunWriter {
    match r {
        Resumed::Continued(w) => w,
        Resumed::NotContinued(why) => panic!("not continued: {why}"),
    }
}

fn not_continued(r: Resumed) -> NotContinued {
    match r {
        Resumed::Continued(w) => panic!("run {} was continued", w.id()),
        Resumed::NotContinued(why) => why,
    }
}

#[test]
fn a_killed_run_resumed_after_step_6_ends_with_every_step_once() {
    let dir = temp_dir("killed");
    let w = RunWriter::start(
        &dir,
        new_run("e", &[("train.steps", "10"), ("optim.lr", "0.1")]),
        options(),
    )
    .unwrap();
    let id = w.id();
    let prior: RunRef = w.run_ref().clone();
    assert_eq!(
        (prior.run, prior.experiment.as_str(), prior.name.as_str()),
        (id, "e", "r")
    );
    assert_eq!(prior.store.len(), 32, "{prior:?}");
    for step in 1..=10 {
        w.log(step, "loss", loss(step, 0));
        w.log(step, "lr", 0.1);
    }
    w.log(10, "val_loss", 7.0);
    w.log(4, "val_loss", 3.0);
    for s in [4, 8] {
        w.artifact("checkpoint", &dir.join(format!("ck/step-{s:08}")));
    }
    w.artifact("trace", &dir.join("trace.json"));
    w.end(Status::Killed, Some("stopped by SIGTERM".into())).unwrap();

    // the resumed config changes train.steps and drops optim.lr
    let resumed = RunWriter::resume(&dir, &prior, 6, new_run("e", &[("train.steps", "12")]), options()).unwrap();
    let w = continued(resumed);
    assert_eq!((w.id(), w.name()), (id, "r"));
    assert_eq!(w.run_ref(), &prior);
    {
        let store = Store::open_existing(&dir).unwrap();
        let d = store.run_detail(id).unwrap();
        assert_eq!(d.summary.status, "running");
        assert_eq!(d.summary.end_time, None);
        assert_eq!(d.error, None);
        assert_eq!(d.summary.start_time, prior.start_time);
        assert_eq!(
            rows(&store, id, "loss"),
            (1..=6).map(|s| (s, loss(s as u64, 0))).collect::<Vec<_>>()
        );
        // val_loss at 10 went, at 4 stayed: its summary is the one row left
        assert_eq!(rows(&store, id, "val_loss"), [(4, 3.0)]);
        assert_eq!(d.metrics, direct(&dir, id));
        assert_eq!(d.metrics["loss"].count, 6);
        assert_eq!(d.metrics["loss"].last_step, 6);
        assert_eq!(d.metrics["loss"].last, loss(6, 0));
        assert_eq!(d.metrics["loss"].min, loss(6, 0));
        assert_eq!(d.metrics["loss"].max, loss(1, 0));
        assert_eq!(d.metrics["val_loss"].max, 3.0);
        assert_eq!(d.summary.params.get("train.steps").map(String::as_str), Some("12"));
        assert!(!d.summary.params.contains_key("optim.lr"), "{:?}", d.summary.params);
        assert_eq!(d.summary.tags.get(RESUMED_TAG).map(String::as_str), Some("6"));
        assert_eq!(d.summary.tags.get("team").map(String::as_str), Some("nlp"));
        // checkpoint artifacts are recorded again when the run ends; the trace stays
        assert_eq!(
            d.artifacts,
            [("trace".to_string(), dir.join("trace.json").display().to_string())]
        );
        assert!(weft_track::now() - d.heartbeat < 30.0);
    }
    for step in 7..=12 {
        w.log(step, "loss", loss(step, 1));
        w.log(step, "lr", 0.1);
    }
    w.artifact("trace", &dir.join("trace.json"));
    w.artifact("checkpoint", &dir.join("ck/step-00000012"));
    w.end(Status::Finished, None).unwrap();

    let store = Store::open_existing(&dir).unwrap();
    let runs = store.list_runs(None).unwrap();
    assert_eq!(runs.len(), 1, "{runs:?}");
    let d = store.run_detail(id).unwrap();
    assert_eq!(d.summary.status, "finished");
    assert!(d.summary.end_time.is_some());
    let expected: Vec<(i64, f64)> = (1..=12)
        .map(|s| (s, loss(s as u64, if s <= 6 { 0 } else { 1 })))
        .collect();
    assert_eq!(rows(&store, id, "loss"), expected);
    assert_eq!(rows(&store, id, "lr").len(), 12);
    assert_eq!(d.metrics, direct(&dir, id));
    assert_eq!(d.metrics["loss"].count, 12);
    assert_eq!(d.metrics["loss"].last, loss(12, 1));
    assert_eq!(runs[0].last["loss"], loss(12, 1));
    // the trace recorded again is not there twice
    assert_eq!(
        d.artifacts,
        [
            ("trace".to_string(), dir.join("trace.json").display().to_string()),
            (
                "checkpoint".to_string(),
                dir.join("ck/step-00000012").display().to_string()
            ),
        ]
    );

    // a finished run can be resumed too; the marker keeps each resume point
    let w = continued(RunWriter::resume(&dir, &prior, 12, new_run("e", &[]), options()).unwrap());
    w.log(13, "loss", 0.5);
    w.end(Status::Failed, Some("boom".into())).unwrap();
    let store = Store::open_existing(&dir).unwrap();
    let d = store.run_detail(id).unwrap();
    assert_eq!(d.summary.tags.get(RESUMED_TAG).map(String::as_str), Some("6,12"));
    assert_eq!(d.summary.status, "failed");
    assert_eq!(d.metrics["loss"].count, 13);
    assert_eq!(d.metrics, direct(&dir, id));
}

#[test]
fn a_run_that_cannot_be_continued_is_left_as_it_was() {
    let dir = temp_dir("refused");
    let other = temp_dir("refused-other");
    let w = RunWriter::start(&dir, new_run("e", &[("train.steps", "10")]), options()).unwrap();
    let prior = w.run_ref().clone();
    for step in 1..=10 {
        w.log(step, "loss", loss(step, 0));
    }
    // still running, its heartbeat fresh: another process records it
    std::thread::sleep(Duration::from_millis(50));
    let why = not_continued(RunWriter::resume(&dir, &prior, 6, new_run("e", &[]), options()).unwrap());
    assert!(matches!(why, NotContinued::Live(age) if age < 30.0), "{why:?}");
    assert!(why.to_string().contains("still running"), "{why}");
    w.end(Status::Killed, None).unwrap();

    // another store (a fresh one gets an id of its own)
    let why = not_continued(RunWriter::resume(&other, &prior, 6, new_run("e", &[]), options()).unwrap());
    assert_eq!(why, NotContinued::OtherStore(other.join(STORE_FILE)));
    // another experiment
    let why = not_continued(RunWriter::resume(&dir, &prior, 6, new_run("f", &[]), options()).unwrap());
    assert_eq!(why, NotContinued::OtherExperiment("f".into()));
    // a store id that is not this store's, at the same path
    let moved = RunRef {
        store: "0".repeat(32),
        ..prior.clone()
    };
    let why = not_continued(RunWriter::resume(&dir, &moved, 6, new_run("e", &[]), options()).unwrap());
    assert!(matches!(why, NotContinued::OtherStore(_)), "{why:?}");

    // none of them changed the run
    let store = Store::open_existing(&dir).unwrap();
    let d = store.run_detail(prior.run).unwrap();
    assert_eq!(d.summary.status, "killed");
    assert_eq!(rows(&store, prior.run, "loss").len(), 10);
    assert!(!d.summary.tags.contains_key(RESUMED_TAG));
    assert_eq!(d.summary.params.get("train.steps").map(String::as_str), Some("10"));

    // deleted: the next run gets an id of its own (ids are never handed out twice)
    let mut store = Store::open_existing(&dir).unwrap();
    store.delete_run(prior.run).unwrap();
    drop(store);
    let why = not_continued(RunWriter::resume(&dir, &prior, 6, new_run("e", &[]), options()).unwrap());
    assert_eq!(why, NotContinued::Deleted);
    let next = RunWriter::start(&dir, new_run("e", &[]), options()).unwrap();
    next.end(Status::Finished, None).unwrap();
    assert_ne!(next.id(), prior.run, "the deleted run's id given again");
    // a store written by a weft that handed deleted ids out again: the id names another run
    let conn = Connection::open(dir.join(STORE_FILE)).unwrap();
    conn.execute_batch("PRAGMA foreign_keys = OFF").unwrap();
    conn.execute("UPDATE runs SET id = ?1 WHERE id = ?2", params![prior.run, next.id()])
        .unwrap();
    drop(conn);
    let why = not_continued(RunWriter::resume(&dir, &prior, 6, new_run("e", &[]), options()).unwrap());
    assert_eq!(why, NotContinued::Replaced);
    let store = Store::open_existing(&dir).unwrap();
    assert_eq!(store.run_detail(prior.run).unwrap().summary.status, "finished");
}

/// A NaN the run met after the step it resumes from goes with those steps (its `nan_step`
/// tag, which holds the last step a metric was NaN at); one last met before stays.
#[test]
fn a_nan_after_the_resumed_step_is_forgotten() {
    let dir = temp_dir("nan");
    let w = RunWriter::start(&dir, new_run("e", &[]), options()).unwrap();
    let id = w.id();
    let prior: RunRef = w.run_ref().clone();
    w.log(2, "val_loss", f64::NAN);
    w.log(4, "val_loss", 1.0);
    w.log(8, "val_loss", f64::NAN);
    w.log(3, "loss", f64::NAN);
    w.end(Status::Killed, None).unwrap();
    let tags = |dir: &Path| Store::open(dir).unwrap().run_detail(id).unwrap().summary.tags;
    assert_eq!(tags(&dir).get("nan_step.val_loss").map(String::as_str), Some("8"));
    let w = continued(RunWriter::resume(&dir, &prior, 6, new_run("e", &[]), options()).unwrap());
    w.end(Status::Finished, None).unwrap();
    let after = tags(&dir);
    assert_eq!(after.get("nan_step.val_loss"), None, "{after:?}");
    assert_eq!(after.get("nan_step.loss").map(String::as_str), Some("3"), "{after:?}");
}
