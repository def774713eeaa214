//! Every tokenizer kind as a Hugging Face `tokenizer.json`, for checkpoint folders written in
//! Hugging Face's layout (`weft checkpoint consolidate --format hf`), which `transformers`'
//! `AutoTokenizer.from_pretrained` and the `tokenizers` library read.
//!
//! - `hf`: the `tokenizer.json` it was read from, unchanged.
//! - `char`: a BPE model without merges over the characters (each character one token, no
//!   normalizer or pre-tokenizer, pieces joined by the `Fuse` decoder): the ids weft gives.
//! - `gpt2`: GPT-2's byte-level BPE in the form GPT-2's own `tokenizer.json` has (vocabulary over
//!   bytes mapped to printable characters, byte-level pre-tokenizer, decoder and post-processor,
//!   `<|endoftext|>` an added token), its merges recovered from the `r50k_base` ranks: for each
//!   token of two or more bytes, every split into two tokens, ordered by the token's rank, then
//!   by the ranks of the halves (the conversion `transformers`' `TikTokenConverter` applies to
//!   tiktoken models). Checked to encode as tiktoken does in this module's tests, but for
//!   `<|endoftext|>` written in the text, which is the special token there (as in GPT-2's own
//!   `tokenizer.json`) and plain text to weft's gpt2 (tiktoken's `encode_ordinary`).

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::Tokenizer;

impl Tokenizer {
    /// This tokenizer as the content of a Hugging Face `tokenizer.json`.
    pub fn to_hf_tokenizer_json(&self) -> Value {
        match self {
            Tokenizer::Hf(t) => t.to_json_value()["tokenizer"].clone(),
            Tokenizer::Char(t) => {
                let vocab: Map<String, Value> = t
                    .chars()
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (c.to_string(), json!(i)))
                    .collect();
                json!({
                    "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
                    "normalizer": null, "pre_tokenizer": null, "post_processor": null,
                    "decoder": {"type": "Fuse"},
                    "model": {"type": "BPE", "dropout": null, "unk_token": null,
                              "continuing_subword_prefix": null, "end_of_word_suffix": null,
                              "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                              "vocab": vocab, "merges": []}
                })
            }
            Tokenizer::Gpt2(t) => gpt2_tokenizer_json(&t.token_bytes()),
        }
    }
}

/// GPT-2's byte-to-character map (`bytes_to_unicode` in GPT-2's `encoder.py`): the printable
/// bytes `!`..`~`, `¡`..`¬` and `®`..`ÿ` map to themselves, the other 68 to U+0100 onwards in
/// byte order.
fn byte_chars() -> [char; 256] {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
    let mut out = ['\0'; 256];
    let mut next = 0x100u32;
    for b in 0..256u32 {
        out[b as usize] = if printable(b) {
            char::from_u32(b).expect("a Latin-1 code point")
        } else {
            next += 1;
            char::from_u32(next - 1).expect("below U+0200")
        };
    }
    out
}

/// The `tokenizer.json` of a byte-level BPE whose token `i` is `tokens[i]` (its rank), plus
/// `<|endoftext|>` after them.
fn gpt2_tokenizer_json(tokens: &[Vec<u8>]) -> Value {
    let chars = byte_chars();
    let text = |b: &[u8]| b.iter().map(|&x| chars[x as usize]).collect::<String>();
    let rank: HashMap<&[u8], usize> = tokens.iter().enumerate().map(|(i, t)| (t.as_slice(), i)).collect();
    let mut merges: Vec<(usize, usize, usize, String)> = Vec::new();
    for (r, t) in tokens.iter().enumerate().filter(|(_, t)| t.len() > 1) {
        for cut in 1..t.len() {
            if let (Some(&a), Some(&b)) = (rank.get(&t[..cut]), rank.get(&t[cut..])) {
                merges.push((r, a, b, format!("{} {}", text(&t[..cut]), text(&t[cut..]))));
            }
        }
    }
    merges.sort();
    let mut vocab: Map<String, Value> = tokens.iter().enumerate().map(|(i, t)| (text(t), json!(i))).collect();
    let eot = tokens.len();
    vocab.insert("<|endoftext|>".into(), json!(eot));
    let merges: Vec<Value> = merges.into_iter().map(|m| Value::String(m.3)).collect();
    json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": eot, "content": "<|endoftext|>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": true, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::{CharTokenizer, Gpt2Tokenizer, HfTokenizer};

    const TORTURE: &str = "Hello, world!  It's 3.14 o'clock\t\tand\n\n  spaces   here; naïve café \u{1F600} \
                           日本語のテキスト ĠĊ <|endoftext don't I'll we've 1234567 ---- \r\n end";

    fn through_json(t: &Tokenizer) -> HfTokenizer {
        HfTokenizer::from_json_text(&t.to_hf_tokenizer_json().to_string()).unwrap()
    }

    #[test]
    fn byte_chars_are_gpt2s() {
        let c = byte_chars();
        assert_eq!(c[b'!' as usize], '!');
        assert_eq!(c[b' ' as usize], 'Ġ');
        assert_eq!(c[b'\n' as usize], 'Ċ');
        assert_eq!(c[0], 'Ā');
        assert_eq!(c[0xad], 'Ń');
        let distinct: std::collections::HashSet<char> = c.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }

    #[test]
    fn a_char_vocabulary_encodes_and_decodes_the_same_through_tokenizer_json() {
        let text = "First Citizen:\nBefore we proceed any further, hear me speak.\n";
        let ours = Tokenizer::Char(CharTokenizer::from_text(text));
        let theirs = through_json(&ours);
        let ids = ours.encode(text).unwrap();
        assert_eq!(theirs.encode(text).unwrap(), ids);
        assert_eq!(theirs.decode(&ids).unwrap(), text);
        assert_eq!(theirs.vocab_size(), ours.vocab_size());
    }

    /// The merges recovered from the ranks give tiktoken's ids, on text with every kind of
    /// whitespace, contractions, digits, accents, an emoji and CJK.
    #[test]
    fn gpt2_encodes_as_tiktoken_through_tokenizer_json() {
        let ours = Tokenizer::Gpt2(Gpt2Tokenizer::new());
        let json = ours.to_hf_tokenizer_json();
        assert_eq!(json["model"]["vocab"].as_object().unwrap().len(), 50257);
        // GPT-2's own first merges
        let merges = json["model"]["merges"].as_array().unwrap();
        assert_eq!(merges[0], "Ġ t");
        assert_eq!(merges[1], "Ġ a");
        let theirs = through_json(&ours);
        let mut texts = vec![TORTURE.to_string()];
        let shakespeare =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/tinyshakespeare.txt");
        match std::fs::read_to_string(&shakespeare) {
            Ok(t) => texts.push(t.chars().take(200_000).collect()),
            Err(_) => eprintln!("skipping Tiny Shakespeare: {} is absent", shakespeare.display()),
        }
        for text in &texts {
            let ids = ours.encode(text).unwrap();
            let got = theirs.encode(text).unwrap();
            let first = ids.iter().zip(&got).position(|(a, b)| a != b);
            assert_eq!(got.len(), ids.len(), "first difference at {first:?}");
            assert_eq!(first, None);
            assert_eq!(theirs.decode(&ids).unwrap(), ours.decode(&ids).unwrap());
        }
        // `<|endoftext|>` in the text is its special token here, as in GPT-2's own tokenizer.json
        // (weft's gpt2 reads it as plain text, as tiktoken's `encode_ordinary` does)
        assert_eq!(theirs.encode("a<|endoftext|>").unwrap(), vec![64, 50256]);
    }
}
