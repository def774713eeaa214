//! `weft data encode | decode | prepare`: the ids, the text, the dataset written, and one error
//! line with a non-zero exit for bad input.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::{temp_dir, weft_bin};

fn weft(args: &[&str], stdin: &[u8]) -> Output {
    weft_threads(args, stdin, 2)
}

fn weft_threads(args: &[&str], stdin: &[u8], threads: usize) -> Output {
    let mut child = Command::new(weft_bin())
        .args(args)
        .env("WEFT_NUM_THREADS", threads.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // a command that fails before reading stdin closes it: a broken pipe here is not the test's concern
    let _ = child.stdin.take().unwrap().write_all(stdin);
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "stderr: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// The run failed (exit 1) with exactly one stderr line, an error that contains every one of
/// `words`.
fn fails_with(o: &Output, words: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("weft: error: "), "{err}");
    for w in words {
        assert!(err.contains(w), "{w:?} not in {err}");
    }
}

#[test]
fn encode_and_decode_gpt2() {
    let ids = stdout(&weft(
        &["data", "encode", "--tokenizer", "gpt2"],
        "hello world".as_bytes(),
    ));
    assert_eq!(ids.trim(), "[31373,995]");
    let text = stdout(&weft(
        &["data", "decode", "--tokenizer", "gpt2"],
        b"[31373, 995, 50256]",
    ));
    assert_eq!(text, "hello world<|endoftext|>");
    let torture = "caf\u{e9} \u{1F468}\u{200D}\u{1F469}\r\n\t  x's";
    let ids = stdout(&weft(&["data", "encode", "--tokenizer", "gpt2"], torture.as_bytes()));
    let back = stdout(&weft(&["data", "decode", "--tokenizer", "gpt2"], ids.as_bytes()));
    assert_eq!(back, torture);
}

#[test]
fn encode_with_a_tokenizer_json() {
    let tj = common::repo().join("crates/weft-data/tests/fixtures/tiny_bpe_tokenizer.json");
    let o = weft(
        &["data", "encode", "--tokenizer", tj.to_str().unwrap()],
        b"the quick brown fox",
    );
    assert_eq!(stdout(&o).trim(), "[271,273,294,260,82,79,87,78,221,291,88]");
}

#[test]
fn bad_input_is_one_line_naming_the_culprit() {
    fails_with(
        &weft(&["data", "decode", "--tokenizer", "gpt2"], b"[1, 2"),
        &["stdin", "JSON"],
    );
    fails_with(
        &weft(&["data", "decode", "--tokenizer", "gpt2"], b"[50257]"),
        &["50257"],
    );
    fails_with(
        &weft(&["data", "encode", "--tokenizer", "gpt2"], b"\xff\xfe"),
        &["stdin", "UTF-8"],
    );
    fails_with(
        &weft(&["data", "encode", "--tokenizer", "char"], b"abc"),
        &["--tokenizer", "char"],
    );
    fails_with(
        &weft(&["data", "encode", "--tokenizer", "/no/such/tok.json"], b"abc"),
        &["/no/such/tok.json"],
    );
    let d = temp_dir("data-cli-bad");
    let input = d.join("in.txt");
    std::fs::write(&input, "some text").unwrap();
    let i = input.to_str().unwrap();
    let out = d.join("out");
    let o = out.to_str().unwrap();
    std::fs::write(d.join("bad.txt"), b"\xff").unwrap();
    let bad = d.join("bad.txt");
    let prepare = |inputs: &[&str], output: &str, extra: &[&str], words: &[&str]| {
        let mut args = vec!["data", "prepare", "--tokenizer", "gpt2", "--output", output];
        args.extend(extra);
        args.push("--input");
        args.extend(inputs);
        fails_with(&weft(&args, b""), words);
    };
    for (flag, value, words) in [
        ("--val-fraction", "1", &["--val-fraction"][..]),
        ("--val-fraction", "x", &["--val-fraction"]),
        ("--shard-tokens", "0", &["--shard-tokens"]),
        ("--shard-tokens", "-5", &["--shard-tokens"]),
        ("--block-bytes", "6", &["--block-bytes"]),
    ] {
        prepare(&[i], o, &[flag, value], words);
    }
    // (writing to a real S3-compatible server is tested in train_tokens.rs)
    prepare(&[i], "ftp://bucket/x", &[], &["ftp://bucket/x", "unsupported scheme"]);
    prepare(&["/no/such.txt"], o, &[], &["/no/such.txt"]);
    prepare(&[i, bad.to_str().unwrap()], o, &[], &["bad.txt", "UTF-8"]);
    assert!(!out.join("index.json").exists());
}

fn read_json(p: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

#[test]
fn prepare_writes_shards_and_an_index_then_refuses_to_overwrite() {
    let d = temp_dir("data-cli-prepare");
    let docs = ["First Citizen:\nSpeak.", "All:\nSpeak, speak.\n", "Resolved. resolved."];
    let inputs: Vec<String> = docs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let p = d.join(format!("d{i}.txt"));
            std::fs::write(&p, t).unwrap();
            p.to_str().unwrap().to_string()
        })
        .collect();
    let out = d.join("out");
    let mut args = vec![
        "data",
        "prepare",
        "--tokenizer",
        "gpt2",
        "--output",
        out.to_str().unwrap(),
    ];
    args.extend(["--val-fraction", "0.2", "--shard-tokens", "5", "--input"]);
    args.extend(inputs.iter().map(String::as_str));
    let line = stdout(&weft(&args, b""));
    assert!(
        line.contains("index.json") && line.contains("train") && line.contains("2 threads"),
        "{line}"
    );
    let index = read_json(&out.join("index.json"));
    assert_eq!(index["dtype"], "u16");
    assert_eq!(index["eot"], 50256);
    // the train stream, decoded: each document's first 80 % then <|endoftext|>
    let mut train = vec![];
    for shard in index["splits"]["train"]["shards"].as_array().unwrap() {
        let raw = std::fs::read(out.join(shard["name"].as_str().unwrap())).unwrap();
        assert!(shard["tokens"].as_u64().unwrap() <= 5);
        train.extend(raw.chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as u32));
    }
    let ids = serde_json::to_string(&train).unwrap();
    let text = stdout(&weft(
        &[
            "data",
            "decode",
            "--tokenizer",
            out.join("index.json").to_str().unwrap(),
        ],
        ids.as_bytes(),
    ));
    assert_eq!(text.matches("<|endoftext|>").count(), 3, "{text}");
    assert!(text.starts_with("First Citizen:\n"), "{text}");
    // a second prepare into the same folder is refused, and leaves the index alone
    let before = std::fs::read(out.join("index.json")).unwrap();
    fails_with(&weft(&args, b""), &["index.json", "already"]);
    assert_eq!(std::fs::read(out.join("index.json")).unwrap(), before);

    // char: the vocabulary of the inputs, recorded in index.json, readable by decode
    let out = d.join("char");
    let mut args = vec![
        "data",
        "prepare",
        "--tokenizer",
        "char",
        "--output",
        out.to_str().unwrap(),
        "--input",
    ];
    args.extend(inputs.iter().map(String::as_str));
    let line = stdout(&weft_threads(&args, b"", 1));
    assert!(line.contains("1 thread)"), "{line}");
    let index = read_json(&out.join("index.json"));
    assert_eq!(index["tokenizer"]["type"], "char");
    assert_eq!(index["eot"], serde_json::Value::Null);
    let idx = out.join("index.json");
    let ids = stdout(&weft(
        &["data", "encode", "--tokenizer", idx.to_str().unwrap()],
        b"Speak",
    ));
    let back = stdout(&weft(
        &["data", "decode", "--tokenizer", idx.to_str().unwrap()],
        ids.as_bytes(),
    ));
    assert_eq!(back, "Speak");
}

#[test]
fn a_tokenizer_json_the_library_panics_on_is_one_error_line_naming_it() {
    let d = temp_dir("data-cli-damaged-tokenizer");
    let file = |name: &str, text: &str| {
        let p = d.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    // found by fuzzing: each made the tokenizers crate panic (exit 101, "thread 'main' panicked at")
    let merge = file(
        "merge.json",
        r#"{"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":["a b"]}}"#,
    );
    let charsmap = file(
        "charsmap.json",
        r#"{"normalizer":{"type":"Precompiled","precompiled_charsmap":"AAAA"},
            "model":{"type":"WordLevel","vocab":{"a":0,"<unk>":1},"unk_token":"<unk>"}}"#,
    );
    let strip = file(
        "strip.json",
        r#"{"decoder":{"type":"Strip","content":" ","start":0,"stop":2},
            "model":{"type":"WordLevel","vocab":{" ":0,"<unk>":1},"unk_token":"<unk>"}}"#,
    );
    for (tok, doing) in [
        (&merge, "cannot load"),
        (&charsmap, "cannot load"),
        (&strip, "cannot decode"),
    ] {
        fails_with(
            &weft(&["data", "decode", "--tokenizer", tok], b"[0]"),
            &["--tokenizer", tok, doing, "the tokenizers library failed"],
        );
    }
    fails_with(
        &weft(&["data", "encode", "--tokenizer", &charsmap], b"a"),
        &[&charsmap, "cannot load"],
    );
    // prepare: the same line, and no index.json
    let input = d.join("in.txt");
    std::fs::write(&input, "a a a").unwrap();
    let out = d.join("out");
    fails_with(
        &weft(
            &[
                "data",
                "prepare",
                "--tokenizer",
                &charsmap,
                "--output",
                out.to_str().unwrap(),
                "--input",
                input.to_str().unwrap(),
            ],
            b"",
        ),
        &[&charsmap, "cannot load"],
    );
    assert!(!out.join("index.json").exists());
}

#[cfg(unix)]
#[test]
fn a_tokenizer_path_that_is_not_a_file_is_refused_before_reading() {
    // /dev/zero never ends: it was read until memory ran out
    fails_with(
        &weft(&["data", "decode", "--tokenizer", "/dev/zero"], b"[0]"),
        &["--tokenizer", "/dev/zero: not a file (a character device)"],
    );
    let d = temp_dir("data-cli-not-a-file");
    let link = d.join("tokenizer.json");
    std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
    let link = link.to_str().unwrap();
    fails_with(
        &weft(&["data", "encode", "--tokenizer", link], b"a"),
        &[link, "not a file"],
    );
    let dir = d.to_str().unwrap();
    fails_with(
        &weft(&["data", "encode", "--tokenizer", dir], b"a"),
        &[dir, "not a file (a directory)"],
    );
}
