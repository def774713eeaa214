//! `weft checkpoint consolidate DIR -o PATH` writes PATH atomically: through a symlink (the link
//! stays), never over something that is not a regular file (a device node, a directory), never
//! over or inside the checkpoint it reads (nor `weft export onnx`), and after a failed write (a
//! full disk) it leaves one error line and no temporary file.
#![cfg(unix)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{consolidate, fixtures, path_set, temp_dir, weft, weft_ok};

/// A checkpoint of the gpt fixture after 5 steps, in `dir/ckpt`.
fn checkpoint(dir: &Path) -> PathBuf {
    let ckpt = dir.join("ckpt");
    let config = fixtures().join("gpt_adamw/run.toml");
    #[rustfmt::skip]
    weft_ok(&["train", "--config", config.to_str().unwrap(), "--quiet", "--set", "train.steps=5",
        "--set", "train.checkpoint_every=5", "--set", &path_set("train.checkpoint_dir", &ckpt)]);
    ckpt
}

/// Checks that `out` failed with exactly one `weft: error:` line, and returns it.
fn one_error_line(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("weft: error: "), "{err}");
    err
}

/// The tensor names in a safetensors file written by consolidate.
fn names(path: &Path) -> Vec<String> {
    let file = weft_core::io::safetensors::load(path).unwrap();
    file.tensors.keys().cloned().collect()
}

/// Files under `dir` (recursively) whose name ends in `.tmp`.
fn leftovers(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if std::fs::symlink_metadata(&p).unwrap().is_dir() {
            out.extend(leftovers(&p));
        } else if p.to_string_lossy().ends_with(".tmp") {
            out.push(p);
        }
    }
    out
}

/// A checkpoint whose index.json lists no model tensors consolidates to nothing: refused, in
/// both formats, and nothing is written.
#[test]
fn a_checkpoint_without_model_tensors_is_refused() {
    let dir = temp_dir("consolidate-empty");
    let ckpt = checkpoint(&dir).join("step-00000005");
    let index = ckpt.join("index.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
    v["model"] = serde_json::json!({});
    std::fs::write(&index, serde_json::to_vec(&v).unwrap()).unwrap();
    for format in ["safetensors", "hf"] {
        let output = dir.join(format!("out-{format}"));
        #[rustfmt::skip]
        let out = weft(&["checkpoint", "consolidate", ckpt.to_str().unwrap(), "-o", output.to_str().unwrap(),
            "--format", format]);
        let err = one_error_line(&out);
        assert!(err.contains("holds no model tensors"), "{format}: {err}");
        assert!(!output.exists(), "{format}: {} was written", output.display());
    }
}

#[test]
fn consolidate_writes_through_a_symlink_and_refuses_what_is_not_a_file() {
    let dir = temp_dir("consolidate-output");
    let ckpt = checkpoint(&dir);
    let out_dir = dir.join("out");
    std::fs::create_dir_all(out_dir.join("releases")).unwrap();

    // a link to an older file: the file is replaced, the link stays
    let real = out_dir.join("releases/model-v1.safetensors");
    std::fs::write(&real, b"an older model").unwrap();
    let link = out_dir.join("model.safetensors");
    std::os::unix::fs::symlink("releases/model-v1.safetensors", &link).unwrap();
    let out = consolidate(&ckpt, &link);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        Path::new("releases/model-v1.safetensors")
    );
    assert!(names(&real).contains(&"transformer.wte.weight".to_string()));
    assert_eq!(names(&link), names(&real));

    // a device node: refused, and left as it is
    let null = Path::new("/dev/null");
    if null.exists() {
        use std::os::unix::fs::FileTypeExt;
        let err = one_error_line(&consolidate(&ckpt, null));
        assert!(err.contains("/dev/null") && err.contains("a character device"), "{err}");
        assert!(std::fs::symlink_metadata(null).unwrap().file_type().is_char_device());
        assert!(!Path::new("/dev/null.tmp").exists());
    }

    // a directory: refused, and left as it is
    let sub = out_dir.join("releases");
    let err = one_error_line(&consolidate(&ckpt, &sub));
    assert!(
        err.contains(&*sub.to_string_lossy()) && err.contains("a directory"),
        "{err}"
    );
    assert!(sub.is_dir() && real.is_file());

    assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn consolidate_on_a_full_disk_fails_with_one_line_and_leaves_no_temporary_file() {
    let dir = temp_dir("consolidate-full");
    let ckpt = checkpoint(&dir);
    let output = dir.join("model.safetensors");
    // files may grow to one 512-byte block (SIGXFSZ ignored, so the write fails with EFBIG
    // instead of killing the process): the disk is full after the first block
    let out = std::process::Command::new("sh")
        .args(["-c", "trap '' XFSZ; ulimit -f 1 && exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_weft"))
        .args([
            "checkpoint",
            "consolidate",
            ckpt.to_str().unwrap(),
            "-o",
            output.to_str().unwrap(),
        ])
        .env("WEFT_NUM_THREADS", "2")
        .output()
        .unwrap();
    let err = one_error_line(&out);
    assert!(
        err.contains(&*output.to_string_lossy()) && err.contains("too large"),
        "{err}"
    );
    assert!(!output.exists());
    assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The model config and tokenizer a checkpoint records are checked before they are copied into
/// an export (they were copied as they stood, and the outputs then failed to load): a config
/// that disagrees with the tensors, names another kind or an impossible size, and a tokenizer
/// that does not load or is wider than the vocabulary are refused with one line naming
/// index.json and the key, in both formats, and nothing is written.
#[test]
fn a_tampered_model_config_or_tokenizer_is_refused_before_writing() {
    let dir = temp_dir("consolidate-tampered");
    let ckpt = checkpoint(&dir).join("step-00000005");
    let index = ckpt.join("index.json");
    let original = std::fs::read(&index).unwrap();
    let tamper = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut v: serde_json::Value = serde_json::from_slice(&original).unwrap();
        edit(&mut v);
        std::fs::write(&index, serde_json::to_vec(&v).unwrap()).unwrap();
    };
    let export = |format: &str| {
        let output = dir.join(format!("out-{format}"));
        #[rustfmt::skip]
        let out = weft(&["checkpoint", "consolidate", ckpt.to_str().unwrap(), "-o", output.to_str().unwrap(),
            "--format", format]);
        (out, output)
    };
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(Edit, &[&str], &[&str])> = vec![
        (
            Box::new(|v| v["state"]["extra"]["model"]["vocab_size"] = 999.into()),
            &["safetensors", "hf"],
            &["model.vocab_size: 999", "transformer.wte.weight has shape"],
        ),
        (
            Box::new(|v| v["state"]["extra"]["model"]["kind"] = "mlp".into()),
            &["safetensors", "hf"],
            &["the model config does not parse", "unknown field"],
        ),
        (
            Box::new(|v| v["state"]["extra"]["model"]["n_head"] = 0.into()),
            &["safetensors", "hf"],
            &["model.n_head: must be positive"],
        ),
        (
            Box::new(|v| v["state"]["extra"]["model"]["dropout"] = 5.into()),
            &["safetensors", "hf"],
            &["model.dropout: 5 is outside [0, 1)"],
        ),
        (
            Box::new(|v| v["state"]["extra"]["tokenizer"] = "{not json".into()),
            &["safetensors", "hf"],
            &["state.extra.tokenizer", "does not parse"],
        ),
        (
            Box::new(|v| {
                let vocab: String = (0..1000).filter_map(|i| char::from_u32(0x100 + i)).collect();
                v["state"]["extra"]["tokenizer"] =
                    serde_json::json!({"type": "char", "vocab": vocab}).to_string().into();
            }),
            &["safetensors", "hf"],
            &["state.extra.tokenizer knows 1000 tokens, more than model.vocab_size"],
        ),
    ];
    for (edit, formats, needles) in &cases {
        tamper(edit.as_ref());
        for format in *formats {
            let (out, output) = export(format);
            let err = one_error_line(&out);
            assert!(err.contains(&*index.to_string_lossy()), "{format}: {err}");
            for n in *needles {
                assert!(err.contains(n), "{format}: {n:?} in {err}");
            }
            assert!(!output.exists(), "{format}: {} was written", output.display());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// An output that would land on what the command reads is refused naming both, and nothing is
/// written: a file of the checkpoint folder (its index.json, a shard), a new file inside it, the
/// folder itself, a link into it, and for `export onnx` the consolidated file it reads. (Both
/// wrote over the checkpoint, which could not be read again.) Beside the folder is fine.
#[test]
fn an_output_inside_the_checkpoint_read_is_refused() {
    let dir = temp_dir("consolidate-into-itself");
    let config = common::write_tiny_mlp(&dir, "steps = 2\n");
    let ckpt = dir.join("ckpt");
    #[rustfmt::skip]
    weft_ok(&["train", "--config", config.to_str().unwrap(), "--quiet", "--set",
        &path_set("train.checkpoint_dir", &ckpt)]);
    let step = ckpt.join("step-00000002");
    let files: Vec<(PathBuf, Vec<u8>)> = ["index.json", "model-rank-00000.safetensors", "COMPLETE"]
        .iter()
        .map(|f| (step.join(f), std::fs::read(step.join(f)).unwrap()))
        .collect();
    std::os::unix::fs::symlink(step.join("index.json"), dir.join("link.json")).unwrap();
    let c = ckpt.to_str().unwrap();
    let refused = |args: &[&str], output: &Path| {
        let err = one_error_line(&weft(args));
        assert!(
            err.contains(&format!("--output {}", output.display())) && err.contains(&*step.to_string_lossy()),
            "{args:?}: {err}"
        );
    };
    for output in [
        step.join("index.json"),
        step.join("model-rank-00000.safetensors"),
        step.join("new.safetensors"),
        ckpt.join("../ckpt/step-00000002/x.st"),
        dir.join("link.json"),
    ] {
        let o = output.to_str().unwrap();
        refused(&["checkpoint", "consolidate", c, "-o", o], &output);
        refused(&["export", "onnx", "--checkpoint", c, "--output", o], &output);
    }
    refused(
        &[
            "checkpoint",
            "consolidate",
            c,
            "-o",
            step.to_str().unwrap(),
            "--format",
            "hf",
        ],
        &step,
    );
    assert!(!step.join("new.safetensors").exists() && !step.join("x.st").exists());
    for (path, bytes) in &files {
        assert_eq!(&std::fs::read(path).unwrap(), bytes, "{} changed", path.display());
    }
    // a consolidated file is not exported over itself
    let file = ckpt.join("model.safetensors");
    weft_ok(&["checkpoint", "consolidate", c, "-o", file.to_str().unwrap()]);
    let before = std::fs::read(&file).unwrap();
    let f = file.to_str().unwrap();
    let err = one_error_line(&weft(&["export", "onnx", "--checkpoint", f, "--output", f]));
    assert!(err.contains(&format!("--output {f}: is {f}")), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), before);
    // beside the checkpoint folder, in its checkpoint directory: written, and it still reads
    let onnx = ckpt.join("model.onnx");
    weft_ok(&["export", "onnx", "--checkpoint", c, "--output", onnx.to_str().unwrap()]);
    weft_ok(&["checkpoint", "inspect", c]);
    assert!(leftovers(&dir).is_empty(), "{:?}", leftovers(&dir));
    let _ = std::fs::remove_dir_all(&dir);
}
