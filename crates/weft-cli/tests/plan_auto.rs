//! `weft plan calibrate` and the `local` spec (the cache file written, read back, a broken one
//! measured again; no calibration names the command), and `[parallel] auto = true`: a 2-rank
//! job plans its layout, logs it and trains; a resume on 1 rank plans again and continues from
//! the 2-rank checkpoint; a 4-rank job that loses a node plans again for 2 and follows the curve
//! of a fresh 2-rank run from the same checkpoint; `auto` next to `dp` is a config error naming
//! the key.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::{path_set, read_metrics, temp_dir, weft_bin, weft_command};

/// The tiny gpt of these tests: 2 blocks, width 32, 16 positions.
const TINY: [&str; 5] = [
    "model.n_layer=2",
    "model.n_embd=32",
    "model.n_head=2",
    "model.block_size=16",
    "data.batch_size=8",
];

fn sets(items: &[&str]) -> Vec<String> {
    items
        .iter()
        .flat_map(|s| ["--set".to_string(), s.to_string()])
        .collect()
}

/// `weft args...` with `WEFT_CACHE_DIR=cache`.
fn weft_in(cache: &Path, args: &[String]) -> Output {
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    weft_command(&args)
        .env("WEFT_CACHE_DIR", cache)
        .output()
        .expect("the weft binary runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Measures this machine for 2 ranks at the tiny gpt's shapes into `cache`.
fn calibrate(cache: &Path) -> Output {
    calibrate_for(cache, 2)
}

fn calibrate_for(cache: &Path, ranks: usize) -> Output {
    let n = ranks.to_string();
    let mut args: Vec<String> = ["plan", "calibrate", "--nproc", &n, "--budget-ms", "20"]
        .map(String::from)
        .to_vec();
    args.extend(sets(&TINY));
    let out = weft_in(cache, &args);
    assert!(out.status.success(), "calibrate: {}", stderr(&out));
    out
}

fn calibration_file(cache: &Path) -> PathBuf {
    cache.join("plan-local.toml")
}

/// The calibration file `name` in `cache`, read.
fn calibration_in(cache: &Path, name: &str) -> weft_plan::calibration::Calibration {
    let text = std::fs::read_to_string(cache.join(name)).unwrap();
    weft_plan::calibration::Calibration::parse(&text, name).unwrap()
}

#[test]
fn calibration_is_written_read_back_and_rebuilt_when_broken() {
    let dir = temp_dir("plan-calibrate");
    let cache = dir.join("cache");
    let out = calibrate(&cache);
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(summary.contains("local: 2 ranks"), "{summary}");
    let text = std::fs::read_to_string(calibration_file(&cache)).unwrap();
    let c = weft_plan::calibration::Calibration::parse(&text, "plan-local.toml").unwrap();
    assert_eq!(
        (c.ranks, c.spec.devices_per_node, c.spec.name.as_str()),
        (2, 2, "local")
    );
    assert!(c.spec.flops_f32 > 1e6 && c.spec.memory_bandwidth > 1e6, "{c:?}");
    assert!(c.spec.intra_bandwidth > 0.0 && c.spec.memory_bytes > 0.0, "{c:?}");
    // the model's own passes were timed (one block and two, at two or three sizes: a rank's
    // share of the batch, half of it and one row of 16 tokens, fewer where the budget is
    // short) beside the cost model's time of each, which grows with the tokens and the blocks,
    // and fitted (timings on a loaded machine are not compared: the fit's own test holds its
    // arithmetic)
    let pc = c.spec.pass_cost;
    assert!(
        pc.time_scale.is_finite() && pc.block.is_finite() && pc.ends.is_finite(),
        "{pc:?}"
    );
    // (blocks, tokens, analytic seconds) of each pass measured
    let mut passes: Vec<(usize, usize, f64)> = Vec::new();
    for (name, seconds) in &c.measured {
        let Some(shape) = name.strip_prefix("pass_").and_then(|n| n.strip_suffix("_tokens_s")) else {
            continue;
        };
        assert!(*seconds > 0.0, "{name}: {c:?}");
        let (blocks, size) = shape.split_once("_blocks_").unwrap();
        let (rows, tokens) = size.split_once('x').unwrap();
        let analytic = c.get(&format!("pass_{shape}_tokens_analytic_s")).unwrap();
        let tokens = rows.parse::<usize>().unwrap() * tokens.parse::<usize>().unwrap();
        passes.push((blocks.parse().unwrap(), tokens, analytic));
    }
    passes.sort_by_key(|p| (p.0, p.1));
    let one: Vec<_> = passes.iter().filter(|p| p.0 == 1).collect();
    let two: Vec<_> = passes.iter().filter(|p| p.0 == 2).collect();
    assert!(one.len() >= 2 && one.len() == two.len(), "{passes:?}");
    assert!(one.windows(2).all(|w| w[0].2 < w[1].2), "{passes:?}");
    assert!(one.iter().zip(&two).all(|(a, b)| a.1 == b.1 && a.2 < b.2), "{passes:?}");
    assert!(summary.contains("model passes"), "{summary}");
    assert_eq!(
        weft_plan::calibration::Calibration::parse(&c.to_toml(), "x").unwrap(),
        c
    );

    // the planner uses it as --device-spec local
    let mut plan: Vec<String> = ["plan", "--devices", "2", "--device-spec", "local", "--json"]
        .map(String::from)
        .to_vec();
    plan.extend(sets(&TINY));
    let out = weft_in(&cache, &plan);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["device"], "local");
    assert!(!v["plans"].as_array().unwrap().is_empty(), "{v}");

    // a broken file and one of another version are measured again, with a warning
    for broken in [
        "format = \"weft-plan-calibration\"\nversion = [",
        &text.replace(
            &format!("version = {}", weft_plan::calibration::VERSION),
            "version = 99",
        ),
    ] {
        std::fs::write(calibration_file(&cache), broken).unwrap();
        let out = calibrate(&cache);
        let err = stderr(&out);
        assert!(err.contains("warning: ignoring the calibration file"), "{err}");
        let text = std::fs::read_to_string(calibration_file(&cache)).unwrap();
        weft_plan::calibration::Calibration::parse(&text, "rebuilt").unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn each_number_of_ranks_plans_on_its_own_calibration() {
    let dir = temp_dir("plan-calibrate-per-ranks");
    let cache = dir.join("cache");
    calibrate_for(&cache, 1);
    calibrate_for(&cache, 2);
    let ranks_of = |name: &str| calibration_in(&cache, name).ranks;
    // one file per number of ranks, and the latest
    assert_eq!(
        (
            ranks_of("plan-local-1.toml"),
            ranks_of("plan-local-2.toml"),
            ranks_of("plan-local.toml")
        ),
        (1, 2, 2)
    );
    let plan = |devices: usize| {
        let mut args: Vec<String> = ["plan", "--device-spec", "local", "--json", "--devices"]
            .map(String::from)
            .to_vec();
        args.push(devices.to_string());
        args.extend(sets(&TINY));
        weft_in(&cache, &args)
    };
    // 1 and 2 ranks have their own; 4 plan on the latest, saying so
    for devices in [1, 2] {
        let out = plan(devices);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(!stderr(&out).contains("note:"), "{devices}: {}", stderr(&out));
    }
    let out = plan(4);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("planning 4 ranks with the calibration of 2 ranks"),
        "{}",
        stderr(&out)
    );
    // the 1-rank plan reads the 1-rank file: a broken one is named, not passed over
    std::fs::write(cache.join("plan-local-1.toml"), "format = [").unwrap();
    let out = plan(1);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("calibration for 1 ranks cannot be used"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Three ranks or more also measure the latency with every rank computing between its calls
/// (pairs of ranks all-reducing); two do not. On shared cores the spec's latency is the larger
/// of that and the link's own, with a core each it is the link's.
#[test]
fn the_loaded_latency_is_measured_from_three_ranks_and_the_larger_latency_kept() {
    let dir = temp_dir("plan-calibrate-loaded");
    let cache = dir.join("cache");
    calibrate_for(&cache, 2);
    calibrate_for(&cache, 3);
    let two = calibration_in(&cache, "plan-local-2.toml");
    assert_eq!(two.get("all_reduce_loaded_latency_s"), None, "{two:?}");
    let three = calibration_in(&cache, "plan-local-3.toml");
    let loaded = three.get("all_reduce_loaded_latency_s").expect("measured");
    let unloaded = three.get("all_reduce_unloaded_latency_s").unwrap();
    assert!(loaded.is_finite() && loaded >= 0.0, "{three:?}");
    let expected = match three.spec.shared_compute {
        Some(_) => loaded.max(unloaded),
        None => unloaded,
    };
    assert_eq!(
        (three.spec.intra_latency, three.get("all_reduce_latency_s")),
        (expected, Some(expected)),
        "{three:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_local_spec_without_a_calibration_names_the_command() {
    let dir = temp_dir("plan-no-calibration");
    let args = ["plan", "--devices", "2", "--device-spec", "local"].map(String::from);
    let out = weft_in(&dir, &args);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("there is none yet") && err.contains("`weft plan calibrate --nproc N`"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // and so does a run that plans itself
    let mut train = vec!["train".to_string()];
    train.extend(sets(&["parallel.auto=true", "train.steps=1"]));
    let err = stderr(&weft_in(&dir, &train));
    assert!(
        err.contains("parallel.auto: ") && err.contains("weft plan calibrate --nproc N"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn auto_next_to_layout_keys_is_a_config_error_naming_them() {
    let dir = temp_dir("plan-auto-dp");
    let mut args = vec!["train".to_string()];
    args.extend(sets(&["parallel.auto=true", "parallel.dp=2"]));
    let out = weft_in(&dir, &args);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("parallel.auto = true chooses the layout, but parallel.dp is given too"),
        "{err}"
    );
    args.extend(sets(&["parallel.pp=2"]));
    let err = stderr(&weft_in(&dir, &args));
    assert!(err.contains("parallel.dp, parallel.pp are given too"), "{err}");
    let mut cluster = vec!["train".to_string()];
    cluster.extend(sets(&["parallel.cluster=\"c.toml\""]));
    let err = stderr(&weft_in(&dir, &cluster));
    assert!(
        err.contains("parallel.cluster: applies with parallel.auto = true only"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `dp tp pp` of the plan line a run logged.
fn planned_layout(err: &str, ranks: usize) -> [usize; 3] {
    let line = err
        .lines()
        .find(|l| l.contains(&format!("weft: parallel.auto: planned for {ranks} ranks on local: ")))
        .unwrap_or_else(|| panic!("no plan line for {ranks} ranks in:\n{err}"));
    let field = |key: &str| -> usize {
        let (_, rest) = line.split_once(&format!(" {key} ")).unwrap();
        rest.split(' ').next().unwrap().parse().unwrap()
    };
    for key in [
        "zero",
        "micro_batches",
        "schedule",
        "virtual_stages",
        "recompute",
        "sequence_parallel",
        "comm_dtype",
        "pipeline_dtype",
        "stage_blocks",
        "predicted",
        "MB per rank",
    ] {
        assert!(line.contains(key), "{key}: {line}");
    }
    // what auto runs reduces and sends in f32
    assert!(line.contains("comm_dtype f32 pipeline_dtype f32"), "{line}");
    [field("dp"), field("tp"), field("pp")]
}

#[test]
fn an_auto_job_plans_trains_and_plans_again_on_fewer_ranks() {
    let dir = temp_dir("plan-auto-job");
    let cache = dir.join("cache");
    calibrate(&cache);
    let (ckpt, metrics) = (dir.join("ckpt"), dir.join("m.jsonl"));
    let run = |steps: &str| {
        let mut s = vec![
            "parallel.auto=true".to_string(),
            format!("train.steps={steps}"),
            "train.log_every=1".into(),
            "train.eval_every=0".into(),
            "train.sample_tokens=0".into(),
            "train.checkpoint_every=4".into(),
            "train.overwrite=true".into(),
            path_set("train.checkpoint_dir", &ckpt),
            path_set("train.metrics", &metrics),
        ];
        s.extend(TINY.iter().map(|x| x.to_string()));
        s
    };
    let bin = weft_bin().display().to_string();
    let mut args: Vec<String> = ["launch", "--nproc-per-node", "2", "--stop-timeout", "5", "--"]
        .map(String::from)
        .to_vec();
    args.extend([bin, "train".into(), "--quiet".into(), "--resume".into()]);
    for s in run("8") {
        args.extend(["--set".into(), s]);
    }
    let out = weft_in(&cache, &args);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let [dp, tp, pp] = planned_layout(&err, 2);
    assert_eq!(dp * tp * pp, 2, "{err}");
    let losses: Vec<f64> = read_metrics(&metrics)
        .iter()
        .filter_map(|r| r["loss"].as_f64())
        .collect();
    assert_eq!(losses.len(), 8, "{losses:?}");
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");

    // the same run resumed on one rank: planned again for 1, from the 2-rank checkpoint of step 8
    let mut one = vec!["train".to_string(), "--quiet".into(), "--resume".into()];
    for s in run("12") {
        one.extend(["--set".into(), s]);
    }
    let out = weft_in(&cache, &one);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(planned_layout(&err, 1), [1, 1, 1]);
    let steps: Vec<(u64, f64)> = read_metrics(&metrics)
        .iter()
        .filter_map(|r| Some((r["step"].as_u64()?, r["loss"].as_f64()?)))
        .collect();
    // the metrics file goes on after the 2-rank run's 8 steps: 9 to 12, each once
    let numbers: Vec<u64> = steps.iter().map(|s| s.0).collect();
    assert_eq!(
        numbers,
        (1..=12).collect::<Vec<u64>>(),
        "resumed after step 8: {steps:?}"
    );
    assert_eq!(steps[..8].iter().map(|s| s.1).collect::<Vec<_>>(), losses);
    assert!(steps.iter().all(|s| s.1.is_finite()), "{steps:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Step -> loss of the last record of each step.
fn last_losses(metrics: &Path) -> BTreeMap<u64, f64> {
    read_metrics(metrics)
        .into_iter()
        .filter_map(|r| Some((r["step"].as_u64()?, r["loss"].as_f64()?)))
        .collect()
}

/// `train --quiet --resume` of the tiny gpt planning itself: 200 steps, a checkpoint every 10.
fn elastic_run(ckpt: &Path, metrics: &Path) -> Vec<String> {
    let mut a: Vec<String> = ["train", "--quiet", "--resume"].map(String::from).to_vec();
    let mut s: Vec<String> = [
        "parallel.auto=true",
        "train.steps=200",
        "train.log_every=1",
        "train.eval_every=0",
        "train.sample_tokens=0",
        "train.checkpoint_every=10",
        "train.keep_checkpoints=100",
    ]
    .map(String::from)
    .to_vec();
    s.extend(TINY.iter().map(|x| x.to_string()));
    s.extend([
        path_set("train.checkpoint_dir", ckpt),
        path_set("train.metrics", metrics),
    ]);
    for x in s {
        a.extend(["--set".into(), x]);
    }
    a
}

#[test]
fn an_auto_job_that_loses_a_node_plans_again_and_follows_a_fresh_run() {
    let dir = temp_dir("plan-auto-elastic");
    let cache = dir.join("cache");
    calibrate_for(&cache, 4);
    let (ckpt, metrics) = (dir.join("ckpt"), dir.join("shrunk.jsonl"));
    let bin = weft_bin();
    let port = common::free_port().to_string();
    // two "nodes" of 2 ranks on this machine over TCP (as tests/elastic.rs); node 1 is lost
    // once step 25 is logged, after the checkpoint of step 20 (or a later one)
    let node = |rank: &str, stderr: Stdio| -> std::process::Child {
        std::process::Command::new(&bin)
            .env("WEFT_TRACK_DIR", common::test_runs_dir())
            .args([
                "launch",
                "--nnodes",
                "1:2",
                "--node-rank",
                rank,
                "--nproc-per-node",
                "2",
            ])
            .args(["--master-port", &port, "--max-restarts", "1", "--rdzv-last-call", "5"])
            .args(["--stop-timeout", "2", "--"])
            .arg(&bin)
            .args(elastic_run(&ckpt, &metrics))
            .env("WEFT_JOB_TOKEN", "tok-plan-auto-elastic")
            .env("WEFT_SHM", "0")
            .env("WEFT_DIST_TIMEOUT", "30")
            .env("WEFT_NUM_THREADS", "1")
            .env("WEFT_CACHE_DIR", &cache)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap()
    };
    // an elastic rendezvous numbers the nodes as they join: either may hold rank 0
    let (log_a, log_b) = (dir.join("a.err"), dir.join("b.err"));
    let file = |p: &Path| Stdio::from(std::fs::File::create(p).unwrap());
    let mut a = node("0", file(&log_a));
    let mut b = node("1", file(&log_b));
    let start = Instant::now();
    while !common::wait_for(0, || common::last_logged_step(&metrics) >= 25) {
        assert!(start.elapsed() < Duration::from_secs(240), "step 25 never came");
        std::thread::sleep(Duration::from_millis(5));
    }
    b.kill().unwrap();
    b.wait().unwrap();
    let status = a.wait().unwrap();
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let err = format!("{}{}", read(&log_b), read(&log_a));
    assert!(status.success(), "the node left did not finish the job:\n{err}");
    let [dp, tp, pp] = planned_layout(&err, 4);
    assert_eq!(dp * tp * pp, 4, "{err}");
    let [dp, tp, pp] = planned_layout(&err, 2);
    assert_eq!(dp * tp * pp, 2, "{err}");
    let resumed: u64 = err
        .split_once("resuming after step ")
        .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .unwrap_or_else(|| panic!("no resume in:\n{err}"));
    // a checkpoint every 10 steps: the newest one every rank had finished writing when the node
    // went (step 10 or 20 when it goes after step 25; a slow build may not have finished 20)
    assert!((10..200).contains(&resumed), "{err}");

    // a fresh 2-rank job from that checkpoint alone
    let fresh = dir.join("fresh");
    let name = format!("step-{resumed:08}");
    let (from, copy) = (ckpt.join(&name), fresh.join("ckpt").join(&name));
    std::fs::create_dir_all(&copy).unwrap();
    for f in std::fs::read_dir(&from).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, copy.join(f.file_name().unwrap())).unwrap();
    }
    let fresh_metrics = fresh.join("m.jsonl");
    let mut args: Vec<String> = ["launch", "--nproc-per-node", "2", "--stop-timeout", "5", "--"]
        .map(String::from)
        .to_vec();
    args.push(bin.display().to_string());
    args.extend(elastic_run(&fresh.join("ckpt"), &fresh_metrics));
    // as the shrunk job ran: one thread a rank, over TCP, so that it plans and reduces as it did
    let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let out = weft_command(&refs)
        .env("WEFT_CACHE_DIR", &cache)
        .env("WEFT_NUM_THREADS", "1")
        .env("WEFT_SHM", "0")
        .output()
        .expect("the weft binary runs");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        planned_layout(&stderr(&out), 2),
        planned_layout(&err, 2),
        "the fresh job planned another layout:\n{}",
        stderr(&out)
    );
    let (shrunk, fresh) = (last_losses(&metrics), last_losses(&fresh_metrics));
    assert_eq!(
        fresh.keys().copied().collect::<Vec<_>>(),
        (resumed + 1..=200).collect::<Vec<u64>>()
    );
    for (step, loss) in &fresh {
        let other = shrunk[step];
        assert!(
            loss.is_finite() && (loss - other).abs() <= 1e-5 * loss.abs(),
            "step {step}: {loss} vs {other}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
