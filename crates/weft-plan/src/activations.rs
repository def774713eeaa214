//! What weft's autograd graph keeps of one micro-batch between its forward and its backward,
//! tensor by tensor, as the models compute (`weft_models::gpt`, `weft_models::llama`) and as
//! autocast casts (`weft_core::autocast`). One accounting for the planner
//! ([`crate::memory::stage_memory`]) and for the check before a run
//! (`weft_train::memory::estimate`); `crates/weft-cli/tests/plan_accounting.rs` holds it to the
//! bytes the graph of a small gpt and llama forward keeps, in f32 and bf16, with and without
//! tensor parallelism (llama with and without `head_dim` and `qk_norm`).
//!
//! weft's autograd keeps of an op's inputs only those its backward formula reads (and a
//! tensor whose own op reads it as an output: softmax, attention); a product's output that only
//! a sum, a bias, a cast or a tensor-parallel reduction reads is freed during the forward. Per
//! token of a block, on one tensor-parallel rank of `tp` (`C` = `n_embd`, `I` the MLP's width,
//! `H` the query heads and `H_kv` the key/value heads, `hd` their width, `q = H hd` (`C` for
//! gpt and for a llama without `head_dim`) and `kv = H_kv hd`; `/tp` what the rank's heads and
//! MLP slice hold):
//!
//! - f32 always: the two residual sums, which the norms read (`2C`), the norms' mean and
//!   reciprocal deviation (4), the attention's log-sum-exp (`H/tp`); in f32 also the norms'
//!   outputs, which the products read (`2C`; under bf16 only their bf16 copies are read);
//! - in the products' dtype (4 bytes in f32, 2 in bf16), cut by tp: gpt's q, k, v and attention
//!   output (`4C`; under bf16 with biases the sum with the bias, not the product) and MLP
//!   pre-activation and GELU output (`2I`); llama's rotated q and k and its v (`q + 2kv`: the
//!   rotation reads only its tables, so the unrotated q and k are freed), attention output
//!   (`q`), under bf16 the heads merged into rows (`q`: f32 attention writes them in place), and
//!   the MLP's gate, up and product (`3I`: in f32 `silu_mul` takes the gate before its
//!   activation; under bf16 the SiLU's output too, `4I`); grouped-query attention reads the
//!   shared key/value heads in place on CPU; on a GPU (`kv_repeated`), which repeats them to
//!   every query head first, the repeated keys and values (`2q`) in place of the rank's own
//!   (`2kv`) where a rank holds more than one key/value head (one head repeated is a view of
//!   it, and keeps it; but with `qk_norm` under bf16 the keys are f32 when repeated, and the
//!   attention's bf16 cast of the repeated view is `q` wide);
//! - with `qk_norm` (Qwen3's per-head RMSNorms on q and k, before the rotation), f32 in either
//!   precision, cut by tp: each norm's input (`q + kv`: the projections' outputs in f32, under
//!   bf16 the f32 copies the norms make of them, the bf16 outputs then freed) and its mean and
//!   reciprocal deviation per head (`2 (H + H_kv)`); their outputs are freed (the rotation
//!   reads only its tables), and the rotated q and k, f32 now, are kept as the attention's
//!   bf16 copies under bf16, as wide as before ([`head_norm_bytes_per_token`]);
//! - under bf16 only: each product's bf16 copy of the f32 norm output it reads (gpt 2, llama 5:
//!   q, k, v, gate and up each cast their own; `C` each, whole).
//!
//! The row-parallel products (gpt's `c_proj`s, llama's `o_proj` and `down_proj`) keep nothing
//! of their outputs: only the bias, the group's sum, the cast to f32 and the residual addition
//! read them, and none of those reads elements in its backward.
//!
//! Per micro-batch besides its tokens' ([`micro_batch_bytes`]): under bf16 each product casts
//! its f32 weight to bf16 in every forward, and the graph keeps the copy until the backward: 2
//! bytes per weight of the rank's products ([`weight_copy_bytes`]; the biases' copies only feed
//! sums and are freed); llama's rotary tables cast to bf16 for q and k (`4 T hd` elements a
//! block; none with `qk_norm`, whose f32 outputs the rotation takes with the f32 tables as they
//! are).

use crate::model::{ModelKind, ModelShape, Precision};

/// Bytes of one element by what computes it, under a precision.
struct Dtypes {
    /// The products' outputs: 4 in f32, 2 in bf16.
    low: f64,
    /// The bf16 copy autocast makes of an f32 input to a product: 2, none in f32.
    cast_low: f64,
}

fn dtypes(precision: Precision) -> Dtypes {
    match precision {
        Precision::F32 => Dtypes {
            low: 4.0,
            cast_low: 0.0,
        },
        Precision::Bf16 => Dtypes {
            low: 2.0,
            cast_low: 2.0,
        },
    }
}

/// Activation bytes one block keeps per token on one rank of `tp`; `kv_repeated`: the device
/// repeats grouped-query keys and values to the query heads ([`crate::Workload::kv_repeated`]).
pub fn block_bytes_per_token(model: &ModelShape, precision: Precision, tp: usize, kv_repeated: bool) -> f64 {
    let d = dtypes(precision);
    let bf16 = precision == Precision::Bf16;
    let (c, i, t) = (model.n_embd as f64, model.intermediate as f64, tp as f64);
    // residual sums, the norms' statistics, the log-sum-exp; in f32 the norms' outputs
    let norm_outputs = if bf16 { 0.0 } else { 2.0 * c };
    let f32_bytes = 4.0 * (2.0 * c + norm_outputs + 4.0 + model.n_head as f64 / t);
    let (cut, casts) = match model.kind {
        ModelKind::Gpt => (4.0 * c + 2.0 * i, 2.0 * c),
        ModelKind::Llama => {
            // q and the attention's output n_head hd wide, k and v n_kv_head hd
            let (q, kv) = (model.q_width(), model.kv_width());
            let merged = if bf16 { q } else { 0.0 };
            let mlp = if bf16 { 4.0 * i } else { 3.0 * i };
            let kv_heads_here = model.n_kv_head / tp.max(1) as u64;
            let repeated = kv_repeated && model.n_kv_head < model.n_head;
            // the repeat copies where the rank holds several key/value heads; one head repeated
            // is a view of it, except that bf16 attention casts f32 keys (normed ones, below)
            // after the repeat, which writes them whole
            let values = if repeated && kv_heads_here > 1 { q } else { kv };
            let keys = if repeated && (kv_heads_here > 1 || (model.qk_norm && bf16)) {
                q
            } else {
                kv
            };
            (q + keys + values + q + merged + mlp, 5.0 * c)
        }
    };
    f32_bytes + head_norm_bytes_per_token(model, tp) + d.low * cut / t + d.cast_low * casts
}

/// Bytes per token of a block on a rank of `tp` that a llama's per-head q and k norms
/// (`qk_norm`) keep, f32 in either precision: each norm's input (the rank's `q/tp` and `kv/tp`
/// of the projections' outputs; under bf16 the f32 copy the norm makes of them, the bf16 outputs
/// freed) and its mean and reciprocal deviation for each of the rank's `(H + H_kv)/tp` heads.
/// Their outputs are not kept: the rotation reads only its tables. 0 without `qk_norm`.
pub fn head_norm_bytes_per_token(model: &ModelShape, tp: usize) -> f64 {
    if !model.qk_norm || model.kind != ModelKind::Llama {
        return 0.0;
    }
    let t = tp as f64;
    let heads = (model.n_head + model.n_kv_head) as f64;
    4.0 * ((model.q_width() + model.kv_width()) + 2.0 * heads) / t
}

/// Activation bytes per token the first stage keeps besides its blocks: the token ids (8) and
/// the embeddings' sum in f32 (gpt: the token and position lookups added, the lookups freed;
/// llama: the lookup, `C`); a vocabulary-parallel embedding (`tp > 1`) also keeps its lookup,
/// which its mask multiplies (`C`).
pub fn first_bytes_per_token(model: &ModelShape, tp: usize) -> f64 {
    let c = model.n_embd as f64;
    8.0 + 4.0 * (c + if tp > 1 { c } else { 0.0 })
}

/// Activation bytes per token the last stage keeps besides its blocks: the final norm's
/// statistics (2, f32) and its output (`C`, f32; under bf16 its bf16 copy, 2 bytes), the logits
/// the loss reads (`V/tp` in f32; under bf16 at `tp = 1` their f32 copy, `V` of 4 bytes, the
/// vocabulary-parallel loss reading the bf16 logits as they are), the f32 gradient of the
/// logits the backward makes first (`V/tp`), the loss's log-sum-exp and targets (12 bytes).
pub fn last_bytes_per_token(model: &ModelShape, precision: Precision, tp: usize) -> f64 {
    let c = model.n_embd as f64;
    let v = model.vocab as f64 / tp as f64;
    let (norm, logits) = match precision {
        Precision::F32 => (4.0 * c, 4.0 * v),
        Precision::Bf16 if tp == 1 => (2.0 * c, 4.0 * v),
        Precision::Bf16 => (2.0 * c, 2.0 * v),
    };
    8.0 + norm + logits + 4.0 * v + 12.0
}

/// Weights the matrix products of one block read on one rank of `tp` (biases and the norms'
/// weights left out).
pub fn block_product_weights(model: &ModelShape, tp: usize) -> f64 {
    let (c, i) = (model.n_embd as f64, model.intermediate as f64);
    let weights = match model.kind {
        // c_attn 3C x C, attn c_proj C x C, c_fc I x C, mlp c_proj C x I
        ModelKind::Gpt => 4.0 * c * c + 2.0 * i * c,
        // q q x C and o C x q (q = n_head hd), k and v kv x C, gate, up and down I x C
        ModelKind::Llama => 2.0 * model.q_width() * c + 2.0 * model.kv_width() * c + 3.0 * i * c,
    };
    weights / tp as f64
}

/// Bytes of the bf16 weight copies one micro-batch's graph keeps on a rank of `tp` holding
/// `blocks` blocks and (`last`) the output layer, `V x C / tp` (the token embedding's lookup
/// reads f32): 2 per weight under bf16, none in f32.
pub fn weight_copy_bytes(model: &ModelShape, precision: Precision, tp: usize, blocks: usize, last: bool) -> f64 {
    let head = if last {
        model.vocab as f64 * model.n_embd as f64 / tp as f64
    } else {
        0.0
    };
    dtypes(precision).cast_low * (blocks as f64 * block_product_weights(model, tp) + head)
}

/// Activation bytes one micro-batch of `tokens` tokens keeps on a rank of `tp` holding `blocks`
/// blocks, the embeddings (`first`) and the final norm, output layer and loss (`last`): what its
/// graph keeps between forward and backward, weight copies included.
#[allow(clippy::too_many_arguments)]
pub fn micro_batch_bytes(
    model: &ModelShape,
    precision: Precision,
    tp: usize,
    kv_repeated: bool,
    blocks: usize,
    (first, last): (bool, bool),
    tokens: f64,
) -> f64 {
    let t = model.seq_len as f64;
    let per_batch = match model.kind {
        ModelKind::Gpt => 0.0,
        // the cos and sin tables cast to bf16 for q and for k, `[T, hd]` each; with qk_norm
        // the rotation takes the norms' f32 outputs and reads the f32 tables as they are
        ModelKind::Llama if model.qk_norm => 0.0,
        ModelKind::Llama => {
            let hd = model.head_dim as f64;
            blocks as f64 * dtypes(precision).cast_low * 4.0 * t * hd
        }
    };
    tokens * stage_bytes_per_token(model, precision, tp, kv_repeated, blocks, first, last)
        + weight_copy_bytes(model, precision, tp, blocks, last)
        + per_batch
}

/// Activation bytes per token of a stage: `blocks` blocks and its ends.
pub fn stage_bytes_per_token(
    model: &ModelShape,
    precision: Precision,
    tp: usize,
    kv_repeated: bool,
    blocks: usize,
    first: bool,
    last: bool,
) -> f64 {
    let mut b = blocks as f64 * block_bytes_per_token(model, precision, tp, kv_repeated);
    if first {
        b += first_bytes_per_token(model, tp);
    }
    if last {
        b += last_bytes_per_token(model, precision, tp);
    }
    b
}

/// Activation bytes per token that sequence parallelism (`parallel.sequence_parallel`) keeps at
/// `1 / tp` instead of whole, on a rank of `tp` holding `blocks` blocks and the ends: a rank
/// then holds only its `T / tp` positions between the tensor-parallel regions. Per block the
/// two f32 residual sums the norms read and the norms' statistics (`4 (2C + 4)`); on the first
/// stage the embeddings' sum (`4C`, which the first norm reads; the vocabulary-parallel lookup
/// its mask multiplies stays whole); on the last the final norm's statistics (8). The gathered
/// inputs of the column-parallel products (the norms' outputs in f32, their bf16 copies under
/// bf16) stay whole: weft's products keep the input they read. This is the part of
/// [`micro_batch_bytes`] that falls by `1 - 1 / tp`.
pub fn sequence_parallel_saving_per_token(
    model: &ModelShape,
    tp: usize,
    blocks: usize,
    first: bool,
    last: bool,
) -> f64 {
    if tp <= 1 {
        return 0.0;
    }
    let c = model.n_embd as f64;
    let mut b = blocks as f64 * 4.0 * (2.0 * c + 4.0);
    if first {
        b += 4.0 * c;
    }
    if last {
        b += 8.0;
    }
    b * (1.0 - 1.0 / tp as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama(n_head: u64, n_kv_head: u64) -> ModelShape {
        ModelShape {
            kind: ModelKind::Llama,
            vocab: 512,
            seq_len: 256,
            n_layer: 4,
            n_head,
            n_kv_head,
            n_embd: 256,
            head_dim: 256 / n_head,
            intermediate: 688,
            tied: false,
            bias: false,
            qk_norm: false,
        }
    }

    #[test]
    fn a_gpu_keeps_the_repeated_keys_and_values_where_a_rank_holds_several_key_value_heads() {
        let gqa = llama(8, 4);
        let extra = |m: &ModelShape, p: Precision, tp: usize| {
            block_bytes_per_token(m, p, tp, true) - block_bytes_per_token(m, p, tp, false)
        };
        // k and v repeated to the rank's query heads, 2 C / tp elements in the products' dtype,
        // in place of the rank's own, 2 kv / tp (kv = 128 here)
        assert_eq!(extra(&gqa, Precision::F32, 1), 4.0 * 2.0 * (256.0 - 128.0));
        assert_eq!(extra(&gqa, Precision::Bf16, 1), 2.0 * 2.0 * (256.0 - 128.0));
        assert_eq!(extra(&gqa, Precision::F32, 2), 4.0 * 2.0 * (256.0 - 128.0) / 2.0);
        // one key/value head a rank: its repeat is a view
        assert_eq!(extra(&gqa, Precision::F32, 4), 0.0);
        // plain multi-head attention and gpt repeat nothing
        assert_eq!(extra(&llama(8, 8), Precision::F32, 1), 0.0);
        let gpt = ModelShape {
            kind: ModelKind::Gpt,
            bias: true,
            ..llama(8, 8)
        };
        assert_eq!(extra(&gpt, Precision::F32, 1), 0.0);
        // through a whole micro-batch: per block and token
        let tokens = 1024.0;
        let whole = |kv| micro_batch_bytes(&gqa, Precision::F32, 1, kv, 4, (true, true), tokens);
        assert_eq!(
            whole(true) - whole(false),
            4.0 * tokens * extra(&gqa, Precision::F32, 1)
        );
    }

    /// `llama(n_head, n_kv_head)` with heads of `hd` (q `n_head hd` wide, not 256), normed per
    /// head or not.
    fn qwen(n_head: u64, n_kv_head: u64, hd: u64, qk_norm: bool) -> ModelShape {
        ModelShape {
            head_dim: hd,
            qk_norm,
            ..llama(n_head, n_kv_head)
        }
    }

    #[test]
    fn the_attention_keeps_q_and_k_and_v_of_the_heads_width() {
        // 8 query heads of 48 (q and the attention's output 384 wide), 4 key/value heads
        // (192), width 256
        let (q, kv, c) = (384.0, 192.0, 256.0);
        let m = qwen(8, 4, 48, false);
        let base = llama(8, 4);
        for (p, bytes) in [(Precision::F32, 4.0), (Precision::Bf16, 2.0)] {
            for tp in [1, 2, 4] {
                // rotated q, k, v, the attention's output, and under bf16 its heads merged into
                // rows: 2 q + 2 kv (+ q) in place of 2 C + 2 (C / 2) (+ C)
                let merged = if p == Precision::Bf16 { 1.0 } else { 0.0 };
                let want = bytes * ((2.0 + merged) * (q - c) + 2.0 * (kv - c / 2.0)) / tp as f64;
                let got = block_bytes_per_token(&m, p, tp, false) - block_bytes_per_token(&base, p, tp, false);
                assert_eq!(got, want, "{p:?} tp {tp}");
            }
        }
        // the products' weights: q x C and C x q, k and v kv x C
        assert_eq!(
            block_product_weights(&m, 2),
            (2.0 * q * c + 2.0 * kv * c + 3.0 * 688.0 * c) / 2.0
        );
        // the rotary tables cast to bf16, [T, hd] for cos and sin, for q and for k, a block
        let tables = |m: &ModelShape| {
            micro_batch_bytes(m, Precision::Bf16, 1, false, 3, (false, false), 0.0)
                - weight_copy_bytes(m, Precision::Bf16, 1, 3, false)
        };
        assert_eq!(tables(&m), 3.0 * 2.0 * 4.0 * 256.0 * 48.0);
        assert_eq!(tables(&base), 3.0 * 2.0 * 4.0 * 256.0 * 32.0);
    }

    #[test]
    fn the_head_norms_keep_their_f32_inputs_and_statistics() {
        let (q, kv) = (384.0, 192.0);
        let (plain, normed) = (qwen(8, 4, 48, false), qwen(8, 4, 48, true));
        for p in [Precision::F32, Precision::Bf16] {
            for tp in [1, 2, 4] {
                // the projections' outputs in f32 (q and k of the rank's heads), a mean and a
                // reciprocal deviation for each of its 12 / tp heads
                let want = 4.0 * (q + kv + 2.0 * 12.0) / tp as f64;
                assert_eq!(head_norm_bytes_per_token(&normed, tp), want);
                let got = block_bytes_per_token(&normed, p, tp, false) - block_bytes_per_token(&plain, p, tp, false);
                assert_eq!(got, want, "{p:?} tp {tp}");
            }
        }
        assert_eq!(head_norm_bytes_per_token(&plain, 1), 0.0);
        // the rotation then takes f32 q and k, and reads the f32 tables: no bf16 copies
        let tables = |m: &ModelShape| {
            micro_batch_bytes(m, Precision::Bf16, 1, false, 3, (false, false), 0.0)
                - weight_copy_bytes(m, Precision::Bf16, 1, 3, false)
        };
        assert!(tables(&plain) > 0.0);
        assert_eq!(tables(&normed), 0.0);
        // nor any weight of theirs among the products'
        assert_eq!(block_product_weights(&normed, 2), block_product_weights(&plain, 2));
    }

    #[test]
    fn a_gpu_repeats_normed_keys_in_f32_and_keeps_their_bf16_copy_whole() {
        // one key/value head a rank (tp 4 of 4): its repeat is a view of it, but bf16 attention
        // casts the normed keys (f32) after the repeat, writing them for every query head; the
        // values (bf16 already) stay a view
        let (q, kv) = (384.0, 192.0);
        let extra = |m: &ModelShape, p: Precision, tp: usize| {
            block_bytes_per_token(m, p, tp, true) - block_bytes_per_token(m, p, tp, false)
        };
        let normed = qwen(8, 4, 48, true);
        assert_eq!(extra(&normed, Precision::Bf16, 4), 2.0 * (q - kv) / 4.0);
        assert_eq!(extra(&normed, Precision::F32, 4), 0.0);
        assert_eq!(extra(&qwen(8, 4, 48, false), Precision::Bf16, 4), 0.0);
        // several a rank: both repeated, as without the norms
        assert_eq!(extra(&normed, Precision::Bf16, 2), 2.0 * 2.0 * (q - kv) / 2.0);
        assert_eq!(extra(&normed, Precision::F32, 1), 4.0 * 2.0 * (q - kv));
        // multi-head attention repeats nothing
        assert_eq!(extra(&qwen(8, 8, 48, true), Precision::Bf16, 8), 0.0);
    }
}
