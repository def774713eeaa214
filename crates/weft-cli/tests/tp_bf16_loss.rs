//! `train.precision = "bf16"` at `parallel.tp = 2`: the vocabulary-parallel loss runs as
//! autocast's f32 `cross_entropy` does, so the logged losses are f32 values that follow one
//! process's within 1e-4 (not the loss rounded to bf16, up to 0.4% off), for the gpt and the
//! llama, with and without sequence parallelism.

mod common;

use std::path::Path;

use common::{assert_same_curve, losses, temp_dir, train_fixture};

const STEPS: usize = 4;

fn bf16_losses(case: &str, ranks: usize, out: &Path, sets: &[&str]) -> Vec<f64> {
    let metrics = out.join(format!("{case}-{ranks}.jsonl"));
    let steps = format!("train.steps={STEPS}");
    let mut all = vec!["train.precision=\"bf16\"", steps.as_str()];
    all.extend(sets);
    train_fixture(case, ranks, &metrics, &[], &all);
    losses(&metrics)
}

/// Whether `x` is a bf16 value (its f32 form has no bits below bf16's 8-bit significand).
fn is_bf16(x: f64) -> bool {
    (x as f32).to_bits() & 0xffff == 0
}

#[test]
fn a_bf16_loss_at_tp_2_is_computed_in_f32_and_follows_one_process() {
    let out = temp_dir("tp-bf16-loss");
    for case in ["gpt_adamw", "llama_gqa_adamw"] {
        let one = bf16_losses(case, 1, &out, &[]);
        let tp2 = bf16_losses(case, 2, &out, &["parallel.tp=2"]);
        eprintln!("{case}: one process {one:?}\n{case}: tp=2 {tp2:?}");
        assert_eq!(one.len(), STEPS, "{case}: steps logged");
        assert!(
            !tp2.iter().all(|&x| is_bf16(x)),
            "{case}: every tp=2 loss is a bf16 value: {tp2:?}"
        );
        assert_same_curve(&one, &tp2, 1e-4, &format!("{case}: tp=2 vs one process under bf16"));
        // sequence-parallel: the f32 norms' outputs gathered before autocast casts them
        let sp = bf16_losses(case, 2, &out, &["parallel.tp=2", "parallel.sequence_parallel=true"]);
        assert_same_curve(
            &one,
            &sp,
            1e-4,
            &format!("{case}: tp=2 sequence-parallel vs one process under bf16"),
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}
