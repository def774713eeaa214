//! `weft train` with `[parallel] pp = 2`, under `weft launch`: GPipe and 1F1B with several
//! micro-batch counts, and pipelines inside dp = 2, tp = 2 and dp = 2 with ZeRO stage 1 meshes,
//! reproduce the PyTorch gpt fixture (gradient clipping on, tied embedding across the first and
//! last stage); checkpoints resume exactly and load into one process; the timeline shows each
//! stage's micro-batches; layouts the model or batch cannot take are refused on every rank; the
//! interleaved schedule (2 model chunks a rank) trains the built-in gpt as one process does.

mod common;

use std::path::{Path, PathBuf};

use common::{
    assert_same_curve, check_against_pytorch, fixtures, launch_train, launch_train_ok, losses, path_set, read_metrics,
    resume_in_one_process, sample_of_built_in_run, temp_dir, weft,
};

fn config() -> PathBuf {
    fixtures().join("gpt_adamw/run.toml")
}

/// Runs the gpt fixture on `ranks` ranks with `sets` (and `flags`); returns the metrics file.
fn train(ranks: usize, out: &Path, name: &str, flags: &[&str], sets: &[&str]) -> PathBuf {
    let metrics = out.join(format!("{name}.jsonl"));
    let _ = std::fs::remove_file(&metrics);
    let mut all = vec![path_set("train.metrics", &metrics)];
    all.extend(sets.iter().map(|s| s.to_string()));
    launch_train_ok(ranks, Some(&config()), flags, &all);
    metrics
}

#[test]
fn gpipe_and_1f1b_on_2_stages_reproduce_pytorch() {
    let out = temp_dir("pp-schedules");
    let mut curves = Vec::new();
    for (schedule, m, cut) in [
        ("gpipe", 2, "parallel.balance=\"blocks\""),
        ("1f1b", 2, "parallel.balance=\"parameters\""),
        ("1f1b", 4, "parallel.stage_blocks=[1, 1]"),
        ("gpipe", 1, "parallel.balance=\"blocks\""),
    ] {
        let name = format!("{schedule}-m{m}");
        let sched = format!("parallel.schedule=\"{schedule}\"");
        let micro = format!("parallel.micro_batches={m}");
        let metrics = train(2, &out, &name, &[], &["parallel.pp=2", &sched, &micro, cut]);
        let worst = check_against_pytorch("gpt_adamw", &metrics);
        eprintln!("pp=2 {name}: max relative loss difference to PyTorch {worst:.2e}");
        curves.push((name, losses(&metrics)));
    }
    for (name, c) in &curves[1..] {
        assert_same_curve(&curves[0].1, c, 1e-5, &format!("{name} vs gpipe-m2"));
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn stages_that_send_bf16_round_only_what_crosses_them() {
    // the gpt fixture on 2 stages, 2 micro-batches: activations and their gradients sent as
    // bf16 (half the bytes) train as the f32 sends do within bf16's rounding, and not bit for
    // bit (so the sends were rounded)
    let out = temp_dir("pp-wire");
    let layout = ["parallel.pp=2", "parallel.micro_batches=2"];
    let f32 = losses(&train(2, &out, "f32", &[], &layout));
    let mut with_bf16 = layout.to_vec();
    with_bf16.push("parallel.pipeline_dtype=\"bf16\"");
    let bf16 = losses(&train(2, &out, "bf16", &[], &with_bf16));
    assert_same_curve(&f32, &bf16, 1e-3, "bf16 sends vs f32 sends");
    assert!(
        f32.iter().zip(&bf16).any(|(a, b)| a != b),
        "bf16 sends changed nothing: {f32:?}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn pipelines_compose_with_data_and_tensor_parallelism_and_zero_1() {
    let out = temp_dir("pp-mesh");
    for (name, sets) in [
        ("dp2-pp2", ["parallel.dp=2", "parallel.tp=1", "parallel.zero=0"]),
        ("tp2-pp2", ["parallel.dp=1", "parallel.tp=2", "parallel.zero=0"]),
        ("dp2-pp2-zero1", ["parallel.dp=2", "parallel.tp=1", "parallel.zero=1"]),
    ] {
        let mut all = vec![
            "parallel.pp=2",
            "parallel.micro_batches=2",
            "parallel.schedule=\"1f1b\"",
        ];
        all.extend(sets);
        let metrics = train(4, &out, name, &[], &all);
        let worst = check_against_pytorch("gpt_adamw", &metrics);
        eprintln!("{name}: max relative loss difference to PyTorch {worst:.2e}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_pipeline_checkpoint_resumes_exactly_and_loads_into_one_process() {
    let out = temp_dir("pp-ckpt");
    let ckpt = out.join("ckpt");
    let dir = path_set("train.checkpoint_dir", &ckpt);
    let pp = ["parallel.pp=2", "parallel.micro_batches=2"];
    let whole = losses(&train(2, &out, "whole", &[], &pp));
    train(2, &out, "first", &[], &[pp[0], pp[1], &dir, "train.steps=20"]);
    // resumed by one process (copied before the resumed run writes newer checkpoints)
    let one = resume_in_one_process(&config(), &ckpt.join("step-00000020"), &out.join("one"));
    assert_same_curve(&whole[20..], &one, 1e-5, "pp=2 checkpoint resumed by one process");
    let resumed = train(2, &out, "resumed", &["--resume"], &[pp[0], pp[1], &dir]);
    assert_eq!(&whole[20..], &losses(&resumed)[..], "resumed at pp=2 vs uninterrupted");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn the_timeline_shows_each_stages_micro_batches_and_the_built_in_run_samples() {
    let out = temp_dir("pp-trace");
    let trace = out.join("trace.json");
    let trace_set = path_set("train.trace", &trace);
    train(
        2,
        &out,
        "traced",
        &[],
        &["parallel.pp=2", "parallel.micro_batches=4", &trace_set],
    );
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    for rank in 0..2 {
        let count = |name: &str| {
            events
                .iter()
                .filter(|e| e["pid"] == rank && e["ph"] == "X" && e["name"] == name)
                .count()
        };
        assert_eq!(count("forward 3"), 40, "rank {rank}");
        assert_eq!(count("backward 0"), 40, "rank {rank}");
    }
    // the sample comes from the trained stages put together: the one process's sample
    let run = ["train.steps=6", "train.eval_every=3", "train.sample_tokens=40"];
    let piped = sample_of_built_in_run(2, &["parallel.pp=2", "parallel.micro_batches=2"], &run);
    assert_eq!(piped, sample_of_built_in_run(1, &[], &run));
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn an_interleaved_stage_reduces_each_chunks_gradients_after_its_last_backward() {
    // the built-in gpt at dp = 2 x pp = 2, 2 chunks a rank of one block each (0.8 MB, under the
    // 1 MB first bucket): chunk 1's bucket is launched in chunk 1's last backward, before chunk
    // 0's backwards, instead of waiting in one bucket with chunk 0's parameters
    let out = temp_dir("pp-interleaved-buckets");
    let trace = out.join("trace.json");
    let sets = [
        path_set("train.trace", &trace),
        "train.steps=2".into(),
        "train.eval_every=0".into(),
        "train.sample_tokens=0".into(),
        "parallel.dp=2".into(),
        "parallel.pp=2".into(),
        "parallel.schedule=\"interleaved\"".into(),
        "parallel.micro_batches=2".into(),
    ];
    launch_train_ok(4, None, &[], &sets);
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let mut spans: Vec<(f64, String)> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["pid"] == 0 && e["ph"] == "X")
        .map(|e| (e["ts"].as_f64().unwrap(), e["name"].as_str().unwrap().to_string()))
        .collect();
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    // rank 0's last step, from its first pass
    let start = spans.iter().rposition(|(_, n)| n == "forward 0 (chunk 0)").unwrap();
    let last: Vec<&str> = spans[start..].iter().map(|(_, n)| n.as_str()).collect();
    let launch = last
        .iter()
        .position(|n| *n == "launch all_reduce")
        .expect("a bucket launched");
    let chunk_0 = last.iter().position(|n| *n == "backward 0 (chunk 0)").unwrap();
    assert!(launch < chunk_0, "rank 0's last step: {last:?}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn the_interleaved_schedule_trains_the_built_in_gpt_as_one_process_does() {
    // the built-in gpt (4 blocks): pp = 2 with 2 chunks a rank is 4 virtual stages of one block
    let out = temp_dir("pp-interleaved");
    let run = [
        "train.steps=6",
        "train.log_every=1",
        "train.eval_every=3",
        "model.dropout=0.0",
    ];
    let curve = |ranks: usize, name: &str, layout: &[&str]| {
        let metrics = out.join(format!("{name}.jsonl"));
        let mut sets = vec![path_set("train.metrics", &metrics)];
        sets.extend(run.iter().chain(layout).map(|s| s.to_string()));
        if ranks == 1 {
            let mut args = vec!["train", "--quiet"];
            for s in &sets {
                args.extend(["--set", s.as_str()]);
            }
            common::weft_ok(&args);
        } else {
            launch_train_ok(ranks, None, &[], &sets);
        }
        let records = read_metrics(&metrics);
        let val: Vec<f64> = records.iter().filter_map(|r| r["val_loss"].as_f64()).collect();
        (losses(&metrics), val)
    };
    let (one, one_val) = curve(1, "one", &[]);
    assert_eq!((one.len(), one_val.len()), (6, 2));
    let interleaved = "parallel.schedule=\"interleaved\"";
    for (ranks, name, layout) in [
        (2, "1f1b", vec!["parallel.pp=2", "parallel.micro_batches=2"]),
        (
            2,
            "interleaved-m2",
            vec!["parallel.pp=2", interleaved, "parallel.micro_batches=2"],
        ),
        (
            2,
            "interleaved-m4-recompute",
            vec![
                "parallel.pp=2",
                interleaved,
                "parallel.virtual_stages=2",
                "parallel.micro_batches=4",
                "parallel.recompute=true",
            ],
        ),
        // inside data parallelism (each chunk's gradients reduced after its last backward),
        // plain with the virtual stages' blocks given, and with ZeRO stage 1
        (
            4,
            "dp2-interleaved",
            vec![
                "parallel.dp=2",
                "parallel.pp=2",
                interleaved,
                "parallel.micro_batches=2",
                "parallel.stage_blocks=[1, 1, 1, 1]",
            ],
        ),
        (
            4,
            "dp2-zero1-interleaved",
            vec![
                "parallel.dp=2",
                "parallel.zero=1",
                "parallel.pp=2",
                interleaved,
                "parallel.micro_batches=2",
            ],
        ),
    ] {
        let (losses, val) = curve(ranks, name, &layout);
        assert_same_curve(&one, &losses, 1e-5, &format!("{name} vs one process"));
        assert_same_curve(&one_val, &val, 1e-5, &format!("{name} val_loss vs one process"));
    }
    // micro-batches not a multiple of the stages: on 2 stages, 12 rows as 3 micro-batches (one
    // group of 3 through each chunk) and 10 rows as 5 (groups of 3 and 2)
    for (batch, m) in [(12, 3), (10, 5)] {
        let rows = format!("data.batch_size={batch}");
        let (one, one_val) = curve(1, &format!("one-b{batch}"), &[rows.as_str()]);
        let micro = format!("parallel.micro_batches={m}");
        let layout = ["parallel.pp=2", interleaved, micro.as_str(), rows.as_str()];
        let name = format!("interleaved-m{m}");
        let (losses, val) = curve(2, &name, &layout);
        assert_same_curve(&one, &losses, 1e-5, &format!("{name} vs one process"));
        assert_same_curve(&one_val, &val, 1e-5, &format!("{name} val_loss vs one process"));
        if m == 3 {
            // the same sending bf16 between stages, forwards recomputed: within bf16's rounding
            // of what crosses (evaluation's sends included), and not bit for bit
            let mut bf16 = layout.to_vec();
            bf16.extend(["parallel.pipeline_dtype=\"bf16\"", "parallel.recompute=true"]);
            let (losses, val) = curve(2, "interleaved-m3-bf16", &bf16);
            assert_same_curve(&one, &losses, 1e-3, "bf16 sends vs one process");
            assert_same_curve(&one_val, &val, 1e-3, "bf16 sends' val_loss vs one process");
            assert!(
                one.iter().zip(&losses).any(|(a, b)| a != b),
                "bf16 sends changed nothing"
            );
        }
    }
    // the sample: the trained chunks put together give the one process's
    let run = [
        "train.steps=6",
        "train.eval_every=3",
        "train.sample_tokens=40",
        "model.dropout=0.0",
    ];
    let interleaved = [
        "parallel.pp=2",
        "parallel.schedule=\"interleaved\"",
        "parallel.micro_batches=2",
    ];
    assert_eq!(
        sample_of_built_in_run(2, &interleaved, &run),
        sample_of_built_in_run(1, &[], &run)
    );
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn layouts_the_model_or_batch_cannot_take_are_refused_on_every_rank() {
    let config = config();
    // 2 blocks cannot make 3 stages; 4 rows do not cut into 3 micro-batches
    for (n, sets, words) in [
        (3, vec!["parallel.pp=3"], vec!["n_layer", "parallel.pp = 3"]),
        (
            2,
            vec!["parallel.pp=2", "parallel.micro_batches=3"],
            vec!["parallel.micro_batches", "4 rows"],
        ),
        (
            2,
            vec!["parallel.pp=2", "parallel.stage_blocks=[2, 0]"],
            vec!["parallel.stage_blocks", "at least one"],
        ),
    ] {
        let out = launch_train(n, Some(&config), &[], &sets);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{sets:?}");
        for w in words {
            assert!(err.contains(w), "{sets:?}: {err}");
        }
    }
    for (sets, words) in [
        (
            vec!["parallel.pp=2", "parallel.zero=2", "parallel.dp=1"],
            vec!["parallel.zero", "zero = 0 or 1"],
        ),
        (
            vec!["parallel.micro_batches=2"],
            vec!["parallel.micro_batches", "pp > 1"],
        ),
        // the interleaved schedule: at least as many micro-batches as stages, a chunk per block
        (
            vec![
                "parallel.pp=2",
                "parallel.schedule=\"interleaved\"",
                "parallel.micro_batches=1",
            ],
            vec!["parallel.micro_batches", "1 micro-batches are fewer than 2"],
        ),
        (
            vec![
                "parallel.pp=2",
                "parallel.schedule=\"interleaved\"",
                "parallel.micro_batches=2",
            ],
            vec![
                "parallel.virtual_stages",
                "4 virtual stages, more than the model's 2 blocks",
            ],
        ),
        (
            vec!["parallel.pp=2", "parallel.virtual_stages=2", "parallel.micro_batches=2"],
            vec!["parallel.virtual_stages", "interleaved"],
        ),
        (
            vec![
                "parallel.pp=2",
                "parallel.schedule=\"interleaved\"",
                "parallel.micro_batches=2",
                "parallel.stage_blocks=[1, 1]",
            ],
            vec!["parallel.stage_blocks", "4 virtual stages need one each"],
        ),
        (
            vec![
                "parallel.pp=2",
                "parallel.schedule=\"interleaved\"",
                "parallel.virtual_stages=1",
            ],
            vec!["parallel.virtual_stages", "at least 2"],
        ),
    ] {
        let mut args = vec!["train", "--config", config.to_str().unwrap(), "--quiet"];
        for s in &sets {
            args.extend(["--set", s]);
        }
        let out = weft(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        for w in words {
            assert!(err.contains(w), "{sets:?}: {err}");
        }
    }
}

#[test]
fn recomputing_activations_changes_nothing_but_the_memory_even_with_dropout() {
    let out = temp_dir("pp-recompute");
    let base = ["parallel.pp=2", "parallel.micro_batches=4", "model.dropout=0.1"];
    let kept = train(2, &out, "kept", &[], &base);
    let mut with = base.to_vec();
    with.push("parallel.recompute=true");
    let recomputed = train(2, &out, "recomputed", &[], &with);
    // the dropout stream is replayed, so the recomputed forwards are the first ones exactly
    assert_eq!(losses(&kept), losses(&recomputed));
    let bytes = |m: &Path| -> Vec<u64> {
        read_metrics(m)[1]["activation_bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect()
    };
    let (k, r) = (bytes(&kept), bytes(&recomputed));
    // 1F1B's stage 0 keeps 2 micro-batches, recomputing 1 at a time; the last stage keeps 1
    assert!(r[0] < k[0], "stage 0: {} recomputed vs {} kept", r[0], k[0]);
    assert!(r[1] <= k[1], "stage 1: {} recomputed vs {} kept", r[1], k[1]);
    let _ = std::fs::remove_dir_all(&out);
}
