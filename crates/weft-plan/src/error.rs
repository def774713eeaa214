//! What planning refuses, by name.

/// Planning errors: bad input, or a model or device count no layout can take.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Error {
    /// A `cluster.toml` that cannot be read or parsed.
    #[error("{source_name}: {message}")]
    ClusterFile { source_name: String, message: String },
    /// A `cluster.toml` field that is missing.
    #[error("{source_name}: missing field `{field}`")]
    MissingField { source_name: String, field: String },
    /// A `cluster.toml` field whose value is out of range (negative, zero, not finite).
    #[error("{source_name}: `{field}` {message}")]
    BadField {
        source_name: String,
        field: String,
        message: String,
    },
    /// A calibration file (`weft plan calibrate`) that cannot be used: unreadable, not one,
    /// or written by another version of the format.
    #[error("{source_name}: {message}")]
    Calibration { source_name: String, message: String },
    /// `--device-spec` names no built-in spec.
    #[error("unknown device spec {name:?} (one of {known})")]
    UnknownDevice { name: String, known: String },
    /// A model shape that is not a model (zero sizes, heads that do not divide the width).
    #[error("model: {0}")]
    BadModel(String),
    /// A global batch or device count of zero.
    #[error("{0}")]
    BadRequest(String),
    /// No `dp x tp x pp` of this many devices is a layout weft can run for this model and batch.
    #[error("no layout uses {devices} devices: {why}")]
    NoLayout { devices: usize, why: String },
    /// No layout that fits has a finite, positive predicted step time: the device spec's rates
    /// are too low or its latencies too long (a `cluster.toml` is held to [`crate::cluster::LIMITS`],
    /// so this is a spec made some other way).
    #[error(
        "no layout on {devices} x {device} has a finite predicted step time (the closest, {layout}, predicts {step} s): \
         the device spec's rates are too low or its latencies too long"
    )]
    NoFiniteTime {
        devices: usize,
        device: String,
        layout: String,
        step: f64,
    },
    /// Every layout needs more memory per device than there is.
    #[error(
        "the model fits no layout on {devices} devices of {capacity}: the least memory a layout needs is {needed} \
         per device ({term} dominates: {term_bytes})"
    )]
    DoesNotFit {
        devices: usize,
        capacity: String,
        needed: String,
        term: String,
        term_bytes: String,
    },
}

/// Planning's result type.
pub type Result<T> = std::result::Result<T, Error>;

/// `bytes` in decimal units: `80.0 GB`.
pub fn human_bytes(bytes: f64) -> String {
    let units = ["B", "kB", "MB", "GB", "TB", "PB"];
    let mut v = bytes;
    let mut i = 0;
    while v >= 1000.0 && i + 1 < units.len() {
        v /= 1000.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", units[i])
    }
}
