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

    /// Every value a grid visits: the listed values, the integers by `q`, or `min + k q`.
    pub fn grid_points(&self) -> Option<Vec<Value>> {
        match &self.dist {
            Distribution::Values(v) => Some((0..v.len()).map(Value::Choice).collect()),
            Distribution::IntUniform { min, max, q } => {
                Some((0..=(max - min) / q).map(|k| Value::Int(min + k * q)).collect())
            }
            Distribution::Uniform { min, max, q: Some(q) } => {
                let n = ((max - min) / q + 1e-9).floor() as usize;
                Some((0..=n).map(|k| Value::Float(tidy(min + k as f64 * q))).collect())
            }
            _ => None,
        }
    }
}

/// `x` rounded to 12 significant digits: `min + k q` without the binary noise of the product
/// (`0.15`, not `0.15000000000000002`).
fn tidy(x: f64) -> f64 {
    format!("{x:.11e}").parse().unwrap_or(x)
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

    /// How many points a grid over the space has (`None` when a parameter is a continuous
    /// range without `q`: it has no grid).
    pub fn grid_size(&self) -> Option<usize> {
        self.params
            .iter()
            .try_fold(1usize, |n, p| Some(n.saturating_mul(p.grid_points()?.len())))
    }
}

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
    let (min, max) = match (number("min")?, number("max")?) {
        (Some(min), Some(max)) => (min, max),
        _ => return Err(format!("distribution {kind:?} needs min and max")),
    };
    if min >= max {
        return Err(format!("min ({min}) must be below max ({max})"));
    }
    let q = number("q")?;
    if let Some(q) = q {
        if q <= 0.0 {
            return Err(format!("q ({q}) must be above 0"));
        }
        if q > max - min {
            return Err(format!("q ({q}) is wider than the range max - min ({})", max - min));
        }
    }
    match kind {
        "uniform" => Ok(Distribution::Uniform { min, max, q }),
        "log_uniform" => {
            if min <= 0.0 {
                return Err(format!(
                    "log_uniform needs 0 < min < max, but the range [{min}, {max}] touches 0 or lies below it"
                ));
            }
            if q.is_some() {
                return Err("q steps are not supported with log_uniform (use uniform with q, or values)".into());
            }
            Ok(Distribution::LogUniform { min, max })
        }
        "int_uniform" => {
            let int = |x: f64, k: &str| {
                (x.fract() == 0.0 && x.abs() < 9e15)
                    .then_some(x as i64)
                    .ok_or(format!("int_uniform needs whole numbers, but {k} = {x}"))
            };
            Ok(Distribution::IntUniform {
                min: int(min, "min")?,
                max: int(max, "max")?,
                q: q.map_or(Ok(1), |q| int(q, "q"))?,
            })
        }
        other => Err(format!("distribution {other:?} is not one of {DISTRIBUTIONS}")),
    }
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
        assert_eq!(wd.grid_points().unwrap().len(), 5);
        assert_eq!(
            layers.grid_points().unwrap(),
            [Value::Int(1), Value::Int(3), Value::Int(5), Value::Int(7)]
        );
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
}
