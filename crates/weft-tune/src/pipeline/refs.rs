//! Step outputs as `key=value` text, and references to them: `${steps.NAME.KEY}` in a step's
//! string settings (a train or sweep step's `set`, a command's `argv`, a prepare step's `tokenizer`,
//! `input` and `output`, an evaluate step's `config` and `data`, a deploy step's `model` and
//! `version`, a condition's `value`) is replaced by the value of `KEY` in the output of step
//! `NAME`, which must be a step it depends on (directly or not).
//!
//! Only `${steps.` starts a reference: other `${...}` (a shell's `${HOME}` in an `argv`) are
//! left as they are, and `$${steps.` writes a literal `${steps.`.

use std::collections::BTreeMap;

/// One reference in a setting.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Reference {
    /// The step whose output is read.
    pub step: String,
    /// The key of its output.
    pub key: String,
}

impl Reference {
    /// `NAME.KEY`: how the values of a step's references are keyed.
    pub fn id(&self) -> String {
        format!("{}.{}", self.step, self.key)
    }
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "${{steps.{}.{}}}", self.step, self.key)
    }
}

/// A piece of a setting: text as written, or a reference.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Text(String),
    Ref(Reference),
}

const OPEN: &str = "${steps.";

/// Whether `c` may be part of an output key or a step's name (letters, digits, `_`, `-`).
pub fn key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// `text` cut into text and references; a malformed reference is an error (one line, without
/// the step's name: the caller adds it).
fn pieces(text: &str) -> Result<Vec<Piece>, String> {
    let mut out = Vec::new();
    let mut plain = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(OPEN) {
        // `$${steps.` is a literal `${steps.`
        if rest[..at].ends_with('$') {
            plain.push_str(&rest[..at - 1]);
            plain.push_str(OPEN);
            rest = &rest[at + OPEN.len()..];
            continue;
        }
        plain.push_str(&rest[..at]);
        let after = &rest[at + OPEN.len()..];
        let Some(end) = after.find('}') else {
            return Err(format!(
                "{:?}: a reference `${{steps.` is not closed with `}}` (write ${{steps.STEP.KEY}}, or $${{steps. for the text itself)",
                text
            ));
        };
        let inner = &after[..end];
        let bad = || {
            format!("{OPEN}{inner}}} in {text:?}: a reference is ${{steps.STEP.KEY}} (KEY: letters, digits, _ and -)")
        };
        let (step, key) = inner.rsplit_once('.').ok_or_else(bad)?;
        if step.is_empty() || key.is_empty() || !key.chars().all(key_char) {
            return Err(bad());
        }
        if !plain.is_empty() {
            out.push(Piece::Text(std::mem::take(&mut plain)));
        }
        out.push(Piece::Ref(Reference {
            step: step.to_string(),
            key: key.to_string(),
        }));
        rest = &after[end + 1..];
    }
    plain.push_str(rest);
    if !plain.is_empty() {
        out.push(Piece::Text(plain));
    }
    Ok(out)
}

/// The references in `text`, in order (an error when one is malformed).
pub fn references(text: &str) -> Result<Vec<Reference>, String> {
    Ok(pieces(text)?
        .into_iter()
        .filter_map(|p| match p {
            Piece::Ref(r) => Some(r),
            Piece::Text(_) => None,
        })
        .collect())
}

/// `text` with each reference replaced by its value in `values` (keyed by [`Reference::id`]);
/// an error naming a reference that has no value.
pub fn substitute(text: &str, values: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::new();
    for p in pieces(text)? {
        match p {
            Piece::Text(t) => out.push_str(&t),
            Piece::Ref(r) => match values.get(&r.id()) {
                Some(v) => out.push_str(v),
                None => return Err(format!("{r}: no value (its step's output was not read)")),
            },
        }
    }
    Ok(out)
}

/// Whether `value` must be quoted in an output: empty, or holding whitespace, a quote or a
/// backslash, or starting with `{` or `[` (which run to the end of the line).
fn needs_quotes(value: &str) -> bool {
    value.is_empty()
        || value.starts_with(['{', '['])
        || value.chars().any(|c| c.is_whitespace() || c == '"' || c == '\\')
}

/// An output line of `key=value` pairs (a value quoted, with `\"` and `\\`, when it needs it),
/// as [`parse_output`] reads it back.
pub fn output(pairs: &[(&str, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| {
            if needs_quotes(v) {
                let escaped = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
                format!("{k}=\"{escaped}\"")
            } else {
                format!("{k}={v}")
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The `key=value` pairs of a step's output (`run=12`, `model=m version=3`, `data="/a b"
/// tokens=9`): words separated by whitespace; a value in double quotes may hold whitespace (`\"`
/// and `\\` inside); a value starting with `{` or `[` runs to the end of the line (a sweep's
/// `params={ ... }`, kept as that text). Words without `=` (a condition's `true`) are not keys.
/// A key given twice keeps its first value.
pub fn parse_output(out: &str) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    let mut rest = out.trim_start();
    while !rest.is_empty() {
        let word_end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let eq = rest[..word_end].find('=');
        let Some(eq) = eq.filter(|&e| e > 0) else {
            rest = rest[word_end..].trim_start();
            continue;
        };
        let key = &rest[..eq];
        let after = &rest[eq + 1..];
        let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    '\\' => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, c)) => value.push(c),
                        None => {}
                    },
                    c => value.push(c),
                }
            }
            (value, &quoted[end.min(quoted.len())..])
        } else if after.starts_with(['{', '[']) {
            let line_end = after.find('\n').unwrap_or(after.len());
            (after[..line_end].trim_end().to_string(), &after[line_end..])
        } else {
            let end = after.find(char::is_whitespace).unwrap_or(after.len());
            (after[..end].to_string(), &after[end..])
        };
        found.entry(key.to_string()).or_insert(value);
        rest = next.trim_start();
    }
    found
}

/// The values of `refs` (keyed by [`Reference::id`]) read from `outputs` (step name -> its
/// output): an error naming the reference and the output when a step has no output or its
/// output has no such key.
pub fn values(refs: &[Reference], outputs: &BTreeMap<String, String>) -> Result<BTreeMap<String, String>, String> {
    let mut values = BTreeMap::new();
    for r in refs {
        let out = outputs
            .get(&r.step)
            .ok_or_else(|| format!("{r}: step {:?} has no output (it did not finish)", r.step))?;
        let pairs = parse_output(out);
        let v = pairs.get(&r.key).ok_or_else(|| {
            let keys: Vec<&String> = pairs.keys().collect();
            format!(
                "{r}: the output of step {:?} ({:?}) has no key {:?} (keys: {keys:?})",
                r.step,
                out.replace('\n', " "),
                r.key
            )
        })?;
        values.insert(r.id(), v.clone());
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_found_substituted_and_escaped() {
        let text = "data.path=\"${steps.prep.data}\" n=${steps.a-b.tokens}${steps.x.y_z}";
        let refs = references(text).unwrap();
        let ids: Vec<String> = refs.iter().map(Reference::id).collect();
        assert_eq!(ids, ["prep.data", "a-b.tokens", "x.y_z"]);
        let values = BTreeMap::from([
            ("prep.data".to_string(), "/d".to_string()),
            ("a-b.tokens".to_string(), "9".to_string()),
            ("x.y_z".to_string(), "!".to_string()),
        ]);
        assert_eq!(substitute(text, &values).unwrap(), "data.path=\"/d\" n=9!");
        // a shell's own ${VAR} and $${steps. are text
        for (text, want) in [
            ("echo ${HOME} $x", "echo ${HOME} $x"),
            ("$${steps.a.b}", "${steps.a.b}"),
            ("a$$${steps.a.b}", "a$${steps.a.b}"),
        ] {
            assert!(references(text).unwrap().is_empty(), "{text}");
            assert_eq!(substitute(text, &values).unwrap(), want);
        }
        let e = substitute("${steps.q.r}", &values).unwrap_err();
        assert!(e.contains("${steps.q.r}"), "{e}");
    }

    #[test]
    fn malformed_references_are_one_line_errors() {
        for (text, want) in [
            ("${steps.prep.data", "not closed"),
            ("${steps.prep}", "a reference is ${steps.STEP.KEY}"),
            ("${steps..data}", "a reference is"),
            ("${steps.prep.}", "a reference is"),
            ("${steps.prep.da ta}", "a reference is"),
        ] {
            let e = references(text).unwrap_err();
            assert!(e.contains(want) && !e.contains('\n'), "{text}: {e}");
        }
    }

    #[test]
    fn outputs_round_trip_through_the_parser() {
        let line = output(&[
            ("data", "/tmp/a b/\"q\"\\".to_string()),
            ("tokens", "1200".to_string()),
            ("empty", String::new()),
            ("url", "s3://b/k".to_string()),
        ]);
        assert!(!line.contains('\n'), "{line}");
        let got = parse_output(&line);
        assert_eq!(got["data"], "/tmp/a b/\"q\"\\");
        assert_eq!(got["tokens"], "1200");
        assert_eq!(got["empty"], "");
        assert_eq!(got["url"], "s3://b/k");
        // the outputs of the steps that exist already
        let sweep = "sweep=s best=trial-3 run=s-trial-3 value=1.25 params={ \"optim.lr\" = 0.01, x = [1, 2] }";
        let got = parse_output(sweep);
        assert_eq!(got["best"], "trial-3");
        assert_eq!(got["value"], "1.25");
        assert_eq!(got["params"], "{ \"optim.lr\" = 0.01, x = [1, 2] }");
        assert_eq!(parse_output("model=m version=3")["version"], "3");
        assert!(parse_output("true").is_empty());
        assert_eq!(parse_output("run=12")["run"], "12");
        assert_eq!(parse_output("a=1 a=2 =3 b")["a"], "1");
    }

    #[test]
    fn a_missing_key_or_output_names_the_reference_and_the_output() {
        let outputs = BTreeMap::from([("cmd".to_string(), "exit=0".to_string())]);
        let refs = references("${steps.cmd.foo}").unwrap();
        let e = values(&refs, &outputs).unwrap_err();
        assert!(
            e.contains("${steps.cmd.foo}") && e.contains("\"exit=0\"") && e.contains("no key \"foo\""),
            "{e}"
        );
        let e = values(&references("${steps.zz.a}").unwrap(), &outputs).unwrap_err();
        assert!(e.contains("has no output"), "{e}");
        let ok = values(&references("${steps.cmd.exit}").unwrap(), &outputs).unwrap();
        assert_eq!(ok["cmd.exit"], "0");
    }
}
