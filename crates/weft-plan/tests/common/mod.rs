//! Shapes, workloads and the H100 spec the planner's tests share.

use weft_plan::{DeviceSpec, ModelKind, ModelShape, Precision, Workload};

pub fn gpt(n_layer: u64, n_head: u64, n_embd: u64, vocab: u64, seq_len: u64) -> ModelShape {
    ModelShape {
        kind: ModelKind::Gpt,
        vocab,
        seq_len,
        n_layer,
        n_head,
        n_kv_head: n_head,
        n_embd,
        head_dim: n_embd / n_head,
        intermediate: 4 * n_embd,
        tied: true,
        bias: true,
        qk_norm: false,
    }
}

pub fn work(model: ModelShape, global_batch: u64) -> Workload {
    Workload {
        model,
        global_batch,
        precision: Precision::Bf16,
        grad_accum: 1,
        optimizer_moments: 2,
        kv_repeated: false,
        fused_accumulation: false,
    }
}

pub fn h100() -> DeviceSpec {
    DeviceSpec::builtin("h100-sxm-80gb").unwrap()
}
