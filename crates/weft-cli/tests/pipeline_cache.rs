//! `weft pipeline`'s cache follows what a step reads, not only the files it names: a sweep
//! step's base config (named inside the sweep file), the data file a train or sweep step's run
//! config names (`data.path = "d.csv"`, or given by the step's `set`); and a cached train step
//! whose checkpoint folder was deleted is run again rather than reused.

mod common;

use std::path::Path;

use common::temp_dir;

fn ok(runs: &Path, args: &[&str]) -> String {
    common::weft_ok_with_store(runs, args)
}

/// The tiny mlp of `common::write_tiny_mlp` (2 steps), and a one-trial grid sweep of it
/// (`sweep.toml`, `base = "mlp.toml"`).
fn setup(dir: &Path) {
    common::write_tiny_mlp(dir, "steps = 2\nlog_every = 1\n");
    std::fs::write(
        dir.join("sweep.toml"),
        "[sweep]\nbase = \"mlp.toml\"\nmetric = \"loss\"\nmethod = \"grid\"\n\
         [sweep.parameters]\n\"optim.lr\" = { values = [0.02] }\n",
    )
    .unwrap();
}

/// Appends rows to the CSV at `path` (same columns, other values).
fn change_csv(path: &Path) {
    let mut text = std::fs::read_to_string(path).unwrap();
    text.push_str("0.900,0.100,1\n0.100,0.900,2\n");
    std::fs::write(path, text).unwrap();
}

#[test]
fn a_changed_base_config_or_data_file_runs_the_steps_that_read_it_again() {
    let dir = temp_dir("pipeline-cache-inputs");
    let runs = dir.join("runs");
    setup(&dir);
    std::fs::copy(dir.join("d.csv"), dir.join("other.csv")).unwrap();
    let file = dir.join("flow.toml");
    std::fs::write(
        &file,
        "[[step]]\nname = \"tune\"\nkind = \"sweep\"\nconfig = \"sweep.toml\"\n\n\
         [[step]]\nname = \"train\"\nkind = \"train\"\nconfig = \"mlp.toml\"\n\n\
         [[step]]\nname = \"other\"\nkind = \"train\"\nconfig = \"mlp.toml\"\nset = [\"data.path=other.csv\"]\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let first = ok(&runs, &["pipeline", "run", f]);
    for step in ["tune", "train", "other"] {
        assert!(first.contains(&format!("step {step}: finished")), "{first}");
    }
    let cached = ok(&runs, &["pipeline", "run", f]);
    for step in ["tune", "train", "other"] {
        assert!(cached.contains(&format!("step {step}: cached")), "{cached}");
    }

    // the sweep's base config edited (the sweep file is not): the sweep step runs again, and
    // the train steps, whose config it also is
    let config = std::fs::read_to_string(dir.join("mlp.toml")).unwrap();
    std::fs::write(dir.join("mlp.toml"), config.replace("steps = 2", "steps = 3")).unwrap();
    let edited = ok(&runs, &["pipeline", "run", f]);
    for step in ["tune", "train", "other"] {
        assert!(edited.contains(&format!("step {step}: finished")), "{edited}");
    }

    // the data file the config names changed: every step reading it runs again; the step
    // reading another file (given by its `set`) comes from the cache
    change_csv(&dir.join("d.csv"));
    let data = ok(&runs, &["pipeline", "run", f]);
    for step in ["tune", "train"] {
        assert!(data.contains(&format!("step {step}: finished")), "{data}");
    }
    assert!(data.contains("step other: cached"), "{data}");
    // and the file a step's `set` names
    change_csv(&dir.join("other.csv"));
    let other = ok(&runs, &["pipeline", "run", f]);
    assert!(other.contains("step other: finished"), "{other}");
    assert!(
        other.contains("step tune: cached") && other.contains("step train: cached"),
        "{other}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cached_train_step_whose_checkpoint_was_deleted_runs_again() {
    let dir = temp_dir("pipeline-cache-gone");
    let runs = dir.join("runs");
    setup(&dir);
    let file = dir.join("flow.toml");
    std::fs::write(
        &file,
        "[[step]]\nname = \"train\"\nkind = \"train\"\nconfig = \"mlp.toml\"\n\n\
         [[step]]\nname = \"reg\"\nkind = \"register\"\nstep = \"train\"\nmodel = \"m\"\ndepends_on = [\"train\"]\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let first = ok(&runs, &["pipeline", "run", f]);
    let line = first
        .lines()
        .find(|l| l.starts_with("step train: finished: run="))
        .unwrap_or_else(|| panic!("{first}"));
    let ckpt = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("checkpoint="))
        .unwrap_or_else(|| panic!("{line}"));
    assert!(first.contains("step reg: finished: model=m version=1"), "{first}");
    // the checkpoint folder deleted: the train step is not reused, and the register step
    // registers the new run's checkpoint
    let folder = Path::new(ckpt).parent().unwrap();
    std::fs::remove_dir_all(folder).unwrap();
    let again = ok(&runs, &["pipeline", "run", f]);
    assert!(
        again.contains(&format!(
            "step train: cached execution 1 is not reused: its checkpoint {ckpt} is gone; running the step again"
        )),
        "{again}"
    );
    assert!(again.contains("step train: finished"), "{again}");
    assert!(again.contains("step reg: finished: model=m version=2"), "{again}");
    let _ = std::fs::remove_dir_all(&dir);
}
