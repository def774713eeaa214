//! `weft runs list --filter EXPR`: comparisons joined by `and`, e.g.
//! `optim.lr < 1e-3 and status = 'finished' and metrics.loss <= 2.5 and tags.team != "x"`.
//!
//! A key is a param (`optim.lr`), `metrics.<key>` (the metric's last value), `tags.<key>`,
//! `status`, `name`, `experiment` or `id`: letters and digits of any script and `_ . - /`, and
//! backquoted parts for anything else (`` tags.`my team` ``; a backquote inside written twice).
//! Operators: `=` (or `==`), `!=`, `<`, `<=`, `>`, `>=`.
//! A value is a number or a quoted string (`'...'` or `"..."`). A number compares with the
//! key's value read as a number; a run where the key is missing (or not a number) does not
//! match. Positions in errors count characters, and any Unicode whitespace separates words.

use std::cmp::Ordering;

use crate::error::{Error, Result};
use crate::RunSummary;

/// A parsed filter: every comparison must hold.
#[derive(Debug, Clone, PartialEq)]
pub struct Filter {
    terms: Vec<Term>,
}

#[derive(Debug, Clone, PartialEq)]
struct Term {
    key: String,
    op: Op,
    value: Value,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// A value a key is compared with or sorted by.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Number(f64),
    Text(String),
}

/// The error at byte `at` of `expr`: its position counted in characters (from 1), what was
/// expected and the word found there.
fn err(expr: &str, at: usize, expected: &str) -> Error {
    let found = expr[at..].split_whitespace().next().unwrap_or("the end");
    Error::Filter(format!(
        "--filter: at character {}: expected {expected}, found {found:?} (in {expr:?})",
        expr[..at].chars().count() + 1
    ))
}

/// What a key is made of outside backquotes: letters and digits (any script's), `_ . - /`.
fn key_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '.' | '-' | '/')
}

/// The character at byte `i` of `expr`.
fn char_at(expr: &str, i: usize) -> Option<char> {
    expr[i..].chars().next()
}

/// Moves `i` past whitespace (any Unicode whitespace, as between words everywhere in a filter).
fn skip_space(expr: &str, i: &mut usize) {
    while let Some(c) = char_at(expr, *i).filter(|c| c.is_whitespace()) {
        *i += c.len_utf8();
    }
}

/// The key at byte `i`, moving `i` past it: key characters and backquoted parts (any
/// characters; a backquote inside written twice), joined: `` tags.`my team` `` is the tag `my
/// team`, `` `optim.lr` `` the param `optim.lr`.
fn parse_key(expr: &str, i: &mut usize) -> Result<String> {
    let start = *i;
    let mut key = String::new();
    loop {
        match char_at(expr, *i) {
            Some('`') => {
                let open = *i;
                let mut j = open + 1;
                loop {
                    let Some(n) = expr[j..].find('`') else {
                        return Err(err(expr, open, "a closing backquote (`) of the quoted key"));
                    };
                    key.push_str(&expr[j..j + n]);
                    j += n + 1;
                    if char_at(expr, j) == Some('`') {
                        key.push('`');
                        j += 1;
                    } else {
                        break;
                    }
                }
                *i = j;
            }
            Some(c) if key_char(c) => {
                key.push(c);
                *i += c.len_utf8();
            }
            _ => break,
        }
    }
    if *i == start {
        return Err(err(
            expr,
            start,
            "a key (a param such as optim.lr, metrics.<key>, tags.<key>, status; `...` quotes one)",
        ));
    }
    Ok(key)
}

impl Filter {
    /// Parses `expr`; an error says at which character and what was expected.
    pub fn parse(expr: &str) -> Result<Filter> {
        // a byte offset into `expr`, always at a character's start
        let mut i = 0;
        let mut terms = Vec::new();
        loop {
            skip_space(expr, &mut i);
            let key = parse_key(expr, &mut i)?;
            skip_space(expr, &mut i);
            let ops: [(&str, Op); 7] = [
                ("==", Op::Eq),
                ("!=", Op::Ne),
                ("<=", Op::Le),
                (">=", Op::Ge),
                ("=", Op::Eq),
                ("<", Op::Lt),
                (">", Op::Gt),
            ];
            let Some((text, op)) = ops.iter().find(|(t, _)| expr[i..].starts_with(t)) else {
                return Err(err(expr, i, "an operator (= != < <= > >=)"));
            };
            i += text.len();
            skip_space(expr, &mut i);
            let value = match char_at(expr, i) {
                Some(q @ ('\'' | '"')) => {
                    let end = expr[i + 1..].find(q).ok_or_else(|| err(expr, i, "a closing quote"))?;
                    let s = expr[i + 1..i + 1 + end].to_string();
                    i += end + 2;
                    Value::Text(s)
                }
                _ => {
                    let start = i;
                    i = expr[i..].find(char::is_whitespace).map_or(expr.len(), |n| i + n);
                    match expr[start..i].parse::<f64>() {
                        Ok(x) if !expr[start..i].is_empty() => Value::Number(x),
                        _ => return Err(err(expr, start, "a number or a quoted string")),
                    }
                }
            };
            terms.push(Term { key, op: *op, value });
            skip_space(expr, &mut i);
            if i == expr.len() {
                return Ok(Filter { terms });
            }
            let word_end = expr[i..].find(char::is_whitespace).map_or(expr.len(), |n| i + n);
            if !expr[i..word_end].eq_ignore_ascii_case("and") {
                return Err(err(expr, i, "`and` or the end"));
            }
            i = word_end;
        }
    }

    /// Whether `run` passes every comparison.
    pub fn matches(&self, run: &RunSummary) -> bool {
        self.terms.iter().all(|t| {
            let Some(have) = lookup(run, &t.key) else {
                return false;
            };
            let ord = match (&t.value, have) {
                (Value::Number(want), have) => match as_number(&have) {
                    Some(x) => x.partial_cmp(want),
                    None => None,
                },
                (Value::Text(want), Value::Text(s)) => Some(s.as_str().cmp(want.as_str())),
                (Value::Text(want), Value::Number(x)) => Some(x.to_string().as_str().cmp(want.as_str())),
            };
            let Some(ord) = ord else {
                return false;
            };
            match t.op {
                Op::Eq => ord == Ordering::Equal,
                Op::Ne => ord != Ordering::Equal,
                Op::Lt => ord == Ordering::Less,
                Op::Le => ord != Ordering::Greater,
                Op::Gt => ord == Ordering::Greater,
                Op::Ge => ord != Ordering::Less,
            }
        })
    }
}

fn as_number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(x) => Some(*x),
        Value::Text(s) => s.trim().parse().ok(),
    }
}

/// The value of `key` for `run` (see the module's keys); `None` when it has none.
pub fn lookup(run: &RunSummary, key: &str) -> Option<Value> {
    if let Some(m) = key.strip_prefix("metrics.") {
        return run.last.get(m).map(|x| Value::Number(*x));
    }
    if let Some(t) = key.strip_prefix("tags.") {
        return run.tags.get(t).map(|s| Value::Text(s.clone()));
    }
    match key {
        "status" => Some(Value::Text(run.status.clone())),
        "name" => Some(Value::Text(run.name.clone())),
        "experiment" => Some(Value::Text(run.experiment.clone())),
        "id" => Some(Value::Number(run.id as f64)),
        _ => run.params.get(key).map(|s| Value::Text(s.clone())),
    }
}

/// What a run's value of the sort key is, in the order [`sort_runs`] puts them: numbers
/// (numerically), then other text (as text), then no value.
#[derive(PartialEq, PartialOrd)]
enum SortKey {
    Number(TotalF64),
    Text(String),
}

/// An f64 ordered by `total_cmp`.
#[derive(PartialEq)]
struct TotalF64(f64);

impl PartialOrd for TotalF64 {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.0.total_cmp(&other.0))
    }
}

fn sort_key(v: Value) -> SortKey {
    match as_number(&v) {
        Some(x) => SortKey::Number(TotalF64(x)),
        None => SortKey::Text(match v {
            Value::Text(s) => s,
            Value::Number(x) => x.to_string(),
        }),
    }
}

/// Sorts `runs` by `key` (a leading `-` sorts descending): values that read as numbers
/// numerically, then other text as text, then runs without the key (the three kinds in that
/// order in either direction; within each, the direction asked). A total order, as sorting needs: comparing each pair as numbers when both read
/// as numbers and as text otherwise was not one ("9" < "10" < "5x" < "9"), and Rust's sort
/// panicked on it.
pub fn sort_runs(runs: &mut [RunSummary], key: &str) {
    let (key, desc) = match key.strip_prefix('-') {
        Some(k) => (k, true),
        None => (key, false),
    };
    let mut keyed: Vec<(Option<SortKey>, RunSummary)> =
        runs.iter().map(|r| (lookup(r, key).map(sort_key), r.clone())).collect();
    keyed.sort_by(|(a, _), (b, _)| match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Greater,
        (Some(_), None) => Ordering::Less,
        (Some(x), Some(y)) => {
            let ord = x.partial_cmp(y).unwrap_or(Ordering::Equal);
            let same_kind = matches!(
                (x, y),
                (SortKey::Number(_), SortKey::Number(_)) | (SortKey::Text(_), SortKey::Text(_))
            );
            if desc && same_kind {
                ord.reverse()
            } else {
                ord
            }
        }
    });
    for (slot, (_, r)) in runs.iter_mut().zip(keyed) {
        *slot = r;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(lr: &str, status: &str, loss: f64) -> RunSummary {
        RunSummary {
            id: 1,
            experiment: "default".into(),
            name: "run-1".into(),
            status: status.into(),
            start_time: 0.0,
            end_time: None,
            params: [("optim.lr".to_string(), lr.to_string())].into(),
            tags: [("team".to_string(), "a".to_string())].into(),
            last: [("loss".to_string(), loss)].into(),
        }
    }

    #[test]
    fn sorting_mixed_numbers_and_text_is_a_total_order() {
        // numbers and text in one key: more than 20 runs, where the sort checks its order
        let values = ["10", "5x", "abc", " 7", "9", "-1", "1e3", "", "NaN", "x10"];
        let mut runs: Vec<RunSummary> = (0..400)
            .map(|i| {
                let mut r = run(values[i * 7 % values.len()], "finished", i as f64);
                r.id = i as i64;
                if i % 13 == 0 {
                    r.params.clear();
                }
                r
            })
            .collect();
        for key in ["optim.lr", "-optim.lr"] {
            sort_runs(&mut runs, key);
            let shown: Vec<Option<String>> = runs.iter().map(|r| r.params.get("optim.lr").cloned()).collect();
            let firsts: Vec<&str> = {
                let mut seen: Vec<&str> = Vec::new();
                for v in shown.iter().flatten() {
                    if seen.last() != Some(&v.as_str()) {
                        seen.push(v);
                    }
                }
                seen
            };
            if key.starts_with('-') {
                assert_eq!(firsts, ["NaN", "1e3", "10", "9", " 7", "-1", "x10", "abc", "5x", ""]);
            } else {
                assert_eq!(firsts, ["-1", " 7", "9", "10", "1e3", "NaN", "", "5x", "abc", "x10"]);
            }
            // runs without the key last either way
            assert!(shown.iter().skip_while(|v| v.is_some()).all(|v| v.is_none()));
        }
    }

    #[test]
    fn comparisons_and_conjunctions() {
        let f = Filter::parse("optim.lr < 1e-3 and status = 'finished' and metrics.loss<=2.5").unwrap();
        assert!(f.matches(&run("0.0005", "finished", 2.0)));
        assert!(!f.matches(&run("0.001", "finished", 2.0)));
        assert!(!f.matches(&run("0.0005", "failed", 2.0)));
        assert!(!f.matches(&run("0.0005", "finished", 3.0)));
        assert!(Filter::parse("tags.team != \"b\"")
            .unwrap()
            .matches(&run("1", "x", 0.0)));
        assert!(!Filter::parse("tags.missing = 'a'")
            .unwrap()
            .matches(&run("1", "x", 0.0)));
    }

    #[test]
    fn bad_expressions_say_where_and_what() {
        for (expr, at, what) in [
            ("optim.lr", 9, "an operator"),
            ("optim.lr < ", 12, "a number or a quoted string"),
            ("optim.lr < abc", 12, "a number or a quoted string"),
            ("status = 'x", 10, "a closing quote"),
            ("status = 'x' or id = 1", 14, "`and` or the end"),
            ("< 3", 1, "a key"),
            ("€ = 1", 1, "a key"),
            ("a€ = 1", 2, "an operator"),
            ("a = 'é", 5, "a closing quote"),
            ("a = 1 andé b = 2", 7, "`and` or the end"),
            // positions count characters, not bytes (the `<` is the 19th; its byte offset 22)
            ("name = 'éééé' and < 3", 19, "a key"),
            ("tags.`équipe = 'x'", 6, "a closing backquote"),
            ("tags.`a`` = 'x'", 6, "a closing backquote"),
            ("name = 'é' and\u{3000}< 3", 16, "a key"),
        ] {
            let e = Filter::parse(expr).unwrap_err().to_string();
            assert!(
                e.contains(&format!("at character {at}:")) && e.contains(what),
                "{expr}: {e}"
            );
        }
    }

    #[test]
    fn keys_of_any_script_quoted_keys_and_unicode_whitespace() {
        let mut r = run("0.5", "finished", 1.0);
        r.tags = [("équipe", "nlp"), ("my team", "a b"), ("it`s", "x"), ("数据", "集")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        for expr in [
            "tags.équipe = 'nlp'",
            "tags.数据 = '集'",
            "tags.`my team` = 'a b'",
            "`tags.my team` = 'a b'",
            "tags.`it``s` = 'x'",
            "`optim.lr` < 1",
            // `and` and the words around it may be separated by any whitespace
            "name = 'run-1' and\u{3000}id = 1",
            "name\u{3000}=\u{3000}'run-1'\u{a0}and\u{2003}id = 1\u{3000}and id = 1\u{3000}",
        ] {
            let f = Filter::parse(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
            assert!(f.matches(&r), "{expr}");
        }
        assert!(!Filter::parse("tags.`my team` = 'a'").unwrap().matches(&r));
        assert_eq!(
            Filter::parse("tags.`x y` = 1").unwrap(),
            Filter::parse("`tags.x y` = 1").unwrap()
        );
    }

    #[test]
    fn sorting_puts_missing_last() {
        let mut runs = vec![run("0.1", "a", 3.0), run("0.01", "b", 1.0), run("1", "c", 2.0)];
        runs[2].last.clear();
        sort_runs(&mut runs, "metrics.loss");
        assert_eq!(
            runs.iter().map(|r| r.status.as_str()).collect::<Vec<_>>(),
            ["b", "a", "c"]
        );
        sort_runs(&mut runs, "-optim.lr");
        assert_eq!(
            runs.iter().map(|r| r.status.as_str()).collect::<Vec<_>>(),
            ["c", "a", "b"]
        );
    }
}
