//! The weights of a Hugging Face checkpoint folder, opened lazily: every file is mapped and its
//! header checked, the names and shapes weft will see (GPT-2's renamed, its `Conv1D` weights
//! transposed) are known at once, and a tensor's bytes are read when it is asked for, so a
//! model is loaded holding one tensor beside it, and a folder whose names or shapes do not fit
//! is refused before anything is read (a file holding an extra 1.5 GB tensor was read whole).

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use weft_core::io::safetensors::SafeTensorsFile;
use weft_core::{Error, Result, Tensor};

use super::{is_conv1d, is_regular_file, transpose_conv1d, WEIGHTS, WEIGHTS_INDEX};

/// Where one of weft's tensors is in the folder's files.
struct Entry {
    /// Index into [`HfWeights::files`].
    file: usize,
    /// Its name in that file.
    stored: String,
    /// A GPT-2 `Conv1D` weight, stored `[in, out]`: transposed when read.
    conv1d: bool,
    /// The rows of the stored tensor this one is (a part of Phi-3's fused `qkv_proj` or
    /// `gate_up_proj`); all of them when `None`.
    rows: Option<Range<usize>>,
    /// Its shape in weft's layout.
    shape: Vec<usize>,
}

/// A folder's weights by weft name, read a tensor at a time (it implements
/// [`weft_nn::state_dict::TensorSource`]).
pub struct HfWeights {
    files: Vec<SafeTensorsFile>,
    entries: BTreeMap<String, Entry>,
}

impl HfWeights {
    /// Tensor bytes read from the files so far (to check what a reader read).
    pub fn bytes_read(&self) -> u64 {
        self.files.iter().map(SafeTensorsFile::bytes_copied).sum()
    }

    /// Every tensor, read (in weft's names and layout).
    pub fn read_all(&self) -> Result<BTreeMap<String, Tensor>> {
        self.entries.keys().map(|n| Ok((n.clone(), self.read(n)?))).collect()
    }

    /// Tensor `name` (a weft name), read.
    pub fn read(&self, name: &str) -> Result<Tensor> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| Error::Io(format!("no tensor {name:?} in the folder")))?;
        let file = &self.files[e.file];
        if let Some(rows) = &e.rows {
            return file.rows(&e.stored, rows.clone());
        }
        let t = file.tensor(&e.stored)?;
        if e.conv1d {
            transpose_conv1d(&t, &e.stored, &file.path().display().to_string())
        } else {
            Ok(t)
        }
    }
}

impl weft_nn::state_dict::TensorSource for HfWeights {
    fn names(&self) -> Vec<&str> {
        self.entries.keys().map(String::as_str).collect()
    }
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.entries.get(name).map(|e| e.shape.clone())
    }
    fn read(&self, name: &str) -> Result<Tensor> {
        HfWeights::read(self, name)
    }
}

/// The files of `dir`'s weights, opened, each with the names it holds for the checkpoint:
/// `model.safetensors` whole, or every shard with the names `model.safetensors.index.json`
/// puts in it (each checked to be in its shard's header).
fn open_files(dir: &Path) -> Result<Vec<(SafeTensorsFile, Vec<String>)>> {
    let single = dir.join(WEIGHTS);
    let index = dir.join(WEIGHTS_INDEX);
    if !is_regular_file(&index)? {
        if !is_regular_file(&single)? {
            return Err(Error::Io(format!(
                "{}: holds neither {WEIGHTS} nor {WEIGHTS_INDEX}",
                dir.display()
            )));
        }
        let file = SafeTensorsFile::open(&single)?;
        let names = file.names().map(str::to_string).collect();
        return Ok(vec![(file, names)]);
    }
    let source = index.display().to_string();
    let text = std::fs::read_to_string(&index).map_err(|e| Error::Io(format!("{source}: {e}")))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| Error::Io(format!("{source}: not JSON: {e}")))?;
    let map = v
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| Error::Io(format!("{source}: weight_map: missing, or not an object")))?;
    let mut by_file: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (name, file) in map {
        let file = file
            .as_str()
            .filter(|f| !f.is_empty() && !f.contains('/') && !f.contains('\\') && *f != "." && *f != "..")
            .ok_or_else(|| {
                Error::Io(format!(
                    "{source}: weight_map.{name}: {file} is not a file name in the folder"
                ))
            })?;
        by_file.entry(file).or_default().push(name);
    }
    let mut out = Vec::with_capacity(by_file.len());
    for (file, names) in by_file {
        let path: PathBuf = dir.join(file);
        let opened = SafeTensorsFile::open(&path)?;
        for name in &names {
            if opened.entry(name).is_none() {
                return Err(Error::Io(format!(
                    "{source}: weight_map puts {name:?} in {file}, which does not hold it"
                )));
            }
        }
        out.push((opened, names.into_iter().map(str::to_string).collect()));
    }
    Ok(out)
}

/// Opens the weights of `dir` for the model `model` (weft's `[model]` keys; `kind` `gpt`: GPT-2's
/// names and layout turned into weft's, see the module's notes; otherwise the names as they are,
/// llama's `rotary_emb.inv_freq` dropped, and Phi-3's fused projections split, see
/// [`fused_parts`]). A GPT-2 `lm_head.weight` must equal the token embedding (weft's gpt ties
/// them): the two are read and compared here.
pub(super) fn open(dir: &Path, model: &Map<String, Value>) -> Result<HfWeights> {
    let opened = open_files(dir)?;
    let gpt = model.get("kind").and_then(Value::as_str) == Some("gpt");
    let mut files = Vec::with_capacity(opened.len());
    let mut entries = BTreeMap::new();
    let mut head = None;
    for (i, (file, names)) in opened.into_iter().enumerate() {
        let path = file.path().display().to_string();
        for stored in names {
            let shape = file.entry(&stored).map(|e| e.shape.clone()).unwrap_or_default();
            if !gpt {
                if let Some(parts) = fused_parts(&stored, &shape, model, &path)? {
                    for (name, rows) in parts {
                        let mut part = shape.clone();
                        part[0] = rows.len();
                        let entry = Entry {
                            file: i,
                            stored: stored.clone(),
                            conv1d: false,
                            rows: Some(rows),
                            shape: part,
                        };
                        if entries.insert(name.clone(), entry).is_some() {
                            return Err(Error::Io(format!(
                                "{path}: holds {stored:?} and {name:?} too, one parameter of weft's llama"
                            )));
                        }
                    }
                } else if !stored.ends_with("rotary_emb.inv_freq") {
                    let entry = Entry {
                        file: i,
                        stored: stored.clone(),
                        conv1d: false,
                        rows: None,
                        shape,
                    };
                    if let Some(other) = entries.insert(stored.clone(), entry) {
                        return Err(Error::Io(format!(
                            "{path}: holds {stored:?} and {:?} too, one parameter of weft's llama",
                            other.stored
                        )));
                    }
                }
                continue;
            }
            if stored == "lm_head.weight" {
                head = Some((i, stored));
                continue;
            }
            let bare = stored.strip_prefix("transformer.").unwrap_or(&stored);
            if bare.ends_with(".attn.bias") && shape.len() == 4 || bare.ends_with(".attn.masked_bias") {
                continue; // mask buffers
            }
            let weft = format!("transformer.{bare}");
            let conv1d = is_conv1d(&weft);
            let shape = if conv1d {
                if shape.len() != 2 {
                    return Err(Error::Io(format!(
                        "{path}: {stored} has shape {shape:?}, but a GPT-2 Conv1D weight is a matrix ([in, out] in the file)"
                    )));
                }
                vec![shape[1], shape[0]]
            } else {
                shape
            };
            if let Some(other) = entries.get(&weft) {
                // `h.0.x` and `transformer.h.0.x`: one of them would be dropped unread
                return Err(Error::Io(format!(
                    "{path}: holds both {:?} and {stored:?}, one parameter ({weft}) of weft's gpt",
                    other.stored
                )));
            }
            entries.insert(
                weft,
                Entry {
                    file: i,
                    stored,
                    conv1d,
                    rows: None,
                    shape,
                },
            );
        }
        files.push(file);
    }
    let weights = HfWeights { files, entries };
    if let Some((i, stored)) = head {
        if weights.entries.contains_key("transformer.wte.weight") {
            let head = weights.files[i].tensor(&stored)?;
            let wte = weights.read("transformer.wte.weight")?;
            // compared in place (a GPT-2 head is 50257 x 768: no f64 copies of it)
            let same = head.shape() == wte.shape()
                && head.dtype() == wte.dtype()
                && head.sub(&wte)?.abs()?.sum_all()?.item()? == 0.0;
            if !same {
                return Err(Error::Io(format!(
                    "{}: lm_head.weight differs from transformer.wte.weight; weft's gpt ties them",
                    dir.display()
                )));
            }
        }
    }
    Ok(weights)
}

/// One of weft's tensors as rows of a stored one: its name and the rows.
type Part = (String, Range<usize>);

/// Phi-3's fused projections as weft's llama holds them: `self_attn.qkv_proj.weight`
/// (`[(n_head + 2 n_kv_head) head_dim, n_embd]`: q's rows, then k's, then v's, as transformers'
/// `Phi3Attention` slices its output) and `mlp.gate_up_proj.weight` (`[2 intermediate_size,
/// n_embd]`: gate's rows, then up's, as `Phi3MLP` chunks its output) become `q_proj`, `k_proj`,
/// `v_proj` and `gate_proj`, `up_proj`, each a range of the stored tensor's rows. `None` for any
/// other tensor; an error naming the file and tensor when the rows are not what `model` makes.
fn fused_parts(stored: &str, shape: &[usize], model: &Map<String, Value>, path: &str) -> Result<Option<Vec<Part>>> {
    let key = |k: &str| model.get(k).and_then(Value::as_u64).map(|v| v as usize).unwrap_or(0);
    let (prefix, parts): (&str, Vec<(&str, usize)>) =
        if let Some(prefix) = stored.strip_suffix("self_attn.qkv_proj.weight") {
            let n_head = key("n_head");
            let head_dim = match key("head_dim") {
                0 => key("n_embd").checked_div(n_head).unwrap_or(0),
                hd => hd,
            };
            let kv = key("n_kv_head") * head_dim;
            (
                prefix,
                vec![
                    ("self_attn.q_proj.weight", n_head * head_dim),
                    ("self_attn.k_proj.weight", kv),
                    ("self_attn.v_proj.weight", kv),
                ],
            )
        } else if let Some(prefix) = stored.strip_suffix("mlp.gate_up_proj.weight") {
            let i = key("intermediate_size");
            (prefix, vec![("mlp.gate_proj.weight", i), ("mlp.up_proj.weight", i)])
        } else {
            return Ok(None);
        };
    let want: usize = parts.iter().map(|p| p.1).sum();
    if shape.len() != 2 || shape[0] != want {
        let what = parts.iter().map(|p| p.0).collect::<Vec<_>>().join(", ");
        return Err(Error::Io(format!(
            "{path}: {stored} has shape {shape:?}, but the config's sizes make it {want} rows ({what}) by n_embd"
        )));
    }
    let mut start = 0;
    Ok(Some(
        parts
            .into_iter()
            .map(|(name, len)| {
                start += len;
                (format!("{prefix}{name}"), start - len..start)
            })
            .collect(),
    ))
}
