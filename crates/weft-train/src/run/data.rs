//! The batches of a run config's `[data]` section, each data-parallel rank's share of them, and
//! the checks that they can serve the run.

use std::sync::Arc;

use weft_data::{BatchesDataset, CsvDataset, LabelColumn, Split, TextDataset};

use crate::config::{DataConfig, LabelColumnConfig, ModelConfig, RunConfig};
use crate::error::{Error, Result};
use crate::trainer::{shard_rows, BatchFn};

/// Training and evaluation batches of a `[data]` section.
pub(super) struct Data {
    pub train: BatchFn,
    pub eval: Option<BatchFn>,
    pub text: Option<Arc<TextDataset>>,
    /// Rows of every training batch (the global batch).
    pub batch_rows: usize,
}

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
            let batch_rows = ds.batch_size();
            Data {
                train: Arc::new(move |step| Ok(ds.batch(step)?)),
                eval: None,
                text: None,
                batch_rows,
            }
        }
        DataConfig::Text(t) => {
            let (path, val_fraction) = (&t.path, t.val_fraction);
            let ds = Arc::new(if path.as_os_str() == "builtin" {
                TextDataset::from_text(crate::builtin::CORPUS, val_fraction)?
            } else {
                TextDataset::from_file(config.resolve(path), val_fraction)?
            });
            if let Some((vocab_size, _)) = config.model.language_model_sizes() {
                if ds.vocab_size() > vocab_size {
                    return Err(Error::Config(format!(
                        "model.vocab_size: {} is smaller than the {} distinct characters of {}",
                        vocab_size,
                        ds.vocab_size(),
                        config.resolve(path).display()
                    )));
                }
            }
            let bs = t.batch_size;
            let (t, v) = (ds.clone(), ds.clone());
            let train: BatchFn = Arc::new(move |step| Ok(t.batch(Split::Train, bs, block_size, seed, step)?));
            let has_val = val_fraction > 0.0;
            let eval: Option<BatchFn> = has_val
                .then(|| Arc::new(move |i| Ok(v.batch(Split::Val, bs, block_size, seed ^ 0x5eed, i)?)) as BatchFn);
            Data {
                train,
                eval,
                text: Some(ds),
                batch_rows: bs,
            }
        }
        DataConfig::Csv(c) => {
            let label = match &c.label_column {
                LabelColumnConfig::Index(i) if *i < 0 => LabelColumn::Last,
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
            let (t, v) = (ds.clone(), ds.clone());
            let train: BatchFn = Arc::new(move |step| Ok(t.batch(Split::Train, bs, seed, step)?));
            let eval: Option<BatchFn> = (c.val_fraction > 0.0)
                .then(|| Arc::new(move |i| Ok(v.batch(Split::Val, bs, seed ^ 0x5eed, i)?)) as BatchFn);
            Data {
                train,
                eval,
                text: None,
                batch_rows: bs,
            }
        }
    })
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
    eval(0).map(drop).map_err(|e| {
        Error::Config(format!(
            "train.eval_every = {}, but the validation split cannot give a batch: {e}; raise data.val_fraction or \
             set train.eval_every = 0",
            t.eval_every
        ))
    })
}
