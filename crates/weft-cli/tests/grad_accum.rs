//! Gradient accumulation (`[train] grad_accum = K`) through the real `weft` binary and launcher:
//! PyTorch's losses, learning rates (the `linear` and `wsd` schedules through `LambdaLR`) and
//! gradient norms within 1e-4 relative in one process, at dp=2 with ZeRO 0-3, at tp=2, at pp=2
//! with pipeline micro-batches, and on a GPU when there is one; the same run as one batch of `K`
//! times the rows; a resumed run equal to the uninterrupted one bit for bit (batches and text);
//! gradients averaged once per step; and bad settings refused in one line. Fixtures from
//! `tools/reference/make_accum_fixtures.py`.

mod common;

use std::path::{Path, PathBuf};

use common::{
    assert_same_curve, check_against_pytorch, fails_with, fixture_config, fixtures, launch_train_ok, losses, path_set,
    read_metrics, resume_in_one_process, temp_dir, train_fixture, weft_ok,
};

const CASES: [&str; 4] = [
    "gpt_adamw_accum2",
    "gpt_adamw_accum4",
    "mlp_adamw_accum2",
    "mlp_adamw_accum4",
];

/// Runs fixture `case` in one process with extra `--set`s; returns the metrics file.
fn train_one(case: &str, out: &Path, tag: &str, extra: &[String]) -> PathBuf {
    train_launched(case, 1, out, tag, &[], extra)
}

/// Runs fixture `case` on `ranks` ranks (launched when more than one) with `--set`s `layout`
/// (and `flags`); returns the metrics file.
fn train_launched(case: &str, ranks: usize, out: &Path, tag: &str, flags: &[&str], layout: &[String]) -> PathBuf {
    let metrics = out.join(format!("{case}-{tag}.jsonl"));
    train_fixture(case, ranks, &metrics, flags, layout);
    metrics
}

fn grad_norms(metrics: &Path) -> Vec<f64> {
    read_metrics(metrics)
        .iter()
        .map(|r| r["grad_norm"].as_f64().unwrap())
        .collect()
}

#[test]
fn one_process_matches_pytorch_for_gpt_and_mlp_at_k_2_and_4() {
    let out = temp_dir("accum-one");
    for case in CASES {
        let metrics = train_one(case, &out, "one", &[]);
        let worst = check_against_pytorch(case, &metrics);
        eprintln!("{case}: one process, max relative loss difference to PyTorch {worst:.2e}");
        // every step waited for its K batches; the field is there and is a duration
        for r in read_metrics(&metrics) {
            let w = r["data_wait_ms"].as_f64().expect("data_wait_ms in every step record");
            assert!(w >= 0.0 && w.is_finite(), "{case}: data_wait_ms {w}");
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn k_micro_batches_equal_one_batch_of_k_times_the_rows() {
    let out = temp_dir("accum-merged");
    for case in CASES {
        let accumulated = train_one(case, &out, "accum", &[]);
        let merged = fixtures().join(case).join("merged.safetensors");
        let sets = [path_set("data.path", &merged), "train.grad_accum=1".to_string()];
        let big = train_one(case, &out, "big", &sets);
        // the mean of K equal-sized micro-batch means is the mean over their rows, and the
        // gradients are equal up to rounding: the curves agree far inside PyTorch's tolerance
        assert_same_curve(&losses(&big), &losses(&accumulated), 1e-5, &format!("{case}: loss"));
        assert_same_curve(
            &grad_norms(&big),
            &grad_norms(&accumulated),
            1e-5,
            &format!("{case}: grad norm"),
        );
        // and tokens (samples) per second count the K micro-batches: the same items per step
        let key = if case.starts_with("gpt") {
            "tokens_per_s"
        } else {
            "samples_per_s"
        };
        let items = |r: &serde_json::Value| r[key].as_f64().unwrap() * r["step_ms"].as_f64().unwrap() / 1e3;
        for (a, b) in read_metrics(&accumulated).iter().zip(read_metrics(&big).iter()) {
            let (ia, ib) = (items(a), items(b));
            assert!((ia - ib).abs() <= 1e-6 * ib, "{case}: {ia} vs {ib} items per step");
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn data_parallel_at_every_zero_stage_matches_pytorch() {
    let out = temp_dir("accum-dp");
    for case in ["gpt_adamw_accum2", "gpt_adamw_accum4", "mlp_adamw_accum4"] {
        let one = losses(&train_one(case, &out, "one", &[]));
        for zero in 0..=3 {
            let layout = ["parallel.dp=2".to_string(), format!("parallel.zero={zero}")];
            let metrics = train_launched(case, 2, &out, &format!("dp2-zero{zero}"), &[], &layout);
            let worst = check_against_pytorch(case, &metrics);
            eprintln!("{case} dp=2 zero={zero}: max relative loss difference to PyTorch {worst:.2e}");
            assert_same_curve(
                &one,
                &losses(&metrics),
                1e-5,
                &format!("{case} dp=2 zero={zero} vs one process"),
            );
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn zero_3_with_bf16_communication_stays_close() {
    let out = temp_dir("accum-bf16");
    let case = "gpt_adamw_accum4";
    let layout = |dtype: &str| {
        [
            "parallel.dp=2".to_string(),
            "parallel.zero=3".to_string(),
            format!("parallel.comm_dtype={dtype:?}"),
        ]
    };
    let f32_curve = losses(&train_launched(case, 2, &out, "f32", &[], &layout("f32")));
    let bf16_curve = losses(&train_launched(case, 2, &out, "bf16", &[], &layout("bf16")));
    assert_same_curve(
        &f32_curve,
        &bf16_curve,
        1e-3,
        "zero=3 accumulation, bf16 vs f32 communication",
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn tensor_and_pipeline_parallel_match_pytorch() {
    let out = temp_dir("accum-tp-pp");
    for case in ["gpt_adamw_accum2", "gpt_adamw_accum4"] {
        let layouts: [(&str, usize, Vec<String>); 3] = [
            ("tp2", 2, vec!["parallel.tp=2".into()]),
            (
                "pp2-mb2",
                2,
                vec!["parallel.pp=2".into(), "parallel.micro_batches=2".into()],
            ),
            (
                "pp2-dp2-zero1-mb2",
                4,
                vec![
                    "parallel.pp=2".into(),
                    "parallel.dp=2".into(),
                    "parallel.zero=1".into(),
                    "parallel.micro_batches=2".into(),
                ],
            ),
        ];
        for (tag, ranks, layout) in layouts {
            let metrics = train_launched(case, ranks, &out, tag, &[], &layout);
            let worst = check_against_pytorch(case, &metrics);
            eprintln!("{case} {tag}: max relative loss difference to PyTorch {worst:.2e}");
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_resumed_run_sees_the_batches_of_an_uninterrupted_one() {
    let out = temp_dir("accum-resume");
    let case = "gpt_adamw_accum4";
    // one process: stopped at step 20 (of 40), resumed
    let whole = losses(&train_one(case, &out, "whole", &[]));
    let ckpt = out.join("ckpt");
    let dir = path_set("train.checkpoint_dir", &ckpt);
    // (wsd's decay ends at train.steps unless total_steps is given: the stopped run keeps 40)
    let stop_at_20 = ["train.steps=20".to_string(), "schedule.total_steps=40".to_string()];
    let mut first = stop_at_20.to_vec();
    first.push(dir.clone());
    train_one(case, &out, "first", &first);
    let step20 = ckpt.join("step-00000020");
    let scratch = out.join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let tail = resume_in_one_process(&fixture_config(case), &step20, &scratch);
    assert_eq!(tail.len(), 20, "steps 21..40 after resuming");
    assert_eq!(&whole[20..], &tail[..], "resumed run vs uninterrupted run, bit for bit");

    // dp=2 at ZeRO stage 2 stopped at 20 and resumed at the same layout: bit for bit; its
    // checkpoint resumed by one process: the same batches (losses equal up to rounding)
    let sharded = ["parallel.dp=2".to_string(), "parallel.zero=2".to_string()];
    let whole2 = losses(&train_launched(case, 2, &out, "whole-dp2", &[], &sharded));
    let ckpt2 = out.join("ckpt2");
    let dir2 = path_set("train.checkpoint_dir", &ckpt2);
    let mut first = sharded.to_vec();
    first.extend(stop_at_20.iter().cloned());
    first.push(dir2.clone());
    train_launched(case, 2, &out, "first-dp2", &[], &first);
    let scratch2 = out.join("scratch2");
    std::fs::create_dir_all(&scratch2).unwrap();
    let one = resume_in_one_process(&fixture_config(case), &ckpt2.join("step-00000020"), &scratch2);
    let mut again = sharded.to_vec();
    again.push(dir2);
    let tail2 = losses(&train_launched(case, 2, &out, "tail-dp2", &["--resume"], &again));
    assert_eq!(tail2.len(), 20);
    assert_eq!(
        &whole2[20..],
        &tail2[..],
        "dp=2 zero=2 resumed vs uninterrupted, bit for bit"
    );
    assert_same_curve(
        &whole2[20..],
        &one,
        1e-5,
        "dp=2 zero=2 checkpoint resumed by one process",
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn bad_accumulation_and_schedule_settings_fail_in_one_line() {
    let run_on = |case: &str, unset: Option<&str>, sets: &[&str], needles: &[&str]| {
        let config = fixture_config(case);
        let mut args = vec!["train", "--config", config.to_str().unwrap(), "--quiet"];
        if let Some(u) = unset {
            args.extend(["--unset", u]);
        }
        for s in sets {
            args.extend(["--set", s]);
        }
        fails_with(&args, needles);
    };
    let run = |sets: &[&str], needles: &[&str]| run_on("gpt_adamw_accum2", None, sets, needles);
    run(&["train.grad_accum=0"], &["train.grad_accum", "at least 1"]);
    run(&["train.grad_accum=-2"], &["grad_accum"]);
    run(&["schedule.warmup_steps=50"], &["warmup_steps 50", "decay_steps 40"]);
    run(&["schedule.min_lr=1.0"], &["min_lr"]);
    // wsd: a missing key, a bad shape, a warmup and decay longer than the run
    let run_wsd =
        |unset: Option<&str>, sets: &[&str], needles: &[&str]| run_on("gpt_adamw_accum4", unset, sets, needles);
    run_wsd(Some("schedule.decay_steps"), &[], &["decay_steps"]);
    run_wsd(
        None,
        &["schedule.decay_shape=\"exp\""],
        &["schedule.decay_shape", "\"exp\""],
    );
    run_wsd(
        None,
        &["schedule.decay_steps=36"],
        &["warmup_steps 5 + decay_steps 36", "total_steps 40"],
    );
    run_wsd(None, &["schedule.total_steps=12"], &["total_steps 12"]);
    run_wsd(None, &["schedule.decay_stpes=3"], &["decay_stpes"]);
}

#[test]
fn text_data_resumes_exactly_and_splits_across_ranks() {
    let out = temp_dir("accum-text");
    let m = |name: &str| out.join(format!("{name}.jsonl"));
    let sets = |metrics: &Path, steps: usize| {
        vec![
            path_set("train.metrics", metrics),
            "train.grad_accum=3".to_string(),
            format!("train.steps={steps}"),
            "train.log_every=1".to_string(),
            "train.eval_every=0".to_string(),
            "train.sample_tokens=0".to_string(),
        ]
    };
    let run_one = |extra: Vec<String>| {
        let mut args: Vec<&str> = common::small_run(&["--quiet"]);
        for s in &extra {
            args.extend(["--set", s.as_str()]);
        }
        weft_ok(&args);
    };
    run_one(sets(&m("whole"), 8));
    let whole = losses(&m("whole"));
    assert_eq!(whole.len(), 8);
    // stopped after 4 steps, resumed to 8: the same 24 batches of the stream
    let ckpt = path_set("train.checkpoint_dir", &out.join("ckpt"));
    let mut first = sets(&m("part"), 4);
    first.push(ckpt.clone());
    run_one(first);
    let mut args: Vec<&str> = common::small_run(&["--quiet", "--resume"]);
    let mut second = sets(&m("part"), 8);
    second.push(ckpt);
    for s in &second {
        args.extend(["--set", s.as_str()]);
    }
    weft_ok(&args);
    assert_eq!(losses(&m("part")), whole, "text: resumed vs uninterrupted, bit for bit");
    // two data-parallel ranks read their halves of the same micro-batches
    let mut layout: Vec<String> = common::SMALL_GPT
        .iter()
        .filter(|a| **a != "--set")
        .map(|s| s.to_string())
        .collect();
    layout.extend(sets(&m("dp2"), 8));
    layout.push("parallel.dp=2".into());
    launch_train_ok(2, None, &[], &layout);
    assert_same_curve(&whole, &losses(&m("dp2")), 1e-5, "text: dp=2 vs one process");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn data_parallel_averages_gradients_once_per_step() {
    let out = temp_dir("accum-sync");
    // gradient all-reduces (averages) in the timeline of 3 steps at dp=2, with K micro-batches
    let averages = |k: usize| {
        let trace = out.join(format!("trace-k{k}.json"));
        let sets = [
            "parallel.dp=2".to_string(),
            format!("train.grad_accum={k}"),
            "train.steps=3".into(),
            "schedule.total_steps=40".into(),
            path_set("train.trace", &trace),
        ];
        train_launched("gpt_adamw_accum4", 2, &out, &format!("sync-k{k}"), &[], &sets);
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
        let events = doc["traceEvents"].as_array().unwrap();
        let count = |prefix: &str| {
            events
                .iter()
                .filter(|e| e["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
                .count()
        };
        (count("all_reduce(avg"), count("backward"))
    };
    let (once, backwards1) = averages(1);
    let (accumulated, backwards4) = averages(4);
    assert!(once >= 3, "{once} gradient all-reduces in 3 steps");
    assert_eq!(backwards4, 4 * backwards1, "4 backward passes per step");
    assert_eq!(
        accumulated, once,
        "the gradients are averaged in the last micro-batch only"
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn on_a_gpu_accumulation_matches_pytorch() {
    if !common::cuda_or_skip("on_a_gpu_accumulation_matches_pytorch") {
        return;
    }
    let out = temp_dir("accum-gpu");
    for case in CASES {
        let metrics = train_one(case, &out, "gpu", &["train.device=\"cuda\"".to_string()]);
        let worst = check_against_pytorch(case, &metrics);
        eprintln!("{case}: on the GPU, max relative loss difference to PyTorch {worst:.2e}");
    }
    let _ = std::fs::remove_dir_all(&out);
}
