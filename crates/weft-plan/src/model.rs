//! The model as the planner sees it: shapes only. Parameter counts match weft's own models
//! (`weft_models::gpt::Gpt`, `weft_models::llama::Llama`) exactly; FLOPs count the matrix
//! products (2 FLOPs per multiply-add), as the MFU literature does (Megatron-LM's
//! `72 B s l h^2 (1 + s / 6h + V / 12hl)` for a GPT step is 3 x [`ModelShape::forward_flops_per_token`]
//! x tokens).

use crate::error::{Error, Result};

/// The most blocks a planned model may have: stage cuts are found by dynamic programming over
/// the blocks, quadratic in their number (no published model has more than a few hundred).
pub const MAX_LAYERS: u64 = 1024;

/// Which of weft's language models.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// GPT-2 layout: learned position embeddings, LayerNorm, GELU MLP of width `4 n_embd`, the
    /// output layer tied to the token embedding.
    Gpt,
    /// Llama layout: rotary positions, RMSNorm, SwiGLU MLP of width `intermediate`, grouped-query
    /// attention with `n_kv_head` key/value heads, no biases.
    Llama,
}

/// Shapes of a gpt or llama model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelShape {
    pub kind: ModelKind,
    pub vocab: u64,
    /// Tokens per sequence (`block_size`): every row of a batch is this long.
    pub seq_len: u64,
    pub n_layer: u64,
    pub n_head: u64,
    /// Key/value heads (llama); `n_head` for gpt.
    pub n_kv_head: u64,
    pub n_embd: u64,
    /// The MLP's hidden width: `4 n_embd` for gpt, `intermediate_size` for llama.
    pub intermediate: u64,
    /// The output layer is the token embedding (always for gpt).
    pub tied: bool,
    /// Biases: in every Linear layer and LayerNorm of a gpt; on the q, k and v projections of
    /// a llama (Qwen2's attention, `[model] qkv_bias`).
    pub bias: bool,
}

/// The dtype the matrix products run in (`[train] precision`). Parameters, gradients and
/// optimizer state are f32 either way (weft's autocast keeps them so).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    F32,
    /// Autocast (`weft_core::autocast`): products in bf16 on the tensor cores, and their outputs
    /// (q, k, v, attention, the MLP's) in bf16; norms, softmax and the loss run in f32, and a bf16
    /// product added to the f32 residual stream gives f32, so norm outputs, the residual stream
    /// and the loss's inputs stay f32.
    Bf16,
}

impl Precision {
    /// Bytes of one element of what the matrix products write (the activations that are cut by
    /// tensor parallelism inside a block); the rest is f32 either way.
    pub fn activation_bytes(self) -> f64 {
        match self {
            Precision::F32 => 4.0,
            Precision::Bf16 => 2.0,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    }
}

/// What one optimizer step trains: a model, the rows of the global batch, the precision and
/// the optimizer's state per parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    pub model: ModelShape,
    /// Rows (sequences) per optimizer step, over every data-parallel replica.
    pub global_batch: u64,
    pub precision: Precision,
    /// Forward and backward passes per optimizer step (`train.grad_accum`): each runs
    /// `global_batch / grad_accum` rows (`data.batch_size`), which the data-parallel replicas
    /// share; gradients are reduced once, after the last.
    pub grad_accum: u64,
    /// f32 state tensors per parameter: 2 for Adam and AdamW (two moments), 1 for SGD with
    /// momentum, 0 for plain SGD.
    pub optimizer_moments: u32,
    /// Whether the devices repeat a grouped-query model's keys and values to its query heads
    /// before attention (GPUs: [`crate::DeviceSpec::gpu`]), which the backward then keeps.
    pub kv_repeated: bool,
    /// Whether the weight-gradient products add into the step's accumulated gradients
    /// (Megatron-LM's gradient-accumulation fusion; weft's autograd does it, see
    /// `weft_core::set_accumulation_fusion`), so that a micro-batch's gradients of the
    /// products' weights cost no pass of their own. The embeddings' gradients (an index-add,
    /// not a product), biases and norm weights are added in a pass of their own either way
    /// ([`crate::cost::accumulate_time`]).
    pub fused_accumulation: bool,
}

impl Workload {
    /// Rows of one forward and backward pass over every replica (`data.batch_size`): the global
    /// batch over `grad_accum`.
    pub fn pass_rows(&self) -> u64 {
        self.global_batch / self.grad_accum.max(1)
    }
}

impl ModelShape {
    /// Refuses shapes that are not a model.
    pub fn check(&self) -> Result<()> {
        let sizes = [
            ("vocab", self.vocab),
            ("seq_len", self.seq_len),
            ("n_layer", self.n_layer),
            ("n_head", self.n_head),
            ("n_kv_head", self.n_kv_head),
            ("n_embd", self.n_embd),
            ("intermediate", self.intermediate),
        ];
        if let Some((name, _)) = sizes.iter().find(|(_, v)| *v == 0) {
            return Err(Error::BadModel(format!("{name} must be at least 1")));
        }
        if self.n_layer > MAX_LAYERS {
            return Err(Error::BadModel(format!(
                "n_layer {}: the planner plans models of at most {MAX_LAYERS} layers",
                self.n_layer
            )));
        }
        if !self.n_embd.is_multiple_of(self.n_head) {
            return Err(Error::BadModel(format!(
                "n_embd {} does not divide by n_head {}",
                self.n_embd, self.n_head
            )));
        }
        if !self.n_head.is_multiple_of(self.n_kv_head) {
            return Err(Error::BadModel(format!(
                "n_head {} does not divide by n_kv_head {}",
                self.n_head, self.n_kv_head
            )));
        }
        Ok(())
    }

    fn c(&self) -> f64 {
        self.n_embd as f64
    }

    /// Width of the key and value projections: `n_kv_head x head size`.
    fn kv(&self) -> f64 {
        (self.n_kv_head * (self.n_embd / self.n_head.max(1))) as f64
    }

    fn bias(&self) -> f64 {
        if self.bias {
            1.0
        } else {
            0.0
        }
    }

    /// Parameters of one block (transformer layer).
    pub fn block_params(&self) -> f64 {
        let split = self.block_params_split();
        split.0 + split.1
    }

    /// Parameters of one block as `(cut by tensor parallelism, whole on every tp rank)`: the
    /// column-parallel weights and biases and the row-parallel weights are cut; norms and the
    /// row-parallel biases are not.
    pub fn block_params_split(&self) -> (f64, f64) {
        let (c, b) = (self.c(), self.bias());
        match self.kind {
            // c_attn 3C x C (+3C), attn c_proj C x C (+C whole), c_fc I x C (+I), mlp c_proj
            // C x I (+C whole); ln_1, ln_2 C (+C)
            ModelKind::Gpt => {
                let i = self.intermediate as f64;
                let cut = 4.0 * c * c + 2.0 * i * c + (3.0 * c + i) * b;
                let whole = 2.0 * c * b + 2.0 * c * (1.0 + b);
                (cut, whole)
            }
            // q and o C x C, k and v kv x C (+C, +kv, +kv, column-parallel like their weights),
            // gate, up and down I x C; two RMSNorms
            ModelKind::Llama => {
                let i = self.intermediate as f64;
                let kv = self.kv();
                (2.0 * c * c + 2.0 * kv * c + 3.0 * i * c + (c + 2.0 * kv) * b, 2.0 * c)
            }
        }
    }

    /// The part of [`ModelShape::block_params_split`] whose gradients no matrix product makes
    /// (biases and norm weights, their gradients column sums), as `(cut by tp, whole)`: what a
    /// runtime with gradient-accumulation fusion still adds in a pass of its own.
    pub fn block_vector_params_split(&self) -> (f64, f64) {
        let (c, b) = (self.c(), self.bias());
        match self.kind {
            ModelKind::Gpt => {
                let i = self.intermediate as f64;
                ((3.0 * c + i) * b, 2.0 * c * b + 2.0 * c * (1.0 + b))
            }
            ModelKind::Llama => ((c + 2.0 * self.kv()) * b, 2.0 * c),
        }
    }

    /// Parameters before the first block as `(cut by tp, whole)`: the token embedding (cut by
    /// vocabulary rows) and gpt's position embedding (whole).
    pub fn embedding_params_split(&self) -> (f64, f64) {
        let tok = self.vocab as f64 * self.c();
        match self.kind {
            ModelKind::Gpt => (tok, self.seq_len as f64 * self.c()),
            ModelKind::Llama => (tok, 0.0),
        }
    }

    /// Parameters after the last block as `(cut by tp, whole)`: the final norm (whole) and the
    /// output layer (cut by vocabulary rows), which a tied model holds here only when the last
    /// block is on another pipeline stage than the embedding (`separate_stage`).
    pub fn head_params_split(&self, separate_stage: bool) -> (f64, f64) {
        // gpt's final LayerNorm has a bias, llama's RMSNorm none
        let norm = match self.kind {
            ModelKind::Gpt => self.c() * (1.0 + self.bias()),
            ModelKind::Llama => self.c(),
        };
        let out = if !self.tied || separate_stage {
            self.vocab as f64 * self.c()
        } else {
            0.0
        };
        (out, norm)
    }

    /// Every parameter of the model, the tied output layer counted once (what weft's model
    /// holds on one process).
    pub fn parameter_count(&self) -> f64 {
        let e = self.embedding_params_split();
        let h = self.head_params_split(false);
        e.0 + e.1 + self.n_layer as f64 * self.block_params() + h.0 + h.1
    }

    /// Forward FLOPs of one block for one token: the products of the weights (2 per
    /// multiply-add) and the attention's `q k^T` and `p v` over the whole sequence (counted
    /// without the causal mask's savings, as Megatron-LM counts them).
    pub fn block_flops_per_token(&self) -> f64 {
        let c = self.c();
        let (t, i) = (self.seq_len as f64, self.intermediate as f64);
        let weights = match self.kind {
            ModelKind::Gpt => 4.0 * c * c + 2.0 * i * c,
            ModelKind::Llama => 2.0 * c * c + 2.0 * self.kv() * c + 3.0 * i * c,
        };
        2.0 * weights + 4.0 * t * c
    }

    /// Forward FLOPs of the attention's `q k^T` and `p v` for one token of one block (`4 T C`,
    /// part of [`Self::block_flops_per_token`]).
    pub fn attention_flops_per_token(&self) -> f64 {
        4.0 * self.seq_len as f64 * self.c()
    }

    /// Forward FLOPs of the output layer for one token.
    pub fn head_flops_per_token(&self) -> f64 {
        2.0 * self.vocab as f64 * self.c()
    }

    /// Forward FLOPs of the whole model for one token.
    pub fn forward_flops_per_token(&self) -> f64 {
        self.n_layer as f64 * self.block_flops_per_token() + self.head_flops_per_token()
    }

    /// Elements one block's memory-bound kernels read and write per token in the forward, as
    /// `(whole on every tp rank, cut by tp)`: the two norms (read and write `C` each), the two
    /// residual additions (read `2C`, write `C` each), and the MLP's activation (gpt: GELU,
    /// read and write `I`; llama: SiLU and the product with `up`, `5I`; rotary positions on
    /// q and k, `2(C + kv)`). Attention is taken as one fused kernel whose scores stay on chip.
    pub fn block_memory_elements_per_token(&self) -> (f64, f64) {
        let (c, i) = (self.c(), self.intermediate as f64);
        let whole = 4.0 * c + 6.0 * c;
        let cut = match self.kind {
            ModelKind::Gpt => 2.0 * i,
            ModelKind::Llama => 5.0 * i + 2.0 * (c + self.kv()),
        };
        (whole, cut)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn gpt2_small() -> ModelShape {
        ModelShape {
            kind: ModelKind::Gpt,
            vocab: 50257,
            seq_len: 1024,
            n_layer: 12,
            n_head: 12,
            n_kv_head: 12,
            n_embd: 768,
            intermediate: 3072,
            tied: true,
            bias: true,
        }
    }

    #[test]
    fn gpt2_small_has_its_124m_parameters() {
        // nanoGPT's GPT-2 small: 124,439,808 parameters, the tied output layer counted once
        assert_eq!(gpt2_small().parameter_count(), 124_439_808.0);
        // by hand: one block is 12 C^2 + 13 C = 7,087,872
        assert_eq!(gpt2_small().block_params(), 12.0 * 768.0 * 768.0 + 13.0 * 768.0);
    }

    #[test]
    fn llama2_7b_has_its_parameters() {
        let m = ModelShape {
            kind: ModelKind::Llama,
            vocab: 32000,
            seq_len: 4096,
            n_layer: 32,
            n_head: 32,
            n_kv_head: 32,
            n_embd: 4096,
            intermediate: 11008,
            tied: false,
            bias: false,
        };
        assert_eq!(m.parameter_count(), 6_738_415_616.0);
        // with biases on q, k and v (Qwen2's attention): C + 2 kv more a layer, cut with them
        let biased = ModelShape { bias: true, ..m };
        assert_eq!(biased.parameter_count(), 6_738_415_616.0 + 32.0 * 3.0 * 4096.0);
        assert_eq!(biased.block_params_split().0 - m.block_params_split().0, 3.0 * 4096.0);
        assert_eq!(biased.head_params_split(false), m.head_params_split(false));
    }

    #[test]
    fn flops_match_megatrons_formula() {
        // 72 B s l h^2 (1 + s / 6h + V / 12 h l) per step (forward and backward) for GPT-3 175B
        let m = ModelShape {
            kind: ModelKind::Gpt,
            vocab: 50257,
            seq_len: 2048,
            n_layer: 96,
            n_head: 96,
            n_kv_head: 96,
            n_embd: 12288,
            intermediate: 4 * 12288,
            tied: true,
            bias: true,
        };
        let (s, l, h, v) = (2048.0, 96.0, 12288.0, 50257.0);
        let megatron = 72.0 * s * l * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * h * l));
        let ours = 3.0 * s * m.forward_flops_per_token();
        assert!((ours / megatron - 1.0).abs() < 1e-12, "{ours} vs {megatron}");
        // GPT-2 small, by hand: 2 x 12 C^2 + 4 T C per block, 2 V C for the head
        let g = gpt2_small();
        assert_eq!(g.block_flops_per_token(), 24.0 * 768.0 * 768.0 + 4.0 * 1024.0 * 768.0);
        assert_eq!(g.head_flops_per_token(), 2.0 * 50257.0 * 768.0);
    }

    #[test]
    fn shapes_that_are_not_models_are_refused() {
        let bad = ModelShape {
            n_head: 5,
            ..gpt2_small()
        };
        assert!(matches!(bad.check(), Err(Error::BadModel(m)) if m.contains("n_head 5")));
        let zero = ModelShape {
            n_layer: 0,
            ..gpt2_small()
        };
        assert!(matches!(zero.check(), Err(Error::BadModel(m)) if m.contains("n_layer")));
        assert!(gpt2_small().check().is_ok());
    }
}
