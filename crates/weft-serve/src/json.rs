//! Request fields read straight from the body's bytes, without building a `serde_json::Value`
//! of them first: a `Value` takes 32 bytes or more for each number and string of a body (a
//! 16 MiB body of `[1],` items took about 900 MB), so the large fields a client controls, tensor
//! data and the string-or-array fields, keep only what weft reads of them (8 bytes a number,
//! the first few items of an array).

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

/// A tensor's values as JSON gives them: one number, a flat array, or arrays nested to any
/// depth (serde_json refuses nesting past 128 levels).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TensorData {
    /// Every number in row-major order, as f64 (whole numbers above 2^53 rounded).
    pub values: Vec<f64>,
    /// The first value that is not a JSON integer fitting an i64 (`3.0`, `1e3` and `2^63` are
    /// not), with its flat index, as the body wrote it (for INT64 tensors).
    pub first_not_whole: Option<(usize, String)>,
    /// The shape the arrays nest as (`[]` for one number); `None` when ragged or when an array
    /// is empty.
    pub nesting: Option<Vec<usize>>,
    /// Whether the outermost array holds an array (flat data is any row-major list).
    pub nested: bool,
}

/// What one element of tensor data was.
enum Element {
    Number,
    /// An array: its nesting (`None`: ragged or empty) and whether it holds an array.
    Array {
        nesting: Option<Vec<usize>>,
        holds_arrays: bool,
    },
}

impl Element {
    fn nesting(self) -> Option<Vec<usize>> {
        match self {
            Element::Number => Some(Vec::new()),
            Element::Array { nesting, .. } => nesting,
        }
    }
}

/// Reads one element of tensor data into `data`.
struct ElementReader<'a> {
    data: &'a mut TensorData,
}

impl ElementReader<'_> {
    fn number(self, value: f64, whole: bool, text: impl FnOnce() -> String) -> Element {
        if !whole && self.data.first_not_whole.is_none() {
            self.data.first_not_whole = Some((self.data.values.len(), text()));
        }
        self.data.values.push(value);
        Element::Number
    }
}

impl<'de> DeserializeSeed<'de> for ElementReader<'_> {
    type Value = Element;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Element, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ElementReader<'_> {
    type Value = Element;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a number or an array of numbers")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Element, E> {
        Ok(self.number(v as f64, true, String::new))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Element, E> {
        Ok(self.number(v as f64, i64::try_from(v).is_ok(), || v.to_string()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Element, E> {
        Ok(self.number(v, false, || format!("{v:?}")))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Element, A::Error> {
        let mut len = 0usize;
        let mut first: Option<Option<Vec<usize>>> = None;
        let mut rectangular = true;
        let mut holds_arrays = false;
        while let Some(element) = seq.next_element_seed(ElementReader { data: &mut *self.data })? {
            holds_arrays |= matches!(element, Element::Array { .. });
            let nesting = element.nesting();
            match &first {
                None => first = Some(nesting),
                Some(f) => rectangular &= *f == nesting,
            }
            len += 1;
        }
        let nesting = match first {
            Some(Some(mut inner)) if rectangular => {
                inner.insert(0, len);
                Some(inner)
            }
            _ => None,
        };
        Ok(Element::Array { nesting, holds_arrays })
    }
}

impl<'de> Deserialize<'de> for TensorData {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut data = TensorData::default();
        let top = ElementReader { data: &mut data }.deserialize(deserializer)?;
        data.nested = matches!(top, Element::Array { holds_arrays: true, .. });
        data.nesting = top.nesting();
        Ok(data)
    }
}

/// Any JSON value, read through and dropped as serde's `IgnoredAny` is, but checked as
/// serde_json checks what it keeps: numbers within f64's range, strings of valid UTF-8 without a
/// lone surrogate escape (`"\ud800"`), nesting within serde_json's limit of 128. `IgnoredAny`
/// skips past all of these unchecked, so a body it reads may still not be JSON. Nothing is kept
/// (a string with escapes passes through serde_json's one scratch buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Checked;

impl<'de> Visitor<'de> for Checked {
    type Value = Checked;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_none<E: de::Error>(self) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(Checked)
    }
}

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Checked)
    }
}

/// A JSON value of which only a scalar is kept: strings, numbers, booleans and null whole,
/// arrays and objects as their kind (their content is read past, [`Checked`], not kept).
#[derive(Debug, Clone, PartialEq)]
pub enum Shallow {
    Null,
    Bool(bool),
    /// A number as the body wrote it.
    Number(String),
    String(String),
    Array,
    Object,
}

impl fmt::Display for Shallow {
    /// As JSON for scalars (a long string cut, as errors echo it), `an array` / `an object`.
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Shallow::Null => f.write_str("null"),
            Shallow::Bool(b) => write!(f, "{b}"),
            Shallow::Number(n) => f.write_str(n),
            Shallow::String(s) => f.write_str(&crate::error::echo(s)),
            Shallow::Array => f.write_str("an array"),
            Shallow::Object => f.write_str("an object"),
        }
    }
}

struct ShallowVisitor;

impl<'de> Visitor<'de> for ShallowVisitor {
    type Value = Shallow;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<Shallow, E> {
        Ok(Shallow::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Shallow, E> {
        Ok(Shallow::Null)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Shallow, E> {
        Ok(Shallow::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Shallow, E> {
        Ok(Shallow::Number(v.to_string()))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Shallow, E> {
        Ok(Shallow::Number(v.to_string()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Shallow, E> {
        Ok(Shallow::Number(format!("{v:?}")))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Shallow, E> {
        Ok(Shallow::String(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Shallow, E> {
        Ok(Shallow::String(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shallow, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Shallow::Array)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shallow, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(Shallow::Object)
    }
}

impl<'de> Deserialize<'de> for Shallow {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ShallowVisitor)
    }
}

/// The most items of an array a [`StringOrList`] keeps; the rest are counted.
pub const KEPT_ITEMS: usize = 8;

/// A field that is a string or an array of strings (OpenAI's `prompt` and `stop`), read
/// keeping at most [`KEPT_ITEMS`] items of an array.
#[derive(Debug, Clone, PartialEq)]
pub enum StringOrList {
    One(String),
    /// An array: its first items and its length.
    List {
        items: Vec<Shallow>,
        len: usize,
    },
    /// Anything else (null included).
    Other(Shallow),
}

struct StringOrListVisitor;

impl<'de> Visitor<'de> for StringOrListVisitor {
    type Value = StringOrList;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string or an array of strings")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<StringOrList, E> {
        Ok(StringOrList::One(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<StringOrList, E> {
        Ok(StringOrList::One(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StringOrList, A::Error> {
        let mut items = Vec::new();
        let mut len = 0usize;
        while items.len() < KEPT_ITEMS {
            match seq.next_element::<Shallow>()? {
                Some(item) => items.push(item),
                None => {
                    return Ok(StringOrList::List {
                        len: items.len(),
                        items,
                    })
                }
            }
        }
        len += items.len();
        while seq.next_element::<Checked>()?.is_some() {
            len += 1;
        }
        Ok(StringOrList::List { items, len })
    }
    fn visit_unit<E: de::Error>(self) -> Result<StringOrList, E> {
        ShallowVisitor.visit_unit().map(StringOrList::Other)
    }
    fn visit_none<E: de::Error>(self) -> Result<StringOrList, E> {
        ShallowVisitor.visit_none().map(StringOrList::Other)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<StringOrList, E> {
        ShallowVisitor.visit_bool(v).map(StringOrList::Other)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<StringOrList, E> {
        ShallowVisitor.visit_i64(v).map(StringOrList::Other)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<StringOrList, E> {
        ShallowVisitor.visit_u64(v).map(StringOrList::Other)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<StringOrList, E> {
        ShallowVisitor.visit_f64(v).map(StringOrList::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<StringOrList, A::Error> {
        ShallowVisitor.visit_map(map).map(StringOrList::Other)
    }
}

impl<'de> Deserialize<'de> for StringOrList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StringOrListVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(json: &str) -> TensorData {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn tensor_data_keeps_the_numbers_in_order_and_how_they_nest() {
        let d = data("[[1, 2, 3], [4, 5, 6]]");
        assert_eq!(d.values, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!((d.nesting, d.nested, d.first_not_whole), (Some(vec![2, 3]), true, None));
        let d = data("[[[1], [2]]]");
        assert_eq!((d.nesting, d.nested), (Some(vec![1, 2, 1]), true));
        let d = data("1.5");
        assert_eq!((d.values, d.nesting, d.nested), (vec![1.5], Some(vec![]), false));
        let d = data("[1, -2, 3]");
        assert_eq!(
            (d.values, d.nesting, d.nested),
            (vec![1.0, -2.0, 3.0], Some(vec![3]), false)
        );
        // ragged, mixed and empty arrays nest as nothing; their numbers are still read
        for ragged in [
            "[[1, 2], [3]]",
            "[[1, 2], 3]",
            "[1, [2, 3]]",
            "[]",
            "[[], []]",
            "[[1], [[2]]]",
        ] {
            assert_eq!(data(ragged).nesting, None, "{ragged}");
        }
        let d = data("[[1, 2], [3, [4]]]");
        assert_eq!((d.values, d.nested), (vec![1.0, 2.0, 3.0, 4.0], true));
        // what is not a JSON integer inside an i64, first one only, as written
        assert_eq!(data("[1, 2.0, 3.5]").first_not_whole, Some((1, "2.0".into())));
        assert_eq!(data("[1e3]").first_not_whole, Some((0, "1000.0".into())));
        assert_eq!(
            data("[[0], [18446744073709551615]]").first_not_whole,
            Some((1, "18446744073709551615".into()))
        );
        assert_eq!(
            data("[-9223372036854775808, 9223372036854775807]").first_not_whole,
            None
        );
    }

    #[test]
    fn tensor_data_refuses_what_is_not_a_number_naming_where() {
        for (json, at) in [
            ("[1, \"a\"]", "[1]"),
            ("[[1], [null]]", "[1][0]"),
            ("{\"a\": 1}", ""),
            ("[true]", "[0]"),
        ] {
            let mut de = serde_json::Deserializer::from_str(json);
            let e = serde_path_to_error::deserialize::<_, TensorData>(&mut de).unwrap_err();
            assert!(
                e.inner()
                    .to_string()
                    .contains("expected a number or an array of numbers"),
                "{json}: {e}"
            );
            let path = e.path().to_string();
            assert_eq!(if path == "." { "" } else { &path }, at, "{json}");
        }
        // nesting deeper than serde_json's limit is an error, not a stack overflow
        let deep = format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(serde_json::from_str::<TensorData>(&deep).is_err());
    }

    #[test]
    fn string_or_list_keeps_a_few_items_and_counts_the_rest() {
        let read = |json: &str| serde_json::from_str::<StringOrList>(json).unwrap();
        assert_eq!(read("\"a\""), StringOrList::One("a".into()));
        assert_eq!(
            read("[\"a\", 1, [2, [3]], {\"x\": [4]}, null, true]"),
            StringOrList::List {
                items: vec![
                    Shallow::String("a".into()),
                    Shallow::Number("1".into()),
                    Shallow::Array,
                    Shallow::Object,
                    Shallow::Null,
                    Shallow::Bool(true),
                ],
                len: 6
            }
        );
        let many = format!("[{}]", vec!["\"s\""; 1000].join(","));
        let StringOrList::List { items, len } = read(&many) else {
            panic!()
        };
        assert_eq!((items.len(), len), (KEPT_ITEMS, 1000));
        assert_eq!(read("5"), StringOrList::Other(Shallow::Number("5".into())));
        assert_eq!(read("2.5"), StringOrList::Other(Shallow::Number("2.5".into())));
        assert_eq!(read("null"), StringOrList::Other(Shallow::Null));
        assert_eq!(read("{\"a\": [1]}"), StringOrList::Other(Shallow::Object));
        assert_eq!(
            Shallow::String("x".repeat(500)).to_string(),
            crate::error::echo(&"x".repeat(500))
        );
        assert_eq!(Shallow::Array.to_string(), "an array");
    }
}
