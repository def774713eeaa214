//! Where a model version came from (`weft models lineage`): the run that made its checkpoint,
//! what that run read (data with its digest, initial weights or a checkpoint it started from),
//! the run whose checkpoint those weights were, and so on back; with each run and each data folder the pipeline step
//! executions that made them (a train step's `run=ID`, a prepare step's `data=FOLDER`).

use std::collections::BTreeSet;
use std::path::Path;

use weft_track::{RunInput, Store};

use crate::error::{Error, Result};
use crate::pipeline::cache::{Cache, Execution};
use crate::registry::{ModelRegistry, ModelVersion};

/// A model version's lineage.
#[derive(Debug, Clone)]
pub struct Lineage {
    pub version: ModelVersion,
    /// The run that made the version's checkpoint, then the runs its initial weights came
    /// from, in that order (each at most once).
    pub runs: Vec<RunLineage>,
}

/// One run of a lineage.
#[derive(Debug, Clone)]
pub struct RunLineage {
    pub id: i64,
    /// `experiment/name`.
    pub name: String,
    pub status: String,
    /// The run's config, flattened (`optim.lr` -> `0.001`).
    pub params: std::collections::BTreeMap<String, String>,
    /// The pipeline step executions that made it (train steps).
    pub made_by: Vec<Execution>,
    pub inputs: Vec<InputLineage>,
}

/// One input of a run, with the executions that wrote it (prepare steps, for data).
#[derive(Debug, Clone)]
pub struct InputLineage {
    pub input: RunInput,
    pub made_by: Vec<Execution>,
}

/// The lineage of version `version` of model `name` in the store in folder `dir`.
pub fn lineage(dir: &Path, name: &str, version: i64) -> Result<Lineage> {
    let registry = ModelRegistry::open_existing(dir)?;
    let v = registry.version(name, version)?;
    let store = Store::open_existing(dir)?;
    let cache = Cache::open_existing(dir)?;
    // the executions (none without the table) whose output's `key` is accepted
    let made = |key: &str, is: &dyn Fn(&str) -> bool| -> Result<Vec<Execution>> {
        match &cache {
            Some(c) => c.made(key, is),
            None => Ok(Vec::new()),
        }
    };
    // a version registered from a folder: the run that recorded the folder, if one did
    let first = match v.source_run {
        Some(r) => Some(r),
        None => store.checkpoint_owner(&v.path.display().to_string())?,
    };
    let mut runs = Vec::new();
    let mut seen = BTreeSet::new();
    let mut next = first;
    while let Some(id) = next {
        if !seen.insert(id) {
            break;
        }
        let d = match store.run_detail(id) {
            Ok(d) => d,
            // a run deleted since: the chain ends where the store does
            Err(weft_track::Error::UnknownRun(_)) => break,
            Err(e) => return Err(Error::from(e)),
        };
        let inputs = d
            .inputs
            .iter()
            .map(|i| {
                let made_by = if i.kind == "data" {
                    // a prepare step's folder as it wrote it, or with links resolved as runs
                    // record their data
                    made("data", &|folder| {
                        folder == i.uri || std::fs::canonicalize(folder).is_ok_and(|c| c.display().to_string() == i.uri)
                    })?
                } else {
                    Vec::new()
                };
                Ok(InputLineage {
                    input: i.clone(),
                    made_by,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // the weights it started from: a checkpoint it was resumed from, else its initial ones
        next = ["resume_from", "init"]
            .iter()
            .find_map(|kind| d.inputs.iter().find(|i| i.kind == *kind))
            .and_then(|i| i.source_run);
        runs.push(RunLineage {
            id,
            name: format!("{}/{}", d.summary.experiment, d.summary.name),
            status: d.summary.status.clone(),
            params: d.summary.params.clone(),
            made_by: made("run", &|run| run == id.to_string())?,
            inputs,
        });
    }
    Ok(Lineage { version: v, runs })
}
