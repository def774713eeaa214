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
    /// Object stores: seconds a failing store is retried (with backoff) before the run fails.
    #[serde(default = "default_retry_seconds")]
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
        by_kind(d, &["batches", "text", "csv", "tokens"], |kind, v| {
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
