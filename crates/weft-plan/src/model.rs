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
    /// attention with `n_kv_head` key/value heads of `head_dim` each (and `n_head` query heads
    /// as wide), no biases; optionally Qwen2's q, k and v biases and Qwen3's per-head q and k
    /// norms.
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
    /// Width of one attention head, resolved (never 0): `n_embd / n_head` for gpt and for a
    /// llama without `[model] head_dim`, else that key (Qwen3, Mistral NeMo). A llama's q and its
    /// attention output are `n_head x head_dim` wide, its k and v `n_kv_head x head_dim`, which
    /// need not be `n_embd`.
    pub head_dim: u64,
    /// The MLP's hidden width: `4 n_embd` for gpt, `intermediate_size` for llama.
    pub intermediate: u64,
    /// The output layer is the token embedding (always for gpt).
    pub tied: bool,
    /// Biases: in every Linear layer and LayerNorm of a gpt; on the q, k and v projections of
    /// a llama (Qwen2's attention, `[model] qkv_bias`).
    pub bias: bool,
    /// A llama's RMSNorm over each query and key head before the rotary embedding (Qwen3's
    /// attention, `[model] qk_norm`): two weights of `head_dim`, whole on every tensor-parallel
    /// rank (their gradients summed over the group in the backward). Always false for gpt.
    pub qk_norm: bool,
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
        // a gpt's heads are its width cut in n_head (c_attn's 3C columns); a llama's are
        // head_dim wide whatever n_embd is
        match self.kind {
            ModelKind::Gpt => {
                if !self.n_embd.is_multiple_of(self.n_head) {
                    return Err(Error::BadModel(format!(
                        "n_embd {} does not divide by n_head {}",
                        self.n_embd, self.n_head
                    )));
                }
                if self.head_dim != self.n_embd / self.n_head {
                    return Err(Error::BadModel(format!(
                        "head_dim {}: a gpt's heads are n_embd / n_head = {} wide",
                        self.head_dim,
                        self.n_embd / self.n_head
                    )));
                }
                if self.qk_norm {
                    return Err(Error::BadModel("qk_norm: a gpt has no per-head q and k norms".into()));
                }
            }
            ModelKind::Llama => {
                if self.head_dim == 0 {
                    return Err(Error::BadModel("head_dim must be at least 1".into()));
                }
            }
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

    /// Width of the query projection and of the attention's output (`o_proj`'s input):
    /// `n_head x head_dim` (`n_embd` for gpt).
    pub fn q_width(&self) -> f64 {
        self.n_head as f64 * self.head_dim as f64
    }

    /// Width of the key and value projections: `n_kv_head x head_dim`.
    pub fn kv_width(&self) -> f64 {
        self.n_kv_head as f64 * self.head_dim as f64
    }

    /// The per-head q and k norms' weights of one block (`2 head_dim` with `qk_norm`, else 0):
    /// whole on every tensor-parallel rank, each summed over the group in the backward.
    pub fn head_norm_params(&self) -> f64 {
        if self.qk_norm && self.kind == ModelKind::Llama {
            2.0 * self.head_dim as f64
        } else {
            0.0
        }
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
            // q q x C and o C x q, k and v kv x C (+q, +kv, +kv, column-parallel like their
            // weights), gate, up and down I x C; two RMSNorms (and the head norms, 2 hd)
            ModelKind::Llama => {
                let i = self.intermediate as f64;
                let (q, kv) = (self.q_width(), self.kv_width());
                (
                    2.0 * q * c + 2.0 * kv * c + 3.0 * i * c + (q + 2.0 * kv) * b,
                    2.0 * c + self.head_norm_params(),
                )
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
            ModelKind::Llama => (
                (self.q_width() + 2.0 * self.kv_width()) * b,
                2.0 * c + self.head_norm_params(),
            ),
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
        let i = self.intermediate as f64;
        let weights = match self.kind {
            ModelKind::Gpt => 4.0 * c * c + 2.0 * i * c,
            ModelKind::Llama => 2.0 * self.q_width() * c + 2.0 * self.kv_width() * c + 3.0 * i * c,
        };
        2.0 * weights + self.attention_flops_per_token()
    }

    /// Forward FLOPs of the attention's `q k^T` and `p v` for one token of one block (`4 T C`
    /// for gpt, `4 T n_head hd` for llama: each of the `n_head` query heads takes `T` dot
    /// products of `hd` with the keys and sums `T` values of `hd`), part of
    /// [`Self::block_flops_per_token`].
    pub fn attention_flops_per_token(&self) -> f64 {
        let width = match self.kind {
            ModelKind::Gpt => self.c(),
            ModelKind::Llama => self.q_width(),
        };
        4.0 * self.seq_len as f64 * width
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
    /// `(whole on every tp rank, in f32; cut by tp, in the products' dtype)`: the two norms
    /// (read and write `C` each), the two residual additions (read `2C`, write `C` each), and
    /// the MLP's activation (gpt: GELU, read and write `I`; llama: SiLU and the product with
    /// `up`, `5I`; rotary positions on q and k, `2(q + kv)` with `q = n_head hd`, unless
    /// `qk_norm` makes them f32: [`Self::block_f32_cut_elements_per_token`]). Attention is
    /// taken as one fused kernel whose scores stay on chip.
    pub fn block_memory_elements_per_token(&self) -> (f64, f64) {
        let (c, i) = (self.c(), self.intermediate as f64);
        let whole = 4.0 * c + 6.0 * c;
        let cut = match self.kind {
            ModelKind::Gpt => 2.0 * i,
            ModelKind::Llama if self.qk_norm => 5.0 * i,
            ModelKind::Llama => 5.0 * i + 2.0 * (self.q_width() + self.kv_width()),
        };
        (whole, cut)
    }

    /// Elements of one block's memory-bound kernels per token in the forward that are cut by
    /// tp and f32 in either precision: with `qk_norm`, the head norms on q and k (read and
    /// write `q + kv`, in f32 as weft's RMSNorm runs) and the rotation of their f32 outputs
    /// (`2(q + kv)`); 0 without.
    pub fn block_f32_cut_elements_per_token(&self) -> f64 {
        if self.qk_norm && self.kind == ModelKind::Llama {
            4.0 * (self.q_width() + self.kv_width())
        } else {
            0.0
        }
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
            head_dim: 64,
            intermediate: 3072,
            tied: true,
            bias: true,
            qk_norm: false,
        }
    }

    #[test]
    fn gpt2_small_has_its_124m_parameters() {
        // nanoGPT's GPT-2 small: 124,439,808 parameters, the tied output layer counted once
        assert_eq!(gpt2_small().parameter_count(), 124_439_808.0);
        // by hand: one block is 12 C^2 + 13 C = 7,087,872
        assert_eq!(gpt2_small().block_params(), 12.0 * 768.0 * 768.0 + 13.0 * 768.0);
    }

    /// Llama 2 7B's shapes (its config.json).
    fn llama2_7b() -> ModelShape {
        ModelShape {
            kind: ModelKind::Llama,
            vocab: 32000,
            seq_len: 4096,
            n_layer: 32,
            n_head: 32,
            n_kv_head: 32,
            n_embd: 4096,
            head_dim: 128,
            intermediate: 11008,
            tied: false,
            bias: false,
            qk_norm: false,
        }
    }

    #[test]
    fn llama2_7b_has_its_parameters() {
        let m = llama2_7b();
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
            head_dim: 128,
            intermediate: 4 * 12288,
            tied: true,
            bias: true,
            qk_norm: false,
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

    /// Qwen3-0.6B (its `config.json`): 28 layers of width 1024, 16 query heads and 8 key/value
    /// heads of `head_dim = 128` (q 2048 wide, twice `n_embd`), q and k normed per head, MLP
    /// 3072, vocabulary 151936, tied.
    pub(crate) fn qwen3_0_6b() -> ModelShape {
        ModelShape {
            kind: ModelKind::Llama,
            vocab: 151936,
            seq_len: 4096,
            n_layer: 28,
            n_head: 16,
            n_kv_head: 8,
            n_embd: 1024,
            head_dim: 128,
            intermediate: 3072,
            tied: true,
            bias: false,
            qk_norm: true,
        }
    }

    #[test]
    fn qwen3_0_6b_has_its_parameters() {
        let m = qwen3_0_6b();
        assert!(m.check().is_ok());
        // by hand: q 2048 x 1024 and o 1024 x 2048, k and v 1024 x 1024, gate, up, down
        // 3072 x 1024, two RMSNorms of 1024, q_norm and k_norm of 128 (HF: 0.6B, 0.44B
        // without the embedding)
        let block = 2.0 * 2048.0 * 1024.0 + 2.0 * 1024.0 * 1024.0 + 3.0 * 3072.0 * 1024.0 + 2.0 * 1024.0 + 256.0;
        assert_eq!(m.block_params(), block);
        assert_eq!(m.parameter_count(), 596_049_920.0);
        assert_eq!(m.parameter_count() - 151936.0 * 1024.0, 440_467_456.0);
        // the head norms whole on every tp rank, and no product's: a pass of their own under
        // gradient-accumulation fusion
        let plain = ModelShape {
            qk_norm: false,
            ..m.clone()
        };
        assert_eq!(m.head_norm_params(), 256.0);
        assert_eq!(m.block_params_split().0, plain.block_params_split().0);
        assert_eq!(m.block_params_split().1, plain.block_params_split().1 + 256.0);
        assert_eq!(m.block_vector_params_split(), (0.0, 2.0 * 1024.0 + 256.0));
        // with q, k and v biases: q + 2 kv = 4096 more, cut with their weights
        let biased = ModelShape {
            bias: true,
            ..m.clone()
        };
        assert_eq!(biased.block_params_split().0 - m.block_params_split().0, 4096.0);
        assert_eq!(biased.block_vector_params_split().0, 4096.0);
    }

    #[test]
    fn a_head_dim_sets_the_attentions_flops_and_bytes() {
        let m = qwen3_0_6b();
        let (q, kv, c, i, t) = (2048.0, 1024.0, 1024.0, 3072.0, 4096.0);
        assert_eq!(m.q_width(), q);
        assert_eq!(m.kv_width(), kv);
        // q k^T and p v over 16 heads of 128, not 1024 / 16 = 64
        assert_eq!(m.attention_flops_per_token(), 4.0 * t * q);
        assert_eq!(
            m.block_flops_per_token(),
            2.0 * (2.0 * q * c + 2.0 * kv * c + 3.0 * i * c) + 4.0 * t * q
        );
        // rotary positions on q and k, each read and written in the products' dtype; with the
        // head norms, the norms and the rotation of their outputs in f32
        let plain = ModelShape {
            qk_norm: false,
            ..m.clone()
        };
        assert_eq!(
            plain.block_memory_elements_per_token(),
            (10.0 * c, 5.0 * i + 2.0 * (q + kv))
        );
        assert_eq!(plain.block_f32_cut_elements_per_token(), 0.0);
        assert_eq!(m.block_memory_elements_per_token(), (10.0 * c, 5.0 * i));
        assert_eq!(m.block_f32_cut_elements_per_token(), 4.0 * (q + kv));
        // without a head_dim of its own, the same as before: Llama 2 7B's q is its width
        let llama2 = llama2_7b();
        assert_eq!(llama2.attention_flops_per_token(), 4.0 * 4096.0 * 4096.0);
        assert_eq!(llama2.head_norm_params(), 0.0);
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
        // a gpt's heads are n_embd / n_head wide, without norms of their own
        let wide = ModelShape {
            head_dim: 128,
            ..gpt2_small()
        };
        assert!(matches!(wide.check(), Err(Error::BadModel(m)) if m.contains("head_dim 128")));
        let normed = ModelShape {
            qk_norm: true,
            ..gpt2_small()
        };
        assert!(matches!(normed.check(), Err(Error::BadModel(m)) if m.contains("qk_norm")));
        // a llama's are head_dim wide, whatever n_embd is: 1000 does not divide by 16
        let odd = ModelShape {
            n_embd: 1000,
            ..qwen3_0_6b()
        };
        assert!(odd.check().is_ok());
        let none = ModelShape {
            head_dim: 0,
            ..qwen3_0_6b()
        };
        assert!(matches!(none.check(), Err(Error::BadModel(m)) if m.contains("head_dim")));
    }
}
