//! CharTokenizer: vocabulary, round trip, errors, JSON form.

use weft_data::{CharTokenizer, Error};

#[test]
fn round_trip_including_unicode_and_newlines() {
    let text = "First Citizen:\nBefore we proceed — any further, héar me speak.\n";
    let t = CharTokenizer::from_text(text);
    let ids = t.encode(text).unwrap();
    assert_eq!(ids.len(), text.chars().count());
    assert!(ids.iter().all(|&i| (0..t.vocab_size() as i64).contains(&i)));
    assert_eq!(t.decode(&ids).unwrap(), text);
    // sorted, unique: ids increase with the character
    let mut chars = t.chars().to_vec();
    chars.sort_unstable();
    chars.dedup();
    assert_eq!(chars, t.chars());
    assert_eq!(t.encode("").unwrap(), Vec::<i64>::new());
    assert_eq!(t.decode(&[]).unwrap(), "");
}

#[test]
fn unknown_char_names_char_and_position() {
    let t = CharTokenizer::from_text("abc");
    let err = t.encode("abéz").unwrap_err();
    assert!(matches!(err, Error::UnknownChar { ch: 'é', position: 2 }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("'é'") && msg.contains("position 2"), "{msg}");
}

#[test]
fn out_of_range_ids_rejected() {
    let t = CharTokenizer::from_text("abc");
    for bad in [3i64, -1, i64::MAX] {
        let err = t.decode(&[0, 1, bad]).unwrap_err();
        assert!(
            matches!(err, Error::TokenOutOfRange { id, position: 2, vocab_size: 3 } if id == bad),
            "{err:?}"
        );
        assert!(err.to_string().contains(&bad.to_string()));
    }
}

#[test]
fn json_round_trip() {
    let t = CharTokenizer::from_text("hello \"world\"\n\t\\ ünï");
    let json = t.to_json();
    let back = CharTokenizer::from_json(&json).unwrap();
    assert_eq!(back, t);
    assert_eq!(back.encode("hello").unwrap(), t.encode("hello").unwrap());
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["type"], "char");
}

#[test]
fn json_errors_name_the_key() {
    let cases = [
        ("not json", "does not parse"),
        ("[1, 2]", "must be an object"),
        (r#"{"vocab": "ab"}"#, "\"type\""),
        (r#"{"type": "bpe", "vocab": "ab"}"#, "\"type\""),
        (r#"{"type": "char"}"#, "\"vocab\""),
        (r#"{"type": "char", "vocab": 3}"#, "\"vocab\""),
        (r#"{"type": "char", "vocab": "aba"}"#, "'a' twice"),
    ];
    for (json, expected) in cases {
        let msg = CharTokenizer::from_json(json).unwrap_err().to_string();
        assert!(msg.contains(expected), "{json}: {msg}");
    }
}
