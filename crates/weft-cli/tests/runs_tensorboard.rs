//! TensorBoard event files: `[track] tensorboard = true` writes one in the run's folder of the
//! store, `weft runs export --format tensorboard` writes one from the store; both read back
//! record by record (checksums and values), and the exported one through TensorBoard's own
//! reader (tools/reference/read_tensorboard.py) when Python has the `tensorboard` package.

mod common;

#[path = "../../weft-track/tests/support/tfevents.rs"]
mod tfevents;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{ok_stdout, repo, temp_dir, weft_in, TINY_GPT};

/// The one `events.out.tfevents.*` file in `dir`.
fn event_file(dir: &Path) -> PathBuf {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("events.out.tfevents.")
        })
        .collect();
    assert_eq!(files.len(), 1, "{files:?} in {}", dir.display());
    files[0].clone()
}

/// `(key, step) -> (value, time)` of the store's CSV export.
fn store_rows(cwd: &Path, run: &str) -> BTreeMap<(String, i64), (f64, f64)> {
    let csv = ok_stdout(weft_in(cwd, &["runs", "export", run]), "csv export");
    csv.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (
                (f[1].to_string(), f[0].parse().unwrap()),
                (f[2].parse().unwrap(), f[3].parse().unwrap()),
            )
        })
        .collect()
}

/// `(key, step) -> value` of an event file, every record's checksums checked.
fn file_scalars(path: &Path) -> (Vec<tfevents::Event>, BTreeMap<(String, i64), f32>) {
    let events = tfevents::read(&std::fs::read(path).unwrap());
    assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
    let mut scalars = BTreeMap::new();
    for e in &events[1..] {
        assert_eq!(e.values.len(), 1, "{e:?}");
        let (tag, v) = &e.values[0];
        assert!(
            scalars.insert((tag.clone(), e.step), *v).is_none(),
            "{tag} at {} twice",
            e.step
        );
    }
    (events, scalars)
}

#[test]
fn event_files_from_training_and_from_the_store() {
    let dir = temp_dir("runs-tensorboard");
    let mut args = vec!["train", "--quiet"];
    let own = [
        "train.steps=6",
        "track.name=\"tb\"",
        "track.experiment=\"exp\"",
        "track.tensorboard=true",
    ];
    for s in TINY_GPT.iter().chain(&own) {
        args.extend(["--set", s]);
    }
    ok_stdout(weft_in(&dir, &args), "train");
    let rows = store_rows(&dir, "tb");
    assert_eq!(rows.keys().filter(|(k, _)| k == "loss").count(), 6, "{rows:?}");

    // written while training, in the run's folder of the store
    let trained = event_file(&dir.join("weft-runs/exp/tb"));
    let (_, scalars) = file_scalars(&trained);
    let expected: BTreeMap<(String, i64), f32> = rows.iter().map(|(k, (v, _))| (k.clone(), *v as f32)).collect();
    assert_eq!(scalars, expected);
    let show = ok_stdout(weft_in(&dir, &["runs", "show", "tb"]), "show");
    assert!(show.contains("artifact tensorboard:"), "{show}");

    // exported from the store: the same scalars, each at the time the store holds
    let out = dir.join("export");
    let printed = ok_stdout(
        weft_in(
            &dir,
            &[
                "runs",
                "export",
                "exp/tb",
                "--format",
                "tensorboard",
                "--output",
                "export",
            ],
        ),
        "tensorboard export",
    );
    let exported = event_file(&out);
    assert_eq!(Path::new(printed.trim()).file_name(), exported.file_name());
    let (events, scalars) = file_scalars(&exported);
    assert_eq!(scalars, expected);
    for e in &events[1..] {
        let (v, time) = rows[&(e.values[0].0.clone(), e.step)];
        assert_eq!(e.values[0].1, v as f32);
        assert!((e.wall_time - time).abs() < 1e-3, "{} vs {time}", e.wall_time);
    }
    let steps: Vec<i64> = events[1..].iter().map(|e| e.step).collect();
    assert!(steps.windows(2).all(|w| w[0] <= w[1]), "by step: {steps:?}");

    let bad = weft_in(&dir, &["runs", "export", "tb", "--format", "parquet"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("csv and tensorboard"));

    // TensorBoard's own reader
    // WEFT_PYTHON, else the environment tools/reference/install-tensorboard.sh makes (.ci/run
    // calls it), else python3
    let venv = repo().join(".cache/tensorboard-venv/bin/python");
    let python = std::env::var("WEFT_PYTHON").unwrap_or_else(|_| {
        if venv.exists() {
            venv.to_string_lossy().into_owned()
        } else {
            "python3".into()
        }
    });
    let has_tb = Command::new(&python)
        .args(["-c", "import tensorboard"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_tb {
        eprintln!("skipped: TensorBoard's reader check ({python} cannot import tensorboard; tools/reference/install-tensorboard.sh installs it)");
        return;
    }
    let read = Command::new(&python)
        .arg(repo().join("tools/reference/read_tensorboard.py"))
        .arg(&out)
        .output()
        .unwrap();
    let read: serde_json::Value = serde_json::from_str(&ok_stdout(read, "read_tensorboard.py")).unwrap();
    // EventAccumulator keeps the number after "brain.Event:"
    assert_eq!(read["file_version"], 2.0);
    let mut seen = 0;
    for (tag, points) in read["scalars"].as_object().unwrap() {
        for p in points.as_array().unwrap() {
            let step = p[0].as_i64().unwrap();
            let value = p[1].as_f64().unwrap();
            let wall = p[2].as_f64().unwrap();
            assert_eq!(value as f32, expected[&(tag.clone(), step)], "{tag} at {step}");
            assert!((wall - rows[&(tag.clone(), step)].1).abs() < 1e-3);
            seen += 1;
        }
    }
    assert_eq!(seen, expected.len(), "{read}");
    eprintln!(
        "TensorBoard {} read {seen} scalars back exactly",
        read["tensorboard_version"].as_str().unwrap_or("?")
    );
}
