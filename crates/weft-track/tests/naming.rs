//! Naming a run from the command line (`Store::find_run`): ids are plain digits, a string that
//! names two runs is refused rather than guessed, and `EXPERIMENT/NAME` splits at any `/`.

use std::path::{Path, PathBuf};

use weft_track::{Error, NewRun, RunWriter, Status, Store, WriterOptions};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weft-track-naming-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Records a finished run `experiment/name`; its id.
fn record(dir: &Path, experiment: &str, name: &str) -> i64 {
    let run = NewRun {
        experiment: experiment.into(),
        name: Some(name.into()),
        ..Default::default()
    };
    let w = RunWriter::start(dir, run, WriterOptions::default()).unwrap();
    w.log(1, "loss", 1.0);
    let id = w.id();
    w.end(Status::Finished, None).unwrap();
    id
}

fn ambiguous(store: &Store, what: &str) -> String {
    match store.find_run(what) {
        Err(e @ Error::UnknownRun(_)) => e.to_string(),
        other => panic!("{what}: {other:?}"),
    }
}

#[test]
fn an_id_is_plain_digits_and_a_string_naming_an_id_and_a_name_is_refused() {
    let dir = temp_dir("ids");
    let ids: Vec<i64> = (1..=7).map(|n| record(&dir, "exp", &format!("n{n}"))).collect();
    assert_eq!(ids, (1..=7).collect::<Vec<_>>());
    let padded = record(&dir, "exp", "007");
    let signed = record(&dir, "exp", "+7");
    let three = record(&dir, "exp", "3");
    let other_n1 = record(&dir, "other", "n1");
    let mut store = Store::open_existing(&dir).unwrap();
    // `007` and `+7` are names, never id 7 (`weft runs delete 007` deleted run 7)
    assert_eq!(store.find_run("007").unwrap(), padded);
    assert_eq!(store.find_run("+7").unwrap(), signed);
    assert_eq!(store.find_run("7").unwrap(), 7);
    assert_eq!(store.find_run("exp/n7").unwrap(), 7);
    // `3` is run 3's id and run `three`'s name: refused, naming both and how to pick
    let e = ambiguous(&store, "3");
    for want in [
        "\"3\" is ambiguous",
        "run 3 (\"exp/n3\", by its id)",
        &format!("run {three} (\"exp/3\", by its name)"),
        "EXPERIMENT/NAME",
    ] {
        assert!(e.contains(want), "{want} in {e}");
    }
    assert_eq!(store.find_run("exp/3").unwrap(), three);
    assert_eq!(store.find_run("exp/n3").unwrap(), 3);
    // one name in two experiments
    let e = ambiguous(&store, "n1");
    assert!(
        e.contains("run 1 (\"exp/n1\", by its name)") && e.contains(&format!("run {other_n1} (\"other/n1\"")),
        "{e}"
    );
    assert!(e.contains("or by its id"), "{e}");
    assert_eq!(store.find_run("other/n1").unwrap(), other_n1);
    // a padded number that names nothing says how an id is written
    let e = ambiguous(&store, "0005");
    assert!(
        e.contains("no run \"0005\"") && e.contains("plain digits") && e.ends_with(": 5)"),
        "{e}"
    );
    // deleting what `007` names leaves run 7
    let id = store.find_run("007").unwrap();
    store.delete_run(id).unwrap();
    assert!(store.has_run(7).unwrap());
    assert!(!store.has_run(padded).unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn experiment_and_run_names_holding_slashes_can_be_named() {
    let dir = temp_dir("slashes");
    let x = record(&dir, "e/f", "x");
    let ab = record(&dir, "z", "a/b");
    let store = Store::open_existing(&dir).unwrap();
    // split at the first `/` only, `e/f/x` was experiment `e`, run `f/x`: no such run
    assert_eq!(store.find_run("e/f/x").unwrap(), x);
    assert_eq!(store.find_run("x").unwrap(), x);
    assert_eq!(store.find_run("z/a/b").unwrap(), ab);
    assert_eq!(store.find_run("a/b").unwrap(), ab);
    assert!(store.find_run("e/x").is_err());
    drop(store);
    // now `e/f/x` is also experiment `e`'s run `f/x`: refused, naming both
    let fx = record(&dir, "e", "f/x");
    let store = Store::open_existing(&dir).unwrap();
    let e = ambiguous(&store, "e/f/x");
    assert!(
        e.contains(&format!("run {x} (\"e/f/x\"")) && e.contains(&format!("run {fx} (\"e/f/x\"")),
        "{e}"
    );
    assert_eq!(store.find_run(&fx.to_string()).unwrap(), fx);
    let _ = std::fs::remove_dir_all(&dir);
}
