//! The built-in run of `weft train` without `--config`: a character-level GPT on a small corpus
//! compiled into the binary, so the main job needs no download and no data folder.

/// Text of the built-in corpus: `builtin_corpus.txt`, a fixed copy of this project's README and
/// architecture notes as they once were. It is a file of its own, not the documents themselves,
/// so that editing the documentation does not change the built-in run's batches and losses.
pub const CORPUS: &str = include_str!("builtin_corpus.txt");

/// The built-in run config (paths: `builtin` is [`CORPUS`]).
pub const CONFIG: &str = r#"
[model]
kind = "gpt"
vocab_size = 128
block_size = 64
n_layer = 4
n_head = 4
n_embd = 128
bias = true
dropout = 0.0

[data]
kind = "text"
path = "builtin"
batch_size = 16
val_fraction = 0.1

[optim]
kind = "adamw"
lr = 0.001
betas = [0.9, 0.95]
weight_decay = 0.1
grad_clip = 1.0

[schedule]
kind = "cosine"
warmup_steps = 50
decay_steps = 1000
min_lr = 0.0001

[train]
steps = 1000
seed = 1337
log_every = 50
eval_every = 250
eval_batches = 8
sample_tokens = 300
"#;
