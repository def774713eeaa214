//! `weft train` with `[parallel] tp = 2` (Megatron's layout of the gpt), alone and in a
//! dp = 2 x tp = 2 mesh with and without ZeRO and sequence parallelism, under `weft launch`: the PyTorch fixture's loss
//! curve within 1e-4 (with gradient clipping on, so the gradient norm must be the whole
//! model's); checkpoints hold whole tensors, resume exactly and load into one process; a
//! layout the model cannot take is refused on every rank.

mod common;

use std::path::{Path, PathBuf};

use common::{
    assert_same_curve, check_against_pytorch, fixtures, launch_train, launch_train_ok, losses, path_set,
    resume_in_one_process, sample_of_built_in_run, temp_dir, weft,
};

fn config() -> PathBuf {
    fixtures().join("gpt_adamw/run.toml")
}

/// Runs the gpt fixture on `dp · tp` ranks with extra `--set`s (and `flags`); returns the
/// metrics file.
fn train(dp: usize, tp: usize, out: &Path, name: &str, flags: &[&str], extra: &[String]) -> PathBuf {
    let metrics = out.join(format!("{name}.jsonl"));
    let _ = std::fs::remove_file(&metrics);
    let mut sets = vec![
        path_set("train.metrics", &metrics),
        format!("parallel.dp={dp}"),
        format!("parallel.tp={tp}"),
    ];
    sets.extend(extra.iter().cloned());
    launch_train_ok(dp * tp, Some(&config()), flags, &sets);
    metrics
}

#[test]
fn tp_2_alone_and_with_dp_2_and_zero_reproduce_pytorch() {
    let out = temp_dir("tp-curves");
    let mut curves = Vec::new();
    // `sp`: sequence parallelism, each rank holding half the tokens between the
    // tensor-parallel regions
    for (dp, tp, zero, sp) in [
        (1, 2, 0, false),
        (2, 2, 0, false),
        (2, 2, 1, false),
        (2, 2, 3, false),
        (1, 2, 0, true),
        (2, 2, 1, true),
    ] {
        let name = format!("dp{dp}-tp{tp}-zero{zero}{}", if sp { "-sp" } else { "" });
        let sets = [
            format!("parallel.zero={zero}"),
            format!("parallel.sequence_parallel={sp}"),
        ];
        let metrics = train(dp, tp, &out, &name, &[], &sets);
        let worst = check_against_pytorch("gpt_adamw", &metrics);
        eprintln!("{name}: max relative loss difference to PyTorch {worst:.2e}");
        curves.push((name, losses(&metrics)));
    }
    for (name, c) in &curves[1..] {
        assert_same_curve(&curves[0].1, c, 1e-5, &format!("{name} vs tp=2"));
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_tensor_parallel_checkpoint_is_whole_resumes_exactly_and_loads_into_one_process() {
    let out = temp_dir("tp-ckpt");
    let ckpt = out.join("ckpt");
    let dir = path_set("train.checkpoint_dir", &ckpt);
    let whole = losses(&train(1, 2, &out, "whole", &[], &[]));
    train(1, 2, &out, "first", &[], &[dir.clone(), "train.steps=20".into()]);
    // each rank wrote its own slice of the cut tensors; read back, they are whole under
    // PyTorch's names (the padded vocabulary cut away)
    let step20 = ckpt.join("step-00000020");
    let index = weft_train::checkpoint::read_index(&step20).unwrap();
    let wte = &index.model["transformer.wte.weight"];
    let files: Vec<&str> = wte.pieces.iter().map(|p| p.file.as_str()).collect();
    assert_eq!(files, ["model-rank-00000.safetensors", "model-rank-00001.safetensors"]);
    // a tensor every rank holds whole is written once
    assert_eq!(index.model["transformer.ln_f.weight"].pieces.len(), 1);
    let loaded = weft_train::checkpoint::read(&step20).unwrap();
    let params = &loaded.params;
    assert_eq!(params["transformer.wte.weight"].shape(), [65, 32]);
    assert_eq!(params["transformer.h.0.attn.c_attn.weight"].shape(), [96, 32]);
    assert_eq!(params["transformer.h.1.mlp.c_proj.weight"].shape(), [32, 128]);
    assert_eq!(
        loaded.optimizer["transformer.h.0.attn.c_attn.weight.exp_avg"].shape(),
        [96, 32]
    );
    // resumed by one process (copied before the resumed run writes newer checkpoints)
    let scratch = out.join("one");
    let one = resume_in_one_process(&config(), &step20, &scratch);
    assert_same_curve(&whole[20..], &one, 1e-5, "tp=2 checkpoint resumed by one process");
    // resumed at tp = 2: the same losses, bit for bit
    let resumed = train(1, 2, &out, "resumed", &["--resume"], &[dir]);
    assert_eq!(&whole[20..], &losses(&resumed)[..], "resumed at tp=2 vs uninterrupted");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn the_built_in_run_samples_from_the_tensor_parallel_model_put_together() {
    // the same sample as one process draws after the same steps
    let run = ["train.steps=4", "train.eval_every=2", "train.sample_tokens=40"];
    let cut = sample_of_built_in_run(2, &["parallel.tp=2"], &run);
    let one = sample_of_built_in_run(1, &[], &run);
    assert_eq!(cut, one);
    let sequence = ["parallel.tp=2", "parallel.sequence_parallel=true"];
    assert_eq!(sample_of_built_in_run(2, &sequence, &run), one);
}

#[test]
fn a_layout_the_model_cannot_take_is_refused_on_every_rank() {
    // the fixture gpt has 2 heads
    let out = launch_train(4, Some(&config()), &[], &["parallel.tp=4"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("n_head") && err.contains("parallel.tp = 4"), "{err}");
    let mlp = fixtures().join("mlp_sgd/run.toml");
    #[rustfmt::skip]
    let out = weft(&["train", "--config", mlp.to_str().unwrap(), "--quiet", "--set", "parallel.tp=2"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("parallel.tp") && err.contains("gpt"), "{err}");
    // sequence parallelism needs a tensor-parallel group
    #[rustfmt::skip]
    let out = weft(&["train", "--config", config().to_str().unwrap(), "--quiet", "--set", "parallel.sequence_parallel=true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("parallel.sequence_parallel") && err.contains("tp > 1"),
        "{err}"
    );
    // nor a model with dropout, nor a sequence whose tokens do not cut into tp parts
    for (extra, words) in [
        ("model.dropout=0.1", ["model.dropout", "sequence_parallel"]),
        (
            "model.block_size=15",
            ["model.block_size", "15 does not divide by parallel.tp = 2"],
        ),
    ] {
        let sets = ["parallel.tp=2", "parallel.sequence_parallel=true", extra];
        let out = launch_train(2, Some(&config()), &[], &sets);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra}");
        assert!(words.iter().all(|w| err.contains(w)), "{extra}: {err}");
    }
}
