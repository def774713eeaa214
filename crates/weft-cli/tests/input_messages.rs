//! What bad input says: a pipeline or sweep file's syntax error names its line and column, a
//! validation split too small for the batch names both keys that fix it, and a checkpoint whose
//! step no run can reach is refused naming the file and the field.

mod common;

use std::path::{Path, PathBuf};

use common::{fails_with, temp_dir, weft_ok, write_tiny_mlp};

#[test]
fn pipeline_and_sweep_syntax_errors_name_the_line_and_column() {
    let dir = temp_dir("syntax-at");
    let pipeline = dir.join("p.toml");
    std::fs::write(
        &pipeline,
        "[[step]]\nname = \"t\"\nkind = \"command\"\nargv = [\"true\"\n",
    )
    .unwrap();
    let line = fails_with(&["pipeline", "run", pipeline.to_str().unwrap()], &["p.toml"]);
    assert!(line.contains("p.toml (line 5, column 1): invalid array"), "{line}");
    let sweep = dir.join("s.toml");
    std::fs::write(&sweep, "[sweep]\nbase = = \"r.toml\"\n").unwrap();
    let line = fails_with(&["sweep", "--config", sweep.to_str().unwrap()], &["s.toml"]);
    assert!(line.contains("s.toml (line 2, column 8): "), "{line}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A tiny mlp trained for 2 steps with its checkpoint in `dir/ck`: its config and checkpoint.
fn trained(dir: &Path) -> (PathBuf, PathBuf) {
    let config = write_tiny_mlp(dir, "steps = 2\ncheckpoint_dir = \"ck\"\n");
    weft_ok(&["train", "--quiet", "--config", config.to_str().unwrap()]);
    (config, dir.join("ck/step-00000002"))
}

#[test]
fn a_batch_larger_than_the_validation_split_names_both_remedies() {
    let dir = temp_dir("eval-batch");
    let (config, ckpt) = trained(&dir);
    let (config, ckpt) = (config.to_str().unwrap(), ckpt.to_str().unwrap());
    let big = ["--set", "data.batch_size=100000"];
    let needles = ["batch_size 100000", "lower data.batch_size or raise data.val_fraction"];
    let mut args = vec!["evaluate", "--config", config, "--checkpoint", ckpt];
    args.extend(big);
    fails_with(&args, &needles);
    let mut args = vec!["train", "--quiet", "--config", config, "--set", "train.eval_every=1"];
    args.extend(big);
    fails_with(&args, &needles);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_checkpoint_step_no_run_reaches_is_refused_naming_the_file_and_field() {
    let dir = temp_dir("step-max");
    let (config, ckpt) = trained(&dir);
    let index = ckpt.join("index.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
    v["state"]["step"] = serde_json::json!(u64::MAX);
    std::fs::write(&index, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    let (config, ckpt_arg) = (config.to_str().unwrap(), ckpt.to_str().unwrap());
    let other = dir.join("other");
    let needles = ["index.json", "state.step = 18446744073709551615"];
    let line = fails_with(
        &[
            "train",
            "--quiet",
            "--config",
            config,
            "--set",
            &format!("train.checkpoint_dir={:?}", other.to_str().unwrap()),
            "--resume-from",
            ckpt_arg,
        ],
        &needles,
    );
    assert!(line.contains("is past 9223372036854775807"), "{line}");
    assert!(!other.join("step-18446744073709551615").exists(), "nothing written");
    fails_with(&["evaluate", "--config", config, "--checkpoint", ckpt_arg], &needles);
    // the bound itself is a step a run config can give: the checkpoint reads
    v["state"]["step"] = serde_json::json!(i64::MAX);
    std::fs::write(&index, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    weft_ok(&["evaluate", "--config", config, "--checkpoint", ckpt_arg]);
    std::fs::remove_dir_all(&dir).unwrap();
}
