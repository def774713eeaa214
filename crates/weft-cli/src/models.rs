//! `weft models`: the model registry in a run store (docs/registry.md): register a run's
//! checkpoint (or a checkpoint folder) as a model's next version, list, show, promote, and a
//! version's lineage.

use std::path::PathBuf;

use serde_json::{json, Value};
use weft_tune::registry::{ModelRegistry, ModelVersion, Stage};

use crate::print_out;

/// Where the store is.
#[derive(clap::Args)]
pub struct DirArg {
    /// The run store's folder (default: `WEFT_TRACK_DIR`, else `weft-runs`).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// The store folder `dir` names, or `WEFT_TRACK_DIR`, or `weft-runs`.
pub fn store_dir(dir: Option<&PathBuf>) -> PathBuf {
    match (dir, std::env::var_os("WEFT_TRACK_DIR")) {
        (Some(d), _) => d.clone(),
        (None, Some(env)) if !env.is_empty() => PathBuf::from(env),
        _ => PathBuf::from("weft-runs"),
    }
}

#[derive(clap::Subcommand)]
pub enum ModelsCommand {
    /// Registers a run's last checkpoint (RUN: id, name or experiment/name), or a checkpoint
    /// folder or directory, as the next version (1, 2, ...) of model NAME.
    Register(RegisterArgs),
    /// Lists every model version: name, version, stage, source run, checkpoint.
    List(ListArgs),
    /// Shows one model's versions.
    Show(ShowArgs),
    /// Moves a version to a stage; promoting one to production archives the previous one.
    Promote(PromoteArgs),
    /// Where a version came from: the run that made it, what that run read (data and its
    /// digest, initial weights), the runs before it, and the pipeline steps that made them.
    Lineage(LineageArgs),
}

#[derive(clap::Args)]
pub struct LineageArgs {
    name: String,
    version: i64,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    dir: DirArg,
}

#[derive(clap::Args)]
pub struct RegisterArgs {
    /// A run of the store, or a checkpoint folder (or checkpoint directory) path.
    #[arg(value_name = "RUN_OR_CHECKPOINT")]
    source: String,
    /// The model's name (1 to 64 of A-Z a-z 0-9 . _ -).
    #[arg(long)]
    name: String,
    /// Skip reading the model's tensors to check their checksums (for a checkpoint too large to
    /// read whole now): the index, the model config against the shapes and every file's header
    /// are still checked, and loading the version checks the checksums.
    #[arg(long)]
    no_checksums: bool,
    #[command(flatten)]
    dir: DirArg,
}

/// Whether checkpoint folder `ckpt` loads as a model (`weft models register` and a pipeline's
/// register step check it before the version is written): see
/// `weft_train::checkpoint::verify_model`. One line naming the file, key or tensor.
pub(crate) fn check_loadable(ckpt: &std::path::Path, checksums: bool) -> Result<(), String> {
    weft_train::checkpoint::verify_model(ckpt, checksums)
        .map(drop)
        .map_err(|e| format!("the checkpoint is not registered: {e}"))
}

#[derive(clap::Args)]
pub struct ListArgs {
    /// Print JSON (an array of versions) instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    dir: DirArg,
}

#[derive(clap::Args)]
pub struct ShowArgs {
    name: String,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    dir: DirArg,
}

#[derive(clap::Args)]
pub struct PromoteArgs {
    name: String,
    version: i64,
    /// staging, production, archived (or none).
    #[arg(long)]
    stage: String,
    #[command(flatten)]
    dir: DirArg,
}

/// A version as `weft models list --json` prints it (and the dashboard's `/api/models` returns it).
pub(crate) fn version_json(v: &ModelVersion) -> Value {
    json!({
        "name": v.name,
        "version": v.version,
        "stage": v.stage,
        "source_run": v.source_run,
        "run_name": v.run_name,
        "path": v.path.display().to_string(),
        "created": v.created,
        "stage_time": v.stage_time,
    })
}

fn table(versions: &[ModelVersion]) -> String {
    let mut out = format!(
        "{:<20} {:>7} {:<10} {:<24} {}\n",
        "NAME", "VERSION", "STAGE", "RUN", "CHECKPOINT"
    );
    for v in versions {
        out.push_str(&format!(
            "{:<20} {:>7} {:<10} {:<24} {}\n",
            v.name,
            v.version,
            v.stage,
            v.run_name.as_deref().unwrap_or("-"),
            v.path.display()
        ));
    }
    out
}

/// The versions of `listing`, after a warning on stderr for each row that is not one.
fn warned(listing: weft_tune::registry::Listing) -> Vec<ModelVersion> {
    for bad in &listing.unreadable {
        weft_core::errln!("weft models: warning: {bad}");
    }
    listing.versions
}

/// The registry of an existing store (a folder without one is an error naming it).
fn open(dir: &DirArg) -> Result<ModelRegistry, String> {
    ModelRegistry::open_existing(&store_dir(dir.dir.as_ref())).map_err(|e| e.to_string())
}

pub fn run(what: ModelsCommand) -> Result<(), String> {
    match what {
        ModelsCommand::Register(a) => {
            let dir = store_dir(a.dir.dir.as_ref());
            let mut reg = ModelRegistry::open(&dir).map_err(|e| e.to_string())?;
            let check = |ckpt: &std::path::Path| check_loadable(ckpt, !a.no_checksums);
            let v = reg
                .register_checked(&dir, &a.source, &a.name, &check)
                .map_err(|e| e.to_string())?;
            print_out(&format!(
                "registered model {} version {} ({})\n",
                v.name,
                v.version,
                v.path.display()
            ))
        }
        ModelsCommand::List(a) => {
            let versions = warned(open(&a.dir)?.list().map_err(|e| e.to_string())?);
            if a.json {
                let all: Vec<Value> = versions.iter().map(version_json).collect();
                print_out(&format!("{}\n", Value::Array(all)))
            } else {
                print_out(&table(&versions))
            }
        }
        ModelsCommand::Show(a) => {
            let versions = warned(open(&a.dir)?.versions(&a.name).map_err(|e| e.to_string())?);
            if a.json {
                let production = versions.iter().find(|v| v.stage == "production").map(|v| v.version);
                let all: Vec<Value> = versions.iter().map(version_json).collect();
                print_out(&format!(
                    "{}\n",
                    json!({ "name": a.name, "production": production, "versions": all })
                ))
            } else {
                print_out(&table(&versions))
            }
        }
        ModelsCommand::Lineage(a) => {
            let l = weft_tune::lineage::lineage(&store_dir(a.dir.dir.as_ref()), &a.name, a.version)
                .map_err(|e| e.to_string())?;
            if a.json {
                print_out(&format!("{}\n", crate::lineage::json(&l)))
            } else {
                print_out(&crate::lineage::text(&l))
            }
        }
        ModelsCommand::Promote(a) => {
            let stage: Stage = a.stage.parse().map_err(|e: weft_tune::Error| e.to_string())?;
            let archived = open(&a.dir)?
                .promote(&a.name, a.version, stage)
                .map_err(|e| e.to_string())?;
            let mut text = format!("model {} version {} is now {}\n", a.name, a.version, stage.as_str());
            if let Some(old) = archived {
                text.push_str(&format!("model {} version {old} is now archived\n", a.name));
            }
            print_out(&text)
        }
    }
}
