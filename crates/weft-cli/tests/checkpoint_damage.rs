//! Damaged and foreign checkpoints are refused with one line naming the file and the tensor (or
//! the path); a checkpoint left half-written by a killed run is never used.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{consolidate_ok, fixtures, path_set, temp_dir, weft, weft_ok};

fn config() -> String {
    fixtures().join("gpt_adamw/run.toml").to_str().unwrap().to_string()
}

/// Trains the gpt fixture for 10 steps with checkpoints at 5 and 10 into `dir` (replacing
/// what an earlier call left there).
fn train_with_checkpoints(dir: &Path) {
    let set = path_set("train.checkpoint_dir", dir);
    #[rustfmt::skip]
    weft_ok(&["train", "--config", &config(), "--quiet", "--set", "train.steps=10",
        "--set", "train.checkpoint_every=5", "--set", "train.overwrite=true", "--set", &set]);
}

/// `weft train --resume` from `dir` up to `steps` steps (with extra sets).
fn resume(dir: &Path, steps: usize, extra: &[&str]) -> Output {
    let set = path_set("train.checkpoint_dir", dir);
    let steps = format!("train.steps={steps}");
    let cfg = config();
    let mut args = vec![
        "train", "--config", &cfg, "--quiet", "--resume", "--set", &steps, "--set", &set,
    ];
    for e in extra {
        args.extend(["--set", e]);
    }
    weft(&args)
}

/// [`resume`], which must fail: its stderr's last line (the error).
fn resume_fails(dir: &Path, extra: &[&str]) -> String {
    let out = resume(dir, 20, extra);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{err}");
    let last = err.trim().lines().last().unwrap_or_default().to_string();
    assert!(last.starts_with("weft: error: "), "{err}");
    last
}

fn newest(dir: &Path) -> PathBuf {
    dir.join("step-00000010")
}

/// Resumes `dir` up to step 8 and checks that the newest checkpoint was skipped with a warning
/// holding every one of `needles`, that the run went on from step 5, and that the damaged
/// folder is still there as it was.
fn skips_the_newest(dir: &Path, needles: &[&str]) {
    let before: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(newest(dir))
        .unwrap()
        .map(|f| {
            let p = f.unwrap().path();
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    let out = resume(dir, 8, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let warning = err
        .lines()
        .find(|l| l.contains("warning: --resume skips"))
        .unwrap_or_else(|| panic!("no warning in:\n{err}"));
    for n in needles.iter().chain(&["step-00000010"]) {
        assert!(warning.contains(n), "{n:?} in {warning:?}");
    }
    assert!(err.contains("resuming after step 5"), "{err}");
    for (p, bytes) in before {
        assert_eq!(std::fs::read(&p).unwrap(), bytes, "{} is kept as it was", p.display());
    }
}

#[test]
fn a_damaged_newest_checkpoint_is_skipped_named_and_kept() {
    let dir = temp_dir("ckpt-damage");
    train_with_checkpoints(&dir);
    // a byte in the last tensor's data
    let model = newest(&dir).join("model-rank-00000.safetensors");
    let mut bytes = std::fs::read(&model).unwrap();
    let at = bytes.len() - 3;
    bytes[at] ^= 0x10;
    std::fs::write(&model, &bytes).unwrap();
    skips_the_newest(
        &dir,
        &[
            "model-rank-00000.safetensors",
            "does not match its checksum",
            "tensor \"",
        ],
    );
    // the optimizer file cut in half
    train_with_checkpoints(&dir);
    let opt = newest(&dir).join("optimizer-rank-00000.safetensors");
    let bytes = std::fs::read(&opt).unwrap();
    std::fs::write(&opt, &bytes[..bytes.len() / 2]).unwrap();
    skips_the_newest(&dir, &["optimizer-rank-00000.safetensors", "truncated: tensor \""]);
    // a rank's file gone
    train_with_checkpoints(&dir);
    std::fs::remove_file(newest(&dir).join("model-rank-00000.safetensors")).unwrap();
    skips_the_newest(&dir, &["model-rank-00000.safetensors"]);
    // the index gone: the model and optimizer files are kept
    train_with_checkpoints(&dir);
    std::fs::remove_file(newest(&dir).join("index.json")).unwrap();
    skips_the_newest(&dir, &["index.json is missing"]);
    // a run that then saves step 10 again keeps the damaged folder under another name
    let out = resume(&dir, 10, &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let kept: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-00000010.kept-"))
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert!(dir.join(&kept[0]).join("model-rank-00000.safetensors").exists());
    assert!(weft_train::checkpoint::is_complete(&newest(&dir)));
    // when no checkpoint verifies, --resume refuses to start over, naming each
    train_with_checkpoints(&dir);
    for step in ["step-00000005", "step-00000010"] {
        std::fs::remove_file(dir.join(step).join("model-rank-00000.safetensors")).unwrap();
    }
    let err = resume_fails(&dir, &[]);
    assert!(err.contains("no checkpoint") && err.contains("verifies"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_checkpoint_of_another_model_and_a_missing_folder_are_named() {
    let dir = temp_dir("ckpt-foreign");
    train_with_checkpoints(&dir);
    // a change of shape (without the init file, which no longer fits either), and one that
    // keeps every shape (the heads split the same weights)
    let set = path_set("train.checkpoint_dir", &dir);
    let cfg = config();
    #[rustfmt::skip]
    let out = weft(&["train", "--config", &cfg, "--quiet", "--resume", "--unset", "init.from",
        "--set", &set, "--set", "model.n_embd=16"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("model.n_embd is 32 in the checkpoint but 16 in this run"),
        "{err}"
    );
    let err = resume_fails(&dir, &["model.n_head=4"]);
    assert!(
        err.contains("model.n_head is 2 in the checkpoint but 4 in this run"),
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
    let out = weft_ok(&["train", "--config", &config(), "--quiet", "--resume", "--set", "train.steps=16",
        "--set", &set, "--set", &m]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("skips") && err.contains("step-00000014") && err.contains("COMPLETE marker"),
        "{err}"
    );
    let steps: Vec<u64> = common::read_metrics(&metrics)
        .iter()
        .filter_map(|r| r["step"].as_u64())
        .collect();
    assert_eq!(
        steps,
        (11..=16).collect::<Vec<_>>(),
        "resumed after step 10, the newest complete checkpoint"
    );
    // the next complete checkpoint removed the temporary folder; the unmarked one, which may
    // hold the only copy of something, is left alone
    assert!(!partial.exists(), "{} was not removed", partial.display());
    assert!(unmarked.join("model-rank-00000.safetensors").exists());
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
    consolidate_ok(&ckpt, &file);
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

/// The gpt fixture on 2 launched ranks with `layout` (`--set`), checkpoints every 5 steps into
/// `dir`, up to `steps` (`train.steps=N`), resuming when `resume`.
fn launch_two(dir: &Path, layout: &str, steps: &str, resume: bool) -> Output {
    let bin = env!("CARGO_BIN_EXE_weft");
    let set = path_set("train.checkpoint_dir", dir);
    let cfg = config();
    #[rustfmt::skip]
    let mut args = vec!["launch", "--nproc-per-node", "2", "--", bin, "train", "--config", &cfg, "--quiet",
        "--set", steps, "--set", layout, "--set", "train.checkpoint_every=5", "--set", &set];
    if resume {
        args.push("--resume");
    }
    weft(&args)
}

#[test]
fn a_pipeline_resume_skips_a_checkpoint_whose_later_stage_does_not_verify() {
    let dir = temp_dir("ckpt-damage-pp");
    let run = |steps: &str, resume: bool| launch_two(&dir, "parallel.pp=2", steps, resume);
    let out = run("train.steps=10", false);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // a byte of the second stage's file, which only rank 1 reads
    let model = newest(&dir).join("model-rank-00001.safetensors");
    let mut bytes = std::fs::read(&model).unwrap();
    let at = bytes.len() - 3;
    bytes[at] ^= 0x10;
    std::fs::write(&model, &bytes).unwrap();
    let out = run("train.steps=8", true);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.contains("warning: --resume skips")).collect();
    // rank 1 says what is wrong with its part, rank 0 that rank 1's part failed
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("model-rank-00001.safetensors") && w.contains("checksum")),
        "{err}"
    );
    assert!(
        warnings.iter().any(|w| w.contains("rank 1's part does not verify")),
        "{err}"
    );
    assert!(warnings.iter().all(|w| w.contains("step-00000010")), "{err}");
    assert!(err.contains("resuming after step 5"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Flips a byte in the middle of tensor `name`'s data in safetensors file `path`.
fn damage_tensor(path: &Path, name: &str) {
    let mut bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let offsets = &header[name]["data_offsets"];
    let (lo, hi) = (
        offsets[0].as_u64().unwrap() as usize,
        offsets[1].as_u64().unwrap() as usize,
    );
    let at = 8 + n + (lo + hi) / 2;
    bytes[at] ^= 0x10;
    std::fs::write(path, &bytes).unwrap();
}

#[test]
fn a_tensor_parallel_resume_checks_the_fused_parts_it_reads_in_rows() {
    let dir = temp_dir("ckpt-damage-tp");
    let run = |steps: &str, resume: bool| launch_two(&dir, "parallel.tp=2", steps, resume);
    let out = run("train.steps=10", false);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // q, k and v side by side: each rank reads its rows of each of the three blocks
    let name = "transformer.h.0.attn.c_attn.weight";
    damage_tensor(&newest(&dir).join("model-rank-00001.safetensors"), name);
    let out = run("train.steps=8", true);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.lines().any(|l| l.contains("warning: --resume skips")
            && l.contains("step-00000010")
            && l.contains(name)
            && l.contains("checksum")),
        "{err}"
    );
    assert!(err.contains("resuming after step 5"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn optimizer_state_missing_a_parameter_is_said_when_the_run_resumes() {
    let dir = temp_dir("ckpt-opt-missing");
    train_with_checkpoints(&dir);
    // drop one parameter's Adam moments from the newest checkpoint's index
    let index_path = newest(&dir).join("index.json");
    let mut index: serde_json::Value = serde_json::from_slice(&std::fs::read(&index_path).unwrap()).unwrap();
    let optimizer = index["optimizer"].as_object_mut().unwrap();
    let victim = optimizer
        .keys()
        .find(|k| k.ends_with(".exp_avg"))
        .unwrap()
        .trim_end_matches(".exp_avg")
        .to_string();
    optimizer.retain(|k, _| !k.starts_with(&format!("{victim}.")));
    std::fs::write(&index_path, serde_json::to_vec(&index).unwrap()).unwrap();
    let out = resume(&dir, 12, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("resuming after step 10"), "{err}");
    // its moments start from zero, which the run says (it resumed without a word before)
    let warning = err
        .lines()
        .find(|l| l.contains("restored optimizer state holds nothing for parameter"))
        .unwrap_or_else(|| panic!("no warning in:\n{err}"));
    assert!(warning.contains(&format!("{victim:?}")), "{warning}");
    assert_eq!(
        err.matches("restored optimizer state holds nothing").count(),
        1,
        "{err}"
    );
}
