//! Tokenizer ids against references computed by Python (tools/reference/make_tokenizer_fixtures.py):
//! GPT-2 BPE against tiktoken's r50k_base on a torture text and Tiny Shakespeare, and a small
//! tokenizer.json against the Python `tokenizers` package.

use std::io::Write;

use serde_json::Value;
use sha2::{Digest, Sha256};
use weft_data::{Gpt2Tokenizer, HfTokenizer, Tokenizer};

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn gpt2_matches_tiktoken_on_the_torture_text() {
    let f = fixture("gpt2_torture.json");
    let text = f["text"].as_str().unwrap();
    let want = ids(&f["ids"]);
    let tok = Tokenizer::Gpt2(Gpt2Tokenizer::new());
    let got = tok.encode(text).unwrap();
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "id {i} differs");
    }
    assert_eq!(tok.decode(&got).unwrap(), text);
    // `<|endoftext|>` in the text is plain text, never the end-of-text id
    assert!(text.contains("<|endoftext|>") && !got.contains(&50256));
}

#[test]
fn gpt2_matches_tiktoken_on_tiny_shakespeare() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/tinyshakespeare.txt");
    let Ok(raw) = std::fs::read(path) else {
        writeln!(std::io::stderr(), "skipped: {path} is absent").unwrap();
        return;
    };
    let f = fixture("gpt2_shakespeare.json");
    assert_eq!(
        format!("{:x}", Sha256::digest(&raw)),
        f["sha256_text"].as_str().unwrap(),
        "{path} is not the text the fixture was made from"
    );
    let got = Gpt2Tokenizer::new().encode(std::str::from_utf8(&raw).unwrap());
    assert_eq!(got.len() as u64, f["count"].as_u64().unwrap());
    let first = ids(&f["first_ids"]);
    assert_eq!(&got[..first.len()], &first[..]);
    let le: Vec<u8> = got.iter().flat_map(|i| i.to_le_bytes()).collect();
    assert_eq!(
        format!("{:x}", Sha256::digest(&le)),
        f["sha256_ids_u32le"].as_str().unwrap()
    );
}

#[test]
fn tokenizer_json_matches_python_tokenizers() {
    check_tokenizer_json("tiny_bpe");
}

/// A tokenizer.json of the form Qwen2's and Qwen3's take: NFC, a `Split` on their regex (with a
/// lookahead), byte-level without its own regex, and their special tokens inside the text.
#[test]
fn a_qwen_style_tokenizer_json_matches_python_tokenizers() {
    check_tokenizer_json("qwen_style");
}

/// `tests/fixtures/{name}_tokenizer.json` encodes and decodes each case of
/// `{name}_expected.json` as the Python `tokenizers` package did.
fn check_tokenizer_json(name: &str) {
    let path = format!("{}/tests/fixtures/{name}_tokenizer.json", env!("CARGO_MANIFEST_DIR"));
    let tok = HfTokenizer::from_file(std::path::Path::new(&path)).unwrap();
    let f = fixture(&format!("{name}_expected.json"));
    assert_eq!(tok.vocab_size() as u64, f["vocab_size"].as_u64().unwrap());
    assert_eq!(tok.eot(), Some(0));
    let cases = f["cases"].as_array().unwrap();
    assert!(cases.len() >= 5);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        assert_eq!(tok.encode(text).unwrap(), want, "{text:?}");
        assert_eq!(
            tok.decode(&want).unwrap(),
            case["decoded"].as_str().unwrap(),
            "{text:?}"
        );
    }
}

#[test]
fn gpt2_encoded_in_parallel_pieces_gives_the_same_ids() {
    let f = fixture("gpt2_torture.json");
    let torture = f["text"].as_str().unwrap();
    let tok = Gpt2Tokenizer::new();
    // the torture text, and text with many cut points, in pieces from 1 byte up
    let words = "It's the end of the world as we know it. Tabs\there, 12 34 x y\n\n".repeat(40);
    let mixed = format!("{torture} {words}{torture}");
    for text in [torture, words.as_str(), mixed.as_str()] {
        let whole = tok.encode(text);
        for piece_bytes in [1, 7, 64, 1000] {
            assert_eq!(
                tok.encode_parallel(text, 3, piece_bytes),
                whole,
                "pieces of {piece_bytes} bytes"
            );
        }
    }
    // Tiny Shakespeare in ~10 KB pieces: the ids of the reference
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/tinyshakespeare.txt");
    let Ok(text) = std::fs::read_to_string(path) else {
        writeln!(std::io::stderr(), "skipped the Tiny Shakespeare part: {path} is absent").unwrap();
        return;
    };
    let ids = tok.encode_parallel(&text, 2, 10_000);
    let f = fixture("gpt2_shakespeare.json");
    assert_eq!(ids.len() as u64, f["count"].as_u64().unwrap());
    let le: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
    assert_eq!(
        format!("{:x}", Sha256::digest(&le)),
        f["sha256_ids_u32le"].as_str().unwrap()
    );
}
