//! `cluster.toml`: a device and its links, for hardware the built-in specs do not cover.
//!
//! ```toml
//! name = "my-cluster"        # optional
//! devices_per_node = 8
//! memory_bytes = 80e9        # bytes per device
//! memory_bandwidth = 3.35e12 # bytes/s
//! shared_compute = 2          # optional: devices of a node that compute at once (CPU ranks
//!                             # sharing cores); absent: each device computes on its own
//! gpu = true                  # optional (default true): false for CPU ranks (grouped-query
//!                             # attention reads shared key/value heads in place there)
//!
//! [flops]                    # peak FLOP/s by dtype
//! bf16 = 989.5e12
//! f32 = 67e12
//!
//! [intra_node]               # per device and direction
//! bandwidth = 450e9          # bytes/s
//! latency = 5e-6             # seconds
//!
//! [inter_node]
//! bandwidth = 50e9
//! latency = 10e-6
//!
//! [efficiency]               # optional; every key optional (defaults: device::Efficiency)
//! gemm = 0.6
//! memory_bound = 0.7
//! collective = 0.8
//! attention = 1.0
//! memory_margin = 0.1
//!
//! [pass_cost]                # optional; every key optional (defaults: device::PassCost)
//! time_scale = 1.0           # measured / analytic time of whole passes
//! block = 0.0                # seconds per block and micro-batch beyond its compute
//! ends = 0.0                 # the same for the embeddings, output layer and loss together
//! ```
//!
//! Every field is checked here: a missing one is [`Error::MissingField`], a negative, zero,
//! non-finite or out-of-range one ([`LIMITS`]) [`Error::BadField`], an unknown key or a value
//! TOML cannot read (an integer past 2^63) [`Error::ClusterFile`], each naming the field.

use crate::device::{DeviceSpec, Efficiency, PassCost};
use crate::error::{Error, Result};

/// What a value must lie in: `(field, low, high, unit)`. The rates' and sizes' lows are far
/// below any device weft plans on (a CPU rank computes about 10^10 FLOP/s and moves about
/// 10^9 bytes/s), the highs far above any (an H200: 10^15 FLOP/s, 4.8 x 10^12 bytes/s of HBM,
/// 141 GB); inside them every predicted time is a finite number of seconds, where a rate of
/// 5e-324 or a latency of 1e308 made every plan's step take forever.
pub const LIMITS: [(&str, f64, f64, &str); 10] = [
    ("flops", 1e6, 1e18, "FLOP/s"),
    ("memory_bandwidth", 1e6, 1e15, "bytes/s"),
    ("bandwidth", 1e6, 1e15, "bytes/s"),
    ("memory_bytes", 1e6, 1e15, "bytes"),
    ("latency", 0.0, 1.0, "seconds"),
    // gemm, memory_bound and collective: the achieved share of a peak
    ("efficiency", 0.01, 1.0, ""),
    // as `weft plan calibrate` clamps the measured ratio
    ("attention", 1e-3, 16.0, ""),
    ("memory_margin", 0.0, 0.99, ""),
    ("time_scale", 1e-3, 16.0, ""),
    // pass_cost.block and pass_cost.ends
    ("pass_seconds", 0.0, 60.0, "seconds"),
];

/// The `(low, high, unit)` of [`LIMITS`] row `name`.
fn limits(name: &str) -> (f64, f64, &'static str) {
    LIMITS
        .iter()
        .find(|l| l.0 == name)
        .map_or((f64::MIN, f64::MAX, ""), |l| (l.1, l.2, l.3))
}

const TOP: [&str; 11] = [
    "name",
    "pass_cost",
    "shared_compute",
    "gpu",
    "devices_per_node",
    "memory_bytes",
    "memory_bandwidth",
    "flops",
    "intra_node",
    "inter_node",
    "efficiency",
];

struct Reader<'a> {
    source: &'a str,
}

impl Reader<'_> {
    fn missing(&self, field: &str) -> Error {
        Error::MissingField {
            source_name: self.source.to_string(),
            field: field.to_string(),
        }
    }

    fn bad(&self, field: &str, message: String) -> Error {
        Error::BadField {
            source_name: self.source.to_string(),
            field: field.to_string(),
            message,
        }
    }

    fn unknown(&self, table: &toml::Table, known: &[&str], prefix: &str) -> Result<()> {
        match table.keys().find(|k| !known.contains(&k.as_str())) {
            Some(k) => Err(Error::ClusterFile {
                source_name: self.source.to_string(),
                message: format!("unknown field `{prefix}{k}` (known: {})", known.join(", ")),
            }),
            None => Ok(()),
        }
    }

    fn table<'t>(&self, table: &'t toml::Table, key: &str) -> Result<Option<&'t toml::Table>> {
        match table.get(key) {
            None => Ok(None),
            Some(toml::Value::Table(t)) => Ok(Some(t)),
            Some(other) => Err(self.bad(key, format!("must be a table, got {}", other.type_str()))),
        }
    }

    /// A number (integer or float) at `field`, or `None` when absent.
    fn number(&self, table: &toml::Table, key: &str, field: &str) -> Result<Option<f64>> {
        match table.get(key) {
            None => Ok(None),
            Some(toml::Value::Float(f)) => Ok(Some(*f)),
            Some(toml::Value::Integer(i)) => Ok(Some(*i as f64)),
            Some(other) => Err(self.bad(field, format!("must be a number, got {}", other.type_str()))),
        }
    }

    /// A required rate or size: positive, and within [`LIMITS`] row `limit`.
    fn positive(&self, table: Option<&toml::Table>, key: &str, field: &str, limit: &str) -> Result<f64> {
        let v = match table {
            Some(t) => self.number(t, key, field)?,
            None => None,
        };
        let v = v.ok_or_else(|| self.missing(field))?;
        if !(v.is_finite() && v > 0.0) {
            return Err(self.bad(field, format!("must be a positive number, got {v}")));
        }
        self.within(v, field, limit)
    }

    /// `v` if it lies within [`LIMITS`] row `limit`, else an error naming `field`.
    fn within(&self, v: f64, field: &str, limit: &str) -> Result<f64> {
        let (low, high, unit) = limits(limit);
        if v.is_finite() && (low..=high).contains(&v) {
            return Ok(v);
        }
        let unit = if unit.is_empty() {
            String::new()
        } else {
            format!(" {unit}")
        };
        Err(self.bad(
            field,
            format!("must be from {} to {}{unit}, got {}", num(low), num(high), num(v)),
        ))
    }

    /// A required latency: seconds within [`LIMITS`].
    fn latency(&self, table: Option<&toml::Table>, field: &str) -> Result<f64> {
        let v = match table {
            Some(t) => self.number(t, "latency", field)?,
            None => None,
        };
        let v = v.ok_or_else(|| self.missing(field))?;
        self.within(v, field, "latency")
    }

    /// An optional number of `[efficiency]` or `[pass_cost]` (`section`) within [`LIMITS`] row
    /// `limit`, or `default`.
    fn optional(&self, t: &toml::Table, section: &str, key: &str, limit: &str, default: f64) -> Result<f64> {
        let field = format!("{section}.{key}");
        match self.number(t, key, &field)? {
            None => Ok(default),
            Some(v) => self.within(v, &field, limit),
        }
    }
}

/// A bound or a value as a short number: `1e6`, `0.01`, `5e-324`.
fn num(v: f64) -> String {
    if v == 0.0 || (1e-3..1e4).contains(&v.abs()) {
        format!("{v}")
    } else {
        format!("{v:e}")
    }
}

/// The `section.key` (or `key`) whose line holds byte `at` of a TOML text, if that line is a
/// `key = value` line: TOML's own errors (an integer past 2^63) name a line, not the field.
fn field_at(text: &str, at: usize) -> Option<String> {
    let at = at.min(text.len());
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let line = text[start..].lines().next()?;
    let key = line.split_once('=')?.0.trim().trim_matches('"');
    if key.is_empty() || key.starts_with('[') || key.starts_with('#') {
        return None;
    }
    let section = text[..start].lines().rev().find_map(|l| {
        let l = l.trim();
        l.starts_with('[')
            .then(|| l.trim_matches(|c| c == '[' || c == ']').trim().to_string())
    });
    Some(match section {
        Some(s) if !s.is_empty() => format!("{s}.{key}"),
        _ => key.to_string(),
    })
}

/// Reads a `cluster.toml` text; `source` names it in errors.
pub fn parse(text: &str, source: &str) -> Result<DeviceSpec> {
    let top: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        let message = e.message().trim().replace('\n', " ");
        let at = e.span().map(|s| s.start);
        let line = at.map(|a| text[..a.min(text.len())].lines().count().max(1));
        Error::ClusterFile {
            source_name: source.to_string(),
            message: match (at.and_then(|a| field_at(text, a)), line) {
                (Some(field), Some(line)) => format!("`{field}` (line {line}): {message}"),
                (None, Some(line)) => format!("line {line}: {message}"),
                _ => message,
            },
        }
    })?;
    from_table(&top, source)
}

/// Reads a parsed `cluster.toml` table (also the `[spec]` of a calibration file).
pub fn from_table(top: &toml::Table, source: &str) -> Result<DeviceSpec> {
    let r = Reader { source };
    r.unknown(top, &TOP, "")?;
    let name = match top.get("name") {
        None => source.to_string(),
        // printed in the table's header: no newline or escape sequence reaches the terminal
        Some(toml::Value::String(s)) if s.chars().any(char::is_control) => {
            return Err(r.bad("name", "must be printable text, without control characters".into()))
        }
        Some(toml::Value::String(s)) => s.clone(),
        Some(other) => return Err(r.bad("name", format!("must be a string, got {}", other.type_str()))),
    };
    let per_node = match top.get("devices_per_node") {
        None => return Err(r.missing("devices_per_node")),
        Some(toml::Value::Integer(i)) if *i >= 1 => *i as usize,
        Some(other) => return Err(r.bad("devices_per_node", format!("must be a whole number >= 1, got {other}"))),
    };
    let flops = r.table(top, "flops")?;
    let intra = r.table(top, "intra_node")?;
    let inter = r.table(top, "inter_node")?;
    for (t, known, prefix) in [
        (flops, &["bf16", "f32"][..], "flops."),
        (intra, &["bandwidth", "latency"][..], "intra_node."),
        (inter, &["bandwidth", "latency"][..], "inter_node."),
    ] {
        if let Some(t) = t {
            r.unknown(t, known, prefix)?;
        }
    }
    let mut efficiency = Efficiency::default();
    if let Some(e) = r.table(top, "efficiency")? {
        r.unknown(
            e,
            &["gemm", "memory_bound", "collective", "attention", "memory_margin"],
            "efficiency.",
        )?;
        let d = efficiency;
        efficiency = Efficiency {
            gemm: r.optional(e, "efficiency", "gemm", "efficiency", d.gemm)?,
            memory_bound: r.optional(e, "efficiency", "memory_bound", "efficiency", d.memory_bound)?,
            collective: r.optional(e, "efficiency", "collective", "efficiency", d.collective)?,
            // a causal kernel that skips the masked half the FLOP count includes exceeds 1
            attention: r.optional(e, "efficiency", "attention", "attention", d.attention)?,
            memory_margin: r.optional(e, "efficiency", "memory_margin", "memory_margin", d.memory_margin)?,
        };
    }
    let mut pass_cost = PassCost::default();
    if let Some(t) = r.table(top, "pass_cost")? {
        r.unknown(t, &["time_scale", "block", "ends"], "pass_cost.")?;
        pass_cost = PassCost {
            time_scale: r.optional(t, "pass_cost", "time_scale", "time_scale", 1.0)?,
            block: r.optional(t, "pass_cost", "block", "pass_seconds", 0.0)?,
            ends: r.optional(t, "pass_cost", "ends", "pass_seconds", 0.0)?,
        };
    }
    Ok(DeviceSpec {
        name,
        devices_per_node: per_node,
        flops_bf16: r.positive(flops, "bf16", "flops.bf16", "flops")?,
        flops_f32: r.positive(flops, "f32", "flops.f32", "flops")?,
        memory_bytes: r.positive(Some(top), "memory_bytes", "memory_bytes", "memory_bytes")?,
        memory_bandwidth: r.positive(Some(top), "memory_bandwidth", "memory_bandwidth", "memory_bandwidth")?,
        intra_bandwidth: r.positive(intra, "bandwidth", "intra_node.bandwidth", "bandwidth")?,
        intra_latency: r.latency(intra, "intra_node.latency")?,
        inter_bandwidth: r.positive(inter, "bandwidth", "inter_node.bandwidth", "bandwidth")?,
        inter_latency: r.latency(inter, "inter_node.latency")?,
        shared_compute: match r.number(top, "shared_compute", "shared_compute")? {
            None => None,
            Some(v) if v.is_finite() && v >= 1.0 && v <= per_node as f64 => Some(v),
            Some(v) => {
                return Err(r.bad(
                    "shared_compute",
                    format!("must be a number from 1 to devices_per_node ({per_node}), got {v}"),
                ))
            }
        },
        gpu: match top.get("gpu") {
            None => true,
            Some(toml::Value::Boolean(b)) => *b,
            Some(v) => return Err(r.bad("gpu", format!("must be true or false, got {v}"))),
        },
        efficiency,
        pass_cost,
    })
}

/// The largest cluster file read, in bytes (one is a few hundred).
const MAX_CLUSTER_FILE: u64 = 1 << 20;

/// Reads the `cluster.toml` at `path`: a regular file (a FIFO would wait for a writer, a device
/// such as `/dev/zero` never end) of at most 1 MiB.
pub fn load(path: &std::path::Path) -> Result<DeviceSpec> {
    use std::io::Read;
    let source = path.display().to_string();
    let refuse = |message: String| Error::ClusterFile {
        source_name: source.clone(),
        message,
    };
    let meta = std::fs::metadata(path).map_err(|e| refuse(e.to_string()))?;
    if !meta.is_file() {
        return Err(refuse("not a regular file".into()));
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_CLUSTER_FILE + 1).read_to_string(&mut text))
        .map_err(|e| refuse(e.to_string()))?;
    if text.len() as u64 > MAX_CLUSTER_FILE {
        return Err(refuse(format!(
            "longer than {MAX_CLUSTER_FILE} bytes: not a cluster file"
        )));
    }
    parse(&text, &source)
}

#[cfg(test)]
mod tests;
