//! Paths that are not regular files (a device that never ends, a pipe, a directory) are refused,
//! by every loader that opens a file a config or a command line names, before anything is read.
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use weft_data::tokens::{prepare, PrepareOptions, INDEX_NAME};
use weft_data::{
    BatchesDataset, CsvDataset, Gpt2Tokenizer, HfTokenizer, LabelColumn, LocalFolder, TextDataset, TokenDataset,
    Tokenizer, TokenizerSpec,
};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("weft-not-a-file-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `d/name`, a symlink to /dev/zero.
fn link_to_zero(d: &Path, name: &str) -> PathBuf {
    let p = d.join(name);
    std::os::unix::fs::symlink("/dev/zero", &p).unwrap();
    p
}

/// `d/name`, a named pipe nobody writes to (opening it for reading would wait for ever).
fn fifo(d: &Path, name: &str) -> PathBuf {
    let p = d.join(name);
    let ok = std::process::Command::new("mkfifo").arg(&p).status().unwrap().success();
    assert!(ok, "mkfifo {}", p.display());
    p
}

/// Every loader of one file, by what it loads; each result as its error's text.
fn every_loader(path: &Path) -> Vec<(&'static str, String)> {
    fn err<T: std::fmt::Debug>(r: weft_data::Result<T>) -> String {
        r.unwrap_err().to_string()
    }
    let tok = Tokenizer::Gpt2(Gpt2Tokenizer::new());
    let out = path.with_extension("out");
    vec![
        ("tokenizer spec", err(TokenizerSpec::File(path.into()).load())),
        ("tokenizer.json", err(HfTokenizer::from_file(path))),
        ("text", err(TextDataset::from_file(path, 0.1))),
        ("csv", err(CsvDataset::from_file(path, LabelColumn::Last, 1.0, 0.1))),
        ("batches", err(BatchesDataset::from_file(path))),
        (
            "prepare input",
            err(prepare(
                &tok,
                &[path.into()],
                &LocalFolder::new(&out),
                &PrepareOptions::default(),
                &mut |_| {},
            )),
        ),
    ]
}

#[test]
fn a_device_a_pipe_or_a_directory_is_refused_naming_the_path() {
    let d = dir("loaders");
    let zero = link_to_zero(&d, "zero.json");
    let pipe = fifo(&d, "pipe.json");
    let sub = d.join("folder.json");
    std::fs::create_dir(&sub).unwrap();
    for (path, kind) in [
        (Path::new("/dev/zero"), "a character device"),
        (&zero, "a character device"),
        (&pipe, "a FIFO"),
        (&sub, "a directory"),
    ] {
        for (loader, e) in every_loader(path) {
            assert_eq!(e, format!("{}: not a file ({kind})", path.display()), "{loader}");
        }
    }
    // prepare wrote nothing for any of them
    assert!(!zero.with_extension("out").join(INDEX_NAME).exists());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_token_dataset_whose_index_or_shard_is_not_a_file_is_refused() {
    let d = dir("tokens");
    let input = d.join("doc.txt");
    std::fs::write(&input, "All: Speak, speak. First Citizen: You are all resolved.").unwrap();
    let out = d.join("out");
    let tok = Tokenizer::Gpt2(Gpt2Tokenizer::new());
    let opts = PrepareOptions {
        val_fraction: 0.2,
        ..PrepareOptions::default()
    };
    prepare(&tok, &[input], &LocalFolder::new(&out), &opts, &mut |_| {}).unwrap();
    let open = || TokenDataset::open(Arc::new(LocalFolder::new(&out)));
    assert!(open().is_ok());

    // a shard replaced by a link to /dev/zero
    let shard = out.join("train-00000.bin");
    std::fs::remove_file(&shard).unwrap();
    link_to_zero(&out, "train-00000.bin");
    let e = open().unwrap_err().to_string();
    assert_eq!(e, format!("{}: not a file (a character device)", shard.display()));

    // index.json itself
    let index = out.join(INDEX_NAME);
    std::fs::remove_file(&index).unwrap();
    link_to_zero(&out, INDEX_NAME);
    let e = open().unwrap_err().to_string();
    assert_eq!(e, format!("{}: not a file (a character device)", index.display()));
    std::fs::remove_dir_all(&d).unwrap();
}
