//! The batches of a run config's `[data]` section, each data-parallel rank's share of them, and
//! the checks that they can serve the run.

use std::ops::Range;
use std::sync::Arc;

use weft_core::Tensor;
use weft_data::{BatchesDataset, CsvDataset, LabelColumn, Split, TextDataset, TokenDataset, Tokenizer};

use crate::config::{DataConfig, LabelColumnConfig, ModelConfig, RunConfig, TokensKeys};
use crate::error::{Error, Result};
use crate::trainer::{shard_rows, BatchFn};

/// Training and evaluation batches of a `[data]` section.
pub(super) struct Data {
    pub train: BatchFn,
    pub eval: Option<BatchFn>,
    /// The tokenizer of text and token data (recorded in checkpoints, used for the sample).
    pub tokenizer: Option<Tokenizer>,
    /// Rows of every training batch (the global batch).
    pub batch_rows: usize,
    /// Rows `rows` of the training batch at an index, built without the others (token data):
    /// a data-parallel rank then reads only its own rows.
    pub rows: Option<RowsFn>,
    /// A token dataset's `index.json` digest as read (`crate::lineage`).
    pub tokens_digest: Option<String>,
    /// Whether the validation split is too small for one evaluation batch (fewer rows than
    /// `data.batch_size`, fewer tokens than one window): only then is an evaluation batch's
    /// error about the batch's size (see [`no_eval_batch`]).
    pub eval_short: bool,
}

/// Rows of the training batch at an index.
pub(super) type RowsFn = Arc<dyn Fn(usize, Range<usize>) -> Result<(Tensor, Tensor)> + Send + Sync>;

impl Data {
    /// This data-parallel rank's share of every training batch: the same global batches are
    /// built on every rank (from the same seed and step) and each keeps its rows, so `ranks`
    /// ranks see exactly what one process would, in the same order whatever their number.
    /// Evaluation batches stay whole (ranks share them out by index instead).
    pub fn shard(mut self, rank: usize, ranks: usize) -> Result<Data> {
        if ranks == 1 {
            return Ok(self);
        }
        if !self.batch_rows.is_multiple_of(ranks) {
            return Err(Error::Config(format!(
                "parallel.dp: a global batch of {} rows does not split evenly across dp = {ranks} ranks",
                self.batch_rows
            )));
        }
        if let Some(rows) = self.rows.clone() {
            let per = self.batch_rows / ranks;
            self.train = Arc::new(move |step| rows(step, rank * per..(rank + 1) * per));
            return Ok(self);
        }
        let inner = self.train.clone();
        self.train = Arc::new(move |step| {
            let (x, y) = inner(step)?;
            Ok((shard_rows(&x, rank, ranks)?, shard_rows(&y, rank, ranks)?))
        });
        Ok(self)
    }
}

pub(super) fn build_data(config: &RunConfig) -> Result<Data> {
    let seed = config.train.seed;
    let block_size = config.model.language_model_sizes().map_or(0, |(_, block)| block);
    Ok(match &config.data {
        DataConfig::Batches(b) => {
            let ds = Arc::new(BatchesDataset::from_file(config.resolve(&b.path))?);
            check_batches(&config.model, &ds)?;
            let batch_rows = ds.batch_size();
            Data {
                train: Arc::new(move |step| Ok(ds.batch(step)?)),
                eval: None,
                tokenizer: None,
                batch_rows,
                rows: None,
                tokens_digest: None,
                eval_short: false,
            }
        }
        DataConfig::Text(t) => {
            let (path, val_fraction) = (&t.path, t.val_fraction);
            let ds = Arc::new(text_dataset(config, t)?);
            if let Some((vocab_size, _)) = config.model.language_model_sizes() {
                if ds.vocab_size() > vocab_size {
                    return Err(Error::Config(format!(
                        "model.vocab_size: {} is smaller than the {} tokens of the {} tokenizer of {}",
                        vocab_size,
                        ds.vocab_size(),
                        ds.tokenizer().kind(),
                        config.resolve(path).display()
                    )));
                }
            }
            let have = ds.num_tokens(Split::Train);
            if have < block_size + 1 {
                return Err(Error::Config(format!(
                    "model.block_size: {block_size}, but the training split of {} has {have} tokens, fewer than \
                     block_size + 1 = {}; give more text, or a smaller model.block_size",
                    config.resolve(path).display(),
                    block_size + 1
                )));
            }
            let bs = t.batch_size;
            let (t, v) = (ds.clone(), ds.clone());
            let train: BatchFn = Arc::new(move |step| Ok(t.batch(Split::Train, bs, block_size, seed, step)?));
            let has_val = val_fraction > 0.0;
            let eval_short = ds.num_tokens(Split::Val) < block_size + 1;
            let eval: Option<BatchFn> = has_val
                .then(|| Arc::new(move |i| Ok(v.batch(Split::Val, bs, block_size, seed ^ 0x5eed, i)?)) as BatchFn);
            Data {
                train,
                eval,
                tokenizer: Some(ds.tokenizer().clone()),
                batch_rows: bs,
                rows: None,
                tokens_digest: None,
                eval_short,
            }
        }
        DataConfig::Tokens(k) => tokens_data(config, k, seed, block_size)?,
        DataConfig::Csv(c) => {
            let label = match &c.label_column {
                LabelColumnConfig::Index(i) if *i < 0 => LabelColumn::FromEnd(i.unsigned_abs() as usize),
                LabelColumnConfig::Index(i) => LabelColumn::Index(*i as usize),
                LabelColumnConfig::Name(n) => LabelColumn::Name(n.clone()),
            };
            let ds = Arc::new(CsvDataset::from_file(
                config.resolve(&c.path),
                label,
                c.feature_scale as f32,
                c.val_fraction,
            )?);
            // a label past the model's classes would fail mid-run, naming neither file nor row
            let classes = match &config.model {
                ModelConfig::Mlp(m) => Some(m.out_features),
                ModelConfig::Convnet(m) => Some(m.num_classes),
                ModelConfig::Gpt(_) | ModelConfig::Llama(_) => None,
            };
            if let Some(classes) = classes {
                ds.check_labels(classes)?;
            }
            let bs = c.batch_size;
            let eval_short = ds.num_rows(Split::Val) < bs;
            let (t, v) = (ds.clone(), ds.clone());
            let train: BatchFn = Arc::new(move |step| Ok(t.batch(Split::Train, bs, seed, step)?));
            let eval: Option<BatchFn> = (c.val_fraction > 0.0)
                .then(|| Arc::new(move |i| Ok(v.batch(Split::Val, bs, seed ^ 0x5eed, i)?)) as BatchFn);
            Data {
                train,
                eval,
                tokenizer: None,
                batch_rows: bs,
                rows: None,
                tokens_digest: None,
                eval_short,
            }
        }
    })
}

/// Checks a batches file against the model before anything is written, so that a file made for
/// another model fails naming it and the key rather than at the first step: the inputs' shape
/// per row (mlp `in_features` values, convnet `in_channels x image_size x image_size` in any
/// shape, a language model's `[T]` with `T <= block_size`), and the targets: a classifier's class ids within its
/// classes, a language model's token ids within its vocabulary (besides the ids the losses
/// ignore: -1 for a language model, -100 for a classifier); and a language model's input ids
/// within the vocabulary.
fn check_batches(model: &ModelConfig, ds: &BatchesDataset) -> Result<()> {
    let file = ds.path().display();
    let (x, _) = ds.batch(0)?;
    let row: Vec<usize> = x.shape()[1..].to_vec();
    // a classifier's rows: their element count is what the model takes (a convnet reshapes
    // `[C*H*W]` or `[C, H, W]` rows alike)
    let (want, key, classes): (Option<usize>, &str, usize) = match model {
        ModelConfig::Mlp(m) => (Some(m.in_features), "model.in_features", m.out_features),
        ModelConfig::Convnet(c) => (
            Some(c.in_channels * c.image_size * c.image_size),
            "model.in_channels x image_size x image_size",
            c.num_classes,
        ),
        ModelConfig::Gpt(_) | ModelConfig::Llama(_) => {
            let (vocab, block) = model.language_model_sizes().expect("a language model");
            if row.len() != 1 || row[0] > block {
                return Err(Error::Config(format!(
                    "data.path: {file}: inputs of shape {:?} per step; model.block_size = {block} takes [B, T] with T <= {block}",
                    x.shape()
                )));
            }
            (None, "model.vocab_size", vocab)
        }
    };
    if let Some(want) = want {
        let have: usize = row.iter().product();
        if have != want {
            return Err(Error::Config(format!(
                "data.path: {file}: inputs of shape {:?} per step hold rows of {row:?} ({have} values), but {key} \
                 makes the model take {want}",
                x.shape()
            )));
        }
    }
    let lm = want.is_none();
    for step in 0..ds.steps_per_cycle() {
        let (x, y) = ds.batch(step)?;
        for (what, ids) in [("inputs", &x), ("targets", &y)] {
            // a classifier's float inputs are features, not ids
            if !ids.dtype().is_int() || (what == "inputs" && !lm) {
                continue;
            }
            // the ids the losses skip: a language model's -1, a classifier's -100 (PyTorch's)
            let ignored = match (what, lm) {
                ("targets", true) => -1.0,
                ("targets", false) => -100.0,
                _ => f64::NAN,
            };
            let outside = |v: f64| v >= classes as f64 || (v < 0.0 && v != ignored);
            if let Some(bad) = ids.to_vec_f64().into_iter().find(|&v| outside(v)) {
                let last = classes.saturating_sub(1);
                let outside = if lm {
                    format!("token id {bad}, outside model.vocab_size = {classes} (ids 0 to {last})")
                } else {
                    format!("class {bad}, outside the model's {classes} classes (0 to {last})")
                };
                return Err(Error::Config(format!(
                    "data.path: {file}: {what} of step {step} hold {outside}"
                )));
            }
        }
    }
    Ok(())
}

/// Checks before anything is built that the data can serve the run: CSV labels within the
/// model's classes, and a validation split that gives a batch when the run evaluates.
pub(super) fn check_data(config: &RunConfig, data: &Data) -> Result<()> {
    let t = &config.train;
    if t.eval_every == 0 {
        return Ok(());
    }
    let Some(eval) = &data.eval else {
        return Err(Error::Config(format!(
            "train.eval_every = {}, but the data has no validation split (data.val_fraction = 0, or data of kind \
             \"batches\"); set train.eval_every = 0, or give the data a validation split",
            t.eval_every
        )));
    };
    eval(0).map(drop).map_err(|e| match data.eval_short {
        true => Error::Config(format!(
            "train.eval_every = {}, but {}, or set train.eval_every = 0",
            t.eval_every,
            no_eval_batch(&e)
        )),
        // a damaged shard, ids outside the vocabulary, a file that cannot be read: the data's own
        // error, which names the file (no batch size helps)
        false => e,
    })
}

/// Why the validation split gives no batch (`e`, the data's error) when it is too small for one
/// ([`Data::eval_short`]), with what to change: a batch larger than the split needs a smaller
/// `data.batch_size` or a larger split.
pub(super) fn no_eval_batch(e: &dyn std::fmt::Display) -> String {
    format!("the validation split cannot give a batch: {e}; lower data.batch_size or raise data.val_fraction")
}

/// The token dataset of a `[data] kind = "tokens"` section: a folder, or an object store read
/// through the on-disk block cache. Checked here against the model: the vocabulary fits, and the
/// training split holds at least one window of `block_size + 1` tokens.
fn tokens_data(config: &RunConfig, k: &TokensKeys, seed: u64, block_size: usize) -> Result<Data> {
    use weft_data::store::{self, CacheOptions, CachedSource, StoreOptions};
    use weft_data::ObjectSource;
    // a plain path is relative to the config; a URL (file:// included) is taken as it is
    let target = if k.path.contains("://") {
        k.path.clone()
    } else {
        let path = config.resolve(std::path::Path::new(&k.path));
        path.to_str()
            .ok_or_else(|| Error::Config(format!("data.path: {} is not UTF-8", path.display())))?
            .to_string()
    };
    let options = StoreOptions {
        retry_for: k.retry_for(),
        ..Default::default()
    };
    let opened = store::open_with(&target, &options)?;
    let index = ObjectSource::read(&*opened, weft_data::tokens::INDEX_NAME)?;
    // `sha256:HEX` of the index as read: the run's data digest (lineage)
    let digest = crate::lineage::digest_of(&index);
    let ds = if opened.is_local() {
        TokenDataset::open_with_index(opened, &index)?
    } else {
        // a dataset prepared again under the same URL must not be served from the old one's
        // blocks: the version (the first 16 hex digits of its index.json's SHA-256, read from the
        // store itself, once) is part of every cache key; all versions share the one folder and
        // its size limit
        let hex = &digest["sha256:".len()..];
        let version = hex[..16].to_string();
        let mut cache = CacheOptions {
            limit_bytes: (k.cache_gb * (1u64 << 30) as f64) as u64,
            block_size: (k.cache_block_mb * (1u64 << 20) as f64) as u64,
            version,
            ..Default::default()
        };
        if let Some(dir) = &k.cache_dir {
            cache.dir = config.resolve(dir);
        }
        TokenDataset::open_with_index(Arc::new(CachedSource::new(opened, cache)?), &index)?
    };
    let ds = Arc::new(ds);
    if let Some((vocab_size, _)) = config.model.language_model_sizes() {
        if ds.vocab_size() > vocab_size {
            return Err(Error::Config(format!(
                "model.vocab_size: {vocab_size} is smaller than the {} tokens of the tokenizer of {} ({})",
                ds.vocab_size(),
                k.path,
                ds.tokenizer().kind()
            )));
        }
    }
    ds.windows(Split::Train, block_size)
        .map_err(|e| Error::Config(format!("model.block_size: {e}")))?;
    let bs = k.batch_size;
    let rows_ds = ds.clone();
    let rows: RowsFn =
        Arc::new(move |step, rows| Ok(rows_ds.batch(Split::Train, step as u64, bs, block_size, seed, rows)?));
    let whole = rows.clone();
    let train: BatchFn = Arc::new(move |step| whole(step, 0..bs));
    // a split too short for one window still makes `eval`, so that its first batch's error
    // (naming the split and both sizes) is what `check_data` reports
    let eval_short = ds.tokens(Split::Val) <= block_size as u64;
    let eval: Option<BatchFn> = (ds.tokens(Split::Val) > 0).then(|| {
        let v = ds.clone();
        Arc::new(move |i: usize| Ok(v.batch(Split::Val, i as u64, bs, block_size, seed ^ 0x5eed, 0..bs)?)) as BatchFn
    });
    Ok(Data {
        train,
        eval,
        tokenizer: Some(ds.tokenizer().clone()),
        batch_rows: bs,
        rows: Some(rows),
        tokens_digest: Some(digest),
        eval_short,
    })
}

/// The text of a `[data] kind = "text"` section, encoded with its `tokenizer` (the text's own
/// characters by default).
fn text_dataset(config: &RunConfig, t: &crate::config::TextKeys) -> Result<TextDataset> {
    use weft_data::TokenizerSpec;
    let text = if t.path.as_os_str() == "builtin" {
        crate::builtin::CORPUS.to_string()
    } else {
        weft_data::files::read_to_string(&config.resolve(&t.path))?
    };
    let spec = match t.tokenizer.as_deref() {
        None => TokenizerSpec::Char,
        Some(s) => s
            .parse::<TokenizerSpec>()
            .map_err(|e| Error::Config(format!("data.tokenizer: {e}")))?,
    };
    // a tokenizer file is relative to the config; char takes the text's own characters
    let spec = match spec {
        TokenizerSpec::File(p) => TokenizerSpec::File(config.resolve(&p)),
        other => other,
    };
    let tokenizer = spec
        .load_with_corpus([text.as_str()])
        .map_err(|e| Error::Config(format!("data.tokenizer: {e}")))?;
    Ok(TextDataset::with_tokenizer(&text, tokenizer, t.val_fraction)?)
}
