//! `[data]`: which data (`kind`), where it is, and how it is read.

use std::path::PathBuf;

use serde::Deserialize;

use super::by_kind;

/// `[data]`: which data (`kind`) and where.
#[derive(Debug, Clone)]
pub enum DataConfig {
    /// A safetensors file with `inputs` `[S, B, ...]` and `targets` `[S, B, ...]`; step `i` uses
    /// row `i mod S`.
    Batches(BatchesKeys),
    /// Character-level text; windows of the model's `block_size`.
    Text(TextKeys),
    /// Numeric features plus a label column (`.csv` or `.csv.gz`).
    Csv(CsvKeys),
    /// Token shards written by `weft data prepare`, in a folder or an object store; windows of
    /// the model's `block_size + 1` tokens.
    Tokens(TokensKeys),
}

/// `[data]` keys of `kind = "tokens"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokensKeys {
    /// A folder (relative to the config file) or a URL (`s3://bucket/prefix`, `gs://`, `az://`,
    /// `http(s)://`, `file://`) holding `index.json` and the shards.
    pub path: String,
    pub batch_size: usize,
    /// Object stores: the folder of the on-disk block cache (default: the user's cache folder,
    /// `$XDG_CACHE_HOME/weft/objects` or `~/.cache/weft/objects`).
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
    /// Object stores: most GiB the cache may hold (least recently used blocks are evicted).
    #[serde(default = "default_cache_gb")]
    pub cache_gb: f64,
    /// Object stores: seconds a failing store is retried (with backoff) before the run fails; at
    /// most [`MAX_RETRY_SECONDS`] (a year).
    #[serde(default = "default_retry_seconds", deserialize_with = "retry_seconds")]
    pub retry_seconds: f64,
    /// Object stores: the cache's block, MiB: what one request to the store fetches.
    #[serde(default = "default_cache_block_mb")]
    pub cache_block_mb: f64,
}

fn default_cache_block_mb() -> f64 {
    4.0
}

fn default_cache_gb() -> f64 {
    10.0
}

fn default_retry_seconds() -> f64 {
    60.0
}

/// The most `[data] retry_seconds` may be: a year, as `weft_dist::MAX_TIMEOUT` bounds the
/// other timeouts. 1e20 passed the check (finite, >= 0) and the run then panicked turning it into
/// a `Duration`.
pub const MAX_RETRY_SECONDS: f64 = weft_dist::MAX_TIMEOUT.as_secs() as f64;

/// `retry_seconds`, refused above [`MAX_RETRY_SECONDS`] (the error reads `data: retry_seconds:
/// ...`). Negative and non-finite values are left to the config's validation, which names
/// `data.retry_seconds`.
fn retry_seconds<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    let secs = f64::deserialize(d)?;
    if secs.is_finite() && secs > MAX_RETRY_SECONDS {
        // 1e20 as written, not as its 21 digits
        let shown = if secs < 1e15 {
            secs.to_string()
        } else {
            format!("{secs:e}")
        };
        return Err(serde::de::Error::custom(format!(
            "{shown} must be seconds, >= 0 and at most {MAX_RETRY_SECONDS} (a year)"
        )));
    }
    Ok(secs)
}

impl TokensKeys {
    /// `retry_seconds` as a `Duration`, without panicking whatever the value (one built in code
    /// skips the checks): clamped to `0..=`[`MAX_RETRY_SECONDS`], NaN read as the default 60 s.
    pub fn retry_for(&self) -> std::time::Duration {
        let secs = if self.retry_seconds.is_nan() {
            default_retry_seconds()
        } else {
            self.retry_seconds.clamp(0.0, MAX_RETRY_SECONDS)
        };
        std::time::Duration::try_from_secs_f64(secs).unwrap_or(weft_dist::MAX_TIMEOUT)
    }
}

/// `[data]` keys of `kind = "batches"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchesKeys {
    pub path: PathBuf,
}

/// `[data]` keys of `kind = "text"`. `path = "builtin"` is the corpus compiled into weft.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextKeys {
    pub path: PathBuf,
    pub batch_size: usize,
    /// `"char"` (the default: the text's own characters), `"gpt2"` (GPT-2's BPE), or the path of
    /// a Hugging Face `tokenizer.json` (relative to the config file).
    #[serde(default)]
    pub tokenizer: Option<String>,
    #[serde(default = "default_val_fraction")]
    pub val_fraction: f64,
}

/// `[data]` keys of `kind = "csv"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CsvKeys {
    pub path: PathBuf,
    pub label_column: LabelColumnConfig,
    pub batch_size: usize,
    #[serde(default = "default_val_fraction")]
    pub val_fraction: f64,
    #[serde(default = "default_feature_scale")]
    pub feature_scale: f64,
}

impl<'de> Deserialize<'de> for DataConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        by_kind(d, "data", &["batches", "text", "csv", "tokens"], |kind, v| {
            Ok(match kind {
                "batches" => DataConfig::Batches(serde_path_to_error::deserialize(v)?),
                "text" => DataConfig::Text(serde_path_to_error::deserialize(v)?),
                "tokens" => DataConfig::Tokens(serde_path_to_error::deserialize(v)?),
                _ => DataConfig::Csv(serde_path_to_error::deserialize(v)?),
            })
        })
    }
}

/// A label column by index (0-based, negative from the end) or by header name.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum LabelColumnConfig {
    Index(i64),
    Name(String),
}

fn default_val_fraction() -> f64 {
    0.1
}

fn default_feature_scale() -> f64 {
    1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(extra: &str) -> std::result::Result<TokensKeys, String> {
        let text = format!("kind = \"tokens\"\npath = \"s3://data/ds\"\nbatch_size = 4\n{extra}");
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| e.to_string())?;
        match DataConfig::deserialize(toml::Value::Table(table)).map_err(|e| e.to_string())? {
            DataConfig::Tokens(k) => Ok(k),
            _ => Err("not tokens".into()),
        }
    }

    #[test]
    fn retry_seconds_is_bounded_by_a_year_and_never_panics_as_a_duration() {
        for big in ["1e20", "31536000.5", "1.8e19"] {
            let e = tokens(&format!("retry_seconds = {big}")).unwrap_err();
            assert!(
                e.contains("retry_seconds") && e.contains("at most 31536000"),
                "{big}: {e}"
            );
        }
        let year = tokens("retry_seconds = 31536000").unwrap();
        assert_eq!(year.retry_for(), weft_dist::MAX_TIMEOUT);
        assert_eq!(tokens("").unwrap().retry_for(), std::time::Duration::from_secs(60));
        assert_eq!(
            tokens("retry_seconds = 0.25").unwrap().retry_for(),
            std::time::Duration::from_millis(250)
        );
        // what the validation refuses later (naming data.retry_seconds) still converts
        for v in [-1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e300] {
            let mut k = tokens("").unwrap();
            k.retry_seconds = v;
            assert!(k.retry_for() <= weft_dist::MAX_TIMEOUT, "{v}");
        }
    }
}
