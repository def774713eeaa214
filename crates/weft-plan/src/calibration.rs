//! The `local` device spec: this machine as `weft plan calibrate` measured it, kept in a
//! versioned TOML file.
//!
//! ```toml
//! format = "weft-plan-calibration"
//! version = 4
//! machine = "AMD EPYC 7B13; 1 threads"   # the CPU and the compute threads of each rank
//! ranks = 2                              # ranks measured together
//! measure_seconds = 3.1
//!
//! [measured]                             # the rates behind the spec, units in the names
//! gemm_f32_flops = 2.1e10
//! ...
//!
//! [spec]                                 # a cluster.toml (crate::cluster), name "local"
//! devices_per_node = 2
//! ...
//! ```
//!
//! [`Calibration::parse`] refuses a file of another `format` or `version` (or a broken one)
//! with [`Error::Calibration`]; callers warn and measure again.

use crate::device::DeviceSpec;
use crate::error::{Error, Result};

/// The `format` key of a calibration file.
pub const FORMAT: &str = "weft-plan-calibration";
/// The version this build writes and reads (4: bf16 products measured since the CPU's own bf16
/// kernel, about twice the rate version 3 files hold where the CPU has AVX-512 BF16).
pub const VERSION: i64 = 4;

/// The most ranks `weft plan calibrate` measures together: the ranks of one machine, started
/// by the command itself.
pub const MAX_RANKS: usize = 64;

/// What to run for a job of more ranks than [`MAX_RANKS`] (or none): its text, for a refusal of
/// `--nproc` or a note (the spec is per rank, its node the machine measured).
pub fn ranks_advice() -> String {
    format!(
        "must be 1 to {MAX_RANKS}: a calibration measures the ranks of one machine (run `weft plan calibrate \
         --nproc N` with N the ranks each machine of the job runs)"
    )
}

/// A measured machine.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibration {
    /// The spec the planner uses (`devices_per_node` = `ranks`, efficiencies relative to the
    /// measured rates).
    pub spec: DeviceSpec,
    /// Ranks measured together on this machine.
    pub ranks: usize,
    /// The CPU and the compute threads of each rank.
    pub machine: String,
    /// Wall time of the measurement, seconds.
    pub measure_seconds: f64,
    /// The measured numbers the spec was made of, by name (units in the name: `_flops` FLOP/s,
    /// `_bytes_per_s` bytes/s, `_s` seconds).
    pub measured: Vec<(String, f64)>,
}

fn spec_table(d: &DeviceSpec) -> toml::Table {
    let mut t = toml::Table::new();
    let num = |v: f64| toml::Value::Float(v);
    let sub = |pairs: &[(&str, f64)]| toml::Value::Table(pairs.iter().map(|(k, v)| (k.to_string(), num(*v))).collect());
    t.insert("name".into(), toml::Value::String(d.name.clone()));
    t.insert(
        "devices_per_node".into(),
        toml::Value::Integer(d.devices_per_node as i64),
    );
    t.insert("memory_bytes".into(), num(d.memory_bytes));
    t.insert("memory_bandwidth".into(), num(d.memory_bandwidth));
    if !d.gpu {
        t.insert("gpu".into(), toml::Value::Boolean(false));
    }
    if let Some(k) = d.shared_compute {
        t.insert("shared_compute".into(), num(k));
    }
    t.insert("flops".into(), sub(&[("bf16", d.flops_bf16), ("f32", d.flops_f32)]));
    t.insert(
        "intra_node".into(),
        sub(&[("bandwidth", d.intra_bandwidth), ("latency", d.intra_latency)]),
    );
    t.insert(
        "inter_node".into(),
        sub(&[("bandwidth", d.inter_bandwidth), ("latency", d.inter_latency)]),
    );
    let c = &d.pass_cost;
    t.insert(
        "pass_cost".into(),
        sub(&[("time_scale", c.time_scale), ("block", c.block), ("ends", c.ends)]),
    );
    let e = &d.efficiency;
    t.insert(
        "efficiency".into(),
        sub(&[
            ("gemm", e.gemm),
            ("memory_bound", e.memory_bound),
            ("collective", e.collective),
            ("attention", e.attention),
            ("memory_margin", e.memory_margin),
        ]),
    );
    t
}

impl Calibration {
    /// The file's text.
    pub fn to_toml(&self) -> String {
        let mut t = toml::Table::new();
        t.insert("format".into(), toml::Value::String(FORMAT.into()));
        t.insert("version".into(), toml::Value::Integer(VERSION));
        t.insert("machine".into(), toml::Value::String(self.machine.clone()));
        t.insert("ranks".into(), toml::Value::Integer(self.ranks as i64));
        t.insert("measure_seconds".into(), toml::Value::Float(self.measure_seconds));
        let measured: toml::Table = self
            .measured
            .iter()
            .map(|(k, v)| (k.clone(), toml::Value::Float(*v)))
            .collect();
        t.insert("measured".into(), toml::Value::Table(measured));
        t.insert("spec".into(), toml::Value::Table(spec_table(&self.spec)));
        format!("# this machine as `weft plan calibrate` measured it (docs/plan.md); measure again to replace\n{t}")
    }

    /// Reads a calibration file's text; `source` names it in errors.
    pub fn parse(text: &str, source: &str) -> Result<Calibration> {
        let bad = |message: String| Error::Calibration {
            source_name: source.to_string(),
            message,
        };
        let top: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| bad(e.message().trim().to_string()))?;
        match top.get("format").and_then(|v| v.as_str()) {
            Some(FORMAT) => {}
            _ => return Err(bad(format!("not a calibration file (no `format = \"{FORMAT}\"`)"))),
        }
        match top.get("version").and_then(|v| v.as_integer()) {
            Some(VERSION) => {}
            Some(v) => return Err(bad(format!("version {v}, but this weft reads version {VERSION}"))),
            None => return Err(bad("no `version`".into())),
        }
        let machine = top
            .get("machine")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string();
        let ranks = match top.get("ranks").and_then(|v| v.as_integer()) {
            Some(r) if r >= 1 => r as usize,
            _ => return Err(bad("`ranks` must be a whole number >= 1".into())),
        };
        let measure_seconds = top.get("measure_seconds").and_then(|v| v.as_float()).unwrap_or(0.0);
        let measured = match top.get("measured") {
            Some(toml::Value::Table(t)) => t
                .iter()
                .map(|(k, v)| match v {
                    toml::Value::Float(f) => Ok((k.clone(), *f)),
                    toml::Value::Integer(i) => Ok((k.clone(), *i as f64)),
                    _ => Err(bad(format!("`measured.{k}` must be a number"))),
                })
                .collect::<Result<Vec<_>>>()?,
            _ => Vec::new(),
        };
        let mut spec = match top.get("spec") {
            Some(toml::Value::Table(t)) => crate::cluster::from_table(t, source)?,
            _ => return Err(bad("no `[spec]` table".into())),
        };
        // `weft plan calibrate` measures CPU ranks (files written before `gpu` was kept too)
        spec.gpu = false;
        if spec.devices_per_node != ranks {
            return Err(bad(format!(
                "`spec.devices_per_node` = {} but `ranks` = {ranks}",
                spec.devices_per_node
            )));
        }
        Ok(Calibration {
            spec,
            ranks,
            machine,
            measure_seconds,
            measured,
        })
    }

    /// A measured number by name.
    pub fn get(&self, name: &str) -> Option<f64> {
        self.measured.iter().find(|(k, _)| k == name).map(|(_, v)| *v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Efficiency;

    pub(crate) fn sample() -> Calibration {
        Calibration {
            spec: DeviceSpec {
                name: "local".into(),
                devices_per_node: 4,
                flops_bf16: 1.5e10,
                flops_f32: 2.25e10,
                memory_bytes: 3.2e9,
                memory_bandwidth: 7.5e9,
                intra_bandwidth: 1.25e9,
                intra_latency: 3.5e-5,
                inter_bandwidth: 1.25e9,
                inter_latency: 3.5e-5,
                shared_compute: Some(2.0),
                gpu: false,
                efficiency: Efficiency {
                    gemm: 1.0,
                    memory_bound: 1.0,
                    collective: 1.0,
                    attention: 0.25,
                    memory_margin: 0.1,
                },
                pass_cost: crate::device::PassCost {
                    time_scale: 1.1,
                    block: 2.5e-4,
                    ends: 5e-4,
                },
            },
            ranks: 4,
            machine: "cpu; 1 threads".into(),
            measure_seconds: 2.5,
            measured: vec![("gemm_f32_flops".into(), 2.25e10)],
        }
    }

    #[test]
    fn a_calibration_reads_back_as_written() {
        let c = sample();
        let text = c.to_toml();
        assert_eq!(Calibration::parse(&text, "c.toml").unwrap(), c);
        assert_eq!(c.get("gemm_f32_flops"), Some(2.25e10));
    }

    #[test]
    fn foreign_and_broken_files_are_refused_by_name() {
        let text = sample().to_toml();
        for (broken, want) in [
            (
                text.replace(&format!("version = {VERSION}"), "version = 2"),
                format!("version 2, but this weft reads version {VERSION}").as_str(),
            ),
            (text.replace(FORMAT, "something-else"), "not a calibration file"),
            (text[..text.len() / 2].to_string(), "c.toml: "),
            ("\u{0}\u{1}garbage".to_string(), "c.toml: "),
            (text.replace("ranks = 4", "ranks = 3"), "but `ranks` = 3"),
            (text.replace("f32 = 22500000000.0", "f32 = -1.0"), "flops.f32"),
        ] {
            let e = Calibration::parse(&broken, "c.toml").unwrap_err().to_string();
            assert!(e.contains(want), "{want}: {e}");
        }
    }
}
