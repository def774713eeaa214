//! A validation split that cannot give a batch: only one too small for a batch gets the advice
//! about batch sizes (`lower data.batch_size or raise data.val_fraction`); a damaged token
//! shard (a checksum that does not match, ids outside the vocabulary) is reported as the shard's
//! own error, naming it, by `weft train` and `weft evaluate` alike. Before, every error of the
//! first evaluation batch came with the batch-size advice.

mod common;

use std::path::{Path, PathBuf};

use common::{fails_with, path_set, temp_dir, weft_ok};
use serde_json::Value;

/// CRC-32 (IEEE), as index.json records a block's.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Char tokens of a small corpus prepared into `dir/NAME` (val split: 10%, one block).
fn prepare(dir: &Path, name: &str) -> PathBuf {
    let corpus = dir.join("corpus.txt");
    let words = ["the ", "king ", "shall ", "speak ", "of ", "night ", "and ", "honour "];
    let text: String = (0..3000).map(|i| words[(i * 7 + i / 5) % words.len()]).collect();
    std::fs::write(&corpus, text).unwrap();
    let out = dir.join(name);
    #[rustfmt::skip]
    weft_ok(&["data", "prepare", "--tokenizer", "char", "--input", corpus.to_str().unwrap(),
        "--output", out.to_str().unwrap()]);
    out
}

/// A tiny gpt on the token data at `data`, evaluating every 2 steps.
fn config(dir: &Path, data: &Path) -> PathBuf {
    let path = dir.join("run.toml");
    let text = format!(
        "[model]\nkind = \"gpt\"\nvocab_size = 32\nblock_size = 8\nn_layer = 1\nn_head = 2\nn_embd = 16\n\
         bias = true\ndropout = 0.0\n\n[data]\nkind = \"tokens\"\npath = {:?}\nbatch_size = 4\n\n\
         [optim]\nkind = \"adamw\"\nlr = 0.001\n\n[train]\nsteps = 2\neval_every = 2\neval_batches = 2\n",
        data.to_str().unwrap()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Rewrites `data`'s val shard with `edit`; with `fix_crc`, records the new bytes' CRC-32 in
/// index.json (so that only the ids are wrong).
fn damage_val(data: &Path, edit: impl Fn(&mut Vec<u8>), fix_crc: bool) {
    let shard = data.join("val-00000.bin");
    let mut bytes = std::fs::read(&shard).unwrap();
    edit(&mut bytes);
    std::fs::write(&shard, &bytes).unwrap();
    if fix_crc {
        let index = data.join("index.json");
        let mut v: Value = serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
        v["splits"]["val"]["shards"][0]["crc32"] = serde_json::json!([crc32(&bytes)]);
        std::fs::write(&index, serde_json::to_vec(&v).unwrap()).unwrap();
    }
}

#[test]
fn a_damaged_validation_shard_is_reported_as_itself() {
    let dir = temp_dir("eval-split");
    let good = prepare(&dir, "good");
    let cfg = config(&dir, &good);
    let c = cfg.to_str().unwrap();
    let ckpt = dir.join("ckpt");
    weft_ok(&[
        "train",
        "--config",
        c,
        "--quiet",
        "--set",
        &path_set("train.checkpoint_dir", &ckpt),
    ]);
    // a split too small for a batch: the advice
    #[rustfmt::skip]
    fails_with(&["train", "--config", c, "--quiet", "--set", "model.block_size=4000"],
        &["train.eval_every = 2, but the validation split cannot give a batch", "too few for one window",
            "lower data.batch_size or raise data.val_fraction"]);

    let crc = dir.join("crc");
    std::fs::create_dir_all(&crc).unwrap();
    for f in ["index.json", "train-00000.bin", "val-00000.bin"] {
        std::fs::copy(good.join(f), crc.join(f)).unwrap();
    }
    let ids = dir.join("ids");
    std::fs::create_dir_all(&ids).unwrap();
    for f in ["index.json", "train-00000.bin", "val-00000.bin"] {
        std::fs::copy(good.join(f), ids.join(f)).unwrap();
    }
    // a byte changed; an id of 31 (the model's vocabulary is 32, the data's a dozen characters)
    // with its block's CRC-32 recorded anew
    damage_val(&crc, |b| b[10] ^= 0x01, false);
    damage_val(&ids, |b| b[10..12].copy_from_slice(&31u16.to_le_bytes()), true);
    let cases = [
        (&crc, "checksum mismatch in bytes 0.."),
        (&ids, "token 31 (at token offset 5) is out of range for vocab_size"),
    ];
    for (data, want) in cases {
        let set = path_set("data.path", data);
        let shard = data.join("val-00000.bin");
        let shard = shard.to_str().unwrap();
        for args in [
            vec!["train", "--config", c, "--quiet", "--set", &set],
            vec![
                "evaluate",
                "--config",
                c,
                "--checkpoint",
                ckpt.to_str().unwrap(),
                "--set",
                &set,
            ],
        ] {
            let err = fails_with(&args, &[shard, want]);
            assert!(
                !err.contains("batch_size") && !err.contains("val_fraction") && !err.contains("cannot give a batch"),
                "{args:?}: {err}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
