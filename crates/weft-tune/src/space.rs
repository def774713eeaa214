//! The search space: `[sweep.parameters]`, one entry per run-config key, each a numeric
//! distribution or a list of values.
//!
//! ```toml
//! [sweep.parameters]
//! "optim.lr" = { distribution = "log_uniform", min = 1e-4, max = 3e-2 }
//! "optim.weight_decay" = { distribution = "uniform", min = 0.0, max = 0.2, q = 0.05 }
//! "model.n_layer" = { distribution = "int_uniform", min = 1, max = 4 }
//! "model.n_embd" = { values = [32, 64] }
//! ```
//!
//! Samplers work on each parameter's *internal scale*: the value itself for `uniform`, its
//! natural log for `log_uniform`, and the integers widened by half a step on each side for
//! `int_uniform` (so every integer owns an interval of equal width), then map a point back with
//! [`Param::from_internal`] (rounding to `q` steps and clamping into `[min, max]`).

use crate::error::{Error, Result};

/// How one parameter's values are drawn.
#[derive(Debug, Clone, PartialEq)]
pub enum Distribution {
    /// Uniform on `[min, max]`; with `q`, the values `min + k q` up to `max`.
    Uniform { min: f64, max: f64, q: Option<f64> },
    /// Uniform in the log on `[min, max]` (`0 < min < max`).
    LogUniform { min: f64, max: f64 },
    /// The integers `min, min + q, ...` up to `max` (`q` default 1).
    IntUniform { min: i64, max: i64, q: i64 },
    /// One of the listed TOML values (categorical; a grid takes each in turn).
    Values(Vec<toml::Value>),
}

/// One swept config key and its distribution.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    /// The run-config key, `section.key` (`optim.lr`).
    pub key: String,
    pub dist: Distribution,
}

/// A drawn value of one parameter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Float(f64),
    Int(i64),
    /// The index into [`Distribution::Values`].
    Choice(usize),
}

/// The parameters of a sweep, in key order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Space {
    pub params: Vec<Param>,
}

impl Param {
    /// Whether the parameter is drawn from a list rather than a numeric range.
    pub fn is_categorical(&self) -> bool {
        matches!(self.dist, Distribution::Values(_))
    }

    /// The bounds of the internal scale (see the module docs); `(0, n)` for `n` listed values.
    pub fn bounds(&self) -> (f64, f64) {
        match &self.dist {
            Distribution::Uniform { min, max, .. } => (*min, *max),
            Distribution::LogUniform { min, max } => (min.ln(), max.ln()),
            Distribution::IntUniform { min, max, q } => {
                let half = *q as f64 / 2.0;
                (*min as f64 - half, *max as f64 + half)
            }
            Distribution::Values(v) => (0.0, v.len() as f64),
        }
    }

    /// A numeric value's point on the internal scale; a choice's index.
    pub fn internal(&self, v: Value) -> f64 {
        match (v, &self.dist) {
            (Value::Float(x), Distribution::LogUniform { .. }) => x.ln(),
            (Value::Float(x), _) => x,
            (Value::Int(i), _) => i as f64,
            (Value::Choice(c), _) => c as f64,
        }
    }

    /// The value at internal point `x`: rounded to the parameter's steps, clamped into its range.
    pub fn from_internal(&self, x: f64) -> Value {
        match &self.dist {
            Distribution::Uniform { min, max, q } => {
                let x = x.clamp(*min, *max);
                match q {
                    Some(q) => {
                        let k = ((x - min) / q).round();
                        let top = ((max - min) / q + 1e-9).floor();
                        Value::Float(tidy(min + k.min(top) * q))
                    }
                    None => Value::Float(x),
                }
            }
            Distribution::LogUniform { min, max } => Value::Float(x.exp().clamp(*min, *max)),
            Distribution::IntUniform { min, max, q } => {
                let k = ((x - *min as f64) / *q as f64).round().max(0.0) as i64;
                let top = (max - min) / q;
                Value::Int(min + k.min(top) * q)
            }
            Distribution::Values(v) => Value::Choice((x.max(0.0) as usize).min(v.len() - 1)),
        }
    }

    /// The value as TOML text for `--set key=TEXT` (floats always with a point or exponent, so
    /// they stay floats).
    pub fn text(&self, v: Value) -> String {
        match (v, &self.dist) {
            (Value::Float(x), _) => format!("{x:?}"),
            (Value::Int(i), _) => i.to_string(),
            (Value::Choice(c), Distribution::Values(vals)) => vals[c].to_string(),
            (Value::Choice(c), _) => c.to_string(),
        }
    }

    /// The value recorded as a run's param text (strings without quotes, other values as TOML
    /// writes them), if it is one this parameter can take.
    pub fn parse_text(&self, text: &str) -> Option<Value> {
        match &self.dist {
            Distribution::Values(vals) => vals.iter().position(|v| match v {
                toml::Value::String(s) => s == text,
                other => other.to_string() == text || same_number(other, text),
            }),
            _ => None,
        }
        .map(Value::Choice)
        .or_else(|| match &self.dist {
            Distribution::IntUniform { .. } => text.trim().parse().ok().map(Value::Int),
            Distribution::Uniform { .. } | Distribution::LogUniform { .. } => text
                .trim()
                .parse()
                .ok()
                .filter(|x: &f64| x.is_finite())
                .map(Value::Float),
            Distribution::Values(_) => None,
        })
    }

    /// How many values a grid of this parameter visits (the listed values, the integers by `q`,
    /// or `min + k q` up to `max`), counted without listing them; `None` for a continuous range.
    /// A count past `u64::MAX` reads as `u64::MAX`.
    pub fn grid_len(&self) -> Option<u64> {
        match &self.dist {
            Distribution::Values(v) => Some(v.len() as u64),
            // |min|, |max| <= 2^53 (checked when read): the difference fits
            Distribution::IntUniform { min, max, q } => Some(((max - min) / q) as u64 + 1),
            // a float-to-integer cast saturates
            Distribution::Uniform { min, max, q: Some(q) } => {
                Some((((max - min) / q + 1e-9).floor() as u64).saturating_add(1))
            }
            _ => None,
        }
    }

    /// Grid value `k` (`k < grid_len()`; a larger `k` gives the last value) of a parameter
    /// with a grid; for a continuous range, its lower end.
    pub fn grid_point(&self, k: u64) -> Value {
        let last = self.grid_len().map_or(0, |n| n - 1);
        let k = k.min(last);
        match &self.dist {
            Distribution::Values(_) => Value::Choice(k as usize),
            Distribution::IntUniform { min, q, .. } => Value::Int(min + k as i64 * q),
            Distribution::Uniform { min, max, q: Some(q) } => {
                // the last step as a float (a count past u64::MAX saturated `last`)
                let top = ((max - min) / q + 1e-9).floor();
                let k = if k == last { top } else { (k as f64).min(top) };
                Value::Float(tidy(min + k * q))
            }
            _ => self.from_internal(self.bounds().0),
        }
    }

    /// Whether `v` is a value this parameter can take: a listed value, a number in its range (an
    /// integer on its steps).
    pub fn contains(&self, v: Value) -> bool {
        match (v, &self.dist) {
            (Value::Choice(c), Distribution::Values(vals)) => c < vals.len(),
            (Value::Float(x), Distribution::Uniform { min, max, .. } | Distribution::LogUniform { min, max }) => {
                (*min..=*max).contains(&x)
            }
            (Value::Int(i), Distribution::IntUniform { min, max, q }) => {
                (*min..=*max).contains(&i) && (i - min) % q == 0
            }
            _ => false,
        }
    }

    /// The values `weft sweep` checks against the run config before the first trial: every
    /// listed value, or a range's two ends (its lowest and highest value, as drawn).
    pub fn checked_values(&self) -> Vec<Value> {
        match (&self.dist, self.grid_len()) {
            (Distribution::Values(v), _) => (0..v.len()).map(Value::Choice).collect(),
            (_, Some(n)) => vec![self.grid_point(0), self.grid_point(n - 1)],
            (Distribution::Uniform { min, max, .. } | Distribution::LogUniform { min, max }, None) => {
                vec![Value::Float(*min), Value::Float(*max)]
            }
            (Distribution::IntUniform { min, max, .. }, None) => vec![Value::Int(*min), Value::Int(*max)],
        }
    }
}

/// `x` rounded to 12 significant digits: `min + k q` without the binary noise of the product
/// (`0.15`, not `0.15000000000000002`).
fn tidy(x: f64) -> f64 {
    format!("{x:.11e}").parse().unwrap_or(x)
}

/// `x` as messages write it: plainly (`0.25`, `300`), or in exponent form where that would run
/// long (`1e300`, not its 301 digits; `1e-12`).
fn shown(x: f64) -> String {
    let a = x.abs();
    if a != 0.0 && !(1e-6..1e16).contains(&a) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

/// A TOML number as messages write it ([`shown`] for a float).
fn shown_value(v: &toml::Value) -> String {
    match v {
        toml::Value::Float(f) => shown(*f),
        other => other.to_string(),
    }
}

/// Whether TOML number `v` equals the number written as `text` (`1e-3` and `0.001`).
fn same_number(v: &toml::Value, text: &str) -> bool {
    let Ok(t) = text.trim().parse::<f64>() else {
        return false;
    };
    match v {
        toml::Value::Integer(i) => *i as f64 == t,
        toml::Value::Float(f) => *f == t,
        _ => false,
    }
}

const KEYS: [&str; 5] = ["distribution", "min", "max", "q", "values"];
const DISTRIBUTIONS: &str = "uniform, log_uniform, int_uniform";

impl Space {
    /// Reads `[sweep.parameters]` (`table`); `source` names the file in errors, which are one
    /// line each: the key and what is wrong with it.
    pub fn from_toml(table: &toml::Table, source: &str) -> Result<Space> {
        if table.is_empty() {
            return Err(Error::Spec(format!(
                "{source}: [sweep.parameters] is empty: name at least one config key"
            )));
        }
        let mut params = Vec::with_capacity(table.len());
        for (key, entry) in table {
            let bad = |msg: String| Error::Spec(format!("{source}: sweep.parameters.\"{key}\": {msg}"));
            match key.split_once('.') {
                Some((s, k)) if !s.is_empty() && !k.is_empty() && !k.contains('.') => {}
                _ => {
                    return Err(bad(
                        "the key must be a run-config key, section.key (e.g. \"optim.lr\")".into()
                    ))
                }
            }
            let entry = entry.as_table().ok_or_else(|| {
                bad("expected a table, e.g. { distribution = \"uniform\", min = 0.0, max = 1.0 }".into())
            })?;
            if let Some(k) = entry.keys().find(|k| !KEYS.contains(&k.as_str())) {
                return Err(bad(format!("unknown key {k:?} (expected {})", KEYS.join(", "))));
            }
            params.push(Param {
                key: key.clone(),
                dist: parse_distribution(entry).map_err(bad)?,
            });
        }
        Ok(Space { params })
    }

    /// How many points a grid over the space has, counted without listing them (`None` when a
    /// parameter is a continuous range without `q`: it has no grid; `u64::MAX` past it).
    pub fn grid_size(&self) -> Option<u64> {
        self.params
            .iter()
            .try_fold(1u64, |n, p| Some(n.saturating_mul(p.grid_len()?)))
    }
}

/// The largest magnitude of an `int_uniform` bound or step: 2^53, up to which every integer is
/// also a float (the samplers draw on floats).
pub const MAX_INT: i64 = 1 << 53;

/// One parameter's distribution, or why the entry is not one.
fn parse_distribution(entry: &toml::Table) -> std::result::Result<Distribution, String> {
    let number = |k: &str| -> std::result::Result<Option<f64>, String> {
        match entry.get(k) {
            None => Ok(None),
            Some(toml::Value::Float(f)) if f.is_finite() => Ok(Some(*f)),
            Some(toml::Value::Integer(i)) => Ok(Some(*i as f64)),
            Some(other) => Err(format!("{k} must be a finite number, got {other}")),
        }
    };
    if let Some(values) = entry.get("values") {
        if let Some(k) = ["distribution", "min", "max", "q"]
            .iter()
            .find(|k| entry.contains_key(**k))
        {
            return Err(format!(
                "give either values or a distribution, not both ({k} is set too)"
            ));
        }
        let values = values
            .as_array()
            .ok_or("values must be a list, e.g. values = [2, 4, 6]")?;
        if values.is_empty() {
            return Err("values is empty: list at least one value".into());
        }
        return Ok(Distribution::Values(values.clone()));
    }
    let kind = match entry.get("distribution") {
        Some(toml::Value::String(s)) => s.as_str(),
        Some(other) => return Err(format!("distribution must be a string, got {other}")),
        None => return Err(format!("give values = [...] or distribution = one of {DISTRIBUTIONS}")),
    };
    if kind == "int_uniform" {
        return parse_int_uniform(entry);
    }
    let (min, max) = match (number("min")?, number("max")?) {
        (Some(min), Some(max)) => (min, max),
        _ => return Err(format!("distribution {kind:?} needs min and max")),
    };
    if min >= max {
        return Err(format!("min ({}) must be below max ({})", shown(min), shown(max)));
    }
    if !(max - min).is_finite() {
        return Err(format!(
            "the range [{min:?}, {max:?}] is too wide: max - min is not a finite number"
        ));
    }
    let q = number("q")?;
    if let Some(q) = q {
        if q <= 0.0 {
            return Err(format!("q ({}) must be above 0", shown(q)));
        }
        if q > max - min {
            return Err(format!(
                "q ({}) is wider than the range max - min ({})",
                shown(q),
                shown(max - min)
            ));
        }
        if !((max - min) / q).is_finite() {
            return Err(format!(
                "q ({q:?}) is too small for the range: (max - min) / q is not a finite number"
            ));
        }
    }
    match kind {
        "uniform" => Ok(Distribution::Uniform { min, max, q }),
        "log_uniform" => {
            if min <= 0.0 {
                return Err(format!(
                    "log_uniform needs 0 < min < max, but the range [{}, {}] touches 0 or lies below it",
                    shown(min),
                    shown(max)
                ));
            }
            if q.is_some() {
                return Err("q steps are not supported with log_uniform (use uniform with q, or values)".into());
            }
            Ok(Distribution::LogUniform { min, max })
        }
        other => Err(format!("distribution {other:?} is not one of {DISTRIBUTIONS}")),
    }
}

/// `int_uniform`'s `min`, `max` and `q`: whole numbers (integers, or floats without a
/// fraction) of at most [`MAX_INT`] in magnitude, read as written (an integer is not rounded
/// through a float first).
fn parse_int_uniform(entry: &toml::Table) -> std::result::Result<Distribution, String> {
    let int = |k: &str| -> std::result::Result<Option<i64>, String> {
        let outside = |v: &toml::Value| {
            format!(
                "int_uniform {k} = {} is outside the whole numbers weft accepts there (-{MAX_INT} to {MAX_INT}, 2^53)",
                shown_value(v)
            )
        };
        match entry.get(k) {
            None => Ok(None),
            Some(v @ toml::Value::Integer(i)) => match i.unsigned_abs() <= MAX_INT as u64 {
                true => Ok(Some(*i)),
                false => Err(outside(v)),
            },
            Some(v @ toml::Value::Float(f)) if f.is_finite() => match (f.fract() == 0.0, f.abs() <= MAX_INT as f64) {
                (false, _) => Err(format!("int_uniform needs whole numbers, but {k} = {}", shown(*f))),
                (true, false) => Err(outside(v)),
                (true, true) => Ok(Some(*f as i64)),
            },
            Some(other) => Err(format!("{k} must be a finite number, got {other}")),
        }
    };
    let (min, max) = match (int("min")?, int("max")?) {
        (Some(min), Some(max)) => (min, max),
        _ => return Err("distribution \"int_uniform\" needs min and max".into()),
    };
    if min >= max {
        return Err(format!("min ({min}) must be below max ({max})"));
    }
    let q = int("q")?.unwrap_or(1);
    if q <= 0 {
        return Err(format!("q ({q}) must be above 0"));
    }
    if q > max - min {
        return Err(format!("q ({q}) is wider than the range max - min ({})", max - min));
    }
    Ok(Distribution::IntUniform { min, max, q })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(text: &str) -> Result<Space> {
        Space::from_toml(&text.parse::<toml::Table>().unwrap(), "s.toml")
    }

    fn error(text: &str) -> String {
        space(text).unwrap_err().to_string()
    }

    #[test]
    fn every_kind_parses_and_maps_to_and_from_its_scale() {
        let s = space(
            "\"optim.lr\" = { distribution = \"log_uniform\", min = 1e-4, max = 1e-2 }\n\
             \"optim.weight_decay\" = { distribution = \"uniform\", min = 0, max = 0.2, q = 0.05 }\n\
             \"model.n_layer\" = { distribution = \"int_uniform\", min = 1, max = 7, q = 2 }\n\
             \"optim.kind\" = { values = [\"adam\", \"sgd\"] }\n",
        )
        .unwrap();
        let keys: Vec<&str> = s.params.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["model.n_layer", "optim.kind", "optim.lr", "optim.weight_decay"]);
        let [layers, kind, lr, wd] = &s.params[..] else {
            panic!()
        };
        assert_eq!(lr.bounds(), (1e-4f64.ln(), 1e-2f64.ln()));
        assert_eq!(lr.from_internal(1e-3f64.ln()), Value::Float(1e-3f64.ln().exp()));
        assert_eq!(lr.text(Value::Float(0.001)), "0.001");
        assert_eq!(wd.from_internal(0.07), Value::Float(0.05));
        assert_eq!(wd.from_internal(0.16), Value::Float(0.15));
        assert_eq!(wd.text(wd.from_internal(0.16)), "0.15");
        assert_eq!(wd.from_internal(9.0), Value::Float(0.2));
        assert_eq!(wd.text(Value::Float(0.0)), "0.0");
        assert_eq!(layers.bounds(), (0.0, 8.0));
        assert_eq!(layers.from_internal(4.2), Value::Int(5));
        assert_eq!(layers.from_internal(99.0), Value::Int(7));
        assert_eq!(kind.text(Value::Choice(1)), "\"sgd\"");
        assert_eq!(kind.parse_text("sgd"), Some(Value::Choice(1)));
        assert_eq!(lr.parse_text("0.001"), Some(Value::Float(0.001)));
        assert_eq!(layers.parse_text("3"), Some(Value::Int(3)));
        assert_eq!(s.grid_size(), None);
        assert_eq!(wd.grid_len(), Some(5));
        let points: Vec<Value> = (0..4).map(|k| layers.grid_point(k)).collect();
        assert_eq!(points, [Value::Int(1), Value::Int(3), Value::Int(5), Value::Int(7)]);
        assert_eq!(layers.grid_len(), Some(4));
        let wd_points: Vec<String> = (0..5).map(|k| wd.text(wd.grid_point(k))).collect();
        assert_eq!(wd_points, ["0.0", "0.05", "0.1", "0.15", "0.2"]);
        assert_eq!(kind.grid_len(), Some(2));
        assert_eq!(lr.grid_len(), None);
        // what weft sweep checks before the first trial: every listed value, a range's ends
        assert_eq!(kind.checked_values(), [Value::Choice(0), Value::Choice(1)]);
        assert_eq!(layers.checked_values(), [Value::Int(1), Value::Int(7)]);
        assert_eq!(wd.checked_values(), [Value::Float(0.0), Value::Float(0.2)]);
        assert_eq!(lr.checked_values(), [Value::Float(1e-4), Value::Float(1e-2)]);
    }

    /// Ranges of 2^52 integers, or of 10^18 q steps, are drawn and counted arithmetically:
    /// listing their values (as grid points) tried to allocate petabytes and aborted, or
    /// overflowed the capacity of a vector.
    #[test]
    fn huge_ranges_are_counted_and_drawn_without_listing_them() {
        let s = space(
            "\"train.seed\" = { distribution = \"int_uniform\", min = 0, max = 4503599627370496 }\n\
             \"optim.lr\" = { distribution = \"uniform\", min = 0.0, max = 0.01, q = 1e-20 }\n\
             \"optim.eps\" = { distribution = \"uniform\", min = 0.0, max = 0.01, q = 1e-300 }\n",
        )
        .unwrap();
        let [eps, lr, seed] = &s.params[..] else { panic!() };
        assert_eq!(seed.grid_len(), Some(4503599627370497));
        assert!(lr.grid_len().unwrap().abs_diff(1_000_000_000_000_000_001) < 1000);
        assert_eq!(eps.grid_len(), Some(u64::MAX));
        assert_eq!(s.grid_size(), Some(u64::MAX));
        assert_eq!(seed.grid_point(4503599627370496), Value::Int(4503599627370496));
        assert_eq!(seed.checked_values(), [Value::Int(0), Value::Int(4503599627370496)]);
        for p in [eps, lr] {
            assert_eq!(p.checked_values(), [Value::Float(0.0), Value::Float(0.01)]);
            let Value::Float(x) = p.from_internal(0.00123) else {
                panic!()
            };
            assert!((x - 0.00123).abs() < 1e-15, "{x}");
        }
        assert_eq!(seed.from_internal(1e15 + 0.3), Value::Int(1_000_000_000_000_000));
    }

    #[test]
    fn bad_entries_are_named_in_one_line() {
        let cases = [
            (
                "\"optim.lr\" = { distribution = \"uniform\", min = 0.1, max = 0.01 }",
                "min (0.1) must be below max (0.01)",
            ),
            (
                "\"optim.lr\" = { distribution = \"uniform\", min = 1, max = 1 }",
                "min (1) must be below max (1)",
            ),
            (
                "\"optim.lr\" = { distribution = \"log_uniform\", min = 0.0, max = 0.1 }",
                "touches 0",
            ),
            (
                "\"optim.lr\" = { distribution = \"log_uniform\", min = -1.0, max = 0.1 }",
                "touches 0",
            ),
            ("\"optim.lr\" = { values = [] }", "values is empty"),
            (
                "\"optim.lr\" = { distribution = \"normal\", min = 0, max = 1 }",
                "\"normal\" is not one of",
            ),
            (
                "\"optim.lr\" = { distribution = \"uniform\", min = 0 }",
                "needs min and max",
            ),
            (
                "\"optim.lr\" = { distribution = \"uniform\", min = 0, max = 1, step = 2 }",
                "unknown key \"step\"",
            ),
            ("\"optim.lr\" = { values = [1], min = 0 }", "not both"),
            (
                "\"model.n_layer\" = { distribution = \"int_uniform\", min = 1.5, max = 4 }",
                "whole numbers",
            ),
            (
                "\"optim.lr\" = { distribution = \"uniform\", min = 0, max = 1, q = 0 }",
                "q (0) must be above 0",
            ),
            (
                "\"train.seed\" = { distribution = \"int_uniform\", min = -9223372036854775808, max = 0 }",
                "int_uniform min = -9223372036854775808 is outside the whole numbers weft accepts there (-9007199254740992 to 9007199254740992",
            ),
            (
                "\"train.seed\" = { distribution = \"int_uniform\", min = 0, max = 1e20 }",
                "is outside the whole numbers weft accepts there",
            ),
            (
                "\"train.seed\" = { distribution = \"int_uniform\", min = 0, max = 9007199254740993 }",
                "int_uniform max = 9007199254740993 is outside the whole numbers",
            ),
            (
                "\"train.seed\" = { distribution = \"int_uniform\", min = 0, max = 10, q = 0 }",
                "q (0) must be above 0",
            ),
            (
                "\"optim.lr\" = { distribution = \"uniform\", min = -1e308, max = 1e308 }",
                "max - min is not a finite number",
            ),
            (
                "\"optim.lr\" = { distribution = \"uniform\", min = 0.0, max = 0.01, q = 5e-324 }",
                "q (5e-324) is too small for the range",
            ),
            ("lr = { values = [1] }", "section.key"),
            ("\"optim.lr\" = 0.1", "expected a table"),
            ("", "is empty"),
        ];
        for (text, want) in cases {
            let e = error(text);
            assert!(e.contains(want), "{text}: {e}");
            assert!(e.starts_with("s.toml: "), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
        assert!(
            error("\"optim.lr\" = { distribution = \"uniform\", min = 0.1, max = 0.01 }")
                .contains("sweep.parameters.\"optim.lr\"")
        );
    }

    #[test]
    fn numbers_far_from_1_are_written_short() {
        let e = error("\"optim.lr\" = { distribution = \"uniform\", min = 0.01, max = 0.1, q = 1e300 }");
        assert!(e.contains("q (1e300) is wider than the range max - min (0.09"), "{e}");
        let e = error("\"train.seed\" = { distribution = \"int_uniform\", min = 0, max = 10, q = 1e300 }");
        assert!(e.contains("int_uniform q = 1e300 is outside the whole numbers"), "{e}");
        let e = error("\"optim.lr\" = { distribution = \"uniform\", min = 1e300, max = 1e299 }");
        assert!(e.contains("min (1e300) must be below max (1e299)"), "{e}");
        let e = error("\"train.seed\" = { distribution = \"int_uniform\", min = 0, max = 10, q = 1e-300 }");
        assert!(e.contains("but q = 1e-300") && e.len() < 200, "{e}");
        // the numbers of every day as they were
        let e = error("\"optim.lr\" = { distribution = \"uniform\", min = 0.2, max = 0.1 }");
        assert!(e.contains("min (0.2) must be below max (0.1)"), "{e}");
    }
}
