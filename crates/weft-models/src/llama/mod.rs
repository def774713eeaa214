//! Llama in transformers' `LlamaForCausalLM` layout: a token embedding, pre-norm decoder layers
//! of grouped-query causal self-attention with rotary position embeddings and a SwiGLU MLP
//! (RMSNorm before each, no biases, or biases on q, k and v as Qwen2's), a final RMSNorm and an
//! output head (`lm_head`, or the token embedding when tied). Rotary embeddings are in `rope.rs`, the attention in `attention.rs`,
//! the MLP in `mlp.rs`, pipeline stages in `stages.rs`, the shapes a config implies in
//! `shapes.rs`.

use weft_core::{CompareOp, DType, Generator, Result, Tensor};
use weft_nn::init;
use weft_nn::layers::{Embedding, Linear, RmsNorm};
use weft_nn::module::{prefixed, Module};
use weft_nn::parallel::{Split, TpGroup};
use weft_nn::sequence_parallel::split_sequence;
use weft_nn::Context;

use crate::{config_error, LanguageModel, Model, StageCut};

mod attention;
mod decode;
mod mlp;
mod rope;
mod shapes;
mod stages;

pub use attention::LlamaAttention;
pub use mlp::LlamaMlp;
pub use rope::{inv_freq, scaled_inv_freq, RopeScaling, Rotary};

/// transformers' `LlamaConfig` (the keys weft takes).
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    pub vocab_size: usize,
    /// Longest sequence (positions; transformers' `max_position_embeddings`).
    pub block_size: usize,
    pub n_layer: usize,
    /// Query heads, each [`head_dim`](Self::head_dim) wide.
    pub n_head: usize,
    /// Key/value heads; `n_head` must divide by it (1 = multi-query, `n_head` = multi-head).
    pub n_kv_head: usize,
    /// Width `C`.
    pub n_embd: usize,
    /// The MLP's hidden size.
    pub intermediate_size: usize,
    /// The rotary base (default 10000).
    pub rope_theta: f64,
    /// How the rotary frequencies are stretched (`None`: plain rotary embeddings).
    pub rope_scaling: Option<RopeScaling>,
    /// RMSNorm's epsilon (default 1e-5).
    pub norm_eps: f64,
    /// The output head is the token embedding (no `lm_head.weight` of its own).
    pub tie_embeddings: bool,
    /// The q, k and v projections carry biases (Qwen2's attention; default false).
    pub qkv_bias: bool,
    /// Width of one head when it is not `n_embd / n_head` (transformers' `head_dim`: Qwen3,
    /// Mistral NeMo); `None` for `n_embd / n_head`. Even, for the rotary pairs.
    pub head_dim: Option<usize>,
    /// Each query and key head goes through an RMSNorm of its own width (weights
    /// `self_attn.q_norm.weight` and `self_attn.k_norm.weight`, `[head_dim]`, shared by the
    /// heads) before the rotary embedding: Qwen3's attention. Default false.
    pub qk_norm: bool,
    /// The token id whose embedding row gets no gradient from its lookups and starts at zero
    /// (transformers' `pad_token_id`, `torch.nn.Embedding`'s `padding_idx`); below
    /// `vocab_size`. `None` (the default): every row learns.
    pub padding_idx: Option<usize>,
}

impl LlamaConfig {
    /// The rotary base when none is given.
    pub const DEFAULT_ROPE_THETA: f64 = 10000.0;
    /// RMSNorm's epsilon when none is given.
    pub const DEFAULT_NORM_EPS: f64 = 1e-5;

    /// Positive sizes, `n_head % n_kv_head == 0`, an even head dim (`head_dim`, or `n_embd /
    /// n_head`, which must then divide), a
    /// positive finite `rope_theta` and `norm_eps`, and a valid `rope_scaling`. The error names
    /// the key.
    pub fn validate(&self) -> Result<()> {
        crate::config_check::positive(&[
            ("vocab_size", self.vocab_size),
            ("block_size", self.block_size),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_kv_head", self.n_kv_head),
            ("n_embd", self.n_embd),
            ("intermediate_size", self.intermediate_size),
        ])?;
        match self.head_dim {
            Some(hd) => {
                if hd == 0 || !hd.is_multiple_of(2) {
                    return Err(config_error(
                        "head_dim",
                        format!("{hd}: rotary embeddings need a positive, even head dim"),
                    ));
                }
                if self.n_head.checked_mul(hd).is_none() {
                    return Err(config_error(
                        "head_dim",
                        format!("{hd} x n_head = {} overflows", self.n_head),
                    ));
                }
            }
            None => {
                crate::config_check::divides("n_embd", self.n_embd, "n_head", self.n_head)?;
                let hd = self.n_embd / self.n_head;
                if !hd.is_multiple_of(2) {
                    return Err(config_error(
                        "n_embd",
                        format!(
                            "{} / n_head = {} is a head dim of {hd}; rotary embeddings need an even one",
                            self.n_embd, self.n_head
                        ),
                    ));
                }
            }
        }
        crate::config_check::divides("n_head", self.n_head, "n_kv_head", self.n_kv_head)?;
        if let Some(p) = self.padding_idx.filter(|&p| p >= self.vocab_size) {
            return Err(config_error(
                "padding_idx",
                format!("{p} is not a token id (vocab_size {})", self.vocab_size),
            ));
        }
        for (key, v) in [("rope_theta", self.rope_theta), ("norm_eps", self.norm_eps)] {
            if !(v.is_finite() && v > 0.0) {
                return Err(config_error(key, format!("{v} must be positive and finite")));
            }
        }
        match &self.rope_scaling {
            Some(scaling) => scaling.validate(),
            None => Ok(()),
        }
    }

    /// The width of one head: `head_dim` when given, else `n_embd / n_head`.
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.n_embd / self.n_head.max(1))
    }
}

/// One decoder layer: `x + attn(input_layernorm(x))`, then `x + mlp(post_attention_layernorm(x))`.
#[derive(Clone, Debug)]
pub struct LlamaLayer {
    pub input_layernorm: RmsNorm,
    pub self_attn: LlamaAttention,
    pub post_attention_layernorm: RmsNorm,
    pub mlp: LlamaMlp,
}

impl LlamaLayer {
    fn forward(&self, x: &Tensor, rope: &Rotary) -> Result<Tensor> {
        let x = self
            .self_attn
            .forward_residual(&self.input_layernorm.forward(x)?, x, rope)?;
        self.mlp
            .forward_residual(&self.post_attention_layernorm.forward(&x)?, &x)
    }
}

impl Module for LlamaLayer {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = prefixed("input_layernorm", self.input_layernorm.parameters());
        p.extend(prefixed("self_attn", self.self_attn.parameters()));
        p.extend(prefixed(
            "post_attention_layernorm",
            self.post_attention_layernorm.parameters(),
        ));
        p.extend(prefixed("mlp", self.mlp.parameters()));
        p
    }
}

/// The Llama language model. With `tie_embeddings`, `lm_head.weight` is
/// `model.embed_tokens.weight`.
pub struct Llama {
    pub config: LlamaConfig,
    pub embed_tokens: Embedding,
    pub layers: Vec<LlamaLayer>,
    pub norm: RmsNorm,
    /// The output head; `None` when tied to `embed_tokens`.
    pub lm_head: Option<Linear>,
    rope: Rotary,
    ctx: Context,
    /// How each parameter is cut, when tensor-parallel.
    splits: Vec<(String, Split)>,
    /// The tensor-parallel group, when it runs sequence-parallel: the layers then see this
    /// rank's part of the stream's tokens.
    sequence: Option<TpGroup>,
    /// How the layers are shared out among pipeline stages.
    pub stage_cut: StageCut,
}

const TIED: &[(&str, &str)] = &[("lm_head.weight", "model.embed_tokens.weight")];

impl Llama {
    /// transformers' initialisation: every Linear and the embedding `N(0, 0.02)`
    /// (`initializer_range`), RMSNorms at ones.
    pub fn new(config: LlamaConfig, seed: u64) -> Result<Self> {
        config.validate()?;
        let ctx = Context::new(seed);
        let mut rng = Generator::new(seed);
        let (c, std) = (config.n_embd, 0.02);
        let mut embed_tokens =
            Embedding::from_weight(init::normal(&[config.vocab_size, c], std, DType::F32, &mut rng)?);
        if let Some(p) = config.padding_idx {
            // transformers' initialisation zeroes the padding row (on whichever device)
            let w = &embed_tokens.weight;
            let row = Tensor::arange(0.0, config.vocab_size as f64, 1.0, DType::I64)?
                .compare(CompareOp::Eq, &Tensor::full(&[], p as f64, DType::I64)?)?
                .unsqueeze(-1)?
                .to(w.device())?;
            embed_tokens.weight = w.detach().masked_fill(&row, 0.0)?.detach().requires_grad_()?;
            embed_tokens.padding_idx = Some(p);
        }
        let mut layers = Vec::with_capacity(config.n_layer);
        for _ in 0..config.n_layer {
            layers.push(LlamaLayer {
                input_layernorm: RmsNorm::new(c, config.norm_eps)?,
                self_attn: LlamaAttention::new(&config, std, &mut rng)?,
                post_attention_layernorm: RmsNorm::new(c, config.norm_eps)?,
                mlp: LlamaMlp::new(c, config.intermediate_size, std, &mut rng)?,
            });
        }
        let lm_head = if config.tie_embeddings {
            None
        } else {
            Some(attention::linear(c, config.vocab_size, std, &mut rng)?)
        };
        Ok(Llama {
            rope: Rotary::new(
                config.head_dim(),
                config.rope_theta,
                config.rope_scaling,
                init::device(),
            ),
            norm: RmsNorm::new(c, config.norm_eps)?,
            embed_tokens,
            layers,
            lm_head,
            ctx,
            config,
            splits: Vec::new(),
            sequence: None,
            stage_cut: StageCut::default(),
        })
    }

    /// # Shapes
    /// I64 ids `[B, T]` -> logits `[B, T, vocab_size]` (tensor-parallel: this rank's columns of
    /// the padded vocabulary).
    pub fn forward(&self, idx: &Tensor) -> Result<Tensor> {
        let x = self.run_layers(self.embed(idx)?, 0..self.layers.len())?;
        self.logits(&x)
    }

    /// The token embedding of ids `[B, T]`: `[B, T, C]`, this rank's `[B, T / tp, C]` when
    /// sequence-parallel (ids outside the vocabulary are an error naming the id).
    fn embed(&self, idx: &Tensor) -> Result<Tensor> {
        crate::lm::check_ids("llama", idx, self.config.block_size, self.config.vocab_size, "inputs")?;
        let x = self.embed_tokens.forward(idx)?;
        match &self.sequence {
            Some(g) => split_sequence(&x, g),
            None => Ok(x),
        }
    }

    /// Layers `layers` on `x` `[B, T, C]`, each run as its unit.
    fn run_layers(&self, mut x: Tensor, layers: std::ops::Range<usize>) -> Result<Tensor> {
        for i in layers {
            let (input, layer) = (x, &self.layers[i]);
            x = self
                .ctx
                .unit(&format!("model.layers.{i}"), || layer.forward(&input, &self.rope))?;
        }
        Ok(x)
    }

    /// The final RMSNorm and the output head: `[B, T, C]` to logits `[B, T, V]`.
    fn logits(&self, x: &Tensor) -> Result<Tensor> {
        let x = self.norm.forward(x)?;
        match &self.lm_head {
            Some(head) => head.forward(&x),
            None => crate::lm::tied_logits(&x, &self.embed_tokens),
        }
    }

    /// Mean cross-entropy of `logits` `[B, T, V]` (tensor-parallel: this rank's vocabulary
    /// columns) against `targets` `[B, T]`, ignoring target -1.
    fn loss_of_logits(&self, logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        crate::lm::next_token_loss(
            "llama loss",
            logits,
            targets,
            self.embed_tokens.shard.as_ref(),
            self.config.vocab_size,
        )
    }

    /// Cuts the model across a tensor-parallel group (Megatron's layout): the token embedding by
    /// vocabulary rows and the output head by vocabulary columns (both padded to a multiple of
    /// the group size), each attention by query and key/value heads and each MLP on its
    /// intermediate dimension; the RMSNorms stay whole. Parameter names do not change;
    /// [`Model::splits`] says how each was cut. Errors, naming the key, when `n_kv_head` or
    /// `intermediate_size` does not divide by the group size.
    pub fn make_tensor_parallel(&mut self, group: &TpGroup) -> Result<()> {
        let tp = group.size();
        if !self.config.n_kv_head.is_multiple_of(tp) {
            return Err(config_error(
                "n_kv_head",
                format!("{} does not divide by parallel.tp = {tp}", self.config.n_kv_head),
            ));
        }
        if !self.config.intermediate_size.is_multiple_of(tp) {
            return Err(config_error(
                "intermediate_size",
                format!(
                    "{} does not divide by parallel.tp = {tp}",
                    self.config.intermediate_size
                ),
            ));
        }
        if group.sequence_parallel() {
            crate::lm::check_sequence_parallel(self.config.block_size, tp)?;
            self.sequence = Some(group.clone());
            self.norm.make_sequence_parallel(group);
            for layer in &mut self.layers {
                layer.input_layernorm.make_sequence_parallel(group);
                layer.post_attention_layernorm.make_sequence_parallel(group);
            }
        }
        let mut splits: Vec<(String, Split)> = Vec::new();
        let mut add = |prefix: &str, s: Vec<(String, Split)>| splits.extend(prefixed(prefix, s));
        add("model.embed_tokens", self.embed_tokens.make_vocab_parallel(group)?);
        for (i, layer) in self.layers.iter_mut().enumerate() {
            add(
                &format!("model.layers.{i}.self_attn"),
                layer.self_attn.make_tensor_parallel(group)?,
            );
            add(&format!("model.layers.{i}.mlp"), layer.mlp.make_tensor_parallel(group)?);
        }
        if let Some(head) = &mut self.lm_head {
            add("lm_head", head.make_column_parallel(group, 1)?);
        }
        self.splits = splits;
        Ok(())
    }
}

impl Module for Llama {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = prefixed("model.embed_tokens", self.embed_tokens.parameters());
        for (i, l) in self.layers.iter().enumerate() {
            p.extend(prefixed(&format!("model.layers.{i}"), l.parameters()));
        }
        p.extend(prefixed("model.norm", self.norm.parameters()));
        if let Some(head) = &self.lm_head {
            p.extend(prefixed("lm_head", head.parameters()));
        }
        p
    }
}

impl Model for Llama {
    fn logits(&self, inputs: &Tensor) -> Result<Tensor> {
        self.forward(inputs)
    }

    fn loss(&self, inputs: &Tensor, targets: &Tensor) -> Result<Tensor> {
        crate::lm::same_shape_targets("llama loss", inputs, targets)?;
        let logits = self.forward(inputs)?;
        self.loss_of_logits(&logits, targets)
    }

    fn reserve_positions(&self, n: usize) -> Result<()> {
        self.rope.reserve(n)
    }

    fn context(&self) -> &Context {
        &self.ctx
    }

    fn aliases(&self) -> &'static [(&'static str, &'static str)] {
        if self.config.tie_embeddings {
            TIED
        } else {
            &[]
        }
    }

    /// One unit per decoder layer; the embedding, the final norm and the head are the root.
    fn units(&self) -> Vec<String> {
        (0..self.layers.len()).map(|i| format!("model.layers.{i}")).collect()
    }

    fn splits(&self) -> Vec<(String, Split)> {
        self.splits.clone()
    }
}

impl LanguageModel for Llama {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn block_size(&self) -> usize {
        self.config.block_size
    }

    fn device(&self) -> weft_core::Device {
        self.embed_tokens.weight.device()
    }

    fn forward_ids(&self, idx: &Tensor) -> Result<Tensor> {
        self.forward(idx)
    }

    fn new_cache(&self) -> crate::KvCache {
        crate::KvCache::new(self.layers.len(), self.config.block_size)
    }

    fn forward_cached(&self, seqs: &mut [crate::CachedTokens]) -> Result<Tensor> {
        Llama::forward_cached(self, seqs)
    }

    fn make_tensor_parallel(&mut self, group: &TpGroup) -> Result<()> {
        Llama::make_tensor_parallel(self, group)
    }

    fn set_stage_cut(&mut self, cut: StageCut) {
        self.stage_cut = cut;
    }
}
