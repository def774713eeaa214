//! Bad input never panics: each case exits non-zero with one line naming the culprit.

mod common;

use common::{fixtures, temp_dir, weft};

/// Runs `weft train` and checks it fails with a single error line containing every `needle`.
/// `weft train` of the gpt fixture with `--set set` fails naming `needles` ([`fails_naming`]).
fn setting_fails_naming(set: &str, needles: &[&str]) {
    fails_naming(&["train", "--quiet", "--config", &gpt_config(), "--set", set], needles);
}

fn fails_naming(args: &[&str], needles: &[&str]) {
    let out = weft(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "weft {args:?} should fail");
    assert_eq!(
        out.status.code(),
        Some(1),
        "exit status of weft {args:?} (a panic exits 101): {stderr}"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line for {args:?}, got:\n{stderr}");
    assert!(lines[0].starts_with("weft: error: "), "{stderr}");
    for n in needles {
        assert!(lines[0].contains(n), "{args:?}: {:?} should name {n:?}", lines[0]);
    }
}

fn gpt_config() -> String {
    fixtures().join("gpt_adamw/run.toml").to_str().unwrap().to_string()
}

#[test]
fn typo_in_a_key() {
    setting_fails_naming("optim.lrr=0.1", &["optim", "lrr"]);
    let dir = temp_dir("typo-section");
    let cfg = dir.join("run.toml");
    let text = std::fs::read_to_string(gpt_config())
        .unwrap()
        .replace("[train]", "[trian]");
    std::fs::write(&cfg, text).unwrap();
    fails_naming(&["train", "--quiet", "--config", cfg.to_str().unwrap()], &["trian"]);
}

#[test]
fn wrong_type() {
    setting_fails_naming("optim.lr=\"fast\"", &["optim.lr"]);
    setting_fails_naming("model.n_layer=-2", &["model", "n_layer"]);
    setting_fails_naming("optim.kind=\"adagrad\"", &["optim.kind", "adagrad"]);
}

#[test]
fn bad_values() {
    setting_fails_naming("parallel.dp=2", &["dp x tp x pp = 2 x 1 x 1 = 2", "single process"]);
    setting_fails_naming("parallel.tp=2", &["tp x pp = 2 x 1 = 2", "single process"]);
    setting_fails_naming("parallel.pp=0", &["parallel.pp", "at least 1"]);
    setting_fails_naming("parallel.zero=7", &["parallel.zero", "0-3"]);
    setting_fails_naming("parallel.comm_dtype=\"bf16\"", &["parallel.comm_dtype", "needs ZeRO"]);
    setting_fails_naming("parallel.comm_dtype=\"f16\"", &["parallel.comm_dtype", "f32, bf16"]);
    // what pipeline stages send: bf16 only where there are stages
    setting_fails_naming(
        "parallel.pipeline_dtype=\"bf16\"",
        &["parallel.pipeline_dtype", "needs pp > 1"],
    );
    setting_fails_naming(
        "parallel.pipeline_dtype=\"f16\"",
        &["parallel.pipeline_dtype", "f32, bf16"],
    );
    setting_fails_naming("model.n_head=3", &["n_embd", "n_head"]);
    // a text shorter than one window named neither the file nor the key
    let dir = temp_dir("short-text");
    let short = dir.join("short.txt");
    std::fs::write(&short, "hello world").unwrap();
    let path = format!("data.path={:?}", short.to_str().unwrap());
    fails_naming(
        &[
            "train",
            "--quiet",
            "--set",
            &path,
            "--set",
            "model.block_size=100",
            "--set",
            "train.eval_every=0",
        ],
        &["model.block_size: 100", "short.txt", "9 tokens"],
    );
    // an empty path named no key; evaluating 0 batches every few steps evaluated nothing
    setting_fails_naming("data.path=\"\"", &["data.path", "is empty"]);
    fails_naming(
        &[
            "train",
            "--quiet",
            "--config",
            &gpt_config(),
            "--set",
            "train.eval_every=1",
            "--set",
            "train.eval_batches=0",
        ],
        &["train.eval_batches", "evaluate nothing"],
    );
}

#[test]
fn missing_files() {
    fails_naming(
        &["train", "--quiet", "--config", "/nonexistent/run.toml"],
        &["/nonexistent/run.toml"],
    );
    let dir = temp_dir("missing-data");
    let cfg = dir.join("run.toml");
    let text = std::fs::read_to_string(gpt_config())
        .unwrap()
        .replace("from = \"init.safetensors\"", "from = \"nowhere.safetensors\"");
    std::fs::write(&cfg, text).unwrap();
    // the data is the fixture's own; only the init file is missing
    let data = fixtures().join("gpt_adamw/batches.safetensors");
    let data = format!("data.path={:?}", data.to_str().unwrap());
    // nothing of the run's is left behind, its checkpoint folder's lock included
    let ckpt = dir.join("ckpt");
    let ckpt_set = format!("train.checkpoint_dir={:?}", ckpt.to_str().unwrap());
    fails_naming(
        &[
            "train",
            "--quiet",
            "--config",
            cfg.to_str().unwrap(),
            "--set",
            &data,
            "--set",
            &ckpt_set,
        ],
        &["nowhere.safetensors"],
    );
    assert!(
        !ckpt.join(weft_train::checkpoint::LOCK).exists(),
        "a run that never started left its lock"
    );
    fails_naming(
        &["generate", "--checkpoint", dir.join("no-ckpt").to_str().unwrap()],
        &["no-ckpt"],
    );
    // a config that never ends was read until memory ran out
    fails_naming(
        &["train", "--quiet", "--config", "/dev/zero"],
        &["/dev/zero", "not a run config"],
    );
}

#[test]
fn truncated_and_mismatched_safetensors() {
    let dir = temp_dir("bad-init");
    let src = fixtures().join("gpt_adamw");
    let bytes = std::fs::read(src.join("init.safetensors")).unwrap();
    std::fs::write(dir.join("init.safetensors"), &bytes[..bytes.len() - 100]).unwrap();
    std::fs::copy(src.join("batches.safetensors"), dir.join("batches.safetensors")).unwrap();
    std::fs::copy(src.join("run.toml"), dir.join("run.toml")).unwrap();
    let cfg = dir.join("run.toml");
    fails_naming(
        &["train", "--quiet", "--config", cfg.to_str().unwrap()],
        &["init.safetensors", "truncated"],
    );
    // a model of another width: the message names the tensor and both shapes
    fails_naming(
        &[
            "train",
            "--quiet",
            "--config",
            &gpt_config(),
            "--set",
            "model.n_embd=48",
        ],
        &["init.safetensors", "transformer.wte.weight", "[65, 32]", "[65, 48]"],
    );
    // a wrong batches file
    std::fs::copy(src.join("init.safetensors"), dir.join("batches.safetensors")).unwrap();
    std::fs::copy(src.join("init.safetensors"), dir.join("init.safetensors")).unwrap();
    fails_naming(
        &["train", "--quiet", "--config", cfg.to_str().unwrap()],
        &["batches.safetensors", "inputs"],
    );
}

#[test]
fn token_id_out_of_vocabulary() {
    let dir = temp_dir("vocab");
    let src = fixtures().join("gpt_adamw");
    std::fs::copy(src.join("batches.safetensors"), dir.join("batches.safetensors")).unwrap();
    let text = std::fs::read_to_string(src.join("run.toml"))
        .unwrap()
        .replace("[init]\nfrom = \"init.safetensors\"\n", "");
    let cfg = dir.join("run.toml");
    std::fs::write(&cfg, text).unwrap();
    fails_naming(
        &[
            "train",
            "--quiet",
            "--config",
            cfg.to_str().unwrap(),
            "--set",
            "model.vocab_size=10",
        ],
        &["token id", "vocab_size = 10"],
    );
}

/// Sizes far past any machine (whose products would overflow), optimizer settings out of
/// range, empty paths and keys that do nothing in the layout are refused from the config, naming
/// the key, before any file is written (the run's metrics file and checkpoint folder are set).
#[test]
fn config_values_are_refused_before_anything_is_written() {
    let dir = temp_dir("refused-before-writing");
    let (ckpt, metrics) = (dir.join("ckpt"), dir.join("m.jsonl"));
    let huge = "4611686018427387904";
    #[rustfmt::skip]
    let cases: &[(&[&str], &[&str])] = &[
        (&["model.n_embd", huge, "model.n_head", "1"], &["model.n_embd", "more than"]),
        (&["parallel.dp", huge, "parallel.tp", "4"], &["parallel.dp", "more than"]),
        (&["parallel.tp", huge, "parallel.pp", "4"], &["parallel.tp", "more than"]),
        (&["parallel.pp", huge, "parallel.schedule", "\"interleaved\"", "parallel.virtual_stages", "4",
           "parallel.micro_batches", huge], &["parallel.pp", "more than"]),
        (&["train.eval_batches", huge], &["train.eval_batches", "more than"]),
        (&["optim.weight_decay", "-1"], &["optim.weight_decay", "-1"]),
        (&["optim.weight_decay", "nan"], &["optim.weight_decay", "NaN"]),
        (&["optim.betas", "[1.0, 0.95]"], &["optim.betas", "beta1 = 1"]),
        (&["optim.eps", "-1e-8"], &["optim.eps"]),
        (&["train.checkpoint_dir", "\"\""], &["train.checkpoint_dir", "empty"]),
        (&["parallel.stage_blocks", "[1, 1]"], &["parallel.stage_blocks", "pp > 1"]),
        (&["schedule.warmup_steps", "50"], &["schedule", "warmup_steps"]),
    ];
    for (sets, needles) in cases {
        let mut args = vec!["train".to_string(), "--quiet".into(), "--config".into(), gpt_config()];
        for pair in sets.chunks(2) {
            args.extend(["--set".to_string(), format!("{}={}", pair[0], pair[1])]);
        }
        for (key, path) in [("train.checkpoint_dir", &ckpt), ("train.metrics", &metrics)] {
            if !sets.contains(&key) {
                args.extend(["--set".to_string(), format!("{key}={:?}", path.to_str().unwrap())]);
            }
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails_naming(&args, needles);
        let out = weft(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("::"), "{sets:?}: the message names a function: {err}");
        assert!(
            !ckpt.exists() && !metrics.exists(),
            "{sets:?} wrote files before failing"
        );
    }
    // a batches file made for another model: named with the key, nothing written
    let mlp = fixtures().join("mlp_adamw/run.toml");
    #[rustfmt::skip]
    let mismatched: &[(&str, &str, &[&str])] = &[
        (mlp.to_str().unwrap(), "model.in_features=19", &["model.in_features", "[20] (20 values)", "take 19"]),
        (mlp.to_str().unwrap(), "model.out_features=2", &["targets of step", "hold class", "the model's 2 classes"]),
        (&gpt_config(), "model.vocab_size=10", &["inputs of step", "model.vocab_size"]),
        (&gpt_config(), "model.block_size=8", &["model.block_size = 8", "T <= 8"]),
    ];
    for (config, set, needles) in mismatched {
        let (ckpt_set, metrics_set) = (
            format!("train.checkpoint_dir={:?}", ckpt.to_str().unwrap()),
            format!("train.metrics={:?}", metrics.to_str().unwrap()),
        );
        fails_naming(
            &[
                "train",
                "--quiet",
                "--config",
                config,
                "--set",
                set,
                "--set",
                &ckpt_set,
                "--set",
                &metrics_set,
            ],
            needles,
        );
        assert!(!ckpt.exists() && !metrics.exists(), "{set} wrote files before failing");
    }
    // a metrics path that is a folder says so
    fails_naming(
        &[
            "train",
            "--quiet",
            "--config",
            &gpt_config(),
            "--set",
            &format!("train.metrics={:?}", dir.to_str().unwrap()),
        ],
        &["train.metrics", "is a folder"],
    );
    // and evaluate's own count
    let out = weft(&[
        "evaluate",
        "--config",
        &gpt_config(),
        "--checkpoint",
        dir.to_str().unwrap(),
        "--batches",
        "18446744073709551615",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("--batches") && err.contains("at most 16777216"), "{err}");
}

/// What the batches-file check lets through: a convnet's rows flattened to `C*H*W` values (the
/// model reshapes them) and a classifier's targets of -100, which its loss skips; the run trains.
#[test]
fn batches_the_models_accept_are_not_refused() {
    use weft_core::io::safetensors;
    let dir = temp_dir("batches-accepted");
    let src = fixtures().join("convnet_adamw");
    let file = safetensors::load(&src.join("batches.safetensors")).unwrap();
    let inputs = file.tensors["inputs"].reshape(&[8, 4, 64]).unwrap();
    let mut targets = file.tensors["targets"].to_vec::<i64>().unwrap();
    targets[1] = -100;
    let targets = weft_core::Tensor::from_vec(targets, &[8, 4]).unwrap();
    let path = dir.join("batches.safetensors");
    let tensors = [("inputs", &inputs), ("targets", &targets)];
    safetensors::save(&path, tensors, &Default::default()).unwrap();
    let config = src.join("run.toml");
    let init = src.join("init.safetensors");
    let out = weft(&[
        "train",
        "--quiet",
        "--config",
        config.to_str().unwrap(),
        "--set",
        &format!("data.path={:?}", path.to_str().unwrap()),
        "--set",
        &format!("init.from={:?}", init.to_str().unwrap()),
        "--set",
        "train.steps=2",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
