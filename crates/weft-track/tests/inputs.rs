//! A run's inputs (`run_inputs`): recorded with the run, read back in order; initial weights
//! inside another run's recorded checkpoint folder name that run (and only a folder that holds
//! them: `step-4` is not `step-40`; data never); deleting that run clears the link; a resumed
//! run records an input it already has once, and one that changed beside it.

use std::path::{Path, PathBuf};

use weft_track::{NewRun, Resumed, RunInput, RunWriter, Status, Store, WriterOptions};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weft-track-inputs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn input(kind: &str, uri: &str, digest: Option<&str>) -> RunInput {
    RunInput {
        kind: kind.into(),
        uri: uri.into(),
        digest: digest.map(str::to_string),
        source_run: None,
    }
}

fn run(name: &str, inputs: Vec<RunInput>) -> NewRun {
    NewRun {
        experiment: "e".into(),
        name: Some(name.into()),
        inputs,
        ..Default::default()
    }
}

/// Starts run `name` with `inputs`, records `checkpoints` as its artifacts, ends it.
fn record(dir: &Path, name: &str, inputs: Vec<RunInput>, checkpoints: &[PathBuf]) -> RunWriter {
    let w = RunWriter::start(dir, run(name, inputs), WriterOptions::default()).unwrap();
    for c in checkpoints {
        w.artifact("checkpoint", c);
    }
    w.end(Status::Finished, None).unwrap();
    w
}

#[test]
fn inputs_are_recorded_and_initial_weights_name_the_run_whose_checkpoint_holds_them() {
    let dir = temp_dir("source");
    let data = dir.join("data.csv").display().to_string();
    let step4 = dir.join("ck").join("step-4");
    let a = record(
        &dir,
        "a",
        vec![input("data", &data, Some("sha256:aa"))],
        std::slice::from_ref(&step4),
    );
    let inside = step4.join("model.safetensors").display().to_string();
    let beside = dir
        .join("ck")
        .join("step-40")
        .join("model.safetensors")
        .display()
        .to_string();
    let b = record(
        &dir,
        "b",
        vec![
            input("data", &data, Some("sha256:aa")),
            input("init", &inside, Some("sha256:bb")),
        ],
        &[],
    );
    let c = record(&dir, "c", vec![input("init", &beside, None)], &[]);
    // the folder itself, as a registered folder names it
    let d = record(&dir, "d", vec![input("init", &step4.display().to_string(), None)], &[]);
    let store = Store::open_existing(&dir).unwrap();
    let got = store.run_detail(b.id()).unwrap().inputs;
    assert_eq!(
        got,
        vec![
            input("data", &data, Some("sha256:aa")),
            RunInput {
                source_run: Some(a.id()),
                ..input("init", &inside, Some("sha256:bb"))
            }
        ]
    );
    assert_eq!(store.inputs(c.id()).unwrap()[0].source_run, None);
    assert_eq!(store.inputs(d.id()).unwrap()[0].source_run, Some(a.id()));
    assert_eq!(store.checkpoint_owner(&inside).unwrap(), Some(a.id()));
    assert_eq!(store.checkpoint_owner(&beside).unwrap(), None);
    assert_eq!(store.inputs(999).unwrap(), []);
    // a data input is never "from" a run, even inside a checkpoint folder
    let e = record(&dir, "e", vec![input("data", &inside, None)], &[]);
    assert_eq!(store.inputs(e.id()).unwrap()[0].source_run, None);
    // deleting a: its inputs go, and b's weights no longer name it
    drop(store);
    let mut store = Store::open_existing(&dir).unwrap();
    store.delete_run(a.id()).unwrap();
    assert_eq!(store.inputs(a.id()).unwrap(), []);
    assert_eq!(store.inputs(b.id()).unwrap()[1].source_run, None);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_resumed_run_records_an_unchanged_input_once_and_a_changed_one_beside_it() {
    let dir = temp_dir("resume");
    let data = dir.join("shards").display().to_string();
    let own = dir.join("own").join("step-2");
    let first = vec![input("data", &data, Some("sha256:v1"))];
    let w = RunWriter::start(&dir, run("r", first.clone()), WriterOptions::default()).unwrap();
    let prior = w.run_ref().clone();
    w.artifact("checkpoint", &own);
    w.end(Status::Killed, None).unwrap();
    let resume =
        |inputs: Vec<RunInput>| match RunWriter::resume(&dir, &prior, 2, run("r", inputs), WriterOptions::default())
            .unwrap()
        {
            Resumed::Continued(w) => w.end(Status::Killed, None).unwrap(),
            Resumed::NotContinued(why) => panic!("{why:?}"),
        };
    resume(first.clone());
    let store = Store::open_existing(&dir).unwrap();
    assert_eq!(store.inputs(prior.run).unwrap(), first);
    // data prepared again under the same folder, and weights from the run's own checkpoint:
    // they are not "from" the run itself
    let own_weights = own.join("model.safetensors").display().to_string();
    resume(vec![
        input("data", &data, Some("sha256:v2")),
        input("init", &own_weights, None),
    ]);
    assert_eq!(
        store.inputs(prior.run).unwrap(),
        vec![
            input("data", &data, Some("sha256:v1")),
            input("data", &data, Some("sha256:v2")),
            input("init", &own_weights, None),
        ]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
