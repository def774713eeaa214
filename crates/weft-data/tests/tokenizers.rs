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
fn ids_a_tokenizer_json_skips_are_refused_by_decode_exact() {
    let t = Tokenizer::Hf(
        HfTokenizer::from_json_text(
            r#"{"model":{"type":"WordLevel","vocab":{"a":0,"<unk>":1,"b":3},"unk_token":"<unk>"}}"#,
        )
        .unwrap(),
    );
    assert_eq!(t.vocab_size(), 4);
    // decode drops the gap without a word, as the tokenizers crate does
    assert_eq!(t.decode(&[0, 2, 3]).unwrap(), t.decode(&[0, 3]).unwrap());
    let e = t.decode_exact(&[0, 3, 2]).unwrap_err().to_string();
    assert!(e.contains("token id 2 at position 2") && e.contains("no token"), "{e}");
    assert_eq!(t.decode_exact(&[0, 3]).unwrap(), t.decode(&[0, 3]).unwrap());
    assert!(matches!(
        t.decode_exact(&[4]),
        Err(Error::TokenOutOfRange { id: 4, .. })
    ));
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

/// tokenizer.json files on which the `tokenizers` crate panics (found by fuzzing): the file, and
/// whether the panic comes while loading it or while decoding `[0]`.
const DAMAGED: [(&str, &str); 3] = [
    // a merge whose pieces are longer than any token of the vocabulary
    (
        "merge.json",
        r#"{"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":["a b"]}}"#,
    ),
    // a Precompiled normalizer whose charsmap does not parse
    (
        "charsmap.json",
        r#"{"normalizer":{"type":"Precompiled","precompiled_charsmap":"AAAA"},
            "model":{"type":"WordLevel","vocab":{"a":0,"<unk>":1},"unk_token":"<unk>"}}"#,
    ),
    // a Strip decoder that strips more characters than the token has
    (
        "strip.json",
        r#"{"decoder":{"type":"Strip","content":" ","start":0,"stop":2},
            "model":{"type":"WordLevel","vocab":{" ":0,"<unk>":1},"unk_token":"<unk>"}}"#,
    ),
];

/// What loading then decoding `[0]` and encoding "a b" gives: the first error.
fn load_and_use(load: impl FnOnce() -> weft_data::Result<Tokenizer>) -> weft_data::Result<()> {
    let t = load()?;
    t.decode(&[0])?;
    t.encode("a b")?;
    Ok(())
}

#[test]
fn a_tokenizer_json_that_panics_the_tokenizers_crate_is_an_error_naming_the_file() {
    for (name, text) in DAMAGED {
        let path = tmp(name);
        std::fs::write(&path, text).unwrap();
        // through every way in: a spec, the file, its JSON form (as a checkpoint records it)
        let via_spec = load_and_use(|| TokenizerSpec::File(path.clone()).load()).unwrap_err();
        let via_file = load_and_use(|| HfTokenizer::from_file(&path).map(Tokenizer::Hf)).unwrap_err();
        for e in [via_spec.to_string(), via_file.to_string()] {
            assert!(e.starts_with(&format!("{}: cannot ", path.display())), "{name}: {e}");
            assert!(
                e.contains("the tokenizers library failed on this tokenizer (it panicked: "),
                "{name}: {e}"
            );
        }
        let form = format!(r#"{{"type":"hf","tokenizer":{text}}}"#);
        let e = load_and_use(|| Tokenizer::from_json(&form)).unwrap_err().to_string();
        assert!(e.contains("cannot ") && e.contains("(it panicked: "), "{name}: {e}");
    }
    // where each one fails, and a message of the library's own
    let strip = tmp("strip.json");
    let t = TokenizerSpec::File(strip.clone()).load().unwrap();
    let e = t.decode(&[0]).unwrap_err().to_string();
    assert!(e.starts_with(&format!("{}: cannot decode: ", strip.display())), "{e}");
    // (the panic's own words depend on the build: an overflow check, or the index it leads to)
    assert!(e.contains("(it panicked: "), "{e}");
    let charsmap = tmp("charsmap.json");
    let e = TokenizerSpec::File(charsmap.clone()).load().unwrap_err().to_string();
    assert!(e.starts_with(&format!("{}: cannot load: ", charsmap.display())), "{e}");
    assert!(e.contains("precompiled_charsmap"), "{e}");
    // the process goes on: a sound tokenizer still works, and decoding an id past the vocabulary
    // is still TokenOutOfRange, checked before the library is called
    let tiny = TokenizerSpec::File(TINY.into()).load().unwrap();
    let ids = tiny.encode("the quick brown fox").unwrap();
    assert_eq!(tiny.decode(&ids).unwrap(), "the quick brown fox");
    assert!(matches!(
        t.decode(&[2]).unwrap_err(),
        Error::TokenOutOfRange { id: 2, .. }
    ));
}

/// The tiny fixture with `extra` merged into its top level.
fn tiny_with(extra: serde_json::Value) -> std::path::PathBuf {
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(TINY).unwrap()).unwrap();
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    let path = tmp(&format!(
        "tiny-{}.json",
        extra.as_object().unwrap().keys().next().unwrap()
    ));
    std::fs::write(&path, v.to_string()).unwrap();
    path
}

#[test]
fn padding_and_truncation_settings_of_the_file_are_not_applied() {
    let plain = TokenizerSpec::File(TINY.into()).load().unwrap();
    let text = "the quick brown fox jumps over the lazy dog ".repeat(20);
    let want = plain.encode(&text).unwrap();
    assert!(want.len() > 64, "{}", want.len());
    let padded = tiny_with(serde_json::json!({"padding": {
        "strategy": {"Fixed": 64}, "direction": "Right", "pad_to_multiple_of": null,
        "pad_id": 3, "pad_type_id": 0, "pad_token": "[PAD]"}}));
    let truncated = tiny_with(serde_json::json!({"truncation": {
        "direction": "Right", "max_length": 3, "strategy": "LongestFirst", "stride": 0}}));
    for path in [padded, truncated] {
        let t = TokenizerSpec::File(path.clone()).load().unwrap();
        // no pad ids after a short text, no document cut to max_length
        assert_eq!(
            t.encode("the").unwrap(),
            plain.encode("the").unwrap(),
            "{}",
            path.display()
        );
        assert_eq!(t.encode(&text).unwrap(), want, "{}", path.display());
        // the recorded form keeps the file as it was; read back, the settings stay off
        let form = t.to_json();
        assert!(
            form.contains("\"padding\":{") || form.contains("\"truncation\":{"),
            "{form}"
        );
        assert_eq!(Tokenizer::from_json(&form).unwrap().encode(&text).unwrap(), want);
    }
}
