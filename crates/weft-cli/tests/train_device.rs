//! `train.device` and `train.precision` through the binary: a device this machine cannot use is
//! refused in one line before anything is written; misspelt names are refused naming the key.

mod common;

use common::{fails_with, names, path_set, small_run, temp_dir};

#[test]
fn a_device_that_cannot_be_used_is_one_line_and_nothing_is_written() {
    let out = temp_dir("device-missing");
    let (ckpt, metrics) = (out.join("ckpt"), out.join("m.jsonl"));
    let (c, m) = (
        path_set("train.checkpoint_dir", &ckpt),
        path_set("train.metrics", &metrics),
    );
    // Without a driver every CUDA device is refused; with one, the ordinal past the last.
    let (device, needles) = match weft_core::cuda::device_count() {
        Err(_) => (
            "cuda".to_string(),
            vec!["train.device: cuda:0 is not available: cuda: ".to_string()],
        ),
        Ok(n) => (
            format!("cuda:{n}"),
            vec![format!("train.device: cuda:{n} does not exist: this machine has")],
        ),
    };
    let d = format!("train.device={device:?}");
    let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
    fails_with(&small_run(&["--set", &d, "--set", &c, "--set", &m]), &needles);
    assert!(!ckpt.exists() && !metrics.exists(), "{:?}", names(&out));
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn misspelt_devices_and_precisions_are_refused_naming_the_key() {
    fails_with(
        &small_run(&["--set", "train.device=\"gpu\""]),
        &["train.device: unknown device \"gpu\""],
    );
    fails_with(
        &small_run(&["--set", "train.device=\"cuda:x\""]),
        &["train.device: unknown device \"cuda:x\""],
    );
    fails_with(
        &small_run(&["--set", "train.precision=\"fp8\""]),
        &["train.precision: \"fp8\" is not one of f32, bf16"],
    );
}

#[test]
fn bf16_autocast_trains_close_to_f32() {
    // bf16 rounds every product: the losses follow the f32 run's closely, not exactly
    let f32 = steps_on("cpu", 6, &[], "precision-f32");
    let bf16 = steps_on("cpu", 6, &["--set", "train.precision=\"bf16\""], "precision-bf16");
    assert_eq!(bf16.len(), f32.len());
    for (i, ((b, _), (f, _))) in bf16.iter().zip(&f32).enumerate() {
        assert!((b - f).abs() <= 2e-2 * f.abs(), "step {}: bf16 {b} vs f32 {f}", i + 1);
    }
    // autocast off would give every step's f32 loss and gradient norm exactly; on, a step's
    // mean loss can still round to the f32 one now and then (two of six did, after an edit of
    // the docs the built-in corpus holds), its gradients' norm (f64, over every gradient) not
    let same = bf16.iter().zip(&f32).filter(|(b, f)| b == f).count();
    assert!(
        same <= 1,
        "{same} of {} steps gave exactly the f32 loss and gradient norm: was autocast on?\nbf16 {bf16:?}\nf32 {f32:?}",
        f32.len()
    );
}

#[test]
fn generate_checks_its_device_before_reading_the_checkpoint() {
    let missing = temp_dir("generate-device").join("no-such-checkpoint");
    let ckpt = missing.to_str().unwrap();
    fails_with(
        &["generate", "--checkpoint", ckpt, "--device", "tpu"],
        &["--device: unknown device \"tpu\""],
    );
    match weft_core::cuda::device_count() {
        Err(_) => fails_with(
            &["generate", "--checkpoint", ckpt, "--device", "cuda"],
            &["--device: cuda:0 is not available: cuda: "],
        ),
        Ok(n) => fails_with(
            &["generate", "--checkpoint", ckpt, "--device", &format!("cuda:{n}")],
            &[&format!("--device: cuda:{n} does not exist")],
        ),
    };
}

/// The losses of a small gpt run of `steps` steps on `device`, with `extra` settings.
fn losses_on(device: &str, steps: usize, extra: &[&str], name: &str) -> Vec<f64> {
    steps_on(device, steps, extra, name)
        .into_iter()
        .map(|(loss, _)| loss)
        .collect()
}

/// Each step's `(loss, grad_norm)` of a run of `steps` steps of the small gpt on `device`.
fn steps_on(device: &str, steps: usize, extra: &[&str], name: &str) -> Vec<(f64, f64)> {
    let out = temp_dir(name);
    let metrics = out.join("m.jsonl");
    let (m, d, s) = (
        path_set("train.metrics", &metrics),
        format!("train.device={device:?}"),
        format!("train.steps={steps}"),
    );
    let mut args = small_run(&[
        "--quiet",
        "--set",
        &m,
        "--set",
        &d,
        "--set",
        &s,
        "--set",
        "train.log_every=1",
    ]);
    args.extend(extra);
    common::weft_ok(&args);
    let records = common::read_metrics(&metrics);
    let _ = std::fs::remove_dir_all(&out);
    records
        .iter()
        .filter_map(|r| Some((r["loss"].as_f64()?, r["grad_norm"].as_f64()?)))
        .collect()
}

fn assert_losses_close(gpu: &[f64], cpu: &[f64]) {
    assert_eq!(gpu.len(), cpu.len());
    for (i, (g, c)) in gpu.iter().zip(cpu).enumerate() {
        assert!(
            (g - c).abs() <= 1e-4 * c.abs().max(1.0),
            "step {}: gpu {g} vs cpu {c}",
            i + 1
        );
    }
}

#[test]
fn dropout_gives_the_same_losses_on_cpu_and_gpu() {
    if !common::cuda_or_skip("dropout_gives_the_same_losses_on_cpu_and_gpu") {
        return;
    }
    let extra = ["--set", "model.dropout=0.1"];
    let cpu = losses_on("cpu", 8, &extra, "dropout-cpu");
    let gpu = losses_on("cuda", 8, &extra, "dropout-gpu");
    assert_losses_close(&gpu, &cpu);
}

#[test]
fn a_gpu_checkpoint_resumes_on_the_cpu() {
    if !common::cuda_or_skip("a_gpu_checkpoint_resumes_on_the_cpu") {
        return;
    }
    let out = temp_dir("gpu-to-cpu");
    let ckpt = path_set("train.checkpoint_dir", &out.join("ckpt"));
    let metrics = out.join("m.jsonl");
    let m = path_set("train.metrics", &metrics);
    #[rustfmt::skip]
    let first = small_run(&["--quiet", "--set", "train.device=\"cuda\"", "--set", "train.steps=3", "--set", &ckpt,
        "--set", &m, "--set", "train.log_every=1"]);
    common::weft_ok(&first);
    #[rustfmt::skip]
    let rest = small_run(&["--quiet", "--resume", "--set", "train.device=\"cpu\"", "--set", "train.steps=6", "--set", &ckpt,
        "--set", &m, "--set", "train.log_every=1"]);
    common::weft_ok(&rest);
    let resumed = common::losses(&metrics);
    let cpu = losses_on("cpu", 6, &[], "gpu-to-cpu-reference");
    assert_losses_close(&resumed, &cpu);
    let _ = std::fs::remove_dir_all(&out);
}
