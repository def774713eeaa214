//! What a step reads besides its settings and the files it names, for its cache key, and
//! whether a cached execution's outputs are still there to be reused.
//!
//! A train step's run config (with its `set`, and the best values of its `from_sweep` step), a
//! sweep step's base config (with the step's `set`, and each listed value of a swept
//! `data.path`, `data.tokenizer` or `init.from`) and an evaluate step's config (with its `data`)
//! name the files their runs read: `data.path`, a `data.tokenizer` file, `init.from`. Each is
//! keyed by its digest ([`weft_tune::pipeline::inputs::digest`]: a file's bytes, a token
//! folder's `index.json`, any other folder's files), a URL by its text.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use weft_train::config::{DataConfig, Overrides, RunConfig};
use weft_tune::pipeline::inputs::digest;
use weft_tune::pipeline::refs::parse_output;
use weft_tune::pipeline::{Action, Evaluate, Step};
use weft_tune::space::Distribution;

use super::execute::train_settings;
use super::Context;

/// The run-config keys whose values name files a run reads.
const INPUT_KEYS: [&str; 3] = ["data.path", "data.tokenizer", "init.from"];

/// What a run-config key names: a path, or something keyed by its text (a URL, `builtin`,
/// `char`, `gpt2`).
enum Named {
    Path(PathBuf),
    Text(String),
}

/// `value` of an input key as a run with that value reads it (relative paths resolved by
/// `resolve`).
fn named(key: &str, value: &str, resolve: impl Fn(&Path) -> PathBuf) -> Named {
    let builtin =
        (key == "data.path" && value == "builtin") || (key == "data.tokenizer" && ["char", "gpt2"].contains(&value));
    if builtin || value.contains("://") {
        Named::Text(value.to_string())
    } else {
        Named::Path(resolve(Path::new(value)))
    }
}

/// The input keys of `config` and what each names.
fn named_inputs(config: &RunConfig) -> Vec<(&'static str, Named)> {
    let resolve = |p: &Path| config.resolve(p);
    let text = |p: &Path| p.to_string_lossy().into_owned();
    let mut out = Vec::new();
    match &config.data {
        DataConfig::Text(k) => {
            out.push(("data.path", named("data.path", &text(&k.path), resolve)));
            if let Some(t) = &k.tokenizer {
                out.push(("data.tokenizer", named("data.tokenizer", t, resolve)));
            }
        }
        DataConfig::Csv(k) => out.push(("data.path", named("data.path", &text(&k.path), resolve))),
        DataConfig::Batches(k) => out.push(("data.path", named("data.path", &text(&k.path), resolve))),
        DataConfig::Tokens(k) => out.push(("data.path", named("data.path", &k.path, resolve))),
    }
    if let Some(from) = &config.init.from {
        out.push(("init.from", named("init.from", &text(from), resolve)));
    }
    out
}

/// `(what, digest)` of one named input.
fn keyed(key: &str, what: &Named) -> Result<(String, String), String> {
    match what {
        Named::Text(t) => Ok((format!("{key} {t}"), "as named".into())),
        Named::Path(p) => Ok((
            format!("{key} {}", p.display()),
            digest(p).map_err(|e| format!("{key}: {e}"))?,
        )),
    }
}

/// `config` read with `sets` (`--set` values, relative paths against the pipeline's folder, as
/// the step's process reads them).
fn load(ctx: &Context, config: &Path, sets: Vec<String>) -> Result<RunConfig, String> {
    let overrides = Overrides {
        unset: Vec::new(),
        set: sets,
        cwd: ctx.root.clone(),
    };
    RunConfig::load(config, &overrides).map_err(|e| e.to_string())
}

/// The inputs of `step` (its action with its references resolved; `outputs`: the outputs of the
/// steps done before it) for its cache key: `(what, digest)` pairs (see the module docs). An
/// error (one line) when its config does not load: the step's process would refuse it too.
pub(super) fn of(
    ctx: &Context,
    step: &Step,
    action: &Action,
    outputs: &BTreeMap<String, String>,
) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    match action {
        Action::Train { .. } => {
            let (config, sets) = train_settings(ctx, &step.name, action, outputs)?;
            for (key, what) in named_inputs(&load(ctx, &config, sets)?) {
                out.push(keyed(key, &what)?);
            }
        }
        Action::Sweep { config, set } => {
            let spec = weft_tune::SweepSpec::load(&ctx.root.join(config)).map_err(|e| e.to_string())?;
            let base = load(ctx, &spec.base, set.clone()).map_err(|e| format!("{}: sweep.base: {e}", spec.source))?;
            for (key, what) in named_inputs(&base) {
                out.push(keyed(key, &what)?);
            }
            // a swept input: each listed value, as a trial's `--set` names it (the trials run in
            // the pipeline's folder)
            for p in spec
                .space
                .params
                .iter()
                .filter(|p| INPUT_KEYS.contains(&p.key.as_str()))
            {
                let Distribution::Values(values) = &p.dist else {
                    continue;
                };
                for v in values.iter().filter_map(toml::Value::as_str) {
                    let what = named(&p.key, v, |path| ctx.root.join(path));
                    let (name, d) = keyed(&p.key, &what)?;
                    out.push((format!("sweep.parameters {name}"), d));
                }
            }
        }
        Action::Evaluate(Evaluate {
            step: train,
            config,
            data,
            ..
        }) => {
            let (config, mut sets) = match config {
                Some(c) => (ctx.root.join(c), Vec::new()),
                None => {
                    let t = ctx.steps.step(train).ok_or_else(|| format!("no step {train:?}"))?;
                    let action = t.action.resolve(&t.values(outputs)?)?;
                    train_settings(ctx, &t.name, &action, outputs)?
                }
            };
            if let Some(d) = data {
                sets.push(format!("data.path={d:?}"));
            }
            // the checkpoint is the train step's (its output is in the key): the data is read
            for (key, what) in named_inputs(&load(ctx, &config, sets)?) {
                if key != "init.from" {
                    out.push(keyed(key, &what)?);
                }
            }
        }
        _ => {}
    }
    Ok(out)
}

/// Why the outputs of a cached execution of `step` (its output `output`) cannot be reused, if
/// they cannot: a train step's checkpoint folder or run gone (deleted since), a prepare step's
/// folder without its `index.json`.
pub(super) fn gone(ctx: &Context, step: &Step, output: &str) -> Option<String> {
    let out = parse_output(output);
    match &step.action {
        Action::Train { .. } => {
            if let Some(ckpt) = out.get("checkpoint") {
                if !Path::new(ckpt).is_dir() {
                    return Some(format!("its checkpoint {ckpt} is gone"));
                }
            }
            let id: i64 = out.get("run")?.parse().ok()?;
            let store = weft_track::Store::open_existing(&ctx.dir).ok()?;
            match store.has_run(id) {
                Ok(false) => Some(format!("its run {id} is no longer in the store")),
                _ => None,
            }
        }
        Action::Prepare(_) => {
            let data = out.get("data")?;
            let index = Path::new(data).join(weft_data::tokens::INDEX_NAME);
            (!data.contains("://") && !index.is_file()).then(|| format!("its data folder {data} is gone"))
        }
        _ => None,
    }
}
