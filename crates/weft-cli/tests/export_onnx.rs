//! `weft export onnx` through the binary: a trained checkpoint (a folder, and the file
//! `checkpoint consolidate` writes) becomes an ONNX file; bad requests are one line, exit 1, and
//! leave the output as it was. (The exported models are run and compared with weft's logits in
//! `crates/weft-train/tests/onnx_export.rs`.)

mod common;

use common::{consolidate_ok, fails_with, path_set, temp_dir, train_fixture, weft, weft_ok};

#[test]
fn a_trained_checkpoint_exports_and_bad_requests_write_nothing() {
    let dir = temp_dir("export-onnx");
    let ckpt = dir.join("ckpt");
    let sets = [path_set("train.checkpoint_dir", &ckpt), "train.steps=3".to_string()];
    let out = train_fixture("llama_gqa_adamw", 1, &dir.join("m.jsonl"), &[], &sets);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let onnx = dir.join("model.onnx");
    let (c, o) = (ckpt.to_str().unwrap(), onnx.to_str().unwrap());
    let out = weft_ok(&["export", "onnx", "--checkpoint", c, "--output", o]);
    let text = String::from_utf8_lossy(&out.stdout);
    for want in [
        "llama model",
        "opset 17",
        "input_ids: I64 [batch, seq]",
        "output logits",
    ] {
        assert!(text.contains(want), "{want:?} in {text}");
    }
    let bytes = std::fs::read(&onnx).unwrap();
    // a ModelProto starts with its ir_version field (1, varint 8)
    assert_eq!(&bytes[..2], &[0x08, 0x08]);
    let names = String::from_utf8_lossy(&bytes);
    assert!(names.contains("model.layers.1.self_attn.k_proj.weight") && names.contains("weft.model"));
    // the consolidated file exports the same model
    let file = dir.join("model.safetensors");
    consolidate_ok(&ckpt, &file);
    let again = dir.join("again.onnx");
    weft_ok(&[
        "export",
        "onnx",
        "--checkpoint",
        file.to_str().unwrap(),
        "--output",
        again.to_str().unwrap(),
        "--seq-len",
        "8",
    ]);
    assert!(String::from_utf8_lossy(&std::fs::read(&again).unwrap()).contains("model.norm.weight"));
    // bad requests: one line, and the earlier file untouched
    fails_with(
        &["export", "onnx", "--checkpoint", c, "--output", o, "--seq-len", "x"],
        &["--seq-len", "\"x\""],
    );
    fails_with(
        &[
            "export",
            "onnx",
            "--checkpoint",
            c,
            "--output",
            o,
            "--seq-len",
            "100000",
        ],
        &["--seq-len: 100000", "block_size"],
    );
    // the whole of stderr is that one line
    let out = weft(&["export", "onnx", "--checkpoint", c, "--output", o, "--seq-len", "0"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--seq-len: 0"), "{err}");
    let missing = dir.join("nothing");
    fails_with(
        &[
            "export",
            "onnx",
            "--checkpoint",
            missing.to_str().unwrap(),
            "--output",
            o,
        ],
        &["nothing"],
    );
    let into_file = onnx.join("x.onnx");
    fails_with(
        &[
            "export",
            "onnx",
            "--checkpoint",
            c,
            "--output",
            into_file.to_str().unwrap(),
        ],
        &["x.onnx"],
    );
    assert_eq!(std::fs::read(&onnx).unwrap(), bytes);
    let leftovers: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_sequence_length_for_a_model_without_one_is_refused() {
    // it was ignored: the file written, exit 0
    let dir = temp_dir("export-onnx-seq-len");
    for case in ["mlp_adamw", "convnet_adamw"] {
        let ckpt = dir.join(case);
        let sets = [path_set("train.checkpoint_dir", &ckpt), "train.steps=1".to_string()];
        let out = train_fixture(case, 1, &dir.join("m.jsonl"), &[], &sets);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let onnx = dir.join(format!("{case}.onnx"));
        let (c, o) = (ckpt.to_str().unwrap(), onnx.to_str().unwrap());
        let kind = case.split('_').next().unwrap();
        fails_with(
            &["export", "onnx", "--checkpoint", c, "--output", o, "--seq-len", "4"],
            &[
                "--seq-len 4",
                "gpt and llama",
                &format!("this {kind} model has no sequence axis"),
            ],
        );
        assert!(!onnx.exists(), "{case}");
        // without it, the export runs
        weft_ok(&["export", "onnx", "--checkpoint", c, "--output", o]);
        assert!(onnx.is_file(), "{case}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
