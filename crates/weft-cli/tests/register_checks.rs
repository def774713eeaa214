//! `weft models register` checks that the checkpoint loads as a model before it takes a version
//! number, as `weft checkpoint inspect` checks it: a damaged or invalid checkpoint (a shard cut
//! in half, a value changed, a model config the model refuses or that is another model's than
//! its tensors) is refused in one line naming the file and the key, exit 1, and no version is
//! registered. Before, only `COMPLETE` and `index.json` being there were checked.

mod common;

use std::path::{Path, PathBuf};

use common::{path_set, temp_dir, weft_ok, weft_ok_with_store, weft_with_store, write_tiny_mlp};
use serde_json::Value;

/// A copy of checkpoint folder `from` at `to`.
fn copy(from: &Path, to: &Path) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    for f in std::fs::read_dir(from).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, to.join(f.file_name().unwrap())).unwrap();
    }
    to.to_path_buf()
}

/// Edits the index of checkpoint folder `step`.
fn edit_index(step: &Path, edit: impl Fn(&mut Value)) {
    let index = step.join("index.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&index, serde_json::to_vec(&v).unwrap()).unwrap();
}

/// Trains `config` (with `sets`) 2 steps into `dir/NAME`; the checkpoint folder.
fn trained(dir: &Path, config: &Path, name: &str, sets: &[&str]) -> PathBuf {
    let ckpt = dir.join(name);
    let set = path_set("train.checkpoint_dir", &ckpt);
    let mut args = vec!["train", "--config", config.to_str().unwrap(), "--quiet", "--set", &set];
    for s in sets {
        args.extend(["--set", s]);
    }
    weft_ok(&args);
    ckpt.join("step-00000002")
}

#[test]
fn a_damaged_or_invalid_checkpoint_is_not_registered() {
    let dir = temp_dir("register-checks");
    let runs = dir.join("runs");
    let mlp = trained(&dir, &write_tiny_mlp(&dir, "steps = 2\n"), "mlp", &[]);
    let gpt = trained(
        &dir,
        &common::fixture_config("gpt_adamw"),
        "gpt",
        &["train.steps=2", "train.checkpoint_every=2"],
    );
    let shard = "model-rank-00000.safetensors";

    // a shard cut in half
    let half = copy(&mlp, &dir.join("half"));
    let bytes = std::fs::read(half.join(shard)).unwrap();
    std::fs::write(half.join(shard), &bytes[..bytes.len() / 2]).unwrap();
    // one value changed: found by its checksum
    let flipped = copy(&mlp, &dir.join("flipped"));
    let mut bytes = std::fs::read(flipped.join(shard)).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(flipped.join(shard), bytes).unwrap();
    // a model config the model refuses
    let heads = copy(&gpt, &dir.join("heads"));
    edit_index(&heads, |v| v["state"]["extra"]["model"]["n_head"] = 0.into());
    // an mlp's config over a gpt's tensors
    let other = copy(&gpt, &dir.join("other"));
    let mlp_config = serde_json::from_slice::<Value>(&std::fs::read(mlp.join("index.json")).unwrap()).unwrap()["state"]
        ["extra"]["model"]
        .clone();
    edit_index(&other, |v| v["state"]["extra"]["model"] = mlp_config.clone());
    // no model config at all
    let bare = copy(&mlp, &dir.join("bare"));
    edit_index(&bare, |v| v["state"]["extra"]["model"] = Value::Null);

    let cases: [(&Path, &[&str]); 5] = [
        (&half, &["half", shard, "truncated"]),
        (&flipped, &["flipped", shard, "does not match its checksum"]),
        (&heads, &["heads/index.json", "model.n_head: must be positive"]),
        (&other, &["other/index.json", "the state dict has no layers.0.weight"]),
        (&bare, &["bare/index.json", "records no model config"]),
    ];
    for (ckpt, needles) in cases {
        let out = weft_with_store(&runs, &["models", "register", ckpt.to_str().unwrap(), "--name", "m"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{}: {err}", ckpt.display());
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(
            err.starts_with("weft: error: the checkpoint is not registered: "),
            "{err}"
        );
        for n in needles {
            assert!(err.contains(n), "{n:?} in {err}");
        }
    }
    // none took a version; the checkpoints that load do, 1 and 2
    let list = weft_ok_with_store(&runs, &["models", "list", "--json"]);
    assert_eq!(list.trim(), "[]");
    let v = weft_ok_with_store(&runs, &["models", "register", mlp.to_str().unwrap(), "--name", "m"]);
    assert!(v.contains("registered model m version 1"), "{v}");
    let v = weft_ok_with_store(&runs, &["models", "register", gpt.to_str().unwrap(), "--name", "m"]);
    assert!(v.contains("version 2"), "{v}");
    // --no-checksums reads no tensor: a changed value is left to the load, the rest still found
    #[rustfmt::skip]
    let v = weft_ok_with_store(&runs, &["models", "register", flipped.to_str().unwrap(), "--name", "m",
        "--no-checksums"]);
    assert!(v.contains("version 3"), "{v}");
    #[rustfmt::skip]
    let out = weft_with_store(&runs, &["models", "register", half.to_str().unwrap(), "--name", "m",
        "--no-checksums"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("truncated"));
    let _ = std::fs::remove_dir_all(&dir);
}
