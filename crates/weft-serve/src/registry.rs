//! Every loaded model by name and version, changed at run time by the management API: which
//! version answers requests that name none (the default, or a weighted traffic split between
//! versions for A/B tests), admission into a version's queue, and unregistering.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

use axum::http::StatusCode;
use tokio::sync::OwnedSemaphorePermit;

use crate::error::{echo, ApiError};
pub use crate::model::{
    bounded, check_name, check_version, load, resolve_in_store, LoadOptions, ModelSpec, Served, Signature,
    DEFAULT_PREFILL_CHUNK, DEFAULT_VERSION, MAX_BATCH_DELAY_MS, MAX_BATCH_SIZE, MAX_PREFILL_CHUNK, MAX_QUEUE,
    MAX_SEQUENCES,
};

/// A request admitted into a version's queue: it holds its queue places (one, or one per
/// completion of an OpenAI request with `n`) until it is dropped, and the version is not
/// drained before that.
pub struct Admitted {
    pub served: Arc<Served>,
    pub(crate) permit: OwnedSemaphorePermit,
    /// When the request was admitted: its time in the queue is measured from here.
    pub(crate) at: Instant,
}

impl Admitted {
    /// Takes one of `served`'s queue places; 503 (with `Retry-After`) when none is left.
    pub fn new(served: &Arc<Served>) -> Result<Admitted, ApiError> {
        Admitted::many(served, 1)
    }

    /// Takes `places` (at least 1) of `served`'s queue places at once: all of them or none,
    /// 503 (with `Retry-After`) when they are not all free. A request that needs several takes
    /// them here, together: taken one by one, a version being drained ([`drain`]) would take
    /// each place the others give back, and the request's later places could never be had.
    pub fn many(served: &Arc<Served>, places: usize) -> Result<Admitted, ApiError> {
        let full = || {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "model {} version {}: its queue is full, retry later",
                    served.name, served.version
                ),
            )
        };
        let count = u32::try_from(places.max(1)).map_err(|_| full())?;
        let permit = served
            .admitted
            .clone()
            .try_acquire_many_owned(count)
            .map_err(|_| full())?;
        Ok(Admitted {
            served: served.clone(),
            permit,
            at: Instant::now(),
        })
    }

    /// The queue places it holds.
    pub fn places(&self) -> usize {
        self.permit.num_permits()
    }

    /// Each of its places as a request of its own (the `n` completions of one prompt, each
    /// giving its place back when it ends), admitted when this was.
    pub fn into_places(mut self) -> Vec<Admitted> {
        let mut all = Vec::with_capacity(self.places());
        while self.places() > 1 {
            let Some(permit) = self.permit.split(1) else { break };
            all.push(Admitted {
                served: self.served.clone(),
                permit,
                at: self.at,
            });
        }
        all.push(self);
        all
    }
}

/// The versions of one model name, and which answers requests that name no version.
#[derive(Debug)]
struct Entry {
    default: String,
    versions: BTreeMap<String, Arc<Served>>,
    /// `(version, share)` with shares summing to 1; empty: the default answers.
    split: Vec<(String, f64)>,
    /// Unversioned requests routed by the split so far (the router's position).
    routed: AtomicU64,
}

impl Entry {
    /// The version that answers the next request naming none: the default, or the split's
    /// pick. The pick follows a Weyl sequence (`frac(n * golden ratio)`), so over any `n`
    /// requests each version's count is within a few of `n * share`, and the same sequence of
    /// requests is routed the same way every time.
    fn route(&self) -> &str {
        if self.split.is_empty() {
            return &self.default;
        }
        let n = self.routed.fetch_add(1, Ordering::Relaxed) + 1;
        let u = (n as f64 * 0.618_033_988_749_894_9).fract();
        let mut acc = 0.0;
        for (v, share) in &self.split {
            acc += share;
            if u < acc {
                return v;
            }
        }
        self.split.last().map_or(self.default.as_str(), |(v, _)| v.as_str())
    }
}

/// Every loaded model by name and version.
#[derive(Debug, Default)]
pub struct Registry {
    models: RwLock<BTreeMap<String, Entry>>,
    /// Models asked for at start that failed to load, until that name and version is added.
    failed: Mutex<Vec<LoadFailure>>,
}

/// A model asked for at start (`--model`) that could not be loaded, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadFailure {
    pub name: String,
    pub version: String,
    pub error: String,
}

/// A description of one model name: its default version, split and versions.
#[derive(Debug, Clone)]
pub struct ModelView {
    pub default: String,
    pub split: Vec<(String, f64)>,
    pub versions: Vec<Arc<Served>>,
}

fn conflict(message: String) -> ApiError {
    ApiError::new(StatusCode::CONFLICT, message)
}

impl Registry {
    fn read(&self) -> RwLockReadGuard<'_, BTreeMap<String, Entry>> {
        // every change below is made whole before the lock is released
        self.models.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, BTreeMap<String, Entry>> {
        self.models.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a loaded version; the first version added for a name is its default. A name and
    /// version already served is refused (409). Returns the version as served (whoever added it
    /// can later tell it from another version registered under the same name and version).
    pub fn add(&self, served: Served) -> Result<Arc<Served>, ApiError> {
        let mut models = self.write();
        let entry = models.entry(served.name.clone()).or_insert_with(|| Entry {
            default: served.version.clone(),
            versions: BTreeMap::new(),
            split: Vec::new(),
            routed: AtomicU64::new(0),
        });
        if entry.versions.contains_key(&served.version) {
            return Err(conflict(format!(
                "model {} version {} is already served",
                served.name, served.version
            )));
        }
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|f| f.name != served.name || f.version != served.version);
        let served = Arc::new(served);
        entry.versions.insert(served.version.clone(), served.clone());
        Ok(served)
    }

    /// Records a model asked for at start that failed to load: the server is not ready
    /// (`/v2/health/ready` answers 503 naming it) until that name and version is added.
    pub fn record_failure(&self, failure: LoadFailure) {
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        // one record per model and version: a failure of a retry replaces the earlier one
        // under the same lock (a readiness probe never sees it missing in between)
        failed.retain(|f| f.name != failure.name || f.version != failure.version);
        failed.push(failure);
    }

    /// Forgets a failure [`Registry::record_failure`] recorded for `name` and `version` (what was
    /// asked for is asked for no longer: the registry's production version changed).
    pub fn clear_failure(&self, name: &str, version: &str) {
        self.failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|f| f.name != name || f.version != version);
    }

    /// The models asked for at start that failed to load and are not served since.
    pub fn failures(&self) -> Vec<LoadFailure> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn unknown_model(models: &BTreeMap<String, Entry>, name: &str) -> ApiError {
        let known: Vec<&str> = models.keys().map(String::as_str).collect();
        ApiError::not_found(format!("unknown model {} (served: {known:?})", echo(name)))
    }

    fn unknown_version(entry: &Entry, name: &str, v: &str) -> ApiError {
        let known: Vec<&str> = entry.versions.keys().map(String::as_str).collect();
        ApiError::not_found(format!(
            "unknown version {} of model {} (versions: {known:?})",
            echo(v),
            echo(name)
        ))
    }

    /// The model `name` at `version` (its default version when `None`); 404 naming what is
    /// unknown.
    pub fn get(&self, name: &str, version: Option<&str>) -> Result<Arc<Served>, ApiError> {
        let models = self.read();
        let entry = models.get(name).ok_or_else(|| Self::unknown_model(&models, name))?;
        let v = version.unwrap_or(&entry.default);
        entry
            .versions
            .get(v)
            .cloned()
            .ok_or_else(|| Self::unknown_version(entry, name, v))
    }

    /// A request to run `name` at `version` (routed by the traffic split, or the default, when
    /// `None`) admitted into that version's queue: 404 naming what is unknown, 503 when the
    /// queue is full. Admission happens under the registry's lock, so a version removed by
    /// [`Registry::remove`] admits nothing after it.
    pub fn admit(&self, name: &str, version: Option<&str>) -> Result<Admitted, ApiError> {
        // every version has a place at least
        self.admit_many(name, version, 1, |s, queue| {
            ApiError::bad_request(format!(
                "model {} version {} admits {queue} requests",
                s.name, s.version
            ))
        })
    }

    /// [`Registry::admit`] for a request that needs `places` queue places (the `n`
    /// completions of one prompt), all taken at once ([`Admitted::many`]): 503 when they are not
    /// all free, and `too_many(version, its queue)` (a 400: no retry helps) when the version
    /// has fewer places than that.
    pub fn admit_many(
        &self,
        name: &str,
        version: Option<&str>,
        places: usize,
        too_many: impl FnOnce(&Served, usize) -> ApiError,
    ) -> Result<Admitted, ApiError> {
        let models = self.read();
        let entry = models.get(name).ok_or_else(|| Self::unknown_model(&models, name))?;
        let v = match version {
            Some(v) => v,
            None => entry.route(),
        };
        let served = entry
            .versions
            .get(v)
            .ok_or_else(|| Self::unknown_version(entry, name, v))?;
        if places > served.options.queue {
            return Err(too_many(served, served.options.queue));
        }
        Admitted::many(served, places)
    }

    /// The versions of `name`, in order.
    pub fn versions(&self, name: &str) -> Vec<String> {
        self.read()
            .get(name)
            .map(|e| e.versions.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Every `(name, default version)`.
    pub fn names(&self) -> Vec<(String, String)> {
        self.read()
            .iter()
            .map(|(n, e)| (n.clone(), e.default.clone()))
            .collect()
    }

    /// Every loaded version of every model.
    pub fn all(&self) -> Vec<Arc<Served>> {
        self.read()
            .values()
            .flat_map(|e| e.versions.values().cloned())
            .collect()
    }

    /// Whether `name` is served, and whether `version` of it is.
    pub fn knows(&self, name: &str, version: Option<&str>) -> (bool, bool) {
        let models = self.read();
        let entry = models.get(name);
        let version_known = match (entry, version) {
            (Some(e), Some(v)) => e.versions.contains_key(v),
            _ => false,
        };
        (entry.is_some(), version_known)
    }

    /// The default version, split and versions of `name`; 404 when unknown.
    pub fn view(&self, name: &str) -> Result<ModelView, ApiError> {
        let models = self.read();
        let entry = models.get(name).ok_or_else(|| Self::unknown_model(&models, name))?;
        Ok(ModelView {
            default: entry.default.clone(),
            split: entry.split.clone(),
            versions: entry.versions.values().cloned().collect(),
        })
    }

    /// Whether no model is loaded.
    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }

    /// Makes `version` answer requests to `name` that name no version (when no split is set).
    pub fn set_default(&self, name: &str, version: &str) -> Result<(), ApiError> {
        let mut models = self.write();
        let entry = models
            .get_mut(name)
            .ok_or_else(|| ApiError::not_found(format!("unknown model {}", echo(name))))?;
        if !entry.versions.contains_key(version) {
            return Err(Self::unknown_version(entry, name, version));
        }
        entry.default = version.to_string();
        Ok(())
    }

    /// Routes requests to `name` that name no version among the versions in `weights` in
    /// proportion to their weights (any non-negative numbers, at least one above 0); an empty
    /// `weights` clears the split (the default answers). 400 for a bad weight, 404 for an
    /// unknown version.
    pub fn set_split(&self, name: &str, weights: &[(String, f64)]) -> Result<(), ApiError> {
        let mut models = self.write();
        let entry = models
            .get_mut(name)
            .ok_or_else(|| ApiError::not_found(format!("unknown model {}", echo(name))))?;
        for (i, (v, w)) in weights.iter().enumerate() {
            if weights[..i].iter().any(|(u, _)| u == v) {
                return Err(ApiError::bad_request(format!(
                    "version {v:?} is given twice in the split: give each version once"
                )));
            }
            if !entry.versions.contains_key(v) {
                return Err(Self::unknown_version(entry, name, v));
            }
            if !(w.is_finite() && *w >= 0.0) {
                return Err(ApiError::bad_request(format!(
                    "the weight of version {v:?} is {w}: give a finite number >= 0"
                )));
            }
        }
        let total: f64 = weights.iter().map(|(_, w)| w).sum();
        if !weights.is_empty() && total <= 0.0 {
            return Err(ApiError::bad_request("the weights sum to 0: give at least one above 0"));
        }
        if !total.is_finite() {
            return Err(ApiError::bad_request(format!(
                "the weights sum to {total}, past the largest number: give smaller weights (only their proportions count)"
            )));
        }
        entry.split = weights
            .iter()
            .filter(|(_, w)| *w > 0.0)
            .map(|(v, w)| (v.clone(), w / total))
            .collect();
        entry.routed.store(0, Ordering::Relaxed);
        Ok(())
    }

    /// Removes `version` of `name`: it admits no request after this, and the split's share of
    /// it goes to the others. The default version cannot be removed while others remain (409:
    /// set another default first); removing the last version removes the name. The caller
    /// drains what it returns ([`drain`]).
    pub fn remove(&self, name: &str, version: &str) -> Result<Arc<Served>, ApiError> {
        Self::remove_from(&mut self.write(), name, version)
    }

    /// Removes `served` as [`Registry::remove`] does, if it is still what its name and version
    /// serve: `Ok(None)` when that version was unregistered since, or is another one registered
    /// under the same name and version (which stays).
    pub fn remove_if_same(&self, served: &Arc<Served>) -> Result<Option<Arc<Served>>, ApiError> {
        let mut models = self.write();
        let same = models
            .get(&served.name)
            .and_then(|e| e.versions.get(&served.version))
            .is_some_and(|s| Arc::ptr_eq(s, served));
        if !same {
            return Ok(None);
        }
        Self::remove_from(&mut models, &served.name, &served.version).map(Some)
    }

    fn remove_from(models: &mut BTreeMap<String, Entry>, name: &str, version: &str) -> Result<Arc<Served>, ApiError> {
        let entry = models
            .get_mut(name)
            .ok_or_else(|| ApiError::not_found(format!("unknown model {}", echo(name))))?;
        if !entry.versions.contains_key(version) {
            return Err(Self::unknown_version(entry, name, version));
        }
        if entry.default == version && entry.versions.len() > 1 {
            return Err(conflict(format!(
                "version {version} is the default of model {name:?}: set another default first \
                 (PUT /models/{name}/VERSION/set-default)"
            )));
        }
        let served = entry.versions.remove(version).expect("checked above");
        entry.split.retain(|(v, _)| v != version);
        let total: f64 = entry.split.iter().map(|(_, w)| w).sum();
        if total > 0.0 {
            entry.split.iter_mut().for_each(|(_, w)| *w /= total);
        } else {
            entry.split.clear();
        }
        if entry.versions.is_empty() {
            models.remove(name);
        }
        Ok(served)
    }
}

/// Waits until every request admitted to `served` has finished (its queue places are all
/// free again), then closes its queue for good.
pub async fn drain(served: &Served) {
    let places = u32::try_from(served.options.queue).unwrap_or(u32::MAX);
    if let Ok(all) = served.admitted.acquire_many(places).await {
        all.forget();
    }
    served.admitted.close();
}

#[cfg(test)]
mod tests;
