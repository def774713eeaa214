//! `weft serve --registry DIR`: serves each model's production version of a run store's model
//! registry (`weft models`) and follows promotions while serving (docs/registry.md).
//!
//! A thread reads the registry every `--registry-poll-ms` (1000 ms by default). When a model's
//! production version changed, the new version is loaded (on that thread: the server goes on
//! answering), added, made the default, and the old version is removed from the serving
//! registry and drained (its admitted requests finish; none is refused), as the management
//! API's unregister does. A model with no production version any more is unregistered the same
//! way.
//!
//! The follower changes only the versions it loaded itself: a version of the same name and
//! version label served from elsewhere (a `--model`, a `POST /models`) is neither taken for the
//! registry's nor unregistered; the registry's version is then not loaded, with one warning. A
//! production version that fails to load (at start or when promoted) is reported with its cause
//! and tried again: at once when it is promoted again or its folder changes, else every
//! [`RETRY_EVERY`]; a retry that fails for the cause already reported says nothing more.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime};

use weft_serve::registry::{LoadFailure, Served};
use weft_serve::{LoadOptions, ModelSpec, Registry};
use weft_tune::registry::{Listing, ModelRegistry, ModelVersion};

use crate::serve::RETRY_EVERY;

/// What the registry thread keeps between reads.
pub struct Follower {
    registry: ModelRegistry,
    load: LoadOptions,
    /// By name, the registry version the follower serves as that model's default, and the very
    /// version it added to the serving registry (another registered under the same name and
    /// version since is not its own).
    served: BTreeMap<String, Own>,
    /// By name, the production version that failed to load, until it loads or another version
    /// (or none) is production.
    failed: BTreeMap<String, Failed>,
    /// By name, the production version (and its promotion time) left unloaded because a version
    /// the follower did not load holds its label: warned about once per promotion.
    conflicts: BTreeMap<String, (i64, f64)>,
    /// By name, the version recorded as not loaded in the server's readiness (a production
    /// version that failed at start), until a production version of the name loads or it has
    /// none.
    unready: BTreeMap<String, String>,
    /// Warnings about the registry's rows already given: each once, not at every read.
    warned: BTreeSet<String>,
    /// The last error reading the registry, said once until the registry reads again.
    read_error: Option<String>,
}

/// A registry version the follower loaded and serves. Held weakly: once unregistered through
/// the management API it is drained and freed (its weights, its threads), and the follower no
/// longer counts it as its own.
struct Own {
    version: i64,
    served: Weak<Served>,
}

impl Own {
    /// Whether this is still what `registry` serves under its name and version label.
    fn is_served(&self, registry: &Registry, name: &str) -> bool {
        let label = self.version.to_string();
        match (self.served.upgrade(), registry.get(name, Some(&label))) {
            (Some(own), Ok(now)) => Arc::ptr_eq(&own, &now),
            _ => false,
        }
    }
}

/// A production version that failed to load, and what its next try waits for.
struct Failed {
    version: i64,
    /// The promotion tried (a promotion again changes it) and the row's path.
    stage_time: f64,
    path: PathBuf,
    /// The checkpoint folder's modification time when tried (`None`: not there).
    folder: Option<SystemTime>,
    /// The cause reported.
    error: String,
    next_try: Instant,
}

/// The modification time of `path` (`None` when it cannot be read): a folder moved into place,
/// or a file added to it, changes it.
fn folder_state(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// `model NAME version V of the registry (PATH)`: what the user gave, as errors name it.
fn describe(v: &ModelVersion) -> String {
    format!(
        "model {} version {} of the registry ({})",
        v.name,
        v.version,
        v.path.display()
    )
}

/// Loads version `v`'s checkpoint folder (its parent folder as the model store); an error names
/// the registry's model, version and path, and the cause.
fn load_version(v: &ModelVersion, load: LoadOptions) -> Result<Served, String> {
    let who = describe(v);
    let full = v.path.canonicalize().map_err(|e| format!("{who}: {e}"))?;
    let (Some(store), Some(folder)) = (full.parent(), full.file_name()) else {
        return Err(format!("{who}: not a checkpoint folder"));
    };
    let spec = ModelSpec {
        name: v.name.clone(),
        path: PathBuf::from(folder),
        version: v.version.to_string(),
    };
    weft_serve::registry::load(store, &spec, load).map_err(|e| {
        // the load names a --model's model store; here the store is the folder's parent
        let prefix = format!("model {} version {}: ", v.name, v.version);
        let cause = e.strip_prefix(&prefix).unwrap_or(&e);
        format!("{who}: {}", cause.replace("the model store", "its parent folder"))
    })
}

impl Follower {
    /// Opens the registry in `dir` and loads every production version into `registry`, each the
    /// default of its name (a `--model` of the same name included). A version that does not
    /// load is reported on stderr and the others are served; until a production version of
    /// that name loads, the server is not ready. An error reading the registry stops the start.
    pub fn start(dir: &Path, registry: &Registry, load: LoadOptions) -> Result<Follower, String> {
        let reg = ModelRegistry::open_existing(dir).map_err(|e| format!("--registry {}: {e}", dir.display()))?;
        let mut follower = Follower {
            registry: reg,
            load,
            served: BTreeMap::new(),
            failed: BTreeMap::new(),
            conflicts: BTreeMap::new(),
            unready: BTreeMap::new(),
            warned: BTreeSet::new(),
            read_error: None,
        };
        let production = follower
            .registry
            .production()
            .map_err(|e| format!("--registry {}: {e}", dir.display()))?;
        let production = follower.choose(production);
        if production.is_empty() {
            weft_core::errln!(
                "weft serve: the registry in {} has no production version yet; serving what gets promoted",
                dir.display()
            );
        }
        for v in &production {
            // nothing is served before: nothing to retire
            follower.update(registry, v, true);
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
        // a registry read as it is (a read-only folder) is opened again when its file changed
        let production = match self.registry.refresh().and_then(|()| self.registry.production()) {
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
        for v in &production {
            if let Some(old) = self.update(registry, v, false) {
                self.retire(registry, runtime, &v.name, old, Some(&v.version.to_string()));
            }
        }
        let Some(unreadable) = unreadable else { return };
        let kept = |n: &String| wanted.contains(n) || unreadable.contains(n);
        self.failed.retain(|n, _| kept(n));
        self.conflicts.retain(|n, _| kept(n));
        let dropped: Vec<(String, String)> = self
            .unready
            .iter()
            .filter(|(n, _)| !kept(n))
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        for (name, version) in dropped {
            // not asked for any more: the server is ready without it
            registry.clear_failure(&name, &version);
            self.unready.remove(&name);
        }
        let gone: Vec<String> = self.served.keys().filter(|n| !kept(n)).cloned().collect();
        for name in gone {
            if let Some(old) = self.served.remove(&name) {
                self.retire(registry, runtime, &name, old, None);
            }
        }
    }

    /// What serves model `name` while its production version is not loaded, for a warning.
    fn meanwhile(&self, registry: &Registry, name: &str) -> String {
        match self.served.get(name) {
            Some(own) => format!("version {} of the registry goes on answering", own.version),
            None if registry.knows(name, None).0 => format!("model {name} is served by its other versions only"),
            None => format!("model {name} is not served"),
        }
    }

    /// Serves production version `v` if the follower does not already: loaded, added and made
    /// the default of its name. Returns the version it replaces as the name's registry version
    /// (for the caller to retire). Leaves a version label served from elsewhere alone (one
    /// warning), and tries a version that failed again only when it was promoted again, its
    /// folder changed or [`RETRY_EVERY`] passed (reporting a failure for the cause already
    /// reported only after a new promotion).
    fn update(&mut self, registry: &Registry, v: &ModelVersion, at_start: bool) -> Option<Own> {
        let name = v.name.as_str();
        if self.served.get(name).is_some_and(|own| own.version == v.version) {
            if self.served[name].is_served(registry, name) {
                return None;
            }
            // unregistered through the management API since: not the follower's any more (a
            // version registered there under the label since is someone else's)
            self.served.remove(name);
        }
        let label = v.version.to_string();
        if registry.knows(name, Some(&label)).1 {
            // not the follower's (its own has another version): a --model or a registration
            // through the management API; the registry's checkpoint may be another one
            let seen = (v.version, v.stage_time);
            if self.conflicts.get(name) != Some(&seen) {
                let source = registry
                    .get(name, Some(&label))
                    .map(|s| s.source.display().to_string())
                    .unwrap_or_default();
                weft_core::errln!(
                    "weft serve: warning: {} is production, but model {name} version {label} is already served \
                     from {source}, not loaded by following the registry (a --model or a POST /models): the \
                     registry's checkpoint is not loaded and that version is left as it is; {}; unregister it \
                     (DELETE /models/{name}/{label}) to serve the registry's",
                    describe(v),
                    self.meanwhile(registry, name)
                );
                self.conflicts.insert(name.to_string(), seen);
            }
            // the name is served (by that version): an earlier version's failure is moot
            if self.failed.get(name).is_some_and(|f| f.version != v.version) {
                self.failed.remove(name);
            }
            if let Some(recorded) = self.unready.remove(name) {
                registry.clear_failure(name, &recorded);
            }
            return None;
        }
        self.conflicts.remove(name);
        let folder = folder_state(&v.path);
        // Some(cause reported) when this is a retry that reports only a new cause
        let mut quiet_unless_new = None;
        if let Some(f) = self.failed.get(name) {
            if f.version == v.version {
                let promoted_again = f.stage_time != v.stage_time || f.path != v.path;
                if !promoted_again && f.folder == folder && Instant::now() < f.next_try {
                    return None;
                }
                if !promoted_again {
                    quiet_unless_new = Some(f.error.clone());
                }
            } else {
                self.failed.remove(name);
            }
        }
        match load_version(v, self.load) {
            Ok(loaded) => {
                let kind = loaded.kind;
                let served = match registry.add(loaded) {
                    Ok(served) => served,
                    Err(e) => {
                        // registered meanwhile through the management API: the next read says so
                        weft_core::errln!("weft serve: warning: {}", e.message);
                        return None;
                    }
                };
                if let Err(e) = registry.set_default(name, &label) {
                    weft_core::errln!("weft serve: warning: {}", e.message);
                }
                let retried = self.failed.remove(name).is_some();
                if let Some(recorded) = self.unready.remove(name) {
                    registry.clear_failure(name, &recorded);
                }
                if retried {
                    weft_core::errln!(
                        "weft serve: loaded model {name} version {label} ({kind}) from the registry ({}) on a later try: it is the default now",
                        v.path.display()
                    );
                } else if at_start {
                    let default = if registry.versions(name).len() > 1 {
                        format!(": the default of {name}")
                    } else {
                        String::new()
                    };
                    weft_core::errln!(
                        "weft serve: loaded model {name} version {label} ({kind}) from the registry ({}){default}",
                        v.path.display()
                    );
                } else {
                    weft_core::errln!(
                        "weft serve: model {name} version {label} ({kind}) is promoted: it is the default now ({})",
                        v.path.display()
                    );
                }
                self.served.insert(
                    name.to_string(),
                    Own {
                        version: v.version,
                        served: Arc::downgrade(&served),
                    },
                )
            }
            Err(error) => {
                if quiet_unless_new.as_ref() != Some(&error) {
                    let retry = format!(
                        "tried again every {} s, and at once when it is promoted again or its folder changes",
                        RETRY_EVERY.as_secs()
                    );
                    if at_start {
                        weft_core::errln!(
                            "weft serve: error: {error}; serving the other models, not ready until it loads ({retry})"
                        );
                    } else {
                        weft_core::errln!(
                            "weft serve: warning: {error}; {} ({retry})",
                            self.meanwhile(registry, name)
                        );
                    }
                }
                // not ready while a model whose production version failed at start serves none
                if at_start || self.unready.contains_key(name) {
                    // another version's record goes; this version's is replaced in one step
                    if let Some(recorded) = self.unready.insert(name.to_string(), label.clone()) {
                        if recorded != label {
                            registry.clear_failure(name, &recorded);
                        }
                    }
                    registry.record_failure(LoadFailure {
                        name: name.to_string(),
                        version: label,
                        error: error.clone(),
                    });
                }
                self.failed.insert(
                    name.to_string(),
                    Failed {
                        version: v.version,
                        stage_time: v.stage_time,
                        path: v.path.clone(),
                        folder,
                        error,
                        next_try: Instant::now() + RETRY_EVERY,
                    },
                );
                None
            }
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

    /// Unregisters `old`, a version the follower loaded, and drains it on `runtime`: unless it
    /// was unregistered since (through the management API), when nothing is done. Still the
    /// default of `name` beside other versions (a `--model`, or a `set-default` call), it first
    /// hands the default to `next` (the newly promoted version) or the first other version.
    fn retire(&self, registry: &Registry, runtime: &tokio::runtime::Handle, name: &str, old: Own, next: Option<&str>) {
        let label = old.version.to_string();
        let mut removed = match old.served.upgrade() {
            Some(served) => registry.remove_if_same(&served),
            None => Ok(None),
        };
        if removed
            .as_ref()
            .is_err_and(|e| e.status == axum::http::StatusCode::CONFLICT)
        {
            let others: Vec<String> = registry.versions(name).into_iter().filter(|v| *v != label).collect();
            let heir = next
                .filter(|n| others.iter().any(|o| o == n))
                .map(str::to_string)
                .or_else(|| others.first().cloned());
            if let Some(heir) = heir {
                if registry.set_default(name, &heir).is_ok() {
                    weft_core::errln!("weft serve: model {name} version {heir} is the default now");
                }
                removed = match old.served.upgrade() {
                    Some(served) => registry.remove_if_same(&served),
                    None => Ok(None),
                };
            }
        }
        match removed {
            Ok(Some(served)) => {
                let name = name.to_string();
                runtime.spawn(async move {
                    weft_serve::registry::drain(&served).await;
                    weft_core::errln!("weft serve: model {name} version {label} is unregistered (drained)");
                });
            }
            Ok(None) => {}
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
            failed: BTreeMap::new(),
            conflicts: BTreeMap::new(),
            unready: BTreeMap::new(),
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
