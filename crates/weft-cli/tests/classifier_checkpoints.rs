//! A classifier's (mlp, convnet) model config, as a checkpoint's index.json records it, is
//! checked against the checkpoint's tensor shapes before a model of its size is built, as a
//! language model's is: an index edited to `hidden = [1073741824]` made `weft export onnx`
//! allocate until the kernel killed it, and `weft checkpoint consolidate` copy the config into a
//! file that did the same. Refused in one line naming index.json and the key, nothing written.

mod common;

use std::path::{Path, PathBuf};

use common::{fails_with, path_set, temp_dir, weft_ok, write_tiny_mlp};
use serde_json::Value;

/// Sets `state.extra.model.KEY = value` in the index of checkpoint folder `step`.
fn edit_model(step: &Path, key: &str, value: Value) {
    let index = step.join("index.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
    v["state"]["extra"]["model"][key] = value;
    std::fs::write(&index, serde_json::to_vec(&v).unwrap()).unwrap();
}

/// A tiny convnet (1 channel of 4x4, 2 channels, 3 classes) trained 2 steps into `dir/NAME`;
/// the checkpoint folder.
fn convnet_checkpoint(dir: &Path, name: &str) -> PathBuf {
    let mut csv = (0..16).map(|i| format!("p{i},")).collect::<String>() + "label\n";
    for r in 0..40 {
        let row: String = (0..16)
            .map(|i| format!("{:.2},", ((r * 7 + i) % 10) as f64 / 10.0))
            .collect();
        csv.push_str(&format!("{row}{}\n", r % 3));
    }
    std::fs::write(dir.join("img.csv"), csv).unwrap();
    let config = dir.join("convnet.toml");
    std::fs::write(
        &config,
        "[model]\nkind = \"convnet\"\nin_channels = 1\nimage_size = 4\nchannels = [2]\nnum_classes = 3\n\n\
         [data]\nkind = \"csv\"\npath = \"img.csv\"\nlabel_column = -1\nbatch_size = 4\nval_fraction = 0.25\n\n\
         [optim]\nkind = \"sgd\"\nlr = 0.1\n\n[train]\nsteps = 2\n",
    )
    .unwrap();
    let ckpt = dir.join(name);
    let set = path_set("train.checkpoint_dir", &ckpt);
    weft_ok(&["train", "--config", config.to_str().unwrap(), "--quiet", "--set", &set]);
    ckpt.join("step-00000002")
}

/// `export onnx` and `checkpoint consolidate` of `step` both refused with every one of `words`
/// (and index.json) in their one line, and neither writes its output.
fn both_refused(dir: &Path, step: &Path, words: &[&str]) {
    let (onnx, file) = (dir.join("x.onnx"), dir.join("x.safetensors"));
    let mut needles = vec!["index.json"];
    needles.extend(words);
    let c = step.to_str().unwrap();
    fails_with(
        &["export", "onnx", "--checkpoint", c, "--output", onnx.to_str().unwrap()],
        &needles,
    );
    fails_with(
        &["checkpoint", "consolidate", c, "-o", file.to_str().unwrap()],
        &needles,
    );
    assert!(!onnx.exists() && !file.exists(), "nothing is written");
}

#[test]
fn an_mlp_config_that_disagrees_with_its_tensors_is_refused_before_the_model_is_built() {
    let dir = temp_dir("classifier-mlp-index");
    let config = write_tiny_mlp(&dir, "steps = 2\n");
    let ckpt = dir.join("ckpt");
    let set = path_set("train.checkpoint_dir", &ckpt);
    weft_ok(&["train", "--config", config.to_str().unwrap(), "--quiet", "--set", &set]);
    let step = ckpt.join("step-00000002");
    // (1048576 wide: refused at once with the check; a model of that width without it, 8 MB)
    edit_model(&step, "hidden", serde_json::json!([1048576]));
    both_refused(
        &dir,
        &step,
        &[
            "model.hidden: [1048576]",
            "layers.0.weight has shape [8, 2], not [hidden[0], in_features]",
        ],
    );
    edit_model(&step, "hidden", serde_json::json!([8]));
    edit_model(&step, "in_features", serde_json::json!(5));
    both_refused(&dir, &step, &["model.in_features: 5, but layers.0.weight"]);
    edit_model(&step, "in_features", serde_json::json!(2));
    edit_model(&step, "hidden", serde_json::json!([8, 8]));
    both_refused(
        &dir,
        &step,
        &["model.hidden: [8, 8], but layers.1.weight has shape [3, 8]"],
    );
    // put back, it exports
    edit_model(&step, "hidden", serde_json::json!([8]));
    let onnx = dir.join("x.onnx");
    weft_ok(&[
        "export",
        "onnx",
        "--checkpoint",
        step.to_str().unwrap(),
        "--output",
        onnx.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_convnet_config_that_disagrees_with_its_tensors_is_refused_before_the_model_is_built() {
    let dir = temp_dir("classifier-convnet-index");
    let step = convnet_checkpoint(&dir, "ckpt");
    edit_model(&step, "channels", serde_json::json!([4096]));
    both_refused(
        &dir,
        &step,
        &["model.channels: [4096], but convs.0.weight has shape [2, 1, 3, 3]"],
    );
    edit_model(&step, "channels", serde_json::json!([2]));
    edit_model(&step, "image_size", serde_json::json!(8));
    both_refused(&dir, &step, &["model.image_size: 8, but fc.weight has shape [3, 8]"]);
    edit_model(&step, "image_size", serde_json::json!(4));
    let file = dir.join("x.safetensors");
    weft_ok(&[
        "checkpoint",
        "consolidate",
        step.to_str().unwrap(),
        "-o",
        file.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_dir_all(&dir);
}
