//! A generation's text as it is made: [`Detokenizer`] turns each new token into new text by
//! decoding only a short window of recent tokens (not the whole completion again), and
//! [`StopText`] ends the text at the first stop sequence, holding back any text that could be the
//! start of one so that no part of a stop sequence is ever sent.

use weft_data::Tokenizer;

use crate::generation::decode_text;

/// Incremental decoding with a prefix offset and a read offset (the scheme of
/// text-generation-inference): `tokens[prefix..read]` is the last window whose text was sent
/// whole, `tokens[read..]` the tokens whose text is not sent yet. Each new token decodes
/// `tokens[prefix..]` and sends what it adds to the text of `tokens[prefix..read]`, once that
/// does not end inside a character (a byte-level token can end inside a multi-byte UTF-8
/// character, which decodes to U+FFFD until the rest arrives). Decoding a window that starts one
/// step back, rather than at `read`, gives tokenizers whose decoding of a token depends on the
/// one before it (a sentencepiece `▁` that starts the text is dropped) the context they need.
///
/// The pieces are those of decoding the whole completion after each token and sending what it
/// adds whenever it does not end with U+FFFD, and their concatenation is the whole decode: the
/// window starts where the text sent ended with a whole character, where a byte-level decode
/// starts afresh. The window grows only while its text keeps ending with U+FFFD (at most a
/// character's 4 bytes of byte-level tokens, unless the model makes invalid UTF-8).
#[derive(Debug, Clone, Default)]
pub(crate) struct Detokenizer {
    prefix: usize,
    read: usize,
}

impl Detokenizer {
    /// A detokenizer of the completion `tokens[start..]` (the prompt is `tokens[..start]`).
    pub(crate) fn new(start: usize) -> Detokenizer {
        Detokenizer {
            prefix: start,
            read: start,
        }
    }

    /// The text that the last of `tokens` adds to the completion (empty while it ends inside a
    /// character); with `last`, all the text not given yet, a broken character as U+FFFD.
    pub(crate) fn next(&mut self, tok: &Tokenizer, tokens: &[i64], last: bool) -> weft_data::Result<String> {
        let sent = decode_text(tok, &tokens[self.prefix..self.read])?;
        let now = decode_text(tok, &tokens[self.prefix..])?;
        if now.ends_with('\u{FFFD}') && !last {
            return Ok(String::new());
        }
        // a tokenizer that changes the window's earlier text with a later token: wait for more
        let Some(piece) = now.strip_prefix(sent.as_str()) else {
            return Ok(String::new());
        };
        let piece = piece.to_string();
        self.prefix = self.read;
        self.read = tokens.len();
        Ok(piece)
    }
}

/// The answer's text when a completion ends by length: the whole completion decoded once (the
/// text the pieces sent add up to, except for a tokenizer whose later tokens change earlier
/// text, which sent pieces cannot take back), or `sent` if that decode fails.
pub(crate) fn final_text(tok: &Tokenizer, completion: &[i64], sent: String) -> String {
    decode_text(tok, completion).unwrap_or(sent)
}

/// The most stop sequences a request may give.
pub const MAX_STOPS: usize = 4;

/// The longest stop sequence a request may give, in bytes: every new piece of text is checked
/// against every prefix of every stop sequence on the decode thread that all sequences share.
pub const MAX_STOP_BYTES: usize = 256;

/// Stop sequences: [`StopText::push`] takes the new text and gives back the part that can be
/// sent (no part of a stop sequence), and whether a stop sequence ended the text.
#[derive(Debug, Clone, Default)]
pub(crate) struct StopText {
    stops: Vec<String>,
    /// Text made but not given back: the end of the text that could start a stop sequence.
    held: String,
}

impl StopText {
    /// `stops` are not empty strings (checked by the request's parser).
    pub(crate) fn new(stops: Vec<String>) -> StopText {
        StopText {
            stops,
            held: String::new(),
        }
    }

    /// Adds `new` text: returns the text that can be sent and `true` when the text now holds a
    /// stop sequence (the text returned ends before its earliest one; nothing follows). With
    /// `flush` (the generation's last token), everything held is given back.
    pub(crate) fn push(&mut self, new: &str, flush: bool) -> (String, bool) {
        self.held.push_str(new);
        let hit = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min();
        if let Some(at) = hit {
            self.held.truncate(at);
            return (std::mem::take(&mut self.held), true);
        }
        if flush {
            return (std::mem::take(&mut self.held), false);
        }
        // the longest end of the text that is the start of a stop sequence stays held
        let keep = self
            .stops
            .iter()
            .filter_map(|s| {
                (1..s.len())
                    .rev()
                    .find(|&k| s.is_char_boundary(k) && self.held.ends_with(&s[..k]))
            })
            .max()
            .unwrap_or(0);
        let rest = self.held.split_off(self.held.len() - keep);
        (std::mem::replace(&mut self.held, rest), false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pieces as they were sent before the window: the whole completion decoded after each
    /// token, what it adds sent whenever it does not end with U+FFFD.
    fn whole_decode_pieces(tok: &Tokenizer, ids: &[i64]) -> Vec<String> {
        let mut sent = String::new();
        let mut pieces = Vec::new();
        for n in 1..=ids.len() {
            let text = decode_text(tok, &ids[..n]).unwrap();
            if !text.ends_with('\u{FFFD}') || n == ids.len() {
                if let Some(piece) = text.strip_prefix(sent.as_str()) {
                    if !piece.is_empty() {
                        pieces.push(piece.to_string());
                    }
                    sent = text;
                }
            }
        }
        pieces
    }

    /// The pieces the detokenizer gives for the completion `ids` after `prompt`.
    fn windowed_pieces(tok: &Tokenizer, prompt: &[i64], ids: &[i64]) -> Vec<String> {
        let mut tokens = prompt.to_vec();
        let mut d = Detokenizer::new(prompt.len());
        let mut pieces = Vec::new();
        for (i, &t) in ids.iter().enumerate() {
            tokens.push(t);
            let piece = d.next(tok, &tokens, i + 1 == ids.len()).unwrap();
            if !piece.is_empty() {
                pieces.push(piece);
            }
            // the window stays short: a character is at most 4 byte-level tokens
            assert!(
                tokens.len() - d.prefix <= 8,
                "window of {} tokens",
                tokens.len() - d.prefix
            );
        }
        pieces
    }

    fn ids(tok: &Tokenizer, text: &str) -> Vec<i64> {
        tok.encode(text).unwrap().into_iter().map(i64::from).collect()
    }

    #[test]
    fn byte_level_pieces_equal_the_whole_decodes_pieces_with_characters_split_across_tokens() {
        let tok = Tokenizer::Gpt2(weft_data::Gpt2Tokenizer::new());
        let text = "naïve café — 日本語のテキスト 🦀🦀 emoji, ∑ x² and 한국어 text; ok.";
        let completion = ids(&tok, text);
        // the text must split characters across tokens, or the test checks nothing
        let broken = (1..completion.len())
            .filter(|&n| decode_text(&tok, &completion[..n]).unwrap().ends_with('\u{FFFD}'))
            .count();
        assert!(broken >= 5, "only {broken} token ends inside a character");
        let prompt = ids(&tok, "Some prompt: ");
        let pieces = windowed_pieces(&tok, &prompt, &completion);
        assert_eq!(pieces, whole_decode_pieces(&tok, &completion));
        assert_eq!(pieces.concat(), text);
        assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
    }

    #[test]
    fn a_completion_that_ends_inside_a_character_gives_its_broken_end_as_the_whole_decode_does() {
        let tok = Tokenizer::Gpt2(weft_data::Gpt2Tokenizer::new());
        let all = ids(&tok, "ab 🦀");
        let cut = &all[..all.len() - 1];
        let whole = decode_text(&tok, cut).unwrap();
        assert!(whole.ends_with('\u{FFFD}'), "{whole:?}");
        let pieces = windowed_pieces(&tok, &[], cut);
        assert_eq!(pieces, whole_decode_pieces(&tok, cut));
        assert_eq!(pieces.concat(), whole);
        // and invalid UTF-8 in the middle (a lone continuation byte, then text) stays as the
        // whole decode has it
        let cont = (0..256)
            .find(|&t| decode_text(&tok, &[t]).unwrap() == "\u{FFFD}")
            .unwrap();
        let mixed: Vec<i64> = [ids(&tok, "x"), vec![cont, cont], ids(&tok, "yz é"), vec![cont]].concat();
        let pieces = windowed_pieces(&tok, &[], &mixed);
        assert_eq!(pieces, whole_decode_pieces(&tok, &mixed));
        assert_eq!(pieces.concat(), decode_text(&tok, &mixed).unwrap());
    }

    #[test]
    fn a_tokenizer_that_drops_a_leading_space_keeps_the_spaces_between_words() {
        // sentencepiece-style: "▁" is a space, dropped at the start of a decode; a window that
        // started at the new token alone would drop every word's space
        let json = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
            "normalizer":null,"pre_tokenizer":null,"post_processor":null,
            "decoder":{"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true},
            "model":{"type":"WordLevel","vocab":{"<unk>":0,"▁to":1,"▁be":2,"▁or":3,"▁not":4,",":5},
                     "unk_token":"<unk>"}}"#;
        let tok = Tokenizer::Hf(weft_data::HfTokenizer::from_json_text(json).unwrap());
        let completion = [1, 2, 5, 3, 4, 1, 2];
        let whole = decode_text(&tok, &completion).unwrap();
        assert_eq!(whole, "to be, or not to be");
        let pieces = windowed_pieces(&tok, &[3], &completion);
        assert_eq!(pieces, whole_decode_pieces(&tok, &completion));
        assert_eq!(pieces.concat(), whole);
    }

    #[test]
    fn a_tokenizer_that_rewrites_earlier_text_loses_nothing_of_the_answer() {
        // a decoder that replaces "ab" with "X" in the joined text: "ca" becomes "cX" once "b"
        // comes, so the pieces cannot add up to the whole text; the answer's text is the whole
        // decode
        let json = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
            "normalizer":null,"pre_tokenizer":null,"post_processor":null,
            "decoder":{"type":"Sequence","decoders":[{"type":"Fuse"},
                {"type":"Replace","pattern":{"String":"ab"},"content":"X"}]},
            "model":{"type":"WordLevel","vocab":{"[UNK]":0,"a":1,"b":2,"c":3},"unk_token":"[UNK]"}}"#;
        let tok = Tokenizer::Hf(weft_data::HfTokenizer::from_json_text(json).unwrap());
        let completion = [3, 1, 2];
        let whole = decode_text(&tok, &completion).unwrap();
        assert_eq!(whole, "cX");
        let pieces = windowed_pieces(&tok, &[3], &completion);
        assert_ne!(pieces.concat(), whole, "the case this test is about: {pieces:?}");
        assert_eq!(final_text(&tok, &completion, pieces.concat()), whole);
        // and where the pieces do add up, the answer is their text
        let gpt2 = Tokenizer::Gpt2(weft_data::Gpt2Tokenizer::new());
        let ids = ids(&gpt2, "naïve café 🦀");
        let pieces = windowed_pieces(&gpt2, &[], &ids);
        assert_eq!(final_text(&gpt2, &ids, pieces.concat()), pieces.concat());
    }

    #[test]
    fn decoding_a_long_completion_reads_a_short_window_per_token() {
        // the window the detokenizer decodes stays short however long the text is: a
        // detokenizer that decoded from the start would fail the window check in
        // windowed_pieces
        let tok = Tokenizer::Gpt2(weft_data::Gpt2Tokenizer::new());
        let completion = ids(&tok, &"Ünïcödé text, 日本語 🦀 and more. ".repeat(100));
        assert!(completion.len() > 1000);
        let pieces = windowed_pieces(&tok, &[], &completion);
        assert_eq!(pieces.concat(), decode_text(&tok, &completion).unwrap());
    }

    /// Feeds `pieces` through stop sequences `stops`; the text sent, and whether it stopped.
    fn stopped(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool) {
        let mut s = StopText::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = Vec::new();
        for (i, p) in pieces.iter().enumerate() {
            let (text, stop) = s.push(p, i + 1 == pieces.len());
            out.push(text);
            if stop {
                return (out, true);
            }
        }
        (out, false)
    }

    #[test]
    fn stop_sequences_end_the_text_before_them_and_no_part_of_one_is_sent() {
        // one piece holding a stop
        assert_eq!(stopped(&["END"], &["abcENDxyz"]), (vec!["abc".into()], true));
        // a stop split over pieces: its start is held until it is known not to be one
        assert_eq!(
            stopped(&["\n\n"], &["ab\n", "\nc"]),
            (vec!["ab".into(), "".into()], true)
        );
        assert_eq!(
            stopped(&["\n\n"], &["ab\n", "c\n", "d"]),
            (vec!["ab".into(), "\nc".into(), "\nd".into()], false)
        );
        // the earliest of several, a multi-byte stop, one held to the end
        assert_eq!(stopped(&["zz", "y"], &["axyzz"]), (vec!["ax".into()], true));
        assert_eq!(
            stopped(&["é!"], &["caf", "é", "!"]),
            (vec!["caf".into(), "".into(), "".into()], true)
        );
        assert_eq!(
            stopped(&["STOP"], &["a", "ST", "O"]),
            (vec!["a".into(), "".into(), "STO".into()], false)
        );
        // a stop at the very start gives no text
        assert_eq!(stopped(&["x", "abc"], &["ab", "c"]), (vec!["".into(), "".into()], true));
        // no stops: everything goes out at once
        assert_eq!(stopped(&[], &["a", "b"]), (vec!["a".into(), "b".into()], false));
    }

    /// Per-token detokenize time at 1,000 to 4,000 tokens, the whole-decode way (as before)
    /// and through the window (gpt2; a debug build unless `--release`); prints, asserts nothing:
    /// `cargo test -p weft-serve --lib detok_time -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn detok_time() {
        let tok = Tokenizer::Gpt2(weft_data::Gpt2Tokenizer::new());
        let text = "The quick brown fox, naïve café 日本語 🦀, jumps over the lazy dog. ".repeat(400);
        let all = ids(&tok, &text);
        for n in [1000, 2000, 4000] {
            let completion = &all[..n];
            let t = std::time::Instant::now();
            let whole = whole_decode_pieces(&tok, completion);
            let before = t.elapsed().as_secs_f64() / n as f64;
            let t = std::time::Instant::now();
            let mut tokens = Vec::with_capacity(n);
            let mut d = Detokenizer::new(0);
            let mut pieces = Vec::new();
            for (i, &id) in completion.iter().enumerate() {
                tokens.push(id);
                let piece = d.next(&tok, &tokens, i + 1 == n).unwrap();
                if !piece.is_empty() {
                    pieces.push(piece);
                }
            }
            let after = t.elapsed().as_secs_f64() / n as f64;
            assert_eq!(pieces, whole);
            println!(
                "{n} tokens: whole decode {:.1} us/token, window {:.2} us/token ({:.0}x)",
                before * 1e6,
                after * 1e6,
                before / after
            );
        }
    }
}
