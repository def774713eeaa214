//! Damaged and foreign checkpoints are refused with one line naming the file and the tensor (or
//! the path); a checkpoint left half-written by a killed run is never used.

mod common;

use std::path::{Path, PathBuf};

use common::{fixtures, path_set, temp_dir, weft, weft_ok};

fn config() -> String {
    fixtures().join("gpt_adamw/run.toml").to_str().unwrap().to_string()
}

/// Trains the gpt fixture for 10 steps with checkpoints at 5 and 10 into `dir`.
fn train_with_checkpoints(dir: &Path) {
    let set = path_set("train.checkpoint_dir", dir);
    #[rustfmt::skip]
    weft_ok(&["train", "--config", &config(), "--quiet", "--set", "train.steps=10",
        "--set", "train.checkpoint_every=5", "--set", &set]);
}

/// `weft train --resume` from `dir` (with extra sets); its stderr, after checking it failed.
fn resume_fails(dir: &Path, extra: &[&str]) -> String {
    let set = path_set("train.checkpoint_dir", dir);
    let cfg = config();
    let mut args = vec![
        "train",
        "--config",
        &cfg,
        "--quiet",
        "--resume",
        "--set",
        "train.steps=20",
        "--set",
        &set,
    ];
    for e in extra {
        args.extend(["--set", e]);
    }
    let out = weft(&args);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    err
}

fn newest(dir: &Path) -> PathBuf {
    dir.join("step-00000010")
}

#[test]
fn a_flipped_byte_or_a_truncated_file_is_refused_naming_the_file_and_the_tensor() {
    let dir = temp_dir("ckpt-damage");
    train_with_checkpoints(&dir);
    // a byte in the last tensor's data
    let model = newest(&dir).join("model-rank-00000.safetensors");
    let mut bytes = std::fs::read(&model).unwrap();
    let at = bytes.len() - 3;
    bytes[at] ^= 0x10;
    std::fs::write(&model, &bytes).unwrap();
    let err = resume_fails(&dir, &[]);
    assert!(
        err.contains("model-rank-00000.safetensors") && err.contains("does not match its checksum"),
        "{err}"
    );
    assert!(err.contains("tensor \""), "{err}");
    // the optimizer file cut in half
    train_with_checkpoints(&dir);
    let opt = newest(&dir).join("optimizer-rank-00000.safetensors");
    let bytes = std::fs::read(&opt).unwrap();
    std::fs::write(&opt, &bytes[..bytes.len() / 2]).unwrap();
    let err = resume_fails(&dir, &[]);
    assert!(
        err.contains("optimizer-rank-00000.safetensors") && err.contains("truncated: tensor \""),
        "{err}"
    );
    // a rank's file gone
    train_with_checkpoints(&dir);
    std::fs::remove_file(newest(&dir).join("model-rank-00000.safetensors")).unwrap();
    let err = resume_fails(&dir, &[]);
    assert!(err.contains("model-rank-00000.safetensors"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_checkpoint_of_another_model_and_a_missing_folder_are_named() {
    let dir = temp_dir("ckpt-foreign");
    train_with_checkpoints(&dir);
    let err = resume_fails(&dir, &["model.n_embd=16"]);
    assert!(
        err.contains("transformer.wte.weight") && err.contains("[65, 32]") && err.contains("[65, 16]"),
        "{err}"
    );
    let missing = dir.join("no-such-folder");
    let out = weft(&["generate", "--checkpoint", missing.to_str().unwrap(), "--prompt", "a"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("no-such-folder"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_half_written_checkpoint_is_never_used() {
    let dir = temp_dir("ckpt-partial");
    train_with_checkpoints(&dir);
    // what a run killed while writing step 15 leaves: the temporary folder, partly written
    let partial = dir.join(".tmp-step-00000015-00000000000ab");
    std::fs::create_dir_all(&partial).unwrap();
    std::fs::write(
        partial.join("model-rank-00000.safetensors"),
        b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":",
    )
    .unwrap();
    // and one killed between moving the folder into place and marking it complete
    let unmarked = dir.join("step-00000014");
    std::fs::create_dir_all(&unmarked).unwrap();
    for f in std::fs::read_dir(newest(&dir)).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, unmarked.join(f.file_name().unwrap())).unwrap();
    }
    std::fs::remove_file(unmarked.join("COMPLETE")).unwrap();
    let metrics = dir.join("resumed.jsonl");
    let set = path_set("train.checkpoint_dir", &dir);
    let m = path_set("train.metrics", &metrics);
    #[rustfmt::skip]
    weft_ok(&["train", "--config", &config(), "--quiet", "--resume", "--set", "train.steps=16",
        "--set", &set, "--set", &m]);
    let steps: Vec<u64> = common::read_metrics(&metrics)
        .iter()
        .filter_map(|r| r["step"].as_u64())
        .collect();
    assert_eq!(
        steps,
        (10..16).collect::<Vec<_>>(),
        "resumed from step 10, the newest complete checkpoint"
    );
    // the next complete checkpoint removed what the killed runs left
    for left in [partial, unmarked] {
        assert!(!left.exists(), "{} was not removed", left.display());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn inspect_lists_a_sharded_runs_checkpoint_and_consolidate_writes_one_file() {
    let dir = temp_dir("ckpt-inspect");
    let ckpt = dir.join("ckpt");
    let bin = env!("CARGO_BIN_EXE_weft");
    let set = path_set("train.checkpoint_dir", &ckpt);
    let cfg = config();
    #[rustfmt::skip]
    weft_ok(&["launch", "--nproc-per-node", "2", "--", bin, "train", "--config", &cfg, "--quiet",
        "--set", "train.steps=5", "--set", "parallel.dp=2", "--set", "parallel.zero=3", "--set", &set]);
    let out = weft_ok(&["checkpoint", "inspect", ckpt.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "step 5",
        "dp = 2, tp = 1, pp = 1, zero = 3",
        "model gpt",
        "checksums verified",
        "transformer.h.1.mlp.c_fc.weight",
        "[128, 32]",
        "transformer.wte.weight.exp_avg_sq",
        // each rank wrote its own ZeRO shard
        "files: 4",
        "model-rank-00001.safetensors",
        "lm_head.weight is transformer.wte.weight (tied)",
    ] {
        assert!(text.contains(want), "{want:?} in:\n{text}");
    }
    let file = dir.join("model.safetensors");
    weft_ok(&[
        "checkpoint",
        "consolidate",
        ckpt.to_str().unwrap(),
        "-o",
        file.to_str().unwrap(),
    ]);
    let written = weft_core::io::safetensors::load(&file).unwrap().tensors;
    let original = weft_train::checkpoint::read(&ckpt.join("step-00000005"))
        .unwrap()
        .params;
    assert_eq!(written.len(), original.len() + 1);
    assert_eq!(
        written["lm_head.weight"].to_vec_f64(),
        original["transformer.wte.weight"].to_vec_f64()
    );
    for (name, t) in &original {
        assert_eq!(written[name].to_vec_f64(), t.to_vec_f64(), "{name}");
    }
    // a damaged checkpoint and a missing folder are refused, naming them
    let opt = ckpt.join("step-00000005/optimizer-rank-00001.safetensors");
    let mut bytes = std::fs::read(&opt).unwrap();
    let at = bytes.len() - 1;
    bytes[at] ^= 1;
    std::fs::write(&opt, &bytes).unwrap();
    let out = weft(&["checkpoint", "inspect", ckpt.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("optimizer-rank-00001.safetensors") && err.contains("checksum"),
        "{err}"
    );
    let out = weft(&["checkpoint", "inspect", dir.join("nothing").to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("nothing: no such checkpoint folder"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
