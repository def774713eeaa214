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
//! Every field is checked here: a missing one is [`Error::MissingField`], a negative, zero or
//! non-finite one [`Error::BadField`], an unknown key [`Error::ClusterFile`], each naming the
//! field.

use crate::device::{DeviceSpec, Efficiency, PassCost};
use crate::error::{Error, Result};

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

    /// A required number that must be positive and finite.
    fn positive(&self, table: Option<&toml::Table>, key: &str, field: &str) -> Result<f64> {
        let v = match table {
            Some(t) => self.number(t, key, field)?,
            None => None,
        };
        let v = v.ok_or_else(|| self.missing(field))?;
        if !(v.is_finite() && v > 0.0) {
            return Err(self.bad(field, format!("must be a positive number, got {v}")));
        }
        Ok(v)
    }

    /// A required latency: finite and not negative.
    fn latency(&self, table: Option<&toml::Table>, field: &str) -> Result<f64> {
        let v = match table {
            Some(t) => self.number(t, "latency", field)?,
            None => None,
        };
        let v = v.ok_or_else(|| self.missing(field))?;
        if !(v.is_finite() && v >= 0.0) {
            return Err(self.bad(field, format!("must be a number of seconds >= 0, got {v}")));
        }
        Ok(v)
    }

    /// An optional ratio in (0, 16] (attention's rate over the products': a causal kernel
    /// that skips the masked half the FLOP count includes may exceed 1).
    fn ratio(&self, t: &toml::Table, key: &str, default: f64) -> Result<f64> {
        let field = format!("efficiency.{key}");
        match self.number(t, key, &field)? {
            None => Ok(default),
            Some(v) if v > 0.0 && v <= 16.0 => Ok(v),
            Some(v) => Err(self.bad(&field, format!("must be a ratio in (0, 16], got {v}"))),
        }
    }

    /// An optional fraction in `range` (lower bound exclusive when `open_low`).
    fn fraction(&self, t: &toml::Table, key: &str, default: f64, open_low: bool) -> Result<f64> {
        let field = format!("efficiency.{key}");
        let Some(v) = self.number(t, key, &field)? else {
            return Ok(default);
        };
        let ok = if open_low {
            v > 0.0 && v <= 1.0
        } else {
            (0.0..1.0).contains(&v)
        };
        if !ok {
            let range = if open_low { "(0, 1]" } else { "[0, 1)" };
            return Err(self.bad(&field, format!("must be a fraction in {range}, got {v}")));
        }
        Ok(v)
    }
}

/// Reads a `cluster.toml` text; `source` names it in errors.
pub fn parse(text: &str, source: &str) -> Result<DeviceSpec> {
    let top: toml::Table = text.parse().map_err(|e: toml::de::Error| Error::ClusterFile {
        source_name: source.to_string(),
        message: e.message().to_string(),
    })?;
    from_table(&top, source)
}

/// Reads a parsed `cluster.toml` table (also the `[spec]` of a calibration file).
pub fn from_table(top: &toml::Table, source: &str) -> Result<DeviceSpec> {
    let r = Reader { source };
    r.unknown(top, &TOP, "")?;
    let name = match top.get("name") {
        None => source.to_string(),
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
        efficiency = Efficiency {
            gemm: r.fraction(e, "gemm", efficiency.gemm, true)?,
            memory_bound: r.fraction(e, "memory_bound", efficiency.memory_bound, true)?,
            collective: r.fraction(e, "collective", efficiency.collective, true)?,
            attention: r.ratio(e, "attention", efficiency.attention)?,
            memory_margin: r.fraction(e, "memory_margin", efficiency.memory_margin, false)?,
        };
    }
    let mut pass_cost = PassCost::default();
    if let Some(t) = r.table(top, "pass_cost")? {
        r.unknown(t, &["time_scale", "block", "ends"], "pass_cost.")?;
        let seconds = |key: &str| -> Result<f64> {
            let field = format!("pass_cost.{key}");
            match r.number(t, key, &field)? {
                None => Ok(0.0),
                Some(v) if v.is_finite() && v >= 0.0 => Ok(v),
                Some(v) => Err(r.bad(&field, format!("must be a number of seconds >= 0, got {v}"))),
            }
        };
        pass_cost = PassCost {
            time_scale: match r.number(t, "time_scale", "pass_cost.time_scale")? {
                None => 1.0,
                Some(v) if v > 0.0 && v <= 16.0 => v,
                Some(v) => return Err(r.bad("pass_cost.time_scale", format!("must be a ratio in (0, 16], got {v}"))),
            },
            block: seconds("block")?,
            ends: seconds("ends")?,
        };
    }
    Ok(DeviceSpec {
        name,
        devices_per_node: per_node,
        flops_bf16: r.positive(flops, "bf16", "flops.bf16")?,
        flops_f32: r.positive(flops, "f32", "flops.f32")?,
        memory_bytes: r.positive(Some(top), "memory_bytes", "memory_bytes")?,
        memory_bandwidth: r.positive(Some(top), "memory_bandwidth", "memory_bandwidth")?,
        intra_bandwidth: r.positive(intra, "bandwidth", "intra_node.bandwidth")?,
        intra_latency: r.latency(intra, "intra_node.latency")?,
        inter_bandwidth: r.positive(inter, "bandwidth", "inter_node.bandwidth")?,
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

/// Reads the `cluster.toml` at `path`.
pub fn load(path: &std::path::Path) -> Result<DeviceSpec> {
    let source = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| Error::ClusterFile {
        source_name: source.clone(),
        message: e.to_string(),
    })?;
    parse(&text, &source)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
devices_per_node = 4
memory_bytes = 24e9
memory_bandwidth = 1e12
[flops]
bf16 = 200e12
f32 = 50e12
[intra_node]
bandwidth = 32e9
latency = 8e-6
[inter_node]
bandwidth = 12.5e9
latency = 0
[efficiency]
gemm = 0.5
"#;

    #[test]
    fn a_whole_file_reads() {
        let d = parse(GOOD, "c.toml").unwrap();
        assert_eq!(d.devices_per_node, 4);
        assert_eq!(d.memory_bytes, 24e9);
        assert_eq!(d.inter_latency, 0.0);
        assert_eq!(d.efficiency.gemm, 0.5);
        assert_eq!(d.efficiency.memory_bound, Efficiency::default().memory_bound);
        assert_eq!(d.name, "c.toml");
        // GPUs unless said otherwise
        assert!(d.gpu);
        // passes cost their compute alone unless said otherwise
        assert_eq!(d.pass_cost, PassCost::default());
        let costed = GOOD.replace(
            "[efficiency]",
            "[pass_cost]\ntime_scale = 1.25\nblock = 2e-4\n[efficiency]",
        );
        let c = parse(&costed, "c.toml").unwrap().pass_cost;
        assert_eq!((c.time_scale, c.block, c.ends), (1.25, 2e-4, 0.0));
        let e = parse(
            &GOOD.replace("[efficiency]", "[pass_cost]\nlaunch = 1\n[efficiency]"),
            "c.toml",
        )
        .unwrap_err();
        assert!(e.to_string().contains("`pass_cost.launch`"), "{e}");
        let cpu = format!("gpu = false\n{GOOD}");
        assert!(!parse(&cpu, "c.toml").unwrap().gpu);
        let e = parse(&format!("gpu = 1\n{GOOD}"), "c.toml").unwrap_err();
        assert!(
            e.to_string().contains("`gpu`") && e.to_string().contains("true or false"),
            "{e}"
        );
    }

    #[test]
    fn missing_fields_are_named() {
        for (field, text) in [
            ("memory_bytes", GOOD.replace("memory_bytes = 24e9\n", "")),
            ("flops.f32", GOOD.replace("f32 = 50e12\n", "")),
            ("inter_node.bandwidth", GOOD.replace("bandwidth = 12.5e9\n", "")),
            ("devices_per_node", GOOD.replace("devices_per_node = 4\n", "")),
            ("intra_node.latency", GOOD.replace("latency = 8e-6\n", "")),
        ] {
            let e = parse(&text, "c.toml").unwrap_err();
            assert_eq!(
                e,
                Error::MissingField {
                    source_name: "c.toml".into(),
                    field: field.into()
                }
            );
            assert_eq!(e.to_string(), format!("c.toml: missing field `{field}`"));
        }
    }

    #[test]
    fn negative_and_odd_fields_are_named() {
        for (field, text) in [
            (
                "memory_bytes",
                GOOD.replace("memory_bytes = 24e9", "memory_bytes = -24e9"),
            ),
            (
                "intra_node.bandwidth",
                GOOD.replace("bandwidth = 32e9", "bandwidth = 0"),
            ),
            ("inter_node.latency", GOOD.replace("latency = 0", "latency = -1e-6")),
            ("flops.bf16", GOOD.replace("bf16 = 200e12", "bf16 = \"fast\"")),
            (
                "devices_per_node",
                GOOD.replace("devices_per_node = 4", "devices_per_node = -2"),
            ),
            ("efficiency.gemm", GOOD.replace("gemm = 0.5", "gemm = 1.5")),
            (
                "pass_cost.block",
                GOOD.replace("[efficiency]", "[pass_cost]\nblock = -1e-4\n[efficiency]"),
            ),
            (
                "pass_cost.time_scale",
                GOOD.replace("[efficiency]", "[pass_cost]\ntime_scale = 0\n[efficiency]"),
            ),
        ] {
            match parse(&text, "c.toml") {
                Err(Error::BadField { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
        let e = parse(&format!("{GOOD}\nspeed = 3\n"), "c.toml").unwrap_err();
        assert!(e.to_string().contains("`efficiency.speed`"), "{e}");
        let e = parse("devices_per_node = [", "c.toml").unwrap_err();
        assert!(matches!(e, Error::ClusterFile { .. }), "{e}");
    }
}
