//! One served model version: `NAME=PATH[:VERSION]` specs, paths kept inside the model store,
//! and loading weft checkpoints (safetensors and JSON only) into a [`Served`].

use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use weft_data::Tokenizer;
use weft_models::convnet::{ConvNet, ConvNetConfig};
use weft_models::gpt::Gpt;
use weft_models::llama::Llama;
use weft_models::{LanguageModel, Model};
use weft_train::config::ModelConfig;

use crate::batch::Pending;
use crate::metrics::ModelStats;
use crate::workers::Workers;

/// The version a `--model` spec without `:VERSION` gets.
pub const DEFAULT_VERSION: &str = "1";

/// One `--model NAME=PATH[:VERSION]`: PATH is relative to the model store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelSpec {
    pub name: String,
    pub path: PathBuf,
    pub version: String,
}

/// Whether `s` is a usable model name or version: 1 to 64 of `A-Z a-z 0-9 . _ -`, not
/// starting with `.` (they appear in URL paths).
fn is_label(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && !s.starts_with('.')
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// What a name or version that is not a label ([`is_label`]) must be.
const LABEL_RULE: &str = "must be 1 to 64 of A-Z a-z 0-9 . _ - (not starting with .)";

/// `Ok` when `name` can name a model, else why not (to follow the name where it is shown).
pub fn check_name(name: &str) -> Result<(), String> {
    if is_label(name) {
        Ok(())
    } else {
        Err(LABEL_RULE.into())
    }
}

/// `Ok` when `version` can be a model version, else why not (to follow the version where it
/// is shown): a label, and neither of the two the management API's paths give a meaning of
/// their own (`/models/NAME/all` names every version, `PUT /models/NAME/traffic` sets the
/// traffic split).
pub fn check_version(version: &str) -> Result<(), String> {
    match version {
        "all" => Err("is reserved: /models/NAME/all names every version of a model".into()),
        "traffic" => Err("is reserved: PUT /models/NAME/traffic sets a model's traffic split".into()),
        v if is_label(v) => Ok(()),
        _ => Err(LABEL_RULE.into()),
    }
}

impl std::str::FromStr for ModelSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<ModelSpec, String> {
        let Some((name, rest)) = s.split_once('=') else {
            return Err(format!("--model {s:?}: expected NAME=PATH[:VERSION]"));
        };
        check_name(name).map_err(|why| format!("--model {s:?}: the name {name:?} {why}"))?;
        let (path, version) = match rest.rsplit_once(':') {
            Some((p, v)) if !v.contains('/') => (p, v),
            _ => (rest, DEFAULT_VERSION),
        };
        check_version(version).map_err(|why| format!("--model {s:?}: the version {version:?} {why}"))?;
        if path.is_empty() {
            return Err(format!("--model {s:?}: the path is empty"));
        }
        Ok(ModelSpec {
            name: name.to_string(),
            path: PathBuf::from(path),
            version: version.to_string(),
        })
    }
}

/// `rel` inside the model store `store`, refused when it is absolute, has a `..` component, or
/// resolves (through links) outside the store, or when a file inside it does (a checkpoint's
/// shard linked to a file elsewhere was loaded before: only the folder was checked).
pub fn resolve_in_store(store: &Path, rel: &Path) -> Result<PathBuf, String> {
    let shown = rel.display();
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(format!(
            "{shown}: a model path must be relative to the model store, without `..`"
        ));
    }
    let root = store
        .canonicalize()
        .map_err(|e| format!("--model-store {}: {e}", store.display()))?;
    let full = root
        .join(rel)
        .canonicalize()
        .map_err(|e| format!("{shown} in the model store {}: {e}", root.display()))?;
    if !full.starts_with(&root) {
        return Err(format!(
            "{shown}: resolves to {}, outside the model store {}",
            full.display(),
            root.display()
        ));
    }
    if let Some(entry) = escaping_entry(&full, &root, 0) {
        return Err(format!(
            "{shown}: {} resolves outside the model store {}",
            entry.display(),
            root.display()
        ));
    }
    Ok(full)
}

/// The first file a load reads (`*.safetensors`, `*.json`) or checkpoint folder (`step-*`) under
/// `dir` (`depth` levels down at most 4) that resolves outside `root`, or that cannot be resolved;
/// `None` when all stay inside. Other entries (a run folder's link to its data elsewhere) are not
/// refused.
fn escaping_entry(dir: &Path, root: &Path, depth: usize) -> Option<PathBuf> {
    if depth > 4 || !dir.is_dir() {
        return None;
    }
    let entries = std::fs::read_dir(dir).ok()?;
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let read_by_a_load = path.extension().is_some_and(|e| e == "safetensors" || e == "json")
            || (path.is_dir() && name.to_string_lossy().starts_with("step-"));
        if !read_by_a_load && !path.is_dir() {
            continue;
        }
        match path.canonicalize() {
            Ok(real) if real.starts_with(root) => {
                if let Some(bad) = escaping_entry(&real, root, depth + 1) {
                    return Some(bad);
                }
            }
            // a folder elsewhere that no load reads (a run's link to its data)
            Ok(_) if !read_by_a_load => {}
            // a dangling link is left to the load, which names a missing file
            Err(_) if entry.file_type().is_ok_and(|t| t.is_symlink()) => {}
            _ => return Some(path),
        }
    }
    None
}

/// What a model takes and gives (the v2 metadata): `Features` and `Images` are classifiers
/// (FP32 in, FP32 logits `[B, classes]` out), `Tokens` a language model (INT64 ids `[B, T]` in,
/// FP32 logits `[B, T, vocab]` out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signature {
    /// mlp: FP32 `[B, features]`.
    Features { features: usize, classes: usize },
    /// convnet: FP32 `[B, channels, size, size]`.
    Images {
        channels: usize,
        size: usize,
        classes: usize,
    },
    /// gpt, llama: INT64 `[B, T]` with `1 <= T <= block` and ids below `vocab`.
    Tokens { vocab: usize, block: usize },
}

/// A loaded model version, ready to run.
pub struct Served {
    pub name: String,
    pub version: String,
    /// `mlp`, `convnet`, `gpt` or `llama`.
    pub kind: &'static str,
    pub signature: Signature,
    pub model: Arc<dyn Model>,
    /// The same model as a language model (gpt, llama), for generation.
    pub lm: Option<Arc<dyn LanguageModel>>,
    /// The tokenizer the checkpoint records (language models trained on text).
    pub tokenizer: Option<Tokenizer>,
    /// The token ids at which generation ends by default (not part of the text), as
    /// `weft generate`: a Hugging Face folder's `eos_token_id`, else the tokenizer's
    /// end-of-text token (none for a char vocabulary).
    pub eos: Vec<i64>,
    /// The checkpoint's path relative to the model store, as it was given.
    pub source: PathBuf,
    /// How requests are queued and batched.
    pub options: LoadOptions,
    /// Seconds reading, checking and building the model took.
    pub load_seconds: f64,
    /// Its workers: a job (a forward of one request or of a batch, or one decode step) holds
    /// one while it runs; `options.workers` at load, changed by the management API.
    pub workers: Arc<Workers>,
    /// Requests admitted (running or waiting); when none are left, 503. Closed once the version
    /// is unregistered and drained.
    pub(crate) admitted: Arc<Semaphore>,
    /// The queue of the dynamic batcher, started by the first batched request.
    pub(crate) batcher: OnceLock<tokio::sync::mpsc::UnboundedSender<Pending>>,
    /// The queue of the decode thread (continuous batching of generation), started by the
    /// first generation request.
    pub(crate) decoder: OnceLock<std::sync::mpsc::Sender<crate::decode::DecodeJob>>,
    /// Counters and histograms of this version (tokens, batch sizes, forward times).
    pub(crate) stats: ModelStats,
}

impl Served {
    /// Requests admitted now (running or waiting for the worker).
    pub fn queue_depth(&self) -> usize {
        self.options.queue.saturating_sub(self.admitted.available_permits())
    }
}

/// The prompt tokens a sequence runs per decode step unless a model is loaded with another
/// `prefill_chunk` (docs/serving.md, "Chunked prefill").
pub const DEFAULT_PREFILL_CHUNK: usize = 256;

/// The most requests a model admits at once (`--queue`): far past what one process runs, and
/// small enough that draining counts every place.
pub const MAX_QUEUE: usize = 1 << 20;

/// The most requests one dynamic batch holds (`--max-batch-size`, `batch_size`).
pub const MAX_BATCH_SIZE: usize = 1024;

/// The longest a batch waits for more requests after its first arrived, in milliseconds
/// (`--max-batch-delay-ms`, `max_batch_delay`): the first request of a batch waits this long
/// for company, so a delay past 10 s is a request no client waits for (and a version being
/// unregistered waits for it too). Batching gains come from delays of a few milliseconds.
pub const MAX_BATCH_DELAY_MS: u64 = 10_000;

/// The most generation requests of one model decoded together (`--max-sequences`,
/// `max_sequences`).
pub const MAX_SEQUENCES: usize = 1024;

/// The largest `--prefill-chunk` / `prefill_chunk` (past any model's `block_size`; 0: whole).
pub const MAX_PREFILL_CHUNK: usize = 1 << 20;

/// `value` of the setting `what` (a flag or a query parameter) when it lies in `min..=max`, else
/// an error naming `what` and the bounds.
pub fn bounded(what: &str, value: u64, min: u64, max: u64) -> Result<u64, String> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(format!("{what}: {value} is outside {min} to {max}"))
    }
}

/// How a model's requests are queued and batched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// Requests admitted at once, running or waiting (over it: 503).
    pub queue: usize,
    /// The most infer/predictions requests run as one forward (1: no batching).
    pub max_batch_size: usize,
    /// How long the batcher waits for more requests after the first of a batch arrives.
    pub max_batch_delay: Duration,
    /// The most generation requests decoded together, one token each per step (continuous
    /// batching; 1: one at a time).
    pub max_sequences: usize,
    /// The most prompt tokens one sequence runs per decode step: a longer prompt runs in
    /// chunks of this many while the other sequences go on decoding (0: whole, in one step).
    pub prefill_chunk: usize,
    /// Jobs of the version run at once (its workers, 1 to [`crate::workers::MAX_WORKERS`]).
    pub workers: usize,
}

impl Default for LoadOptions {
    /// 64 queued requests, no batching of infer requests, 8 sequences generated together,
    /// prompts run in chunks of [`DEFAULT_PREFILL_CHUNK`] tokens, one worker.
    fn default() -> Self {
        LoadOptions {
            queue: 64,
            max_batch_size: 1,
            max_batch_delay: Duration::ZERO,
            max_sequences: 8,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            workers: 1,
        }
    }
}

impl std::fmt::Debug for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Served({} v{} {})", self.name, self.version, self.kind)
    }
}

/// The checkpoint `spec` names inside `store`, read, checked and built on the CPU, queued and
/// batched as `options` say. Errors name the model and the cause.
pub fn load(store: &Path, spec: &ModelSpec, options: LoadOptions) -> Result<Served, String> {
    let started = Instant::now();
    let who = format!("model {} version {}", spec.name, spec.version);
    let path = resolve_in_store(store, &spec.path).map_err(|e| format!("{who}: {e}"))?;
    let fail = |e: &dyn std::fmt::Display| format!("{who}: {e}");
    let trained = weft_train::generate::read_trained(&path).map_err(|e| fail(&e))?;
    let cfg = weft_train::generate::recorded_model(&trained).map_err(|e| fail(&e))?;
    let (model, lm, signature): (Arc<dyn Model>, Option<Arc<dyn LanguageModel>>, Signature) = match &cfg {
        ModelConfig::Gpt(g) => {
            let m = Arc::new(Gpt::new(g.to_config(), 0).map_err(|e| fail(&e))?);
            let sig = Signature::Tokens {
                vocab: g.vocab_size,
                block: g.block_size,
            };
            (m.clone(), Some(m), sig)
        }
        ModelConfig::Llama(l) => {
            let m = Arc::new(Llama::new(l.to_config(), 0).map_err(|e| fail(&e))?);
            let sig = Signature::Tokens {
                vocab: l.vocab_size,
                block: l.block_size,
            };
            (m.clone(), Some(m), sig)
        }
        ModelConfig::Mlp(m) => {
            let sig = Signature::Features {
                features: m.in_features,
                classes: m.out_features,
            };
            (weft_train::run::build_model(&cfg, 0).map_err(|e| fail(&e))?, None, sig)
        }
        ModelConfig::Convnet(c) => {
            let net = ConvNet::new(
                ConvNetConfig {
                    in_channels: c.in_channels,
                    image_size: c.image_size,
                    channels: c.channels.clone(),
                    num_classes: c.num_classes,
                },
                0,
            )
            .map_err(|e| fail(&e))?;
            let sig = Signature::Images {
                channels: c.in_channels,
                size: c.image_size,
                classes: c.num_classes,
            };
            (Arc::new(net), None, sig)
        }
    };
    weft_nn::state_dict::load_state_dict(
        model.as_ref(),
        trained.params.as_ref(),
        model.aliases(),
        &trained.source,
    )
    .map_err(|e| fail(&e))?;
    model.context().set_training(false);
    let tokenizer = match (&lm, &trained.tokenizer) {
        (Some(lm), Some(json)) => {
            let tok = Tokenizer::from_json(json).map_err(|e| fail(&e))?;
            if tok.vocab_size() > lm.vocab_size() {
                return Err(format!(
                    "{who}: the tokenizer knows {} tokens, more than the model's vocab_size = {}",
                    tok.vocab_size(),
                    lm.vocab_size()
                ));
            }
            Some(tok)
        }
        _ => None,
    };
    let eos: Vec<i64> = match (&trained.eos, &tokenizer) {
        (Some(ids), _) => ids.iter().map(|&i| i64::from(i)).collect(),
        (None, Some(tok)) => tok.eot().map(i64::from).into_iter().collect(),
        (None, None) => Vec::new(),
    };
    Ok(Served {
        name: spec.name.clone(),
        version: spec.version.clone(),
        kind: cfg.kind(),
        signature,
        model,
        lm,
        tokenizer,
        eos,
        source: spec.path.clone(),
        options: LoadOptions {
            queue: options.queue.max(1),
            max_batch_size: options.max_batch_size.max(1),
            max_sequences: options.max_sequences.max(1),
            workers: options.workers.clamp(1, crate::workers::MAX_WORKERS),
            ..options
        },
        load_seconds: started.elapsed().as_secs_f64(),
        workers: Workers::new(options.workers.clamp(1, crate::workers::MAX_WORKERS)),
        admitted: Arc::new(Semaphore::new(options.queue.max(1))),
        batcher: OnceLock::new(),
        decoder: OnceLock::new(),
        stats: ModelStats::default(),
    })
}

/// An mlp of 2 features, 4 hidden and 3 classes named `m` version `1`, admitting `queue`
/// requests and batching up to `max_batch_size` of them (waiting 20 ms for more).
#[cfg(test)]
pub(crate) fn test_mlp(queue: usize, max_batch_size: usize) -> Arc<Served> {
    Arc::new(test_version("1", queue, max_batch_size))
}

/// Version `version` of the mlp of [`test_mlp`].
#[cfg(test)]
pub(crate) fn test_version(version: &str, queue: usize, max_batch_size: usize) -> Served {
    test_version_hidden(version, queue, max_batch_size, vec![4])
}

/// [`test_version`] with the hidden layers `hidden`.
#[cfg(test)]
pub(crate) fn test_version_hidden(version: &str, queue: usize, max_batch_size: usize, hidden: Vec<usize>) -> Served {
    let config = weft_models::mlp::MlpConfig {
        in_features: 2,
        hidden,
        out_features: 3,
        activation: weft_nn::layers::Activation::Relu,
    };
    let options = LoadOptions {
        queue,
        max_batch_size,
        max_batch_delay: Duration::from_millis(20),
        max_sequences: 8,
        prefill_chunk: DEFAULT_PREFILL_CHUNK,
        workers: 1,
    };
    Served {
        name: "m".into(),
        version: version.into(),
        kind: "mlp",
        signature: Signature::Features {
            features: 2,
            classes: 3,
        },
        model: Arc::new(weft_models::mlp::MlpModel::new(config, 0).unwrap()),
        lm: None,
        tokenizer: None,
        eos: Vec::new(),
        source: PathBuf::from("m"),
        options,
        load_seconds: 0.0,
        workers: Workers::new(1),
        admitted: Arc::new(Semaphore::new(queue)),
        batcher: OnceLock::new(),
        decoder: OnceLock::new(),
        stats: ModelStats::default(),
    }
}

/// A tiny gpt (block_size 16, 2 layers of width 16) named `g` version `1`, with a character
/// tokenizer of a short corpus.
#[cfg(test)]
pub(crate) fn test_gpt() -> Served {
    test_gpt_with(LoadOptions::default())
}

/// [`test_gpt`] loaded with `options`.
#[cfg(test)]
pub(crate) fn test_gpt_with(options: LoadOptions) -> Served {
    use weft_models::gpt::GptConfig;
    let tok = weft_data::TokenizerSpec::Char
        .load_with_corpus(["to be, or not to be: that is the question"])
        .unwrap();
    let config = GptConfig {
        vocab_size: tok.vocab_size(),
        block_size: 16,
        n_layer: 2,
        n_head: 2,
        n_embd: 16,
        bias: true,
        dropout: 0.0,
        activation: weft_core::UnaryOp::Gelu,
    };
    let model = Arc::new(Gpt::new(config, 3).unwrap());
    Served {
        name: "g".into(),
        version: "1".into(),
        kind: "gpt",
        signature: Signature::Tokens {
            vocab: tok.vocab_size(),
            block: 16,
        },
        model: model.clone(),
        lm: Some(model),
        tokenizer: Some(tok),
        eos: Vec::new(),
        source: PathBuf::from("g"),
        options,
        load_seconds: 0.0,
        workers: Workers::new(1),
        admitted: Arc::new(Semaphore::new(options.queue)),
        batcher: OnceLock::new(),
        decoder: OnceLock::new(),
        stats: ModelStats::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_bad_ones_are_refused() {
        let s: ModelSpec = "gpt=runs/a/ckpt:2".parse().unwrap();
        assert_eq!(
            (s.name.as_str(), s.path.as_path(), s.version.as_str()),
            ("gpt", Path::new("runs/a/ckpt"), "2")
        );
        let s: ModelSpec = "m=dir".parse().unwrap();
        assert_eq!(s.version, DEFAULT_VERSION);
        for bad in [
            "noequals",
            "=dir",
            "a b=dir",
            "m=",
            "m=dir:",
            "m=dir:v/1",
            ".m=dir",
            "m=dir:all",
            "m=dir:traffic",
        ] {
            let r: Result<ModelSpec, _> = bad.parse();
            if bad == "m=dir:v/1" {
                // a colon followed by a path is part of the path
                assert_eq!(r.unwrap().path, Path::new("dir:v/1"));
            } else {
                assert!(r.is_err(), "{bad:?} should be refused");
            }
        }
        // the versions the management API's paths use are refused, saying why
        for (spec, why) in [
            ("m=dir:all", "/models/NAME/all"),
            ("m=dir:traffic", "/models/NAME/traffic"),
        ] {
            let e = spec.parse::<ModelSpec>().unwrap_err();
            assert!(
                e.contains(&format!("{:?} is reserved: ", &spec[6..])) && e.contains(why),
                "{e}"
            );
        }
        // as names they mean nothing special
        assert_eq!("all=dir:2".parse::<ModelSpec>().unwrap().name, "all");
    }

    #[test]
    fn paths_outside_the_store_are_refused() {
        let root = std::env::temp_dir().join(format!("weft-serve-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("store/m")).unwrap();
        std::fs::create_dir_all(root.join("outside")).unwrap();
        let store = root.join("store");
        assert!(resolve_in_store(&store, Path::new("m")).is_ok());
        for bad in ["../outside", "m/../../outside", "/tmp"] {
            let e = resolve_in_store(&store, Path::new(bad)).unwrap_err();
            assert!(e.contains("relative to the model store"), "{bad}: {e}");
        }
        std::os::unix::fs::symlink(root.join("outside"), store.join("link")).unwrap();
        let e = resolve_in_store(&store, Path::new("link")).unwrap_err();
        assert!(e.contains("outside the model store"), "{e}");
        // a file inside a checkpoint folder (two levels down) linked to one outside
        std::fs::create_dir_all(store.join("m/step-00000004")).unwrap();
        std::fs::write(root.join("outside/secret.safetensors"), b"x").unwrap();
        let shard = store.join("m/step-00000004/rank-00000.safetensors");
        std::os::unix::fs::symlink(root.join("outside/secret.safetensors"), &shard).unwrap();
        let e = resolve_in_store(&store, Path::new("m")).unwrap_err();
        assert!(
            e.contains("rank-00000.safetensors resolves outside the model store"),
            "{e}"
        );
        // linked within the store: fine
        std::fs::remove_file(&shard).unwrap();
        std::fs::write(store.join("m/real.safetensors"), b"x").unwrap();
        std::os::unix::fs::symlink(store.join("m/real.safetensors"), &shard).unwrap();
        assert!(resolve_in_store(&store, Path::new("m")).is_ok());
        // a link to a folder elsewhere that no load reads (a run's data): fine; a checkpoint
        // folder elsewhere: refused
        std::os::unix::fs::symlink(root.join("outside"), store.join("m/data")).unwrap();
        assert!(resolve_in_store(&store, Path::new("m")).is_ok());
        std::os::unix::fs::symlink(root.join("outside"), store.join("m/step-00000008")).unwrap();
        let e = resolve_in_store(&store, Path::new("m")).unwrap_err();
        assert!(e.contains("step-00000008 resolves outside the model store"), "{e}");
        let _ = std::fs::remove_dir_all(&root);
    }
}
