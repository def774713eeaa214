//! `weft train` against PyTorch: every fixture case (3 models x 3 optimizers, plus gpt without
//! biases) must reproduce PyTorch's per-step losses within 1e-4 relative, its learning rates
//! exactly, and its pre-clipping gradient norms within 1e-4 relative. Also: a run stopped and
//! resumed gives the uninterrupted run's losses bit for bit.

mod common;

use common::{check_against_pytorch, fixtures, read_metrics, temp_dir, train_config, weft_ok};

/// Trains fixture `case` on `device` and compares it with PyTorch's run (on the CPU).
fn check_case_on(case: &str, device: &str) {
    let dir = fixtures().join(case);
    let out = temp_dir(&format!("align-{case}-{}", device.replace(':', "")));
    let metrics = out.join("metrics.jsonl");
    train_config(
        &dir.join("run.toml"),
        1,
        &metrics,
        &[],
        &[format!("train.device={device:?}")],
    );
    check_against_pytorch(case, &metrics);
    let _ = std::fs::remove_dir_all(&out);
}

fn check_case(case: &str) {
    check_case_on(case, "cpu");
}

macro_rules! cases {
    ($($name:ident),*) => {
        $(#[test]
        fn $name() {
            check_case(stringify!($name));
        })*
        /// The same cases with `train.device = "cuda"` (f32, TF32 off): PyTorch's CPU losses
        /// within the same tolerances. Skipped, one line each, without a CUDA device.
        mod on_gpu {
            $(#[test]
            fn $name() {
                if super::common::cuda_or_skip(concat!("on_gpu::", stringify!($name))) {
                    super::check_case_on(stringify!($name), "cuda");
                }
            })*
        }
    };
}

cases!(
    gpt_adamw,
    gpt_adam,
    gpt_sgd,
    gpt_nobias_adamw,
    mlp_adamw,
    mlp_adam,
    mlp_sgd,
    convnet_adamw,
    convnet_adam,
    convnet_sgd
);

#[test]
fn resume_reproduces_the_uninterrupted_run_bit_for_bit() {
    let config = fixtures().join("gpt_adamw/run.toml");
    let config = config.to_str().unwrap();
    let out = temp_dir("resume");
    let set = |k: &str, v: &str| format!("train.{k}={v}");
    let full = out.join("full.jsonl");
    weft_ok(&[
        "train",
        "--config",
        config,
        "--quiet",
        "--set",
        &set("metrics", &format!("{:?}", full.to_str().unwrap())),
    ]);
    let ckpt = out.join("ckpt");
    let part = out.join("part.jsonl");
    let common = [
        "--quiet".to_string(),
        "--set".into(),
        set("metrics", &format!("{:?}", part.to_str().unwrap())),
        "--set".into(),
        set("checkpoint_dir", &format!("{:?}", ckpt.to_str().unwrap())),
        "--set".into(),
        set("checkpoint_every", "10"),
    ];
    let mut first: Vec<&str> = vec!["train", "--config", config];
    first.extend(common.iter().map(String::as_str));
    let stop = set("steps", "25");
    first.extend(["--set", stop.as_str()]);
    weft_ok(&first);
    // steps 1 to 25 ran; checkpoints after 10, 20 and 25 (the end)
    let mut second: Vec<&str> = vec!["train", "--config", config, "--resume"];
    second.extend(common.iter().map(String::as_str));
    weft_ok(&second);
    let (a, b) = (read_metrics(&full), read_metrics(&part));
    assert_eq!(b.len(), a.len(), "the resumed run appends to the metrics file");
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x["step"], y["step"]);
        assert_eq!(
            x["loss"].as_f64(),
            y["loss"].as_f64(),
            "step {}: losses differ after resume",
            x["step"]
        );
        assert_eq!(x["grad_norm"].as_f64(), y["grad_norm"].as_f64(), "step {}", x["step"]);
    }
    let kept: Vec<_> = std::fs::read_dir(&ckpt)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        kept.iter()
            .all(|n| n.starts_with("step-") || n == weft_train::checkpoint::LOCK),
        "no temporary folders left: {kept:?}"
    );
    let _ = std::fs::remove_dir_all(&out);
}
