//! Numeric CSV data (features plus an integer class label), read from `.csv` or gzip-compressed
//! `.csv.gz`, split once into train/val, and served as shuffled epochs whose batches are a pure
//! function of `(seed, split, step)`.
//!
//! Format: comma-separated values, one row per line, blank lines skipped, fields may be quoted. The first row
//! is a header if any of its fields is neither empty nor a number (an empty field alone does not make
//! a header: it is reported as a bad value). Every row must have as many values as the first.
//!
//! Random counters (all via `weft_core::rng::uniform`), disjoint per purpose:
//! - the train/val split: seed `split_seed`, counters `1 << 60 | i`;
//! - the order of epoch `e` of the train split: seed `seed`, counters `2 << 60 | e << 32 | i`;
//! - the order of epoch `e` of the val split: seed `seed`, counters `3 << 60 | e << 32 | i`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use weft_core::Tensor;

use crate::error::{invalid, Error, Result};
use crate::{check_val_fraction, permutation, train_len, Split};

const SPLIT_COUNTERS: u64 = 1 << 60;
const EPOCH_COUNTERS: [u64; 2] = [2 << 60, 3 << 60];
/// Epochs and rows must fit the counter layout above.
const MAX_EPOCH: u64 = 1 << 28;
const MAX_ROWS: usize = 1 << 32;

/// Which CSV column holds the class label; every other column is a feature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelColumn {
    /// The column at this 0-based index.
    Index(usize),
    /// The column with this header name (the file must have a header row).
    Name(String),
    /// The last column.
    Last,
    /// The `k`-th column from the end, `k >= 1` (1: the last), as Python's index `-k`.
    FromEnd(usize),
}

/// A cached epoch order: (seed, epoch, permutation of positions in the split).
type EpochOrder = (u64, u64, Arc<Vec<usize>>);

/// Rows of numeric features (F32) and class labels (I64), split into train and val.
#[derive(Debug)]
pub struct CsvDataset {
    path: PathBuf,
    header: Option<Vec<String>>,
    label_index: usize,
    num_features: usize,
    num_classes: usize,
    /// Row-major `[rows, num_features]`, already multiplied by the feature scale.
    features: Vec<f32>,
    labels: Vec<i64>,
    /// The file line (1-based) of each row, for errors about it.
    lines: Vec<usize>,
    /// Row indices (in file order) of each split: `[train, val]`.
    splits: [Vec<usize>; 2],
    /// The last epoch order built for each split (a cache: batches do not depend on it).
    orders: [Mutex<Option<EpochOrder>>; 2],
}

impl Clone for CsvDataset {
    fn clone(&self) -> CsvDataset {
        CsvDataset {
            path: self.path.clone(),
            header: self.header.clone(),
            label_index: self.label_index,
            num_features: self.num_features,
            num_classes: self.num_classes,
            features: self.features.clone(),
            labels: self.labels.clone(),
            lines: self.lines.clone(),
            splits: self.splits.clone(),
            orders: Default::default(),
        }
    }
}

fn split_slot(split: Split) -> usize {
    match split {
        Split::Train => 0,
        Split::Val => 1,
    }
}

/// The file's text, gunzipped if it starts with the gzip magic bytes. A path that is not a regular
/// file (a directory, `/dev/zero`) is refused before reading.
fn read_text(path: &Path) -> Result<String> {
    let io = |source| Error::Io {
        path: path.into(),
        source,
    };
    let bytes = crate::files::read(path)?;
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut text = String::new();
        flate2::read::MultiGzDecoder::new(&bytes[..])
            .read_to_string(&mut text)
            .map_err(io)?;
        Ok(text)
    } else {
        String::from_utf8(bytes).map_err(|e| io(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
    }
}

/// The rows of CSV `text` with their 1-based line numbers, fields trimmed, blank lines skipped
/// (through the `csv` crate: no header handling, rows of any length, quoted fields unquoted).
///
/// Line numbers are counted here from each record's byte offset (the crate's own line count does
/// not advance over the blank lines it skips).
fn records<'a>(text: &'a str, origin: &'a Path) -> impl Iterator<Item = Result<(usize, csv::StringRecord)>> + 'a {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let bytes = text.as_bytes();
    let reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(bytes);
    // (byte offset, 1-based line at that offset), moving forward only: O(len) in all
    let mut at = (0usize, 1usize);
    let mut line_of = move |p: Option<&csv::Position>| {
        let Some(p) = p else { return at.1 };
        let mut b = (p.byte() as usize).min(bytes.len());
        // a record's offset may be that of the blank lines before it
        while b < bytes.len() && matches!(bytes[b], b'\r' | b'\n') {
            b += 1;
        }
        if b >= at.0 {
            at = (b, at.1 + bytes[at.0..b].iter().filter(|&&c| c == b'\n').count());
        }
        at.1
    };
    reader.into_records().filter_map(move |r| match r {
        Ok(rec) if rec.iter().all(str::is_empty) && rec.len() <= 1 => None,
        Ok(rec) => Some(Ok((line_of(rec.position()), rec))),
        Err(e) => Some(Err(Error::Csv {
            path: origin.into(),
            line: line_of(e.position()),
            column: None,
            msg: e.to_string(),
        })),
    })
}

fn parse_label(field: &str) -> std::result::Result<i64, String> {
    let v = match field.parse::<i64>() {
        Ok(v) => v,
        // accept integral floats such as "3.0"
        Err(_) => match field.parse::<f64>() {
            Ok(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => f as i64,
            _ => return Err(format!("label {field:?} is not an integer")),
        },
    };
    if v < 0 {
        return Err(format!("label {v} is negative (labels are class ids 0, 1, ...)"));
    }
    Ok(v)
}

impl CsvDataset {
    /// The split seed [`CsvDataset::from_file`] uses.
    pub const DEFAULT_SPLIT_SEED: u64 = 0;

    /// Reads a `.csv` or `.csv.gz` file (gzip is detected from the content). Features are every
    /// column but the label, read as f32 and multiplied by `feature_scale`; labels must be
    /// non-negative integers. The rows are split once by a permutation seeded with
    /// [`CsvDataset::DEFAULT_SPLIT_SEED`]: a `val_fraction` share go to val, the rest
    /// (`floor(rows * (1 - val_fraction))`) to train.
    ///
    /// Errors name the path, and the line and column of an unparsable value or ragged row.
    pub fn from_file(
        path: impl AsRef<Path>,
        label_column: LabelColumn,
        feature_scale: f32,
        val_fraction: f64,
    ) -> Result<CsvDataset> {
        Self::from_file_with_split_seed(
            path,
            label_column,
            feature_scale,
            val_fraction,
            Self::DEFAULT_SPLIT_SEED,
        )
    }

    /// [`CsvDataset::from_file`] with another seed for the train/val split.
    pub fn from_file_with_split_seed(
        path: impl AsRef<Path>,
        label_column: LabelColumn,
        feature_scale: f32,
        val_fraction: f64,
        split_seed: u64,
    ) -> Result<CsvDataset> {
        let path = path.as_ref();
        let text = read_text(path)?;
        Self::from_csv_text(&text, path, label_column, feature_scale, val_fraction, split_seed)
    }

    /// Parses CSV text already in memory; `origin` is the path named in error messages.
    pub fn from_csv_text(
        text: &str,
        origin: &Path,
        label_column: LabelColumn,
        feature_scale: f32,
        val_fraction: f64,
        split_seed: u64,
    ) -> Result<CsvDataset> {
        check_val_fraction(val_fraction)?;
        if !feature_scale.is_finite() {
            return Err(invalid(format!("feature_scale must be finite, got {feature_scale}")));
        }
        let at = |line: usize, column: Option<usize>, msg: String| Error::Csv {
            path: origin.into(),
            line,
            column,
            msg,
        };
        let mut rows = records(text, origin).peekable();
        let first = match rows.peek() {
            None => return Err(invalid(format!("{}: no rows", origin.display()))),
            Some(Err(_)) => return Err(rows.next().expect("peeked").expect_err("peeked an error")),
            Some(Ok(first)) => first.clone(),
        };
        let (first_line, first_fields) = first;
        let num_columns = first_fields.len();
        let header = if first_fields.iter().all(|f| f.is_empty() || f.parse::<f64>().is_ok()) {
            None
        } else {
            rows.next();
            Some(first_fields.iter().map(str::to_string).collect::<Vec<_>>())
        };
        if num_columns < 2 {
            return Err(at(
                first_line,
                None,
                format!("need at least 2 columns (features and a label), found {num_columns}"),
            ));
        }
        let label_index = match &label_column {
            LabelColumn::Last => num_columns - 1,
            LabelColumn::Index(i) if *i < num_columns => *i,
            LabelColumn::Index(i) => {
                return Err(invalid(format!(
                    "{}: label column index {i} is out of range: rows have {num_columns} columns",
                    origin.display()
                )))
            }
            LabelColumn::FromEnd(k) if (1..=num_columns).contains(k) => num_columns - k,
            LabelColumn::FromEnd(k) => {
                return Err(invalid(format!(
                "{}: label column index -{k} is out of range: rows have {num_columns} columns (-1 to -{num_columns})",
                origin.display()
            )))
            }
            LabelColumn::Name(name) => match &header {
                Some(names) => names.iter().position(|n| n == name).ok_or_else(|| {
                    invalid(format!(
                        "{}: no column named {name:?} in the header {names:?}",
                        origin.display()
                    ))
                })?,
                None => {
                    return Err(invalid(format!(
                        "{}: label column {name:?} asked by name, but the file has no header row",
                        origin.display()
                    )))
                }
            },
        };
        let column_name = |j: usize| match &header {
            Some(names) => format!(" ({:?})", names[j]),
            None => String::new(),
        };
        let num_features = num_columns - 1;
        let (mut features, mut labels, mut lines) = (Vec::new(), Vec::new(), Vec::new());
        for row in rows {
            let (line, fields) = row?;
            lines.push(line);
            if fields.len() != num_columns {
                let msg = format!("ragged row: expected {num_columns} values, found {}", fields.len());
                return Err(at(line, None, msg));
            }
            for (j, field) in fields.iter().enumerate() {
                if j == label_index {
                    labels
                        .push(parse_label(field).map_err(|m| at(line, Some(j + 1), format!("{m}{}", column_name(j))))?);
                    continue;
                }
                match field.parse::<f32>() {
                    Ok(v) if v.is_finite() => features.push(v * feature_scale),
                    _ => {
                        let msg = format!("value {field:?}{} is not a finite number", column_name(j));
                        return Err(at(line, Some(j + 1), msg));
                    }
                }
            }
        }
        let n = labels.len();
        if n == 0 {
            return Err(invalid(format!("{}: no data rows (only a header)", origin.display())));
        }
        if n >= MAX_ROWS {
            return Err(invalid(format!(
                "{}: {n} rows, more than the {MAX_ROWS} supported",
                origin.display()
            )));
        }
        let num_classes = labels.iter().max().map_or(0, |&m| m as usize + 1);
        let order = permutation(n, split_seed, SPLIT_COUNTERS);
        let n_train = train_len(n, val_fraction);
        let (mut train, mut val) = (order[..n_train].to_vec(), order[n_train..].to_vec());
        train.sort_unstable();
        val.sort_unstable();
        Ok(CsvDataset {
            path: origin.into(),
            header,
            label_index,
            num_features,
            num_classes,
            features,
            labels,
            lines,
            splits: [train, val],
            orders: Default::default(),
        })
    }

    /// The path the data came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Checks every label against `classes`, the classes a model predicts: the first label of
    /// `classes` or more is an error naming the file, its line and column, and the value.
    pub fn check_labels(&self, classes: usize) -> Result<()> {
        let Some(row) = self.labels.iter().position(|&l| l as usize >= classes) else {
            return Ok(());
        };
        let name = self
            .header
            .as_ref()
            .map_or(String::new(), |h| format!(" ({:?})", h[self.label_index]));
        Err(Error::Csv {
            path: self.path.clone(),
            line: self.lines[row],
            column: Some(self.label_index + 1),
            msg: format!(
                "label {}{name} is outside the model's {classes} classes (0 to {})",
                self.labels[row],
                classes.saturating_sub(1)
            ),
        })
    }

    /// The header row's column names (label included), if the file had one.
    pub fn header(&self) -> Option<&[String]> {
        self.header.as_deref()
    }

    /// The 0-based index of the label column in the file.
    pub fn label_index(&self) -> usize {
        self.label_index
    }

    /// Number of feature columns (the width of `x`).
    pub fn num_features(&self) -> usize {
        self.num_features
    }

    /// Number of classes: the largest label in the whole file plus one.
    pub fn num_classes(&self) -> usize {
        self.num_classes
    }

    /// Number of rows in the whole file.
    pub fn num_rows_total(&self) -> usize {
        self.labels.len()
    }

    /// Number of rows in one split.
    pub fn num_rows(&self, split: Split) -> usize {
        self.splits[split_slot(split)].len()
    }

    /// The 0-based data-row indices (in file order, header excluded) that make up one split.
    pub fn rows(&self, split: Split) -> &[usize] {
        &self.splits[split_slot(split)]
    }

    /// Full batches per epoch of `split` (the last partial batch is dropped). Errors (naming the split
    /// and sizes) if `batch_size` is 0 or larger than the split.
    pub fn batches_per_epoch(&self, split: Split, batch_size: usize) -> Result<usize> {
        let n = self.num_rows(split);
        if batch_size == 0 || batch_size > n {
            return Err(invalid(format!(
                "csv batch: the {split} split of {} has {n} rows; batch_size {batch_size} must be in 1..={n}",
                self.path.display()
            )));
        }
        Ok(n / batch_size)
    }

    /// The order of epoch `epoch` of `split` under `seed`: a permutation of `0..num_rows(split)`
    /// (positions in [`CsvDataset::rows`]), a pure function of `(seed, split, epoch)`.
    pub fn epoch_order(&self, split: Split, seed: u64, epoch: u64) -> Result<Arc<Vec<usize>>> {
        if epoch >= MAX_EPOCH {
            return Err(invalid(format!(
                "csv batch: epoch {epoch} is past the supported {MAX_EPOCH}"
            )));
        }
        let slot = split_slot(split);
        let mut cache = self.orders[slot].lock().unwrap_or_else(|e| e.into_inner());
        if let Some((s, e, order)) = cache.as_ref() {
            if (*s, *e) == (seed, epoch) {
                return Ok(order.clone());
            }
        }
        let order = Arc::new(permutation(
            self.num_rows(split),
            seed,
            EPOCH_COUNTERS[slot] | (epoch << 32),
        ));
        *cache = Some((seed, epoch, order.clone()));
        Ok(order)
    }

    /// The training batch at `step`: `(x, y)` with x F32 `[batch_size, num_features]` and y I64
    /// `[batch_size]`. Epoch `e = step / batches_per_epoch` visits the split's rows in
    /// [`CsvDataset::epoch_order`]`(split, seed, e)`; step takes batch `step % batches_per_epoch` of
    /// it (the last partial batch of an epoch is dropped). A pure function of `(split, batch_size,
    /// seed, step)`.
    pub fn batch(&self, split: Split, batch_size: usize, seed: u64, step: usize) -> Result<(Tensor, Tensor)> {
        let per_epoch = self.batches_per_epoch(split, batch_size)?;
        let (epoch, k) = ((step / per_epoch) as u64, step % per_epoch);
        let order = self.epoch_order(split, seed, epoch)?;
        let split_rows = self.rows(split);
        let rows: Vec<usize> = order[k * batch_size..(k + 1) * batch_size]
            .iter()
            .map(|&p| split_rows[p])
            .collect();
        self.gather(&rows)
    }

    /// The whole split in row order, in batches of `batch_size` (the last one partial): each item is
    /// `(x, y)` as in [`CsvDataset::batch`], with `rows` in the first dim. An error item if
    /// `batch_size` is 0.
    pub fn eval_batches(&self, split: Split, batch_size: usize) -> impl Iterator<Item = Result<(Tensor, Tensor)>> + '_ {
        let err = (batch_size == 0).then(|| invalid("csv eval_batches: batch_size must be positive"));
        let rows = if err.is_some() { &[][..] } else { self.rows(split) };
        err.map(Err)
            .into_iter()
            .chain(rows.chunks(batch_size.max(1)).map(move |chunk| self.gather(chunk)))
    }

    /// x F32 `[rows.len(), num_features]` and y I64 `[rows.len()]` of these data rows.
    fn gather(&self, rows: &[usize]) -> Result<(Tensor, Tensor)> {
        let f = self.num_features;
        let mut x = weft_core::alloc::with_capacity("csv batch", rows.len() * f)?;
        for &r in rows {
            x.extend_from_slice(&self.features[r * f..(r + 1) * f]);
        }
        let y = weft_core::alloc::collect("csv batch", rows.len(), rows.iter().map(|&r| self.labels[r]))?;
        Ok((
            Tensor::from_vec(x, &[rows.len(), f])?,
            Tensor::from_vec(y, &[rows.len()])?,
        ))
    }
}
