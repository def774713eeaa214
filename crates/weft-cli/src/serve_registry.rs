//! `weft serve --registry DIR`: serves each model's production version of a run store's model
//! registry (`weft models`) and follows promotions while serving (docs/registry.md).
//!
//! A thread reads the registry every `--registry-poll-ms` (1000 ms by default). When a model's
//! production version changed, the new version is loaded (on that thread: the server goes on
//! answering), added, made the default, and the old version is removed from the serving
//! registry and drained (its admitted requests finish; none is refused), as the management
//! API's unregister does. A model with no production version any more is unregistered the same
//! way.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use weft_serve::registry::Served;
use weft_serve::{LoadOptions, ModelSpec, Registry};
use weft_tune::registry::{Listing, ModelRegistry, ModelVersion};

/// What the registry thread keeps between reads.
pub struct Follower {
    registry: ModelRegistry,
    load: LoadOptions,
    /// The registry version served as each model's default, by name.
    served: BTreeMap<String, i64>,
    /// Versions whose load failed (not tried again).
    failed: BTreeSet<(String, i64)>,
    /// Warnings about the registry's rows already given: each once, not at every read.
    warned: BTreeSet<String>,
    /// The last error reading the registry, said once until the registry reads again.
    read_error: Option<String>,
}

/// Loads version `v`'s checkpoint folder (its parent folder as the model store).
fn load_version(v: &ModelVersion, load: LoadOptions) -> Result<Served, String> {
    let store = v.path.parent().unwrap_or(Path::new("/"));
    let folder = v.path.file_name().map(PathBuf::from).unwrap_or_default();
    let spec = ModelSpec {
        name: v.name.clone(),
        path: folder,
        version: v.version.to_string(),
    };
    weft_serve::registry::load(store, &spec, load)
}

impl Follower {
    /// Opens the registry in `dir` and loads every production version into `registry`: a
    /// version that does not load is an error (the server does not start).
    pub fn start(dir: &Path, registry: &Registry, load: LoadOptions) -> Result<Follower, String> {
        let reg = ModelRegistry::open_existing(dir).map_err(|e| format!("--registry {}: {e}", dir.display()))?;
        let mut follower = Follower {
            registry: reg,
            load,
            served: BTreeMap::new(),
            failed: BTreeSet::new(),
            warned: BTreeSet::new(),
            read_error: None,
        };
        let production = follower.registry.production().map_err(|e| e.to_string())?;
        let production = follower.choose(production);
        if production.is_empty() {
            weft_core::errln!(
                "weft serve: the registry in {} has no production version yet; serving what gets promoted",
                dir.display()
            );
        }
        for v in production {
            let served = load_version(&v, load)?;
            weft_core::errln!(
                "weft serve: loaded model {} version {} ({}) from the registry ({})",
                v.name,
                v.version,
                served.kind,
                v.path.display()
            );
            registry.add(served).map_err(|e| e.message)?;
            follower.served.insert(v.name.clone(), v.version);
        }
        Ok(follower)
    }

    /// Follows the registry on a thread of its own, reading it every `every`; drains run on
    /// `runtime`.
    pub fn follow(mut self, registry: Arc<Registry>, runtime: tokio::runtime::Handle, every: Duration) {
        std::thread::Builder::new()
            .name("weft-serve-registry".into())
            .spawn(move || loop {
                std::thread::sleep(every);
                self.step(&registry, &runtime);
            })
            .expect("a thread starts");
    }

    /// One read of the registry and the changes it calls for.
    fn step(&mut self, registry: &Registry, runtime: &tokio::runtime::Handle) {
        // a model whose production row does not read (or any model, when a row's name does not)
        // keeps what it serves: the row may still name it, and retiring it would stop serving it
        let mut unreadable: Option<BTreeSet<String>> = Some(BTreeSet::new());
        let production = match self.registry.production() {
            Ok(p) => {
                self.read_error = None;
                for bad in &p.unreadable {
                    match (&bad.name, unreadable.as_mut()) {
                        (Some(n), Some(names)) => {
                            names.insert(n.clone());
                        }
                        _ => unreadable = None,
                    }
                }
                self.choose(p)
            }
            Err(e) => {
                let e = e.to_string();
                if self.read_error.as_ref() != Some(&e) {
                    weft_core::errln!(
                        "weft serve: warning: reading the registry: {e} (said once; read again every poll)"
                    );
                    self.read_error = Some(e);
                }
                return;
            }
        };
        let wanted: BTreeSet<String> = production.iter().map(|v| v.name.clone()).collect();
        for v in production {
            if self.served.get(&v.name) == Some(&v.version) || self.failed.contains(&(v.name.clone(), v.version)) {
                continue;
            }
            let label = v.version.to_string();
            if !registry.knows(&v.name, Some(&label)).1 {
                match load_version(&v, self.load) {
                    Ok(served) => {
                        if let Err(e) = registry.add(served) {
                            weft_core::errln!("weft serve: warning: {}", e.message);
                        }
                    }
                    Err(e) => {
                        weft_core::errln!("weft serve: warning: promoted {e}; still serving the previous version");
                        self.failed.insert((v.name.clone(), v.version));
                        continue;
                    }
                }
            }
            if let Err(e) = registry.set_default(&v.name, &label) {
                weft_core::errln!("weft serve: warning: {}", e.message);
                continue;
            }
            weft_core::errln!(
                "weft serve: model {} version {} is promoted: it is the default now",
                v.name,
                v.version
            );
            if let Some(old) = self.served.insert(v.name.clone(), v.version) {
                self.retire(registry, runtime, &v.name, old);
            }
        }
        let Some(unreadable) = unreadable else { return };
        let gone: Vec<(String, i64)> = self
            .served
            .iter()
            .filter(|(n, _)| !wanted.contains(*n) && !unreadable.contains(*n))
            .map(|(n, v)| (n.clone(), *v))
            .collect();
        for (name, old) in gone {
            self.served.remove(&name);
            self.retire(registry, runtime, &name, old);
        }
    }

    /// Says `message` on stderr the first time only.
    fn warn_once(&mut self, message: String) {
        if self.warned.insert(message.clone()) {
            weft_core::errln!("weft serve: warning: {message}");
        }
    }

    /// The production versions to serve, one per name: a row that is not a version is left out
    /// with one warning, a name `weft serve` cannot serve (not 1
    /// to 64 of `A-Z a-z 0-9 . _ -`, or starting with `.`) is skipped, and of several production
    /// versions of one name (rows edited by hand: `weft models promote` keeps one) the highest
    /// is served; each with one warning.
    fn choose(&mut self, production: Listing) -> Vec<ModelVersion> {
        for bad in &production.unreadable {
            self.warn_once(bad.to_string());
        }
        let mut by_name: BTreeMap<String, Vec<ModelVersion>> = BTreeMap::new();
        for v in production.versions {
            if !weft_tune::registry::is_model_name(&v.name) {
                self.warn_once(format!(
                    "the registry's model name {} is not 1 to 64 of A-Z a-z 0-9 . _ - (not starting with .): not served",
                    weft_serve::error::echo(&v.name)
                ));
                continue;
            }
            by_name.entry(v.name.clone()).or_default().push(v);
        }
        let mut chosen = Vec::new();
        for (name, mut versions) in by_name {
            versions.sort_by_key(|v| v.version);
            if versions.len() > 1 {
                let all: Vec<i64> = versions.iter().map(|v| v.version).collect();
                self.warn_once(format!(
                    "model {name} has {} production versions in the registry ({all:?}): serving the highest, {}",
                    all.len(),
                    all[all.len() - 1]
                ));
            }
            chosen.extend(versions.pop());
        }
        chosen
    }

    /// Unregisters version `old` of `name` and drains it on `runtime`.
    fn retire(&self, registry: &Registry, runtime: &tokio::runtime::Handle, name: &str, old: i64) {
        match registry.remove(name, &old.to_string()) {
            Ok(served) => {
                let name = name.to_string();
                runtime.spawn(async move {
                    weft_serve::registry::drain(&served).await;
                    weft_core::errln!("weft serve: model {name} version {old} is unregistered (drained)");
                });
            }
            Err(e) => weft_core::errln!("weft serve: warning: unregistering: {}", e.message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(name: &str, version: i64) -> ModelVersion {
        ModelVersion {
            name: name.into(),
            version,
            stage: "production".into(),
            source_run: None,
            run_name: None,
            path: PathBuf::from("/nowhere"),
            created: 0.0,
            stage_time: 0.0,
        }
    }

    #[test]
    fn one_production_version_per_name_and_bad_names_skipped_warning_once() {
        let dir = std::env::temp_dir().join(format!("weft-serve-registry-choose-{}", std::process::id()));
        let mut f = Follower {
            registry: ModelRegistry::open(&dir).unwrap(),
            load: LoadOptions::default(),
            served: BTreeMap::new(),
            failed: BTreeSet::new(),
            warned: BTreeSet::new(),
            read_error: None,
        };
        let rows = || {
            vec![
                version("a", 3),
                version("a", 7),
                version("a", 5),
                version("b c", 1),
                version(&"x".repeat(65), 1),
                version(".hidden", 1),
                version("ok", 2),
            ]
        };
        for _ in 0..3 {
            // the same answer at every read, whatever the rows' order
            let mut shuffled = rows();
            shuffled.reverse();
            for production in [rows(), shuffled] {
                let chosen: Vec<(String, i64)> = f
                    .choose(Listing {
                        versions: production,
                        unreadable: Vec::new(),
                    })
                    .into_iter()
                    .map(|v| (v.name, v.version))
                    .collect();
                assert_eq!(chosen, [("a".to_string(), 7), ("ok".to_string(), 2)]);
            }
        }
        // one warning per cause, however many reads
        assert_eq!(f.warned.len(), 4, "{:?}", f.warned);
        assert!(f
            .warned
            .iter()
            .any(|w| w.contains("model a has 3 production versions") && w.ends_with("serving the highest, 7")));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
