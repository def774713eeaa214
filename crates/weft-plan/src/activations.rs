//! What weft's autograd graph keeps of one micro-batch between its forward and its backward,
//! tensor by tensor, as the models compute (`weft_models::gpt`, `weft_models::llama`) and as
//! autocast casts (`weft_core::autocast`). One accounting for the planner
//! ([`crate::memory::stage_memory`]) and for the check before a run
//! (`weft_train::memory::estimate`); `crates/weft-cli/tests/plan.rs` holds it to the bytes the
//! graph of a small gpt and llama forward keeps, in f32 and bf16, with and without tensor
//! parallelism.
//!
//! Per token of a block, on one tensor-parallel rank of `tp` (`C` = `n_embd`, `I` the MLP's
//! width, `kv` the key/value width, `H` the heads; `/tp` what the rank's heads and MLP slice
//! hold):
//!
//! - f32 always: the two norms' outputs and the two residual sums (`4C`), the norms' mean and
//!   reciprocal deviation (4), the attention's log-sum-exp (`H/tp`);
//! - in the products' dtype (4 bytes in f32, 2 in bf16), cut by tp: gpt's q, k, v and attention
//!   output (`4C`) and MLP pre-activation and GELU output (`2I`; under bf16 with biases the
//!   product, its sum with the bias and the GELU, `3I`, as bf16 does not fuse them); llama's
//!   q, k, v (`C + 2kv`), rotated q and k (`C + kv`), attention output (`C`), under bf16 the
//!   heads merged into rows (`C`: f32 attention writes them in place), and the MLP's gate, up
//!   and product (`3I`: in f32 `silu_mul` takes the gate before its activation; under bf16 the
//!   SiLU's output too, `4I`); grouped-query attention reads the shared key/value heads in
//!   place on CPU; on a GPU (`kv_repeated`), which repeats them to every query head first, the
//!   repeated keys and values (`2C`) where a rank holds more than one key/value head (one head
//!   repeated is a view of it);
//! - each of the two row-parallel products (gpt's `c_proj`s, llama's `o_proj` and
//!   `down_proj`), whole: at `tp = 1` its output (`C`, products' dtype) unless an f32 layer with
//!   a bias adds bias and residual in the product's own op; at `tp > 1` its partial sum and the
//!   group's sum (`2C`, products' dtype) and, with a bias, the sum plus bias (`C`, f32);
//! - under bf16 only: each product's bf16 copy of the f32 norm output it reads (gpt 2, llama 5:
//!   q, k, v, gate and up each cast their own; `C` each, whole), and the f32 copy of each bf16
//!   row-parallel output added to f32 (`C` each).
//!
//! Per micro-batch besides its tokens' ([`micro_batch_bytes`]): under bf16 each product casts
//! its f32 weight (and bias) to bf16 in every forward, and the graph keeps the copy until the
//! backward: 2 bytes per parameter of the rank's products ([`weight_copy_bytes`]); llama's
//! rotary tables cast to bf16 for q and k (`4 T hd` elements a block); gpt's position
//! embeddings (`T C`, f32).

use crate::model::{ModelKind, ModelShape, Precision};

/// Bytes of one element by what computes it, under a precision.
struct Dtypes {
    /// The products' outputs: 4 in f32, 2 in bf16.
    low: f64,
    /// The bf16 copy autocast makes of an f32 input to a product: 2, none in f32.
    cast_low: f64,
    /// The f32 copy of a bf16 tensor an f32 op reads (the residual addition, the loss): 4,
    /// none in f32.
    cast_f32: f64,
}

fn dtypes(precision: Precision) -> Dtypes {
    match precision {
        Precision::F32 => Dtypes {
            low: 4.0,
            cast_low: 0.0,
            cast_f32: 0.0,
        },
        Precision::Bf16 => Dtypes {
            low: 2.0,
            cast_low: 2.0,
            cast_f32: 4.0,
        },
    }
}

/// Activation bytes one block keeps per token on one rank of `tp`; `kv_repeated`: the device
/// repeats grouped-query keys and values to the query heads ([`crate::Workload::kv_repeated`]).
pub fn block_bytes_per_token(model: &ModelShape, precision: Precision, tp: usize, kv_repeated: bool) -> f64 {
    let d = dtypes(precision);
    let bf16 = precision == Precision::Bf16;
    let (c, i, kv, t) = (model.n_embd as f64, model.intermediate as f64, kv(model), tp as f64);
    // norms' outputs and residual sums, the norms' statistics, the log-sum-exp
    let f32_bytes = 4.0 * (4.0 * c + 4.0 + model.n_head as f64 / t);
    let (cut, casts) = match model.kind {
        ModelKind::Gpt => {
            let mlp = if bf16 && model.bias { 3.0 * i } else { 2.0 * i };
            (4.0 * c + mlp, 2.0 * c)
        }
        ModelKind::Llama => {
            let merged = if bf16 { c } else { 0.0 };
            let mlp = if bf16 { 4.0 * i } else { 3.0 * i };
            let kv_heads_here = model.n_kv_head / tp.max(1) as u64;
            let repeated = if kv_repeated && model.n_kv_head < model.n_head && kv_heads_here > 1 {
                2.0 * c
            } else {
                0.0
            };
            (3.0 * c + 3.0 * kv + merged + mlp + repeated, 5.0 * c)
        }
    };
    let row = if tp == 1 {
        let fused = model.bias && !bf16;
        (if fused { 0.0 } else { d.low * c }) + d.cast_f32 * c
    } else {
        2.0 * d.low * c + if model.bias { 4.0 * c } else { 0.0 } + d.cast_f32 * c
    };
    f32_bytes + d.low * cut / t + d.cast_low * casts + 2.0 * row
}

fn kv(model: &ModelShape) -> f64 {
    (model.n_kv_head * (model.n_embd / model.n_head.max(1))) as f64
}

/// Activation bytes per token the first stage keeps besides its blocks: the token ids (8) and
/// the embeddings' outputs in f32 (gpt: the token lookup and its sum with the positions', `2C`;
/// llama: the lookup, `C`); a vocabulary-parallel embedding (`tp > 1`) also keeps its lookup and
/// masked partial sum (`2C`).
pub fn first_bytes_per_token(model: &ModelShape, tp: usize) -> f64 {
    let c = model.n_embd as f64;
    let e = match model.kind {
        ModelKind::Gpt => 2.0 * c,
        ModelKind::Llama => c,
    };
    8.0 + 4.0 * (e + if tp > 1 { 2.0 * c } else { 0.0 })
}

/// Activation bytes per token the last stage keeps besides its blocks: the final norm's output
/// and statistics (`C + 2`, f32), the logits (`V/tp`, the products' dtype), the f32 gradient of
/// the logits the backward makes first (`V/tp`), the loss's log-sum-exp and targets (12 bytes);
/// under bf16 also the norm output's bf16 copy (`C`) and, at `tp = 1`, the logits' f32 copy the
/// loss reads (`V`; the vocabulary-parallel loss reads them as they are).
pub fn last_bytes_per_token(model: &ModelShape, precision: Precision, tp: usize) -> f64 {
    let d = dtypes(precision);
    let c = model.n_embd as f64;
    let v = model.vocab as f64 / tp as f64;
    let widened = if tp == 1 { d.cast_f32 * v } else { 0.0 };
    4.0 * (c + 2.0) + d.low * v + 4.0 * v + 12.0 + d.cast_low * c + widened
}

/// Parameters the matrix products of one block read on one rank of `tp`: every weight but
/// the norms', the column-parallel biases, and the row-parallel biases where the product adds
/// them itself (`tp = 1`; a row-parallel layer adds its whole bias after the group's sum).
pub fn block_product_params(model: &ModelShape, tp: usize) -> f64 {
    let (cut, _) = model.block_params_split();
    let row_biases = if model.bias && tp == 1 {
        2.0 * model.n_embd as f64
    } else {
        0.0
    };
    cut / tp as f64 + row_biases
}

/// Bytes of the bf16 weight copies one micro-batch's graph keeps on a rank of `tp` holding
/// `blocks` blocks and (`last`) the output layer, `V x C / tp` (the token embedding's lookup
/// reads f32): 2 per parameter under bf16, none in f32.
pub fn weight_copy_bytes(model: &ModelShape, precision: Precision, tp: usize, blocks: usize, last: bool) -> f64 {
    let head = if last {
        model.vocab as f64 * model.n_embd as f64 / tp as f64
    } else {
        0.0
    };
    dtypes(precision).cast_low * (blocks as f64 * block_product_params(model, tp) + head)
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
        // the position embeddings' lookup, `[T, C]` f32
        ModelKind::Gpt if first => 4.0 * t * model.n_embd as f64,
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
        // k and v repeated to the rank's query heads: 2 C / tp elements in the products' dtype
        assert_eq!(extra(&gqa, Precision::F32, 1), 4.0 * 2.0 * 256.0);
        assert_eq!(extra(&gqa, Precision::Bf16, 1), 2.0 * 2.0 * 256.0);
        assert_eq!(extra(&gqa, Precision::F32, 2), 4.0 * 2.0 * 256.0 / 2.0);
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
