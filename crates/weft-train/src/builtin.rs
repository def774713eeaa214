//! The built-in run of `weft train` without `--config`: a character-level GPT on a small corpus
//! compiled into the binary (this project's own documentation), so the main job needs no download
//! and no data folder.

/// Text of the built-in corpus.
pub const CORPUS: &str = concat!(
    include_str!("../../../README.md"),
    "\n",
    include_str!("../../../docs/architecture.md")
);

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
