//! `weft train` with `[parallel] tp = 2` (Megatron's layout of the gpt), alone and in a
//! dp = 2 x tp = 2 mesh with and without ZeRO, under `weft launch`: the PyTorch fixture's loss
//! curve within 1e-4 (with gradient clipping on, so the gradient norm must be the whole
//! model's); checkpoints hold whole tensors, resume exactly and load into one process; a
//! layout the model cannot take is refused on every rank.

mod common;

use std::path::{Path, PathBuf};

use common::{check_against_pytorch, fixtures, read_metrics, temp_dir, weft, weft_ok};

/// Runs the gpt fixture on `dp · tp` ranks with extra `--set`s; returns the metrics file.
fn train(dp: usize, tp: usize, out: &Path, name: &str, extra: &[String]) -> PathBuf {
    let metrics = out.join(format!("{name}.jsonl"));
    let _ = std::fs::remove_file(&metrics);
    let config = fixtures().join("gpt_adamw/run.toml");
    let bin = env!("CARGO_BIN_EXE_weft");
    let mut sets = vec![
        format!("train.metrics={:?}", metrics.to_str().unwrap()),
        format!("parallel.dp={dp}"),
        format!("parallel.tp={tp}"),
    ];
    sets.extend(extra.iter().cloned());
    let n = (dp * tp).to_string();
    let mut args = vec!["launch", "--nproc-per-node", &n, "--", bin, "train"];
    args.extend(["--config", config.to_str().unwrap(), "--quiet"]);
    for s in &sets {
        args.extend(["--set", s]);
    }
    weft_ok(&args);
    metrics
}

fn losses(metrics: &Path) -> Vec<f64> {
    read_metrics(metrics)
        .iter()
        .filter_map(|r| r["loss"].as_f64())
        .collect()
}

fn assert_same_curve(a: &[f64], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: number of steps");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * x.abs(), "{what} step {i}: {x} vs {y}");
    }
}

#[test]
fn tp_2_alone_and_with_dp_2_and_zero_reproduce_pytorch() {
    let out = temp_dir("tp-curves");
    let mut curves = Vec::new();
    for (dp, tp, zero) in [(1, 2, 0), (2, 2, 0), (2, 2, 1), (2, 2, 3)] {
        let name = format!("dp{dp}-tp{tp}-zero{zero}");
        let metrics = train(dp, tp, &out, &name, &[format!("parallel.zero={zero}")]);
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
    let dir = format!("train.checkpoint_dir={:?}", ckpt.to_str().unwrap());
    let whole = losses(&train(1, 2, &out, "whole", &[]));
    train(1, 2, &out, "first", &[dir.clone(), "train.steps=20".into()]);
    // the checkpoint holds whole tensors under PyTorch's names (the padded vocabulary cut away)
    let step20 = ckpt.join("step-00000020");
    let params = weft_core::io::safetensors::load(&step20.join("model.safetensors"))
        .unwrap()
        .tensors;
    assert_eq!(params["transformer.wte.weight"].shape(), [65, 32]);
    assert_eq!(params["transformer.h.0.attn.c_attn.weight"].shape(), [96, 32]);
    assert_eq!(params["transformer.h.1.mlp.c_proj.weight"].shape(), [32, 128]);
    let opt = weft_core::io::safetensors::load(&step20.join("optimizer.safetensors"))
        .unwrap()
        .tensors;
    assert_eq!(opt["transformer.h.0.attn.c_attn.weight.exp_avg"].shape(), [96, 32]);
    // resumed at tp = 2: the same losses, bit for bit
    let bin = env!("CARGO_BIN_EXE_weft");
    let config = fixtures().join("gpt_adamw/run.toml");
    let resumed = out.join("resumed.jsonl");
    let metrics = format!("train.metrics={:?}", resumed.to_str().unwrap());
    let copy = out.join("ckpt-copy");
    std::fs::create_dir_all(&copy).unwrap();
    std::fs::create_dir_all(copy.join("step-00000020")).unwrap();
    for f in ["model.safetensors", "optimizer.safetensors", "state.json"] {
        std::fs::copy(step20.join(f), copy.join("step-00000020").join(f)).unwrap();
    }
    #[rustfmt::skip]
    weft_ok(&["launch", "--nproc-per-node", "2", "--", bin, "train", "--config", config.to_str().unwrap(),
        "--quiet", "--resume", "--set", &dir, "--set", &metrics, "--set", "parallel.tp=2"]);
    assert_eq!(&whole[20..], &losses(&resumed)[..], "resumed at tp=2 vs uninterrupted");
    // resumed by one process
    let single = out.join("single.jsonl");
    let metrics = format!("train.metrics={:?}", single.to_str().unwrap());
    let copy_dir = format!("train.checkpoint_dir={:?}", copy.to_str().unwrap());
    #[rustfmt::skip]
    weft_ok(&["train", "--config", config.to_str().unwrap(), "--quiet", "--resume", "--set", &copy_dir,
        "--set", &metrics]);
    assert_same_curve(
        &whole[20..],
        &losses(&single),
        1e-5,
        "tp=2 checkpoint resumed by one process",
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn the_built_in_run_samples_from_a_tensor_parallel_model() {
    let bin = env!("CARGO_BIN_EXE_weft");
    #[rustfmt::skip]
    let out = weft_ok(&["launch", "--nproc-per-node", "2", "--", bin, "train", "--quiet",
        "--set", "train.steps=2", "--set", "train.eval_every=0", "--set", "train.sample_tokens=20",
        "--set", "parallel.tp=2"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.matches("--- sample (20 characters) ---").count(), 1, "{stdout}");
}

#[test]
fn a_layout_the_model_cannot_take_is_refused_on_every_rank() {
    let bin = env!("CARGO_BIN_EXE_weft");
    let config = fixtures().join("gpt_adamw/run.toml");
    // the fixture gpt has 2 heads
    #[rustfmt::skip]
    let out = weft(&["launch", "--nproc-per-node", "4", "--", bin, "train", "--config",
        config.to_str().unwrap(), "--quiet", "--set", "parallel.tp=4"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("n_head") && err.contains("parallel.tp = 4"), "{err}");
    let mlp = fixtures().join("mlp_sgd/run.toml");
    #[rustfmt::skip]
    let out = weft(&["train", "--config", mlp.to_str().unwrap(), "--quiet", "--set", "parallel.tp=2"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("parallel.tp") && err.contains("gpt"), "{err}");
}
