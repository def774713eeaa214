//! A character-level tokenizer, as nanoGPT's `data/shakespeare_char/prepare.py`: the vocabulary is
//! the sorted set of distinct characters of a text, and a character's id is its rank in that set.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::error::{invalid, Error, Result};

/// The `"type"` field of the JSON form.
const JSON_TYPE: &str = "char";

/// A character-level vocabulary: id `i` is the `i`-th character of [`CharTokenizer::chars`].
///
/// Ids are `i64` (the dtype of weft's index tensors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CharTokenizer {
    chars: Vec<char>,
    ids: HashMap<char, i64>,
}

impl CharTokenizer {
    /// The vocabulary of `text`: its distinct characters (Unicode scalar values) in sorted order,
    /// as Python's `sorted(set(text))`.
    pub fn from_text(text: &str) -> CharTokenizer {
        let mut chars: Vec<char> = text.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        Self::build(chars)
    }

    /// A tokenizer with exactly this vocabulary, in this order (id `i` is `chars[i]`). Errors if a
    /// character appears twice.
    pub fn from_chars(chars: Vec<char>) -> Result<CharTokenizer> {
        let t = Self::build(chars);
        if t.ids.len() != t.chars.len() {
            let mut seen = HashMap::new();
            for (i, &c) in t.chars.iter().enumerate() {
                if let Some(first) = seen.insert(c, i) {
                    return Err(invalid(format!(
                        "tokenizer vocabulary has character {c:?} twice (at {first} and {i})"
                    )));
                }
            }
        }
        Ok(t)
    }

    fn build(chars: Vec<char>) -> CharTokenizer {
        let ids = chars.iter().enumerate().map(|(i, &c)| (c, i as i64)).collect();
        CharTokenizer { chars, ids }
    }

    /// Number of distinct tokens.
    pub fn vocab_size(&self) -> usize {
        self.chars.len()
    }

    /// The vocabulary: `chars()[id]` is the character of `id`.
    pub fn chars(&self) -> &[char] {
        &self.chars
    }

    /// The id of each character of `text`, in order (one id per `char`). Errors with
    /// [`Error::UnknownChar`] (naming the character and its char position) on the first character
    /// not in the vocabulary.
    pub fn encode(&self, text: &str) -> Result<Vec<i64>> {
        text.chars()
            .enumerate()
            .map(|(position, ch)| self.ids.get(&ch).copied().ok_or(Error::UnknownChar { ch, position }))
            .collect()
    }

    /// The text of a sequence of ids. Errors with [`Error::TokenOutOfRange`] (naming the id and its
    /// position) on the first id outside `0..vocab_size()`.
    pub fn decode(&self, ids: &[i64]) -> Result<String> {
        ids.iter()
            .enumerate()
            .map(|(position, &id)| {
                usize::try_from(id)
                    .ok()
                    .and_then(|i| self.chars.get(i).copied())
                    .ok_or(Error::TokenOutOfRange {
                        id,
                        position,
                        vocab_size: self.chars.len(),
                    })
            })
            .collect()
    }

    /// The JSON form, for storing in checkpoints: `{"type": "char", "vocab": "<the characters in id
    /// order>"}`.
    pub fn to_json(&self) -> String {
        let vocab: String = self.chars.iter().collect();
        json!({ "type": JSON_TYPE, "vocab": vocab }).to_string()
    }

    /// Reads the JSON form written by [`CharTokenizer::to_json`]. Errors (naming the key at fault) if
    /// the text is not JSON, `type` is not `"char"`, `vocab` is missing or not a string, or a
    /// character appears twice.
    pub fn from_json(text: &str) -> Result<CharTokenizer> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| invalid(format!("tokenizer JSON does not parse: {e}")))?;
        let obj = value
            .as_object()
            .ok_or_else(|| invalid(format!("tokenizer JSON must be an object, got {value}")))?;
        match obj.get("type") {
            Some(Value::String(t)) if t == JSON_TYPE => {}
            Some(other) => {
                return Err(invalid(format!(
                    "tokenizer JSON key \"type\": expected \"char\", got {other}"
                )))
            }
            None => return Err(invalid("tokenizer JSON: missing key \"type\"")),
        }
        let vocab = match obj.get("vocab") {
            Some(Value::String(v)) => v,
            Some(other) => {
                return Err(invalid(format!(
                    "tokenizer JSON key \"vocab\": expected a string, got {other}"
                )))
            }
            None => return Err(invalid("tokenizer JSON: missing key \"vocab\"")),
        };
        Self::from_chars(vocab.chars().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocabulary_is_sorted_unique_chars() {
        let t = CharTokenizer::from_text("hello world\n");
        assert_eq!(t.chars(), &['\n', ' ', 'd', 'e', 'h', 'l', 'o', 'r', 'w']);
        assert_eq!(t.vocab_size(), 9);
        assert_eq!(t.encode("hello").unwrap(), vec![4, 3, 5, 5, 6]);
    }

    #[test]
    fn duplicate_chars_rejected() {
        let e = CharTokenizer::from_chars(vec!['a', 'b', 'a']).unwrap_err().to_string();
        assert!(e.contains("'a'") && e.contains("at 0 and 2"), "{e}");
    }
}
