//! Will the run fit? Before anything of the model or data is allocated, an estimate of the
//! memory one rank needs (parameters, gradients, optimizer state, activations, data) from the
//! config alone, checked against the memory this machine has available per rank on it. A config
//! that cannot fit is refused with the estimate, instead of the process dying part-way through
//! building the model (an allocation failure aborts; a successful over-commitment is killed by
//! the kernel once the pages are touched).
//!
//! The estimate is meant to be low rather than high, so that it refuses only runs that cannot
//! fit: parameter and optimizer bytes are exact for f32 models, activations count what the
//! autograd graph of one step keeps (measured against the process's peak resident memory for
//! the built-in run, `docs/training.md`), and the code, thread stacks and allocator slack are
//! not counted.

use crate::config::{DataConfig, ModelConfig, RunConfig};
use crate::error::{Error, Result};
use weft_plan::Precision;

/// Bytes one rank needs for a run, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimate {
    /// The whole model's parameters: every rank builds the whole model before cutting or
    /// sharding it.
    pub params: f64,
    /// Gradients of the parameters this rank trains.
    pub grads: f64,
    /// Optimizer state of the parameters (or pieces) this rank updates.
    pub optimizer: f64,
    /// What one step's autograd graph keeps, for this rank's rows.
    pub activations: f64,
    /// The dataset held in memory, and the batches being prepared.
    pub data: f64,
}

impl Estimate {
    pub fn total(&self) -> f64 {
        self.params + self.grads + self.optimizer + self.activations + self.data
    }
}

const F32: f64 = 4.0;

/// Parameters of the model of `cfg` (f32 elements).
pub fn parameter_count(cfg: &ModelConfig) -> f64 {
    match cfg {
        ModelConfig::Mlp(m) => {
            let mut widths = vec![m.in_features as f64];
            widths.extend(m.hidden.iter().map(|&h| h as f64));
            widths.push(m.out_features as f64);
            widths.windows(2).map(|w| w[0] * w[1] + w[1]).sum()
        }
        ModelConfig::Convnet(c) => {
            let mut c_in = c.in_channels as f64;
            let mut total = 0.0;
            for &ch in &c.channels {
                total += c_in * ch as f64 * 9.0 + ch as f64;
                c_in = ch as f64;
            }
            let side = (c.image_size >> c.channels.len().min(63)) as f64;
            total + c_in * side * side * c.num_classes as f64 + c.num_classes as f64
        }
        ModelConfig::Gpt(g) => {
            let c = g.n_embd as f64;
            let bias = if g.bias { 1.0 } else { 0.0 };
            // per block: ln_1 and ln_2, c_attn (3C x C), attn.c_proj (C x C), c_fc (4C x C),
            // mlp.c_proj (C x 4C), and their biases
            let block = 12.0 * c * c + 2.0 * c * (1.0 + bias) + 9.0 * c * bias;
            (g.vocab_size + g.block_size) as f64 * c + g.n_layer as f64 * block + c * (1.0 + bias)
        }
        ModelConfig::Llama(l) => {
            let (c, inter) = (l.n_embd as f64, l.intermediate_size as f64);
            // heads of `[model] head_dim`, else n_embd / n_head, as the model resolves it
            let hd = l.to_config().head_dim() as f64;
            let (q, kv) = (l.n_head as f64 * hd, l.n_kv_head as f64 * hd);
            // per layer: two RMSNorms, q (q x C) and o (C x q), k and v (kv x C), gate, up and
            // down (I x C each); q, k and v's biases when there are; the q and k head norms (hd
            // each) with qk_norm
            let bias = if l.qkv_bias { q + 2.0 * kv } else { 0.0 };
            let head_norms = if l.qk_norm { 2.0 * hd } else { 0.0 };
            let layer = 2.0 * c + 2.0 * q * c + 2.0 * kv * c + 3.0 * inter * c + bias + head_norms;
            let heads = if l.tie_embeddings { 1.0 } else { 2.0 };
            heads * l.vocab_size as f64 * c + l.n_layer as f64 * layer + c
        }
    }
}

/// Activation bytes one step keeps for `rows` rows of the model of `cfg`, with its layers cut
/// over `tp` tensor-parallel ranks (`sequence`: sequence-parallel) and `pp` stages, its
/// products in `precision`. Gpt and llama as the planner counts them
/// ([`weft_plan::activations`]): the blocks of the largest stage and both ends of the model,
/// bf16 weight copies included (and on a GPU, `kv_repeated`, the repeated keys and values of
/// grouped-query attention), less what sequence parallelism holds at `1 / tp`.
#[allow(clippy::too_many_arguments)]
fn activation_bytes(
    cfg: &ModelConfig,
    precision: Precision,
    rows: f64,
    tp: f64,
    pp: f64,
    kv_repeated: bool,
    sequence: bool,
) -> f64 {
    match cfg {
        ModelConfig::Mlp(m) => {
            let widths: f64 = m.hidden.iter().map(|&h| 2.0 * h as f64).sum();
            rows * (m.in_features as f64 + widths + 2.0 * m.out_features as f64) * F32
        }
        ModelConfig::Convnet(c) => {
            let mut side = c.image_size as f64;
            let mut per_row = c.in_channels as f64 * side * side;
            for &ch in &c.channels {
                // padded input copy, convolution output, its activation, the pooled output
                per_row += 3.0 * ch as f64 * side * side + ch as f64 * side * side / 4.0;
                side /= 2.0;
            }
            rows * (per_row + 2.0 * c.num_classes as f64) * F32
        }
        ModelConfig::Gpt(_) | ModelConfig::Llama(_) => {
            let Ok(shape) = crate::plan_shape::model_shape(cfg) else {
                return 0.0;
            };
            let layers = (shape.n_layer as f64 / pp).ceil() as usize;
            let tokens = rows * shape.seq_len as f64;
            let saved = if sequence {
                tokens
                    * weft_plan::activations::sequence_parallel_saving_per_token(
                        &shape,
                        tp as usize,
                        layers,
                        true,
                        true,
                    )
            } else {
                0.0
            };
            weft_plan::activations::micro_batch_bytes(
                &shape,
                precision,
                tp as usize,
                kv_repeated,
                layers,
                (true, true),
                tokens,
            ) - saved
        }
    }
}

/// The estimate for `config` on one rank of its layout (`parallel`, with `dp` resolved).
pub fn estimate(config: &RunConfig) -> Estimate {
    let p = &config.parallel;
    let (dp, tp, pp) = (p.dp.max(1) as f64, p.tp.max(1) as f64, p.pp.max(1) as f64);
    let params = parameter_count(&config.model) * F32;
    // what this rank trains: its tensor-parallel part of its stage
    let trained = params / (tp * pp);
    let zero = if p.dp > 1 { p.zero } else { 0 };
    // a compiled step's capture returns every gradient whole before ZeRO-2 reduces and shards
    // them (its replays hand each unit over as it is made)
    let grads = if zero >= 2 && !config.train.compile {
        trained / dp
    } else {
        trained
    };
    let moments = match config.optim.kind.as_str() {
        "sgd" if config.optim.momentum == 0.0 => 0.0,
        "sgd" => 1.0,
        _ => 2.0,
    };
    let optimizer = moments * if zero >= 1 { trained / dp } else { trained };
    let (batch, data_file) = match &config.data {
        DataConfig::Text(t) => (t.batch_size as f64, file_bytes(config, &t.path) * 8.0),
        DataConfig::Csv(c) => (c.batch_size as f64, file_bytes(config, &c.path) * 2.0),
        DataConfig::Batches(b) => (0.0, file_bytes(config, &b.path)),
        // token shards are read by block as windows need them: a block cache of a few MiB
        DataConfig::Tokens(k) => (k.batch_size as f64, 128.0 * 65536.0),
    };
    let rows = batch / dp;
    let precision = match config.train.precision.as_str() {
        "bf16" => Precision::Bf16,
        _ => Precision::F32,
    };
    let on_gpu = config.train.device.trim().starts_with("cuda");
    let sequence = p.sequence_parallel && p.tp > 1;
    let activations = activation_bytes(&config.model, precision, rows, tp, pp, on_gpu, sequence);
    let per_row_input = match &config.model {
        ModelConfig::Gpt(_) | ModelConfig::Llama(_) => {
            2.0 * config.model.language_model_sizes().map_or(0, |(_, block)| block) as f64 * 8.0
        }
        ModelConfig::Mlp(m) => m.in_features as f64 * F32 + 8.0,
        ModelConfig::Convnet(c) => (c.in_channels * c.image_size * c.image_size) as f64 * F32 + 8.0,
    };
    // the global batch is built on every rank, and the prefetcher keeps up to three
    let data = data_file + 3.0 * batch * per_row_input;
    Estimate {
        params,
        grads,
        optimizer,
        activations,
        data,
    }
}

/// Size of a data file of the config (0 for the built-in corpus or a file that is not there:
/// reading it will say so).
fn file_bytes(config: &RunConfig, path: &std::path::Path) -> f64 {
    if path.as_os_str() == "builtin" {
        return 0.0;
    }
    std::fs::metadata(config.resolve(path)).map_or(0.0, |m| m.len() as f64)
}

/// `bytes` as people read them: `51.2 GB` (decimal units, as the allocation errors).
fn human(bytes: f64) -> String {
    weft_core::alloc::human_bytes(bytes as u128)
}

/// Refuses `config` when its [`estimate`] exceeds the memory available to each of the
/// `local_ranks` ranks of this machine (what [`weft_core::memory::available`] reports now,
/// shared evenly); returns the estimate otherwise.
pub fn check(config: &RunConfig, local_ranks: usize) -> Result<Estimate> {
    let e = estimate(config);
    let Some(available) = weft_core::memory::available().map(|a| a.bytes as f64) else {
        return Ok(e);
    };
    let ranks = local_ranks.max(1) as f64;
    let per_rank = available / ranks;
    if e.total() > per_rank {
        let share = if local_ranks > 1 {
            format!(" ({} for {local_ranks} ranks on this machine)", human(available))
        } else {
            String::new()
        };
        return Err(Error::Config(format!(
            "the run needs about {} per rank before its first step (parameters {}, gradients {}, optimizer state \
             {}, activations {}, data {}), but this machine has {} available per rank{share}; make the model \
             (model.*) or data.batch_size smaller, or spread it over more ranks (parallel.dp with parallel.zero, \
             parallel.tp, parallel.pp)",
            human(e.total()),
            human(e.params),
            human(e.grads),
            human(e.optimizer),
            human(e.activations),
            human(e.data),
            human(per_rank)
        )));
    }
    Ok(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{GptKeys, LlamaKeys, MlpKeys};

    #[test]
    fn parameter_counts_match_the_models() {
        // nanoGPT's 124M GPT-2 (vocab 50257, block 1024, 12 x 768, biases): 124,439,808
        // parameters with the tied output layer counted once
        let gpt2 = ModelConfig::Gpt(GptKeys {
            vocab_size: 50257,
            block_size: 1024,
            n_layer: 12,
            n_head: 12,
            n_embd: 768,
            bias: true,
            dropout: 0.0,
            activation: "gelu".into(),
        });
        assert_eq!(parameter_count(&gpt2), 124_439_808.0);
        let mlp = ModelConfig::Mlp(MlpKeys {
            in_features: 64,
            hidden: vec![32],
            out_features: 10,
            activation: "relu".into(),
        });
        assert_eq!(parameter_count(&mlp), (64 * 32 + 32 + 32 * 10 + 10) as f64);
        // Llama 2 7B (vocab 32000, 32 x 4096, 32 heads, MLP 11008, untied): 6,738,415,616
        let llama2 = LlamaKeys {
            vocab_size: 32000,
            block_size: 4096,
            n_layer: 32,
            n_head: 32,
            n_kv_head: 32,
            n_embd: 4096,
            intermediate_size: 11008,
            rope_theta: 10000.0,
            rope_scaling: None,
            norm_eps: 1e-5,
            tie_embeddings: false,
            qkv_bias: false,
            head_dim: None,
            qk_norm: false,
            padding_idx: None,
        };
        assert_eq!(parameter_count(&ModelConfig::Llama(llama2.clone())), 6_738_415_616.0);
        // grouped-query and tied: a model built and counted
        let small = LlamaKeys {
            vocab_size: 50,
            n_layer: 3,
            n_head: 4,
            n_kv_head: 2,
            n_embd: 16,
            intermediate_size: 24,
            tie_embeddings: true,
            ..llama2
        };
        let built = weft_models::llama::Llama::new(small.to_config(), 0).unwrap();
        let n: usize = weft_nn::Module::parameters(&built).iter().map(|(_, t)| t.numel()).sum();
        assert_eq!(parameter_count(&ModelConfig::Llama(small.clone())), n as f64);
        // with biases on q, k and v (Qwen2's)
        let biased = LlamaKeys {
            qkv_bias: true,
            ..small.clone()
        };
        let built = weft_models::llama::Llama::new(biased.to_config(), 0).unwrap();
        let m: usize = weft_nn::Module::parameters(&built).iter().map(|(_, t)| t.numel()).sum();
        assert_eq!(m, n + 3 * (16 + 2 * 2 * 4));
        assert_eq!(parameter_count(&ModelConfig::Llama(biased)), m as f64);
        // heads of 6, not 16 / 4 (q and o 24 x 16, k and v 12 x 16), and Qwen3's q_norm and
        // k_norm (6 each) a layer, with biases on q, k and v
        let qwen3 = LlamaKeys {
            head_dim: Some(6),
            qk_norm: true,
            qkv_bias: true,
            ..small
        };
        let built = weft_models::llama::Llama::new(qwen3.to_config(), 0).unwrap();
        let q: usize = weft_nn::Module::parameters(&built).iter().map(|(_, t)| t.numel()).sum();
        let per_layer =
            |q_width: usize, kv: usize, norms: usize| 2 * q_width * 16 + 2 * kv * 16 + q_width + 2 * kv + norms;
        assert_eq!(q, m + 3 * (per_layer(24, 12, 12) - per_layer(16, 8, 0)));
        assert_eq!(parameter_count(&ModelConfig::Llama(qwen3)), q as f64);
    }

    #[test]
    fn a_compiled_zero2_step_holds_whole_gradients() {
        let text = "[model]\nkind = \"gpt\"\nvocab_size = 96\nblock_size = 16\nn_layer = 1\nn_head = 2\n\
                    n_embd = 16\nbias = true\ndropout = 0.0\n[data]\nkind = \"text\"\npath = \"builtin\"\nbatch_size = 8\n\
                    [optim]\nkind = \"adamw\"\nlr = 0.001\n[parallel]\ndp = 2\nzero = 2\n[train]\nsteps = 1\n";
        let config = |compile: bool| {
            let mut c = RunConfig::parse(text, "test", ".".into(), &Default::default()).unwrap();
            c.train.compile = compile;
            c
        };
        let whole = parameter_count(&config(false).model) * F32;
        assert_eq!(estimate(&config(false)).grads, whole / 2.0);
        assert_eq!(estimate(&config(true)).grads, whole);
    }
    #[test]
    fn bf16_activations_are_counted_as_the_planner_counts_them() {
        let text = "[model]\nkind = \"llama\"\nvocab_size = 96\nblock_size = 16\nn_layer = 2\nn_head = 4\n\
                    n_kv_head = 2\nn_embd = 32\nintermediate_size = 48\n[data]\nkind = \"text\"\npath = \"builtin\"\n\
                    batch_size = 8\n[optim]\nkind = \"adamw\"\nlr = 0.001\n[train]\nsteps = 1\n";
        let config = |precision: &str| {
            let mut c = RunConfig::parse(text, "test", ".".into(), &Default::default()).unwrap();
            c.train.precision = precision.into();
            c
        };
        let shape = crate::plan_shape::model_shape(&config("bf16").model).unwrap();
        for (precision, p) in [("f32", Precision::F32), ("bf16", Precision::Bf16)] {
            // 8 rows of 16 tokens through both layers and both ends
            let planned = weft_plan::activations::micro_batch_bytes(&shape, p, 1, false, 2, (true, true), 128.0);
            assert_eq!(estimate(&config(precision)).activations, planned, "{precision}");
        }
        // bf16 is not f32 at 4 bytes an element: the products at 2 and autocast's copies (of
        // the weights among them) counted
        let copies = weft_plan::activations::weight_copy_bytes(&shape, Precision::Bf16, 1, 2, true);
        assert!(copies > 0.0);
        assert_ne!(
            estimate(&config("bf16")).activations,
            estimate(&config("f32")).activations
        );
    }
}
