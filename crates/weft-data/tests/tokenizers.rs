//! Tokenizer: the kinds behind one type, their JSON forms, specs, errors and lossy decoding.

use weft_data::{CharTokenizer, Error, Gpt2Tokenizer, HfTokenizer, Tokenizer, TokenizerSpec};

const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tiny_bpe_tokenizer.json");

fn tmp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("weft-tokenizers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn every_kind_round_trips_through_its_json_form() {
    let kinds = [
        Tokenizer::Char(CharTokenizer::from_text("hello world")),
        Tokenizer::Gpt2(Gpt2Tokenizer::new()),
        Tokenizer::Hf(HfTokenizer::from_file(std::path::Path::new(TINY)).unwrap()),
    ];
    for tok in kinds {
        let back = Tokenizer::from_json(&tok.to_json()).unwrap();
        assert_eq!(back.kind(), tok.kind());
        assert_eq!(back.vocab_size(), tok.vocab_size());
        assert_eq!(back.eot(), tok.eot());
        let text = "hello world hello";
        assert_eq!(back.encode(text).unwrap(), tok.encode(text).unwrap(), "{}", tok.kind());
        let ids = tok.encode(text).unwrap();
        assert_eq!(back.decode(&ids).unwrap(), text);
    }
}

#[test]
fn the_char_json_form_is_unchanged_and_old_checkpoints_read() {
    let c = CharTokenizer::from_text("ab\nc");
    let t = Tokenizer::from(c.clone());
    assert_eq!(t.to_json(), c.to_json());
    // the form existing checkpoints hold
    let old = r#"{"type":"char","vocab":"\nabc"}"#;
    let back = Tokenizer::from_json(old).unwrap();
    assert_eq!(back.encode("cab\n").unwrap(), vec![3, 1, 2, 0]);
    assert_eq!(back.eot(), None);
}

#[test]
fn gpt2_basics() {
    let t = Tokenizer::Gpt2(Gpt2Tokenizer::new());
    assert_eq!(t.vocab_size(), 50257);
    assert_eq!(t.eot(), Some(50256));
    assert_eq!(t.encode("hello world").unwrap(), vec![31373, 995]);
    assert_eq!(t.decode(&[50256]).unwrap(), "<|endoftext|>");
    assert_eq!(t.to_json(), r#"{"encoding":"r50k_base","type":"gpt2"}"#);
}

#[test]
fn ids_that_split_a_character_decode_lossily() {
    let t = Tokenizer::Gpt2(Gpt2Tokenizer::new());
    let ids = t.encode("\u{1F600}").unwrap();
    assert!(ids.len() > 1, "{ids:?}");
    assert_eq!(t.decode(&ids).unwrap(), "\u{1F600}");
    let first = t.decode(&ids[..1]).unwrap();
    assert!(first.contains('\u{FFFD}') && !first.contains('\u{1F600}'), "{first:?}");
}

#[test]
fn out_of_range_ids_are_refused_by_every_kind() {
    let kinds = [
        Tokenizer::Char(CharTokenizer::from_text("abc")),
        Tokenizer::Gpt2(Gpt2Tokenizer::new()),
        Tokenizer::Hf(HfTokenizer::from_file(std::path::Path::new(TINY)).unwrap()),
    ];
    for t in kinds {
        let v = t.vocab_size() as u32;
        let err = t.decode(&[0, v]).unwrap_err();
        assert!(
            matches!(err, Error::TokenOutOfRange { id, position: 1, .. } if id == i64::from(v)),
            "{}: {err:?}",
            t.kind()
        );
    }
}

#[test]
fn bad_json_forms_name_the_key() {
    for (text, key) in [
        ("[1]", "object"),
        ("{}", "\"type\""),
        (r#"{"type":"bpe"}"#, "\"type\""),
        (r#"{"type":"gpt2","encoding":"cl100k_base"}"#, "\"encoding\""),
        (r#"{"type":"hf"}"#, "\"tokenizer\""),
        (r#"{"type":"hf","tokenizer":{"model":3}}"#, "tokenizer.json"),
        (r#"{"type":"char"}"#, "\"vocab\""),
        ("nope", "parse"),
    ] {
        let e = Tokenizer::from_json(text).unwrap_err().to_string();
        assert!(e.contains(key), "{text}: {e}");
    }
}

#[test]
fn specs_load_gpt2_files_and_refuse_a_bare_char() {
    assert_eq!("gpt2".parse::<TokenizerSpec>().unwrap().load().unwrap().kind(), "gpt2");
    let e = "char".parse::<TokenizerSpec>().unwrap().load().unwrap_err().to_string();
    assert!(e.contains("char"), "{e}");
    let t = "char"
        .parse::<TokenizerSpec>()
        .unwrap()
        .load_with_corpus(["ba", "ca"])
        .unwrap();
    assert_eq!(t.encode("abc").unwrap(), vec![0, 1, 2]);
    // a file: a tokenizer.json, or weft's own JSON form
    assert_eq!(TokenizerSpec::File(TINY.into()).load().unwrap().kind(), "hf");
    let own = tmp("own.json");
    std::fs::write(&own, t.to_json()).unwrap();
    assert_eq!(TokenizerSpec::File(own.clone()).load().unwrap().vocab_size(), 3);
    // errors name the file
    let missing = tmp("missing.json");
    let e = TokenizerSpec::File(missing.clone()).load().unwrap_err().to_string();
    assert!(e.contains("missing.json"), "{e}");
    let garbage = tmp("garbage.json");
    std::fs::write(&garbage, "{not json").unwrap();
    let e = TokenizerSpec::File(garbage).load().unwrap_err().to_string();
    assert!(e.contains("garbage.json") && e.contains("not JSON"), "{e}");
    let not_tok = tmp("not_tok.json");
    std::fs::write(&not_tok, r#"{"model": 1}"#).unwrap();
    let e = TokenizerSpec::File(not_tok).load().unwrap_err().to_string();
    assert!(e.contains("not_tok.json"), "{e}");
    assert!("".parse::<TokenizerSpec>().is_err());
}
