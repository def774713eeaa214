//! What weft's autograd graph keeps of one micro-batch between its forward and its backward,
//! tensor by tensor, as the models compute (`weft_models::gpt`, `weft_models::llama`) and as
//! autocast casts (`weft_core::autocast`). One accounting for the planner
//! ([`crate::memory::stage_memory`]) and for the check before a run
//! (`weft_train::memory::estimate`); `crates/weft-cli/tests/plan.rs` holds it to the bytes the
//! graph of a small gpt and llama forward keeps, in f32 and bf16, with and without tensor
//! parallelism.
//!
//! weft's autograd keeps of an op's inputs only those its backward formula reads (and a
//! tensor whose own op reads it as an output: softmax, attention); a product's output that only
//! a sum, a bias, a cast or a tensor-parallel reduction reads is freed during the forward. Per
//! token of a block, on one tensor-parallel rank of `tp` (`C` = `n_embd`, `I` the MLP's width,
//! `kv` the key/value width, `H` the heads; `/tp` what the rank's heads and MLP slice hold):
//!
//! - f32 always: the two residual sums, which the norms read (`2C`), the norms' mean and
//!   reciprocal deviation (4), the attention's log-sum-exp (`H/tp`); in f32 also the norms'
//!   outputs, which the products read (`2C`; under bf16 only their bf16 copies are read);
//! - in the products' dtype (4 bytes in f32, 2 in bf16), cut by tp: gpt's q, k, v and attention
//!   output (`4C`; under bf16 with biases the sum with the bias, not the product) and MLP
//!   pre-activation and GELU output (`2I`); llama's rotated q and k and its v (`C + 2kv`: the
//!   rotation reads only its tables, so the unrotated q and k are freed), attention output
//!   (`C`), under bf16 the heads merged into rows (`C`: f32 attention writes them in place), and
//!   the MLP's gate, up and product (`3I`: in f32 `silu_mul` takes the gate before its
//!   activation; under bf16 the SiLU's output too, `4I`); grouped-query attention reads the
//!   shared key/value heads in place on CPU; on a GPU (`kv_repeated`), which repeats them to
//!   every query head first, the repeated keys and values (`2C`) in place of the rank's own
//!   (`2kv`) where a rank holds more than one key/value head (one head repeated is a view of
//!   it, and keeps it);
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
//! block).

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
    let (c, i, kv, t) = (model.n_embd as f64, model.intermediate as f64, kv(model), tp as f64);
    // residual sums, the norms' statistics, the log-sum-exp; in f32 the norms' outputs
    let norm_outputs = if bf16 { 0.0 } else { 2.0 * c };
    let f32_bytes = 4.0 * (2.0 * c + norm_outputs + 4.0 + model.n_head as f64 / t);
    let (cut, casts) = match model.kind {
        ModelKind::Gpt => (4.0 * c + 2.0 * i, 2.0 * c),
        ModelKind::Llama => {
            let merged = if bf16 { c } else { 0.0 };
            let mlp = if bf16 { 4.0 * i } else { 3.0 * i };
            let kv_heads_here = model.n_kv_head / tp.max(1) as u64;
            let repeated = kv_repeated && model.n_kv_head < model.n_head && kv_heads_here > 1;
            let keys_values = if repeated { 2.0 * c } else { 2.0 * kv };
            (2.0 * c + keys_values + merged + mlp, 5.0 * c)
        }
    };
    f32_bytes + d.low * cut / t + d.cast_low * casts
}

fn kv(model: &ModelShape) -> f64 {
    (model.n_kv_head * (model.n_embd / model.n_head.max(1))) as f64
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
        // q and o C x C, k and v kv x C, gate, up and down I x C
        ModelKind::Llama => 2.0 * c * c + 2.0 * kv(model) * c + 3.0 * i * c,
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
        // the cos and sin tables cast to bf16 for q and for k, `[T, hd]` each
        ModelKind::Llama => {
            let hd = (model.n_embd / model.n_head.max(1)) as f64;
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
            intermediate: 688,
            tied: false,
            bias: false,
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
}
