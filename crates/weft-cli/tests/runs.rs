//! `weft train` records runs in the run store of its working directory, and `weft runs` lists,
//! filters, compares, deletes and exports them; failed and stopped runs show as such.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{ok_stdout, path_set, read_metrics, temp_dir, wait_for, weft_bin, weft_in, TINY_GPT};

/// `train` of [`TINY_GPT`] for `steps` steps with more `--set`s.
fn train_args<'a>(steps: &'a str, sets: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["train", "--quiet", "--set", steps];
    for s in TINY_GPT.iter().chain(sets) {
        args.extend(["--set", s]);
    }
    args
}

fn json(cwd: &Path, args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&ok_stdout(weft_in(cwd, args), &format!("{args:?}"))).unwrap()
}

#[test]
fn two_runs_are_listed_filtered_compared_exported_and_deleted() {
    let dir = temp_dir("runs-two");
    let metrics = dir.join("a.jsonl");
    let m = path_set("train.metrics", &metrics);
    ok_stdout(
        weft_in(
            &dir,
            &train_args("train.steps=5", &["optim.lr=0.001", "track.name=\"a\"", &m]),
        ),
        "run a",
    );
    ok_stdout(
        weft_in(
            &dir,
            &train_args("train.steps=5", &["optim.lr=0.002", "track.name=\"b\""]),
        ),
        "run b",
    );
    assert!(dir.join("weft-runs/runs.db").is_file());

    let runs = json(&dir, &["runs", "list", "--json"]);
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[0]["name"], "a");
    assert_eq!(runs[1]["name"], "b");
    for r in runs {
        assert_eq!(r["status"], "finished");
        assert_eq!(r["experiment"], "default");
        assert_eq!(r["params"]["model.n_layer"], "2");
    }
    assert_eq!(runs[0]["params"]["optim.lr"], "0.001");
    // the machine, as system tags
    let cpus: usize = runs[0]["tags"]["sys.cpus"].as_str().unwrap().parse().unwrap();
    assert!(cpus >= 1);
    assert!(runs[0]["tags"]["sys.os"].as_str().unwrap().contains('/'));
    assert_eq!(runs[1]["params"]["optim.lr"], "0.002");
    // the last loss is the metrics file's last step's
    let file = read_metrics(&metrics);
    let last = file.iter().rfind(|r| r.get("loss").is_some()).unwrap();
    assert_eq!(last["step"], 5);
    assert_eq!(
        runs[0]["metrics"]["loss"].as_f64().unwrap(),
        last["loss"].as_f64().unwrap()
    );
    assert_ne!(runs[0]["metrics"]["loss"], runs[1]["metrics"]["loss"]);

    let picked = json(
        &dir,
        &[
            "runs",
            "list",
            "--json",
            "--filter",
            "optim.lr > 0.0015 and status = 'finished'",
        ],
    );
    let names: Vec<&str> = picked
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["b"]);
    let sorted = json(&dir, &["runs", "list", "--json", "--sort", "-optim.lr"]);
    assert_eq!(sorted[0]["name"], "b");

    let bad = weft_in(&dir, &["runs", "list", "--filter", "optim.lr <> 1"]);
    assert_eq!(bad.status.code(), Some(1));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("at character 11") && err.contains("a number or a quoted string"),
        "{err}"
    );

    let cmp = json(&dir, &["runs", "compare", "a", "b", "--json"]);
    let params = cmp["params"].as_object().unwrap();
    // only run a wrote a metrics file
    assert_eq!(
        params.keys().collect::<Vec<_>>(),
        ["optim.lr", "train.metrics"],
        "{cmp}"
    );
    assert_eq!(cmp["params"]["optim.lr"], serde_json::json!(["0.001", "0.002"]));
    assert_eq!(cmp["metrics"]["loss"].as_array().unwrap().len(), 2);
    let text = ok_stdout(weft_in(&dir, &["runs", "compare", "a", "b"]), "compare");
    assert!(
        text.contains("optim.lr") && text.contains("loss last/min/max"),
        "{text}"
    );

    let csv = ok_stdout(weft_in(&dir, &["runs", "export", "a", "--format", "csv"]), "export");
    let losses: Vec<f64> = csv
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[1] == "loss").then(|| f[2].parse().unwrap())
        })
        .collect();
    let want: Vec<f64> = file
        .iter()
        .filter_map(|r| r["loss"].as_f64().filter(|_| r.get("lr").is_some()))
        .collect();
    assert_eq!(losses, want);
    assert_eq!(csv.lines().next(), Some("step,key,value,time"));

    let shown = json(&dir, &["runs", "show", "b", "--json"]);
    assert_eq!(shown["layout"], "dp=1 tp=1 pp=1 zero=0");
    assert!(shown["command"].as_str().unwrap().contains("train"));
    assert_eq!(shown["metric_summaries"]["loss"]["count"], 5);

    ok_stdout(weft_in(&dir, &["runs", "delete", "a"]), "delete");
    let left = json(&dir, &["runs", "list", "--json"]);
    assert_eq!(left.as_array().unwrap().len(), 1);
    assert_eq!(left[0]["name"], "b");
    let gone = weft_in(&dir, &["runs", "show", "a"]);
    assert_eq!(gone.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&gone.stderr).contains("no run \"a\""));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_failed_run_and_a_stopped_run_say_so() {
    let dir = temp_dir("runs-fail");
    // a learning rate that makes the loss non-finite: `fit` fails after its first steps
    let out = weft_in(
        &dir,
        &train_args(
            "train.steps=50",
            &["optim.lr=1e30", "optim.grad_clip=1e30", "track.name=\"nan\""],
        ),
    );
    assert!(!out.status.success());
    let runs = json(&dir, &["runs", "list", "--json", "--filter", "status = 'failed'"]);
    assert_eq!(
        runs.as_array().unwrap().len(),
        1,
        "{runs}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = json(&dir, &["runs", "show", "nan", "--json"]);
    let error = shown["error"].as_str().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(error), "{error} not in:\n{stderr}");

    // stopped by SIGTERM while training: killed, with the signal
    let args = train_args("train.steps=1000000", &["track.name=\"long\""]);
    let child = Command::new(weft_bin())
        .args(&args)
        .current_dir(&dir)
        .env("WEFT_NUM_THREADS", "2")
        .env_remove("WEFT_TRACK_DIR")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let running = wait_for(60, || {
        let out = weft_in(
            &dir,
            &[
                "runs",
                "list",
                "--json",
                "--filter",
                "name = 'long' and metrics.loss > 0",
            ],
        );
        out.status.success()
            && serde_json::from_slice::<serde_json::Value>(&out.stdout).is_ok_and(|v| v[0]["status"] == "running")
    });
    assert!(running, "the run was not recorded as running with a loss");
    assert!(Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(143));
    let shown = json(&dir, &["runs", "show", "long", "--json"]);
    assert_eq!(shown["status"], "killed");
    assert_eq!(shown["error"], "stopped by SIGTERM");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_corrupt_store_is_named_and_the_run_trains_untracked() {
    let dir = temp_dir("runs-corrupt");
    std::fs::create_dir_all(dir.join("weft-runs")).unwrap();
    std::fs::write(dir.join("weft-runs/runs.db"), vec![7u8; 4096]).unwrap();
    let out = weft_in(&dir, &train_args("train.steps=5", &[]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("weft-runs/runs.db") && err.contains("not recorded"),
        "{err}"
    );
    let list = weft_in(&dir, &["runs", "list"]);
    assert_eq!(list.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&list.stderr).contains("not a weft run store"));
    // tracking off: nothing is written
    let off = temp_dir("runs-off");
    ok_stdout(
        weft_in(&off, &train_args("train.steps=5", &["track.enabled=false"])),
        "untracked run",
    );
    assert!(!off.join("weft-runs").exists());
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&off);
}

#[test]
fn a_runs_generated_sample_is_one_of_its_artifacts() {
    let dir = temp_dir("runs-sample");
    let out = ok_stdout(
        weft_in(
            &dir,
            &train_args("train.steps=3", &["train.sample_tokens=24", "track.name=\"s\""]),
        ),
        "run s",
    );
    let heading = "--- sample (24 characters) ---\n";
    let at = out.find(heading).unwrap_or_else(|| panic!("a sample printed:\n{out}"));
    let printed = out[at + heading.len()..].strip_suffix('\n').unwrap();
    assert_eq!(printed.chars().count(), 25, "a new line and 24 characters: {printed:?}");
    let run = json(&dir, &["runs", "show", "s", "--json"]);
    let samples: Vec<&serde_json::Value> = run["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["kind"] == "sample")
        .collect();
    assert_eq!(samples.len(), 1, "{run}");
    let path = Path::new(samples[0]["path"].as_str().unwrap());
    assert_eq!(path, dir.join("weft-runs/default/s/sample.txt"), "recorded absolute");
    assert_eq!(std::fs::read_to_string(path).unwrap(), printed);
}

#[test]
fn a_live_run_is_deleted_only_with_force() {
    let dir = temp_dir("runs-live");
    let store = dir.join("weft-runs");
    let run = weft_track::NewRun {
        experiment: "e".into(),
        name: Some("live".into()),
        ..Default::default()
    };
    // a run being recorded: `running`, its heartbeat fresh
    let w = weft_track::RunWriter::start(&store, run, weft_track::WriterOptions::default()).unwrap();
    w.log(0, "loss", 1.0);
    let refused = weft_in(&dir, &["runs", "delete", "live"]);
    assert_eq!(refused.status.code(), Some(1));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("still running") && err.contains("--force"), "{err}");
    assert_eq!(json(&dir, &["runs", "list", "--json"]).as_array().unwrap().len(), 1);
    ok_stdout(weft_in(&dir, &["runs", "delete", "live", "--force"]), "delete --force");
    assert_eq!(json(&dir, &["runs", "list", "--json"]).as_array().unwrap().len(), 0);
    // its writer learns at its end that the run is gone
    let e = w
        .end(weft_track::Status::Finished, None)
        .expect_err("the run was deleted");
    assert!(e.to_string().contains("deleted"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
