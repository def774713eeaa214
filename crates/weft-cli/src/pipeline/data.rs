//! The prepare step (`weft data prepare` into a folder of its own) and the evaluate step
//! (`weft evaluate` of a train step's last checkpoint, its value recorded into that run).

use std::collections::BTreeMap;
use std::process::Command;

use weft_data::tokens::INDEX_NAME;
use weft_data::ObjectSource;
use weft_track::Store;
use weft_tune::pipeline::refs::output;
use weft_tune::pipeline::{Cache, Evaluate, Prepare};

use super::execute::{captured, run_of, train_settings};
use super::Context;

/// How many hex digits of a prepare step's cache key name its execution's folder.
const FOLDER_DIGITS: usize = 16;

/// Tokenizes the inputs into `OUTPUT/KEY` (the first 16 hex digits of the step's cache key
/// `key`: every execution has its own folder, and identical settings and inputs give the same
/// one). A folder that already holds an `index.json` was written by an execution with this
/// very key (the same input bytes, tokenizer and settings), so it is used as it is. The output:
/// `data=FOLDER_OR_URL tokens=N train_tokens=N val_tokens=N vocab_size=V`.
pub(super) fn prepare(ctx: &Context, p: &Prepare, key: &str) -> Result<String, String> {
    let sub = &key[..FOLDER_DIGITS.min(key.len())];
    let target = if p.output.contains("://") {
        format!("{}/{sub}", p.output.trim_end_matches('/'))
    } else {
        let dir = ctx.root.join(&p.output).join(sub);
        dir.to_str()
            .ok_or_else(|| format!("`output`: {} is not UTF-8", dir.display()))?
            .to_string()
    };
    let store = weft_data::store::open(&target).map_err(|e| format!("`output` {target}: {e}"))?;
    if ObjectSource::len(&*store, INDEX_NAME).is_err() {
        let mut cmd = Command::new(&ctx.exe);
        cmd.current_dir(&ctx.root).args(["data", "prepare", "--tokenizer"]);
        if ["gpt2", "char"].contains(&p.tokenizer.as_str()) {
            cmd.arg(&p.tokenizer);
        } else {
            cmd.arg(ctx.root.join(&p.tokenizer));
        }
        cmd.arg("--input");
        for i in &p.input {
            cmd.arg(ctx.root.join(i));
        }
        cmd.args(["--output", &target]);
        if let Some(f) = p.val_fraction {
            cmd.args(["--val-fraction", &f.to_string()]);
        }
        if let Some(n) = p.shard_tokens {
            cmd.args(["--shard-tokens", &n.to_string()]);
        }
        captured(cmd, "weft data prepare")?;
    }
    let index = ObjectSource::read(&*store, INDEX_NAME).map_err(|e| format!("{target}: {e}"))?;
    let index: serde_json::Value =
        serde_json::from_slice(&index).map_err(|e| format!("{}: {e}", store.describe(INDEX_NAME)))?;
    let split = |name: &str| index["splits"][name]["tokens"].as_u64().unwrap_or(0);
    let (train, val) = (split("train"), split("val"));
    Ok(output(&[
        ("data", target.clone()),
        ("tokens", (train + val).to_string()),
        ("train_tokens", train.to_string()),
        ("val_tokens", val.to_string()),
        ("vocab_size", index["vocab_size"].as_u64().unwrap_or(0).to_string()),
    ]))
}

/// Evaluates the last checkpoint of the run that train step `e.step` made (`weft evaluate
/// --json`, with `e.config` or else the train step's config and overrides, `data.path` set to
/// `e.data` when given), and records the loss (and accuracy) into that run as `eval/val_loss`
/// (`eval/val_accuracy`) at the checkpoint's step. The output: `metric=val_loss value=V run=ID
/// step=S batches=N` (and `accuracy=A`).
pub(super) fn evaluate(ctx: &Context, e: &Evaluate, outputs: &BTreeMap<String, String>) -> Result<String, String> {
    let run = run_of(outputs.get(&e.step).map_or("", String::as_str))?;
    let store = Store::open_existing(&ctx.dir).map_err(|e| e.to_string())?;
    let detail = store.run_detail(run).map_err(|e| e.to_string())?;
    drop(store);
    let ckpt = weft_tune::registry::last_checkpoint(&detail).ok_or_else(|| {
        format!(
            "run {run} (step {:?}) recorded no checkpoint that is still there",
            e.step
        )
    })?;
    let (config, mut sets) = match &e.config {
        Some(c) => (ctx.root.join(c), Vec::new()),
        None => {
            let train = ctx.steps.step(&e.step).ok_or_else(|| format!("no step {:?}", e.step))?;
            // its references are to steps before it, whose outputs are here too
            let action = train.action.resolve(&train.values(outputs)?)?;
            train_settings(ctx, &train.name, &action, outputs)?
        }
    };
    if let Some(d) = &e.data {
        sets.push(format!("data.path={d:?}"));
    }
    let mut cmd = Command::new(&ctx.exe);
    cmd.current_dir(&ctx.root)
        .args(["evaluate", "--json", "--config"])
        .arg(&config)
        .arg("--checkpoint")
        .arg(&ckpt);
    if let Some(n) = e.batches {
        cmd.args(["--batches", &n.to_string()]);
    }
    for s in &sets {
        cmd.args(["--set", s]);
    }
    let printed = captured(cmd, "weft evaluate")?;
    let v: serde_json::Value = serde_json::from_str(printed.trim())
        .map_err(|err| format!("weft evaluate --json printed {:?}: {err}", printed.trim()))?;
    let (Some(loss), Some(step), Some(batches)) = (v["val_loss"].as_f64(), v["step"].as_i64(), v["batches"].as_u64())
    else {
        return Err(format!(
            "weft evaluate --json printed {v} (no val_loss, step or batches)"
        ));
    };
    let accuracy = v["val_accuracy"].as_f64();
    let mut cache = Cache::open(&ctx.dir).map_err(|e| e.to_string())?;
    cache
        .log_metric(run, step, "eval/val_loss", loss)
        .map_err(|e| e.to_string())?;
    if let Some(a) = accuracy {
        cache
            .log_metric(run, step, "eval/val_accuracy", a)
            .map_err(|e| e.to_string())?;
    }
    let mut pairs = vec![
        ("metric", "val_loss".to_string()),
        ("value", loss.to_string()),
        ("run", run.to_string()),
        ("step", step.to_string()),
        ("batches", batches.to_string()),
    ];
    if let Some(a) = accuracy {
        pairs.push(("accuracy", a.to_string()));
    }
    Ok(output(&pairs))
}
