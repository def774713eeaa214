//! `[data] kind = "tokens"` through the binary: shards written by `weft data prepare` into a
//! folder and into a real S3-compatible server on loopback (s3s-fs, started by the test), trained
//! from at dp = 1 and 2 with the same losses, through a store that goes down for seconds mid-run,
//! and resumed mid-epoch after a SIGKILL.

mod common;
#[path = "../../weft-data/tests/support/s3_server.rs"]
mod s3_server;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::*;
use s3_server::{S3Server, ACCESS_KEY, SECRET_KEY};

/// A deterministic English-like text of about `bytes` bytes.
fn corpus(bytes: usize) -> String {
    const WORDS: [&str; 24] = [
        "the", "king", "shall", "speak", "of", "night", "and", "honour", "my", "lord", "what", "is", "love", "but",
        "a", "sword", "to", "thee", "sweet", "friends", "come", "away", "from", "here",
    ];
    let mut s = String::with_capacity(bytes + 16);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while s.len() < bytes {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        s.push_str(WORDS[(x >> 33) as usize % WORDS.len()]);
        s.push_str(match (x >> 20) % 13 {
            0 => ".\n",
            1 => ", ",
            _ => " ",
        });
    }
    s
}

/// The environment a child needs to reach `server`.
fn s3_env(cmd: &mut Command, server: &S3Server) {
    cmd.env("AWS_ENDPOINT_URL", server.endpoint())
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        .env("AWS_REGION", "us-east-1");
}

fn ok(out: Output, what: &str) -> Output {
    assert!(
        out.status.success(),
        "{what}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Prepares `corpus` with the gpt2 tokenizer into `output` (a folder or a URL).
fn prepare(dir: &Path, output: &str, server: Option<&S3Server>, bytes: usize) {
    let input = dir.join("corpus.txt");
    if !input.exists() {
        std::fs::write(&input, corpus(bytes)).unwrap();
    }
    let mut cmd = weft_command(&[
        "data",
        "prepare",
        "--tokenizer",
        "gpt2",
        "--input",
        input.to_str().unwrap(),
        "--output",
        output,
    ]);
    if let Some(s) = server {
        s3_env(&mut cmd, s);
    }
    ok(cmd.output().unwrap(), "prepare");
}

/// A small llama on token data at `path`.
fn config(dir: &Path, name: &str, path: &str, steps: usize, extra: &str) -> PathBuf {
    let text = format!(
        "[model]\nkind = \"llama\"\nvocab_size = 50304\nblock_size = 32\nn_layer = 1\nn_head = 2\nn_kv_head = 1\n\
         n_embd = 16\nintermediate_size = 32\n\
         [data]\nkind = \"tokens\"\npath = {path:?}\nbatch_size = 8\ncache_dir = {:?}\n{extra}\n\
         [optim]\nkind = \"adamw\"\nlr = 0.003\n\
         [train]\nsteps = {steps}\nlog_every = 1\nmetrics = \"{name}.jsonl\"\n",
        dir.join(format!("cache-{name}"))
    );
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, text).unwrap();
    p
}

fn train(config: &Path, ranks: usize, server: Option<&S3Server>, flags: &[&str]) -> Output {
    let bin = weft_bin();
    let mut args: Vec<&str> = Vec::new();
    let n = ranks.to_string();
    if ranks > 1 {
        args.extend([
            "launch",
            "--nproc-per-node",
            &n,
            "--stop-timeout",
            "5",
            "--",
            bin.to_str().unwrap(),
        ]);
    }
    args.extend(["train", "--quiet", "--config", config.to_str().unwrap()]);
    args.extend(flags);
    let mut cmd = weft_command(&args);
    if let Some(s) = server {
        s3_env(&mut cmd, s);
    }
    ok(cmd.output().unwrap(), &format!("train {}", config.display()))
}

#[test]
fn token_data_gives_the_same_losses_from_a_folder_or_s3_at_dp_1_and_2() {
    let dir = temp_dir("tokens-dp");
    let server = S3Server::start(&dir.join("s3"));
    server.create_bucket("data");
    prepare(&dir, dir.join("local").to_str().unwrap(), None, 200_000);
    prepare(&dir, "s3://data/shakes", Some(&server), 200_000);
    let run = |name: &str, path: &str, ranks: usize| {
        let c = config(&dir, name, path, 12, "");
        train(&c, ranks, Some(&server), &[]);
        losses(&dir.join(format!("{name}.jsonl")))
    };
    let local1 = run("local1", "local", 1);
    assert_eq!(local1.len(), 12);
    let local2 = run("local2", "local", 2);
    assert_same_curve(&local1, &local2, 1e-5, "dp = 2 against dp = 1");
    // the same bytes through the store: the same losses, bit for bit, at each dp
    assert_eq!(run("s3-1", "s3://data/shakes", 1), local1);
    assert_eq!(run("s3-2", "s3://data/shakes", 2), local2);
    // the model must hold the tokenizer's vocabulary
    let small = config(&dir, "small", "local", 1, "");
    let text = std::fs::read_to_string(&small)
        .unwrap()
        .replace("vocab_size = 50304", "vocab_size = 1000");
    std::fs::write(&small, text).unwrap();
    fails_with(
        &["train", "--config", small.to_str().unwrap()],
        &["model.vocab_size", "50257", "gpt2"],
    );
}

#[test]
fn a_store_down_for_seconds_mid_run_changes_no_loss() {
    let dir = temp_dir("tokens-outage");
    let mut server = S3Server::start(&dir.join("s3"));
    server.create_bucket("data");
    // a corpus of about a million tokens read in 4 KiB blocks: far more blocks than the first
    // steps touch, so the run keeps asking the store for more
    prepare(&dir, dir.join("local").to_str().unwrap(), None, 4_000_000);
    prepare(&dir, "s3://data/shakes", Some(&server), 4_000_000);
    let steps = 150;
    let remote = config(&dir, "remote", "s3://data/shakes", steps, "cache_block_mb = 0.00390625");
    let mut cmd = weft_command(&["train", "--quiet", "--config", remote.to_str().unwrap()]);
    s3_env(&mut cmd, &server);
    let mut child = KillOnDrop(cmd.spawn().unwrap());
    let metrics = dir.join("remote.jsonl");
    assert!(
        wait_for(60, || metrics.exists() && last_logged_step(&metrics) >= 20),
        "the run did not start"
    );
    server.stop();
    std::thread::sleep(Duration::from_secs(3));
    let during = last_logged_step(&metrics);
    server.resume();
    let status = child.0.wait().unwrap();
    assert!(status.success(), "the run through the outage failed: {status}");
    assert!(
        during < steps as u64,
        "the run had ended ({during} steps) before the store came back"
    );
    let records = read_metrics(&metrics);
    let waited: f64 = records.iter().filter_map(|r| r["data_wait_ms"].as_f64()).sum();
    assert!(
        waited >= 1500.0,
        "the run never waited for the store ({waited} ms in all)"
    );
    // the same run from the folder
    let local = config(&dir, "local", "local", steps, "");
    train(&local, 1, None, &[]);
    assert_eq!(losses(&metrics), losses(&dir.join("local.jsonl")));
}

#[test]
fn a_run_killed_mid_epoch_resumes_from_s3_with_the_same_losses() {
    let dir = temp_dir("tokens-kill");
    let server = S3Server::start(&dir.join("s3"));
    server.create_bucket("data");
    prepare(&dir, "s3://data/shakes", Some(&server), 200_000);
    let steps = 30;
    let whole = config(&dir, "whole", "s3://data/shakes", steps, "");
    train(&whole, 1, Some(&server), &[]);
    let killed = config(&dir, "killed", "s3://data/shakes", steps, "");
    let ckpt = dir.join("ckpt");
    let sets = [
        "--set".to_string(),
        path_set("train.checkpoint_dir", &ckpt),
        "--set".to_string(),
        "train.checkpoint_every=5".to_string(),
    ];
    let mut args = vec!["train", "--quiet", "--config", killed.to_str().unwrap()];
    args.extend(sets.iter().map(String::as_str));
    let mut cmd = weft_command(&args);
    s3_env(&mut cmd, &server);
    let mut child = KillOnDrop(cmd.spawn().unwrap());
    let tenth = ckpt.join("step-00000010").join("index.json");
    assert!(wait_for(60, || tenth.exists()), "no checkpoint at step 10");
    // SIGKILL: no chance to save anything more
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    args.push("--resume");
    let mut cmd = weft_command(&args);
    s3_env(&mut cmd, &server);
    ok(cmd.output().unwrap(), "resume");
    // each step logged once, the resumed ones equal to the uninterrupted run's
    let whole = losses(&dir.join("whole.jsonl"));
    let resumed = read_metrics(&dir.join("killed.jsonl"));
    let steps_logged: Vec<u64> = resumed.iter().filter_map(|r| r["step"].as_u64()).collect();
    assert_eq!(steps_logged, (1..=steps as u64).collect::<Vec<_>>());
    assert_eq!(losses(&dir.join("killed.jsonl")), whole);
}

#[test]
fn missing_data_bad_credentials_and_a_dead_store_are_one_line_each() {
    let dir = temp_dir("tokens-bad");
    let server = S3Server::start(&dir.join("s3"));
    server.create_bucket("data");
    prepare(&dir, "s3://data/shakes", Some(&server), 20_000);
    let run = |name: &str, path: &str, extra: &str, env: &[(&str, String)]| -> String {
        let c = config(&dir, name, path, 2, extra);
        let mut cmd = weft_command(&["train", "--quiet", "--config", c.to_str().unwrap()]);
        s3_env(&mut cmd, &server);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(1), "{name}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{name}: {err}");
        assert!(!dir.join(format!("{name}.jsonl")).exists(), "{name} wrote metrics");
        err
    };
    let e = run("nofolder", "nowhere", "", &[]);
    assert!(e.contains("nowhere") && e.contains("index.json"), "{e}");
    let e = run("nokey", "s3://data/elsewhere", "", &[]);
    assert!(e.contains("s3://data/elsewhere") && e.contains("index.json"), "{e}");
    let start = std::time::Instant::now();
    let e = run(
        "badkey",
        "s3://data/shakes",
        "",
        &[("AWS_SECRET_ACCESS_KEY", "wrong".into())],
    );
    assert!(e.contains("s3://data/shakes"), "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "bad credentials were retried"
    );
    let dead = format!("http://127.0.0.1:{}", free_port());
    let e = run(
        "dead",
        "s3://data/shakes",
        "retry_seconds = 1",
        &[("AWS_ENDPOINT_URL", dead.clone())],
    );
    assert!(e.contains("s3://data/shakes"), "{e}");
}

#[test]
fn text_data_takes_any_tokenizer() {
    let dir = temp_dir("text-gpt2");
    let ckpt = dir.join("ckpt");
    let cfg = dir.join("run.toml");
    std::fs::write(
        &cfg,
        format!(
            "[model]\nkind = \"llama\"\nvocab_size = 50304\nblock_size = 16\nn_layer = 1\nn_head = 2\nn_kv_head = 1\n\
             n_embd = 16\nintermediate_size = 32\n\
             [data]\nkind = \"text\"\npath = \"builtin\"\nbatch_size = 4\ntokenizer = \"gpt2\"\n\
             [optim]\nkind = \"adamw\"\nlr = 0.003\n\
             [train]\nsteps = 3\nsample_tokens = 5\ncheckpoint_dir = {ckpt:?}\n"
        ),
    )
    .unwrap();
    let out = weft_ok(&["train", "--quiet", "--config", cfg.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("--- sample (5 tokens) ---"), "{stdout}");
    // the checkpoint records the gpt2 tokenizer: generation encodes and decodes with it
    let gen = weft_ok(&[
        "generate",
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--prompt",
        " weft",
        "--tokens",
        "3",
    ]);
    assert!(String::from_utf8_lossy(&gen.stdout).starts_with(" weft"));
    let index = std::fs::read_to_string(ckpt.join("step-00000003/index.json")).unwrap();
    assert!(index.contains(r#"\"type\":\"gpt2\""#), "{index}");
    // a tokenizer file that is not there, and a vocabulary too small for the tokenizer
    let c = cfg.to_str().unwrap();
    fails_with(
        &[
            "train",
            "--config",
            c,
            "--set",
            "data.tokenizer=\"nowhere/tokenizer.json\"",
        ],
        &["data.tokenizer", "nowhere/tokenizer.json"],
    );
    fails_with(
        &["train", "--config", c, "--set", "model.vocab_size=100"],
        &["model.vocab_size", "50257", "gpt2"],
    );
}

#[test]
fn a_dataset_prepared_again_under_the_same_url_is_not_served_from_the_old_cache() {
    let dir = temp_dir("tokens-reprepare");
    let server = S3Server::start(&dir.join("s3"));
    server.create_bucket("data");
    let url = "s3://data/corpus";
    let run = |name: &str, cache: &str| {
        let c = config(&dir, name, url, 3, &format!("cache_dir = {:?}", dir.join(cache)));
        // TOML refuses a key given twice: keep this cache_dir, drop the one config() wrote
        let text = std::fs::read_to_string(&c).unwrap();
        let text: String = text
            .lines()
            .filter(|l| !l.starts_with("cache_dir") || l.contains(cache))
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(&c, text).unwrap();
        train(&c, 1, Some(&server), &[]);
        losses(&dir.join(format!("{name}.jsonl")))
    };
    prepare(&dir, url, Some(&server), 20_000);
    let first = run("first", "shared-cache");
    // the same URL, another corpus: the old objects removed from the bucket, then prepared again
    std::fs::remove_dir_all(dir.join("s3/data/corpus")).unwrap();
    std::fs::write(dir.join("corpus.txt"), corpus(30_000).to_uppercase()).unwrap();
    prepare(&dir, url, Some(&server), 0);
    let again = run("again", "shared-cache");
    let fresh = run("fresh", "fresh-cache");
    assert_eq!(again, fresh, "the run read the old dataset's cached blocks");
    assert_ne!(again, first);
    // the run store tells the two datasets apart: each run's data input is the URL with the
    // digest of the index.json it read (the bucket's folder holds the current one)
    let store = weft_track::Store::open_existing(&common::test_runs_dir()).unwrap();
    let data_of = |name: &str| {
        let runs = store.list_runs(None).unwrap();
        let metrics = format!("{name}.jsonl");
        let r = runs
            .iter()
            .find(|r| r.params.get("train.metrics") == Some(&metrics))
            .unwrap_or_else(|| panic!("no run wrote {metrics}"));
        let inputs = store.inputs(r.id).unwrap();
        assert_eq!(
            (inputs[0].kind.as_str(), inputs[0].uri.as_str()),
            ("data", url),
            "{inputs:?}"
        );
        inputs[0].digest.clone().unwrap()
    };
    let now = common::sha256_of(&dir.join("s3/data/corpus/index.json"));
    assert_eq!(data_of("again"), now);
    assert_eq!(data_of("fresh"), now);
    assert_ne!(data_of("first"), now);
}
