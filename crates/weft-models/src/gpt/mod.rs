//! GPT in nanoGPT's layout: token and position embeddings, pre-norm blocks of causal
//! self-attention and MLP, a final LayerNorm, and an output head tied to the token embedding.
//! Generation and its sampling filters are in `generate.rs`, the parameter shapes a config
//! implies (and their check against a state dict's) in `shapes.rs`, pipeline stages in
//! `stages.rs`.

use weft_core::{DType, Generator, Result, Tensor, UnaryOp};
use weft_nn::init;
use weft_nn::layers::{CausalSelfAttention, Dropout, Embedding, LayerNorm, Mlp};
use weft_nn::module::{prefixed, Module};
use weft_nn::parallel::{Split, TpGroup};
use weft_nn::sequence_parallel::split_sequence;
use weft_nn::Context;

use crate::{config_error, LanguageModel, Model};

mod decode;
mod shapes;
mod stages;
pub use crate::sampling::Sampling;
pub use crate::stage_cut::StageCut;

/// nanoGPT's `GPTConfig`.
#[derive(Clone, Debug, PartialEq)]
pub struct GptConfig {
    pub vocab_size: usize,
    /// Longest sequence (positions).
    pub block_size: usize,
    pub n_layer: usize,
    pub n_head: usize,
    /// Width `C`; must divide by `n_head`.
    pub n_embd: usize,
    /// Biases in every Linear and LayerNorm.
    pub bias: bool,
    pub dropout: f64,
    /// The MLP's activation: `UnaryOp::Gelu` (exact, nanoGPT's) or `UnaryOp::GeluTanh` (GPT-2's
    /// `gelu_new`).
    pub activation: UnaryOp,
}

impl GptConfig {
    /// The epsilon of every LayerNorm (nanoGPT's and GPT-2's).
    pub const LAYER_NORM_EPS: f64 = 1e-5;

    pub fn validate(&self) -> Result<()> {
        crate::config_check::positive(&[
            ("vocab_size", self.vocab_size),
            ("block_size", self.block_size),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_embd", self.n_embd),
        ])?;
        crate::config_check::divides("n_embd", self.n_embd, "n_head", self.n_head)?;
        if !matches!(self.activation, UnaryOp::Gelu | UnaryOp::GeluTanh) {
            return Err(config_error(
                "activation",
                format!("{:?} is not one of gelu, gelu_tanh", self.activation),
            ));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(config_error("dropout", format!("{} is outside [0, 1)", self.dropout)));
        }
        Ok(())
    }
}

/// One pre-norm transformer block: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`.
pub struct Block {
    pub ln_1: LayerNorm,
    pub attn: CausalSelfAttention,
    pub ln_2: LayerNorm,
    pub mlp: Mlp,
}

impl Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = self.attn.forward_residual(&self.ln_1.forward(x)?, x)?;
        self.mlp.forward_residual(&self.ln_2.forward(&x)?, &x)
    }
}

impl Module for Block {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = prefixed("ln_1", self.ln_1.parameters());
        p.extend(prefixed("attn", self.attn.parameters()));
        p.extend(prefixed("ln_2", self.ln_2.parameters()));
        p.extend(prefixed("mlp", self.mlp.parameters()));
        p
    }
}

/// The GPT language model. `lm_head.weight` is `transformer.wte.weight` (tied).
pub struct Gpt {
    pub config: GptConfig,
    pub wte: Embedding,
    pub wpe: Embedding,
    pub h: Vec<Block>,
    pub ln_f: LayerNorm,
    drop: Dropout,
    ctx: Context,
    /// How each parameter is cut, when tensor-parallel.
    splits: Vec<(String, Split)>,
    /// The tensor-parallel group, when it runs sequence-parallel: the blocks then see this
    /// rank's part of the stream's tokens.
    sequence: Option<TpGroup>,
    /// How the blocks are shared out among pipeline stages.
    pub stage_cut: StageCut,
}

const ALIASES: &[(&str, &str)] = &[("lm_head.weight", "transformer.wte.weight")];

impl Gpt {
    /// nanoGPT's initialisation: N(0, 0.02) weights, zero biases, residual projections
    /// (`c_proj`) N(0, 0.02 / sqrt(2 n_layer)), LayerNorms at ones and zeros.
    pub fn new(config: GptConfig, seed: u64) -> Result<Self> {
        config.validate()?;
        let ctx = Context::new(seed);
        let mut rng = Generator::new(seed);
        let c = config.n_embd;
        let f = DType::F32;
        let eps = GptConfig::LAYER_NORM_EPS;
        let mut h = Vec::with_capacity(config.n_layer);
        for _ in 0..config.n_layer {
            h.push(Block {
                ln_1: LayerNorm::new(c, config.bias, eps)?,
                attn: CausalSelfAttention::new(c, config.n_head, config.bias, config.dropout, &ctx, &mut rng)?,
                ln_2: LayerNorm::new(c, config.bias, eps)?,
                mlp: Mlp::new(c, config.bias, config.dropout, &ctx, &mut rng)?.with_activation(config.activation),
            });
        }
        let model = Gpt {
            wte: Embedding::from_weight(init::normal(&[config.vocab_size, c], 0.02, f, &mut rng)?),
            wpe: Embedding::from_weight(init::normal(&[config.block_size, c], 0.02, f, &mut rng)?),
            h,
            ln_f: LayerNorm::new(c, config.bias, eps)?,
            drop: Dropout::new(config.dropout, &ctx),
            ctx,
            config,
            splits: Vec::new(),
            sequence: None,
            stage_cut: StageCut::default(),
        };
        let proj_std = 0.02 / (2.0 * model.config.n_layer as f64).sqrt();
        for (name, p) in model.parameters() {
            let fresh = if name.ends_with("c_proj.weight") {
                Some(init::normal(p.shape(), proj_std, f, &mut rng)?)
            } else if name.contains(".c_") && name.ends_with(".weight") {
                Some(init::normal(p.shape(), 0.02, f, &mut rng)?)
            } else if name.contains(".c_") && name.ends_with(".bias") {
                Some(Tensor::zeros_on(p.shape(), f, p.device())?)
            } else {
                None
            };
            if let Some(v) = fresh {
                p.copy_from(&v)?;
            }
        }
        Ok(model)
    }

    /// Cuts the model across a tensor-parallel group (Megatron's layout): the token embedding
    /// and the tied output layer by vocabulary rows (padded to a multiple of the group size),
    /// each attention by heads and each MLP on its hidden dimension; LayerNorms and position
    /// embeddings stay whole on every rank. Parameter names do not change; [`Model::splits`]
    /// says how each was cut. Errors when `n_head` or the MLP's hidden size does not divide by
    /// the group size.
    pub fn make_tensor_parallel(&mut self, group: &TpGroup) -> Result<()> {
        let tp = group.size();
        if !self.config.n_head.is_multiple_of(tp) {
            return Err(config_error(
                "n_head",
                format!("{} does not divide by parallel.tp = {tp}", self.config.n_head),
            ));
        }
        if group.sequence_parallel() {
            crate::lm::check_sequence_parallel(self.config.block_size, tp)?;
            if self.config.dropout > 0.0 {
                // each rank would draw the same mask for its own tokens
                return Err(config_error(
                    "dropout",
                    format!(
                        "{} with parallel.sequence_parallel: dropout on a rank's part of the tokens is not supported \
                         yet; set model.dropout = 0",
                        self.config.dropout
                    ),
                ));
            }
            self.sequence = Some(group.clone());
            self.ln_f.make_sequence_parallel(group);
            for block in &mut self.h {
                block.ln_1.make_sequence_parallel(group);
                block.ln_2.make_sequence_parallel(group);
            }
        }
        let mut splits: Vec<(String, Split)> = Vec::new();
        let mut add = |prefix: &str, s: Vec<(String, Split)>| splits.extend(prefixed(prefix, s));
        add("transformer.wte", self.wte.make_vocab_parallel(group)?);
        for (i, block) in self.h.iter_mut().enumerate() {
            add(
                &format!("transformer.h.{i}.attn"),
                block.attn.make_tensor_parallel(group)?,
            );
            add(
                &format!("transformer.h.{i}.mlp"),
                block.mlp.make_tensor_parallel(group)?,
            );
        }
        self.splits = splits;
        Ok(())
    }

    /// # Shapes
    /// I64 ids `[B, T]` -> logits `[B, T, vocab_size]` (tensor-parallel: this rank's columns of
    /// the padded vocabulary).
    pub fn forward(&self, idx: &Tensor) -> Result<Tensor> {
        let x = self.run_blocks(self.embed(idx)?, 0..self.h.len())?;
        self.logits(&x)
    }

    /// Token plus position embeddings (then dropout) of ids `[B, T]`: `[B, T, C]` (this rank's
    /// `[B, T / tp, C]` when sequence-parallel).
    fn embed(&self, idx: &Tensor) -> Result<Tensor> {
        crate::lm::check_ids("gpt", idx, self.config.block_size, self.config.vocab_size, "inputs")?;
        let t = idx.shape()[1];
        let pos = Tensor::arange(0.0, t as f64, 1.0, DType::I64)?.to(idx.device())?;
        let x = self
            .drop
            .forward(&self.wte.forward(idx)?.add(&self.wpe.forward(&pos)?)?)?;
        match &self.sequence {
            Some(g) => split_sequence(&x, g),
            None => Ok(x),
        }
    }

    /// Blocks `blocks` on `x` `[B, T, C]`, each run as its unit.
    fn run_blocks(&self, mut x: Tensor, blocks: std::ops::Range<usize>) -> Result<Tensor> {
        for i in blocks {
            let (input, block) = (x, &self.h[i]);
            x = self.ctx.unit(&format!("transformer.h.{i}"), || block.forward(&input))?;
        }
        Ok(x)
    }

    /// The final LayerNorm and the output layer (tied to the token embedding): `[B, T, C]` to
    /// logits `[B, T, V]` (from this rank's part of the tokens, `[B, T / tp, C]`, when sequence-parallel).
    fn logits(&self, x: &Tensor) -> Result<Tensor> {
        crate::lm::tied_logits(&self.ln_f.forward(x)?, &self.wte)
    }
}

impl Module for Gpt {
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut p = prefixed("transformer.wte", self.wte.parameters());
        p.extend(prefixed("transformer.wpe", self.wpe.parameters()));
        for (i, b) in self.h.iter().enumerate() {
            p.extend(prefixed(&format!("transformer.h.{i}"), b.parameters()));
        }
        p.extend(prefixed("transformer.ln_f", self.ln_f.parameters()));
        p
    }
}

impl Model for Gpt {
    fn logits(&self, inputs: &Tensor) -> Result<Tensor> {
        self.forward(inputs)
    }

    fn loss(&self, inputs: &Tensor, targets: &Tensor) -> Result<Tensor> {
        crate::lm::same_shape_targets("gpt loss", inputs, targets)?;
        let logits = self.forward(inputs)?;
        self.loss_of_logits(&logits, targets)
    }

    fn context(&self) -> &Context {
        &self.ctx
    }

    fn aliases(&self) -> &'static [(&'static str, &'static str)] {
        ALIASES
    }

    /// One unit per transformer block; the embeddings and the final LayerNorm are the root.
    fn units(&self) -> Vec<String> {
        (0..self.h.len()).map(|i| format!("transformer.h.{i}")).collect()
    }

    fn splits(&self) -> Vec<(String, Split)> {
        self.splits.clone()
    }
}

impl Gpt {
    /// Mean cross-entropy of `logits` `[B, T, V]` (tensor-parallel: this rank's vocabulary
    /// columns) against `targets` `[B, T]`, ignoring target -1.
    fn loss_of_logits(&self, logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        crate::lm::next_token_loss(
            "gpt loss",
            logits,
            targets,
            self.wte.shard.as_ref(),
            self.config.vocab_size,
        )
    }
}

impl LanguageModel for Gpt {
    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn block_size(&self) -> usize {
        self.config.block_size
    }

    fn device(&self) -> weft_core::Device {
        self.wte.weight.device()
    }

    fn forward_ids(&self, idx: &Tensor) -> Result<Tensor> {
        self.forward(idx)
    }

    fn new_cache(&self) -> crate::KvCache {
        crate::KvCache::new(self.h.len(), self.config.block_size)
    }

    fn forward_cached(&self, seqs: &mut [crate::CachedTokens]) -> Result<Tensor> {
        Gpt::forward_cached(self, seqs)
    }

    fn make_tensor_parallel(&mut self, group: &TpGroup) -> Result<()> {
        Gpt::make_tensor_parallel(self, group)
    }

    fn set_stage_cut(&mut self, cut: StageCut) {
        self.stage_cut = cut;
    }
}
