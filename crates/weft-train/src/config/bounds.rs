//! Lower and upper bounds on the config's sizes. A classifier's size of 0, or a language model's
//! vocabulary or context of 0, is refused naming its key. The upper bounds are far above any
//! model or job that can run, low enough that the products the planner, the memory estimate and
//! the layouts form from them (parameters, activations, ranks) stay inside 64-bit integers, so a
//! mistyped size is refused naming its key rather than overflowing somewhere later.

use super::{DataConfig, ModelConfig, RunConfig};

/// A model's widths (embedding, features, classes, vocabulary, context), and rows of a batch.
const WIDTH: usize = 1 << 30;
/// Counts of layers, heads, channels, and image sides.
const COUNT: usize = 1 << 16;
/// The width of one attention head (a llama's `head_dim`): with as many heads as `COUNT`, a
/// projection `n_head x head_dim` wide stays within `WIDTH x 4`.
const HEAD_WIDTH: usize = 1 << 16;
/// Evaluation batches of one evaluation (`train.eval_batches`, `weft evaluate --batches`).
pub const MAX_EVAL_BATCHES: usize = 1 << 24;
/// Ranks along one parallel dimension, micro-batches, accumulation steps.
const RANKS: usize = 1 << 20;

/// The bound on a gpt's or llama's `[model]` size `key` (without `model.`), if it has one.
pub(super) fn language_model_bound(key: &str) -> Option<usize> {
    match key {
        "vocab_size" | "block_size" | "n_embd" | "intermediate_size" => Some(WIDTH),
        "n_layer" | "n_head" | "n_kv_head" => Some(COUNT),
        "head_dim" => Some(HEAD_WIDTH),
        _ => None,
    }
}

/// The first model size that is 0, as (key, message): a model with no features, classes or
/// tokens is a config mistake, refused here naming the key rather than later by the data
/// checks, which run before the model is built and would blame the data (a label outside 0
/// classes, a validation split too short for a window of 0 tokens). A language model's layer,
/// head and width counts are left to its own check (`validate`), which names the key and runs
/// before any step, and before a sweep's first trial.
fn zero_model_size(model: &ModelConfig) -> Option<(String, String)> {
    let mut sizes: Vec<(String, usize)> = Vec::new();
    let mut add = |key: &str, v: usize| sizes.push((key.to_string(), v));
    match model {
        ModelConfig::Gpt(g) => {
            add("model.vocab_size", g.vocab_size);
            add("model.block_size", g.block_size);
        }
        ModelConfig::Llama(l) => {
            add("model.vocab_size", l.vocab_size);
            add("model.block_size", l.block_size);
        }
        ModelConfig::Mlp(m) => {
            add("model.in_features", m.in_features);
            for (i, &h) in m.hidden.iter().enumerate() {
                add(&format!("model.hidden[{i}]"), h);
            }
            add("model.out_features", m.out_features);
        }
        ModelConfig::Convnet(c) => {
            add("model.in_channels", c.in_channels);
            add("model.image_size", c.image_size);
            if c.channels.is_empty() {
                return Some((
                    "model.channels".into(),
                    "is empty: give at least one stage's channels".into(),
                ));
            }
            for (i, &ch) in c.channels.iter().enumerate() {
                add(&format!("model.channels[{i}]"), ch);
            }
            add("model.num_classes", c.num_classes);
        }
    }
    sizes
        .into_iter()
        .find(|(_, v)| *v == 0)
        .map(|(key, _)| (key, "must be at least 1".into()))
}

/// The first model size that is 0, else the first size above its bound, as (key, message).
pub(super) fn check(config: &RunConfig) -> Option<(String, String)> {
    if let Some(zero) = zero_model_size(&config.model) {
        return Some(zero);
    }
    let mut sizes: Vec<(String, usize, usize)> = Vec::new();
    let mut add = |key: &str, v: usize, max: usize| sizes.push((key.to_string(), v, max));
    match &config.model {
        ModelConfig::Gpt(g) => {
            add("model.vocab_size", g.vocab_size, WIDTH);
            add("model.block_size", g.block_size, WIDTH);
            add("model.n_embd", g.n_embd, WIDTH);
            add("model.n_layer", g.n_layer, COUNT);
            add("model.n_head", g.n_head, COUNT);
        }
        ModelConfig::Llama(l) => {
            add("model.vocab_size", l.vocab_size, WIDTH);
            add("model.block_size", l.block_size, WIDTH);
            add("model.n_embd", l.n_embd, WIDTH);
            add("model.intermediate_size", l.intermediate_size, WIDTH);
            add("model.n_layer", l.n_layer, COUNT);
            add("model.n_head", l.n_head, COUNT);
            add("model.n_kv_head", l.n_kv_head, COUNT);
            if let Some(hd) = l.head_dim {
                add("model.head_dim", hd, HEAD_WIDTH);
            }
        }
        ModelConfig::Mlp(m) => {
            add("model.in_features", m.in_features, WIDTH);
            add("model.out_features", m.out_features, WIDTH);
            add("model.hidden (count)", m.hidden.len(), COUNT);
            for (i, &h) in m.hidden.iter().enumerate() {
                add(&format!("model.hidden[{i}]"), h, WIDTH);
            }
        }
        ModelConfig::Convnet(c) => {
            add("model.in_channels", c.in_channels, COUNT);
            add("model.image_size", c.image_size, COUNT);
            add("model.num_classes", c.num_classes, WIDTH);
            add("model.channels (count)", c.channels.len(), COUNT);
            for (i, &ch) in c.channels.iter().enumerate() {
                add(&format!("model.channels[{i}]"), ch, COUNT);
            }
        }
    }
    let p = &config.parallel;
    add("parallel.dp", p.dp, RANKS);
    add("parallel.tp", p.tp, RANKS);
    add("parallel.pp", p.pp, RANKS);
    add("parallel.micro_batches", p.micro_batches, RANKS);
    if let Some(v) = p.virtual_stages {
        add("parallel.virtual_stages", v, COUNT);
    }
    add("train.grad_accum", config.train.grad_accum, RANKS);
    add("train.eval_batches", config.train.eval_batches, MAX_EVAL_BATCHES);
    let batch = match &config.data {
        DataConfig::Text(k) => Some(k.batch_size),
        DataConfig::Csv(k) => Some(k.batch_size),
        DataConfig::Tokens(k) => Some(k.batch_size),
        DataConfig::Batches(_) => None,
    };
    if let Some(b) = batch {
        add("data.batch_size", b, WIDTH);
    }
    sizes
        .into_iter()
        .find(|(_, v, max)| v > max)
        .map(|(key, v, max)| (key, format!("{v} is more than the {max} weft accepts")))
}
