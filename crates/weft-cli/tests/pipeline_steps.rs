//! `weft pipeline` with the step kinds `prepare`, `evaluate` and `deploy` and `${steps.NAME.KEY}`
//! references: a command writes a corpus, prepare tokenizes it, a tiny gpt trains on
//! `${steps.prep.data}`, evaluate measures its checkpoint (what `weft evaluate` prints, and what
//! the run's own evaluation logged at that step), a condition gates on the evaluated value,
//! register and deploy put it in production; a second run is cached; a changed corpus reruns
//! prepare and everything after it; deploy against real `weft serve` processes (one following
//! the registry, one told through the management API) ends with each answering the new
//! version; the Tiny Shakespeare example runs on tiny settings (skipped without the data). (What
//! fails in one line: `pipeline_step_refusals.rs`.)

mod common;

use std::path::Path;
use std::process::{Output, Stdio};

use common::{free_port, temp_dir, wait_for, weft_command};
use serde_json::Value;

fn weft_with(runs: &Path, args: &[&str]) -> Output {
    common::weft_with_store(runs, args)
}

fn ok(runs: &Path, args: &[&str]) -> String {
    common::weft_ok_with_store(runs, args)
}

/// A tiny character-level gpt on token data whose path and vocabulary the pipeline sets: 6
/// steps, evaluated (2 batches) at step 6.
const GPT: &str = "[model]\nkind = \"gpt\"\nvocab_size = 64\nblock_size = 16\nn_layer = 1\nn_head = 2\nn_embd = 16\n\
    bias = true\ndropout = 0.0\n\n[data]\nkind = \"tokens\"\npath = \"set-by-the-pipeline\"\nbatch_size = 4\n\n\
    [optim]\nkind = \"adamw\"\nlr = 0.01\n\n[train]\nsteps = 6\nlog_every = 1\neval_every = 6\neval_batches = 2\n\
    sample_tokens = 0\n";

/// corpus (a command) -> prep -> train -> eval -> gate -> reg -> ship, and `again` (an
/// evaluate step given the data) beside eval.
const FLOW: &str = "[[step]]\nname = \"corpus\"\nkind = \"command\"\n\
    argv = [\"sh\", \"-c\", \"for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo 'to be or not to be, that is the question'; done > corpus.txt\"]\n\n\
    [[step]]\nname = \"prep\"\nkind = \"prepare\"\ntokenizer = \"char\"\ninput = [\"corpus.txt\"]\noutput = \"data\"\n\
    val_fraction = 0.25\ndepends_on = [\"corpus\"]\n\n\
    [[step]]\nname = \"train\"\nkind = \"train\"\nconfig = \"gpt.toml\"\n\
    set = [\"data.path=\\\"${steps.prep.data}\\\"\", \"model.vocab_size=${steps.prep.vocab_size}\"]\n\
    depends_on = [\"prep\"]\n\n\
    [[step]]\nname = \"eval\"\nkind = \"evaluate\"\nstep = \"train\"\nbatches = 2\ndepends_on = [\"train\"]\n\n\
    [[step]]\nname = \"again\"\nkind = \"evaluate\"\nstep = \"train\"\nbatches = 2\ndata = \"${steps.prep.data}\"\n\
    depends_on = [\"train\"]\n\n\
    [[step]]\nname = \"gate\"\nkind = \"condition\"\nstep = \"eval\"\nkey = \"value\"\nop = \"<\"\nvalue = 100\n\
    depends_on = [\"eval\"]\n\n\
    [[step]]\nname = \"reg\"\nkind = \"register\"\nstep = \"train\"\nmodel = \"lm\"\ndepends_on = [\"gate\"]\n\n\
    [[step]]\nname = \"ship\"\nkind = \"deploy\"\nstep = \"reg\"\nmodel = \"lm\"\ndepends_on = [\"reg\"]\n";

const ALL: [&str; 8] = ["corpus", "prep", "train", "eval", "again", "gate", "reg", "ship"];

/// The output of step `step` in a pipeline run's stdout (`step S: finished: OUT` or `step S:
/// cached (...): OUT`), as key -> value.
fn output_of(out: &str, step: &str) -> std::collections::BTreeMap<String, String> {
    let line = out
        .lines()
        .find(|l| {
            l.starts_with(&format!("step {step}: finished: ")) || l.starts_with(&format!("step {step}: cached ("))
        })
        .unwrap_or_else(|| panic!("no output of step {step}: {out}"));
    let text = line
        .split_once("): ")
        .map_or_else(|| line.split_once(": finished: ").unwrap().1, |(_, t)| t);
    text.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
        .collect()
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn models(runs: &Path) -> Vec<Value> {
    json_of(&ok(runs, &["models", "list", "--json"]))
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn a_prepared_corpus_is_trained_evaluated_gated_registered_and_deployed() {
    let dir = temp_dir("pipeline-steps");
    let runs = dir.join("runs");
    std::fs::write(dir.join("gpt.toml"), GPT).unwrap();
    let file = dir.join("flow.toml");
    std::fs::write(&file, FLOW).unwrap();
    let f = file.to_str().unwrap();

    let first = ok(&runs, &["pipeline", "run", f]);
    for step in ALL {
        assert!(first.contains(&format!("step {step}: finished")), "{step}: {first}");
    }
    // prepare: a folder of its own in `data/`, the corpus's tokens and vocabulary
    let prep = output_of(&first, "prep");
    let data = Path::new(&prep["data"]);
    assert!(
        data.starts_with(dir.join("data")) && data.join("index.json").is_file(),
        "{prep:?}"
    );
    let corpus = std::fs::read_to_string(dir.join("corpus.txt")).unwrap();
    assert_eq!(prep["tokens"], corpus.chars().count().to_string(), "{prep:?}");
    let mut chars: Vec<char> = corpus.chars().collect();
    chars.sort();
    chars.dedup();
    assert_eq!(prep["vocab_size"], chars.len().to_string());
    // the train run read the prepared data: its params hold the resolved references
    let run_id = output_of(&first, "train")["run"].clone();
    let run = json_of(&ok(&runs, &["runs", "show", &run_id, "--json"]));
    assert_eq!(run["params"]["data.path"], prep["data"].as_str(), "{run}");
    assert_eq!(run["params"]["model.vocab_size"], prep["vocab_size"].as_str(), "{run}");

    // evaluate: the value `weft evaluate` prints for that checkpoint, recorded into the run
    let eval = output_of(&first, "eval");
    assert_eq!(
        (
            eval["metric"].as_str(),
            eval["run"].as_str(),
            eval["step"].as_str(),
            eval["batches"].as_str()
        ),
        ("val_loss", run_id.as_str(), "6", "2"),
        "{eval:?}"
    );
    let value: f64 = eval["value"].parse().unwrap();
    let ckpt = run["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|a| a["kind"] == "checkpoint")
        .unwrap()["path"]
        .as_str()
        .unwrap()
        .to_string();
    let data_set = format!("data.path={:?}", prep["data"]);
    let vocab_set = format!("model.vocab_size={}", prep["vocab_size"]);
    let printed = json_of(&ok(
        &runs,
        &[
            "evaluate",
            "--config",
            dir.join("gpt.toml").to_str().unwrap(),
            "--checkpoint",
            &ckpt,
            "--set",
            &data_set,
            "--set",
            &vocab_set,
            "--batches",
            "2",
            "--json",
        ],
    ));
    assert_eq!(printed["val_loss"].as_f64(), Some(value), "{printed}");
    assert_eq!(
        (printed["step"].as_u64(), printed["batches"].as_u64()),
        (Some(6), Some(2))
    );
    // the same checkpoint, batches and evaluation as the run's own at step 6: the same loss
    let run = json_of(&ok(&runs, &["runs", "show", &run_id, "--json"]));
    assert_eq!(run["metric_summaries"]["val_loss"]["last_step"], 6, "{run}");
    assert_eq!(run["metrics"]["val_loss"].as_f64(), Some(value), "{run}");
    assert_eq!(run["metrics"]["eval/val_loss"].as_f64(), Some(value), "{run}");
    assert_eq!(run["metric_summaries"]["eval/val_loss"]["last_step"], 6, "{run}");
    // `data` set to the same folder: the same value
    assert_eq!(output_of(&first, "again")["value"], eval["value"]);

    assert!(first.contains("step gate: finished: true"), "{first}");
    assert!(
        first.contains("step ship: finished: model=lm version=1 stage=production"),
        "{first}"
    );
    let v = models(&runs);
    assert_eq!((v.len(), &v[0]["stage"]), (1, &Value::from("production")), "{v:?}");

    // a second run: every step from the cache
    let second = ok(&runs, &["pipeline", "run", f]);
    assert_eq!(second.matches(": cached (").count(), ALL.len(), "{second}");
    assert!(!second.contains("running"), "{second}");
    assert_eq!(output_of(&second, "eval")["value"], eval["value"]);

    // a changed corpus (the command that wrote it is cached): prepare and every step after it
    // run again; the new version is in production, the old one archived
    std::fs::write(
        dir.join("corpus.txt"),
        format!("{corpus}whether 'tis nobler in the mind to suffer\n"),
    )
    .unwrap();
    let third = ok(&runs, &["pipeline", "run", f]);
    assert!(third.contains("step corpus: cached"), "{third}");
    for step in &ALL[1..] {
        assert!(third.contains(&format!("step {step}: finished")), "{step}: {third}");
    }
    assert_ne!(output_of(&third, "prep")["data"], prep["data"]);
    assert!(third.contains("model=lm version=2 stage=production"), "{third}");
    let stages: Vec<(i64, String)> = models(&runs)
        .iter()
        .map(|v| (v["version"].as_i64().unwrap(), v["stage"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(stages, [(1, "archived".to_string()), (2, "production".to_string())]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `weft serve` process, killed when dropped.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `weft serve ARGS` on free ports with the token file `token`; the server, its
/// inference URL and its management URL, once it answers its health check.
fn serve(args: &[&str], token: &Path) -> (Server, String, String) {
    let (port, mport, xport) = (
        free_port().to_string(),
        free_port().to_string(),
        free_port().to_string(),
    );
    let mut all = vec![
        "serve",
        "--port",
        &port,
        "--management-port",
        &mport,
        "--metrics-port",
        &xport,
    ];
    all.extend(["--token-file", token.to_str().unwrap()]);
    all.extend(args);
    let child = weft_command(&all)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let server = Server(child);
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::blocking::Client::new();
    let up = wait_for(60, || {
        client
            .get(format!("{base}/v2/health/live"))
            .send()
            .is_ok_and(|r| r.status() == 200)
    });
    assert!(up, "weft serve {args:?} answered no health check");
    (server, base, format!("http://127.0.0.1:{mport}"))
}

/// The version that answers an infer request to model `cls` of the server at `base`.
fn answering_version(base: &str) -> String {
    let body =
        serde_json::json!({"inputs": [{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [0.3, 0.6]}]});
    let r = reqwest::blocking::Client::new()
        .post(format!("{base}/v2/models/cls/infer"))
        .body(body.to_string())
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = serde_json::from_str(&r.text().unwrap()).unwrap();
    v["model_version"].as_str().unwrap().to_string()
}

#[test]
fn deploy_steps_make_running_servers_answer_with_the_new_version() {
    let dir = temp_dir("pipeline-deploy");
    let runs = dir.join("runs");
    common::write_tiny_mlp(&dir, "steps = 4\nlog_every = 1\n");
    std::fs::create_dir_all(&runs).unwrap();
    // the store exists before the servers read it (a run recorded in it)
    let mlp = dir.join("mlp.toml");
    ok(
        &runs,
        &[
            "train",
            "--config",
            mlp.to_str().unwrap(),
            "--set",
            "track.enabled=true",
        ],
    );
    let token = dir.join("token");
    std::fs::write(&token, "management-token-0123456789").unwrap();
    // one server follows the registry; the other is told through its management API
    let (_a, a_url, a_mgmt) = serve(
        &["--registry", runs.to_str().unwrap(), "--registry-poll-ms", "200"],
        &token,
    );
    let (_b, b_url, b_mgmt) = serve(&["--model-store", runs.to_str().unwrap()], &token);
    let flow = format!(
        "[[step]]\nname = \"train\"\nkind = \"train\"\nconfig = \"mlp.toml\"\n\n\
         [[step]]\nname = \"reg\"\nkind = \"register\"\nstep = \"train\"\nmodel = \"cls\"\ndepends_on = [\"train\"]\n\n\
         [[step]]\nname = \"follow\"\nkind = \"deploy\"\nstep = \"reg\"\nmodel = \"cls\"\nserver = \"{a_mgmt}\"\n\
         token_file = \"token\"\ntimeout = 60\ndepends_on = [\"reg\"]\n\n\
         [[step]]\nname = \"told\"\nkind = \"deploy\"\nstep = \"reg\"\nmodel = \"cls\"\nserver = \"{b_mgmt}\"\n\
         token_file = \"token\"\nmodel_store = \"runs\"\ntimeout = 60\ndepends_on = [\"follow\"]\n"
    );
    let file = dir.join("flow.toml");
    std::fs::write(&file, &flow).unwrap();
    let f = file.to_str().unwrap();

    let first = ok(&runs, &["pipeline", "run", f]);
    for step in ["follow", "told"] {
        assert!(
            first.contains(&format!(
                "step {step}: finished: model=cls version=1 stage=production server="
            )),
            "{first}"
        );
    }
    assert_eq!(answering_version(&a_url), "1");
    assert_eq!(answering_version(&b_url), "1");

    // a changed config: a new run, version 2, and both servers answer with it
    let config = std::fs::read_to_string(dir.join("mlp.toml")).unwrap();
    std::fs::write(dir.join("mlp.toml"), config.replace("lr = 0.01", "lr = 0.02")).unwrap();
    let second = ok(&runs, &["pipeline", "run", f]);
    assert!(second.contains("step told: finished: model=cls version=2"), "{second}");
    assert_eq!(answering_version(&a_url), "2");
    assert_eq!(answering_version(&b_url), "2");

    // unchanged: train and register come from the cache, the deploy steps run (a server may
    // have been told otherwise meanwhile) and find version 2 served
    let third = ok(&runs, &["pipeline", "run", f]);
    assert!(
        third.contains("step train: cached") && third.contains("step reg: cached"),
        "{third}"
    );
    assert!(
        third.contains("step follow: running") && third.contains("step told: finished"),
        "{third}"
    );

    // a server that is not there: the deploy step fails after its timeout, in one line
    let dead = free_port();
    std::fs::write(
        &file,
        flow.replace(&b_mgmt, &format!("http://127.0.0.1:{dead}")).replace(
            "timeout = 60\ndepends_on = [\"follow\"]",
            "timeout = 1\ndepends_on = [\"follow\"]",
        ),
    )
    .unwrap();
    let out = weft_with(&runs, &["pipeline", "run", f]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(&format!("told: server http://127.0.0.1:{dead}")), "{err}");

    // a token file that is a FIFO: refused at once, not read until a writer comes
    std::fs::write(&file, &flow).unwrap();
    std::fs::remove_file(&token).unwrap();
    common::mkfifo(&token);
    let mut cmd = common::weft_command(&["pipeline", "run", f]);
    cmd.env("WEFT_TRACK_DIR", &runs);
    let out = common::output_within(cmd, 60, "a FIFO token file");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("follow: `token_file`") && err.contains("a FIFO"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `text` with `from` replaced by `to`, which must be there (the example changed otherwise).
fn swap(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "the example no longer holds {from:?}");
    text.replace(from, to)
}

#[test]
fn the_shakespeare_example_runs_on_tiny_settings_then_comes_from_the_cache() {
    let corpus = common::repo().join("../shared/data/tinyshakespeare.txt");
    if !corpus.is_file() {
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "skipped: {} is not there", corpus.display());
        return;
    }
    let dir = temp_dir("pipeline-shakespeare");
    let runs = dir.join("runs");
    let examples = common::repo().join("examples");
    let read = |name: &str| std::fs::read_to_string(examples.join(name)).unwrap();
    // the example's files, shrunk: a 1-layer gpt of width 16 on windows of 16 tokens, 2 steps a
    // trial, 2 trials, 4 steps for the best, 2 evaluation batches
    let mut flow = swap(
        &read("pipeline_shakespeare.toml"),
        "\"../../shared/data/tinyshakespeare.txt\"",
        &format!("{:?}", corpus.canonicalize().unwrap()),
    );
    flow = swap(
        &flow,
        "[\"train.steps=300\", \"train.eval_every=100\",",
        "[\"train.steps=4\", \"train.eval_every=4\",",
    );
    flow = swap(&flow, "batches = 16", "batches = 2");
    flow = swap(&flow, "value = 8.0", "value = 100.0");
    let mut gpt = read("pipeline_shakespeare_gpt.toml");
    for (from, to) in [
        ("n_layer = 2", "n_layer = 1"),
        ("n_embd = 64", "n_embd = 16"),
        ("block_size = 64", "block_size = 16"),
        ("steps = 100", "steps = 2"),
        ("log_every = 25", "log_every = 1"),
        ("eval_every = 50", "eval_every = 2"),
        ("eval_batches = 4", "eval_batches = 2"),
    ] {
        gpt = swap(&gpt, from, to);
    }
    let sweep = swap(
        &read("pipeline_shakespeare_sweep.toml"),
        "[0.001, 0.003, 0.01]",
        "[0.001, 0.01]",
    );
    std::fs::write(dir.join("pipeline_shakespeare.toml"), flow).unwrap();
    std::fs::write(dir.join("pipeline_shakespeare_gpt.toml"), gpt).unwrap();
    std::fs::write(dir.join("pipeline_shakespeare_sweep.toml"), sweep).unwrap();
    let file = dir.join("pipeline_shakespeare.toml");
    let run = || {
        ok(
            &runs,
            &[
                "pipeline",
                "run",
                file.to_str().unwrap(),
                "--dir",
                runs.to_str().unwrap(),
            ],
        )
    };
    let first = run();
    let steps = ["prepare", "sweep", "train", "evaluate", "gate", "register", "deploy"];
    for step in steps {
        assert!(first.contains(&format!("step {step}: finished")), "{step}: {first}");
    }
    // GPT-2's tokens of Tiny Shakespeare, as docs/data.md gives them
    let prep = output_of(&first, "prepare");
    assert_eq!(
        (prep["train_tokens"].as_str(), prep["val_tokens"].as_str()),
        ("304223", "33804"),
        "{prep:?}"
    );
    assert!(first.contains("step gate: finished: true"), "{first}");
    assert!(
        first.contains("step deploy: finished: model=shakespeare_gpt version=1 stage=production"),
        "{first}"
    );
    // the version's lineage: the train step's run, which read the prepare step's folder, its
    // digest that of the folder's index.json
    let l = json_of(&ok(&runs, &["models", "lineage", "shakespeare_gpt", "1", "--json"]));
    let made = &l["runs"][0];
    assert_eq!(made["made_by"][0]["step"], "train", "{l}");
    assert_eq!(made["inputs"][0]["kind"], "data", "{l}");
    assert_eq!(made["inputs"][0]["made_by"][0]["step"], "prepare", "{l}");
    let index = std::path::Path::new(&prep["data"]).join("index.json");
    assert_eq!(made["inputs"][0]["digest"], common::sha256_of(&index), "{l}");
    let second = run();
    assert_eq!(second.matches(": cached (").count(), steps.len(), "{second}");
    let _ = std::fs::remove_dir_all(&dir);
}
