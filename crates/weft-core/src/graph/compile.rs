//! [`compile`] and [`GraphCache`]: a function over tensors captured at its first call for each
//! input signature and replayed after that.

use super::autotune::{Autotune, TuneReport};
use super::ir::Graph;
use super::passes::{optimize, PassReport};
use super::remat::{rematerialize, RematReport};
use super::run::{all_present, Draws, Prepared, Ready};
use super::trace::{trace_with, CaptureError};
use crate::error::Result;
use crate::{DType, Device, Tensor};

/// Graphs kept per compiled function (one per input signature); the least recently used goes.
pub const DEFAULT_CACHE: usize = 8;

type Signature = Vec<(Vec<usize>, DType, Device)>;

fn signature(inputs: &[Tensor]) -> Signature {
    inputs
        .iter()
        .map(|t| (t.shape().to_vec(), t.dtype(), t.device()))
        .collect()
}

/// What the last call did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Captured a new graph (the call itself ran eagerly while being captured).
    Captured,
    /// Replayed a cached graph.
    Replayed,
    /// Ran eagerly because the function cannot be captured; the reason.
    Eager(String),
}

/// The graphs of one function, by input signature (shapes, dtypes, devices). The function is
/// handed to each [`GraphCache::call`], so it may borrow what its caller holds.
pub struct GraphCache {
    /// Most recently used last.
    cache: Vec<(Signature, Prepared)>,
    capacity: usize,
    refused: Option<String>,
    /// Whether a capture was already tried again after one that may succeed a second time.
    retried: bool,
    last: Option<Outcome>,
    report: PassReport,
    autotune: Autotune,
    /// The signatures whose graph was tuned.
    tuned: Vec<Signature>,
    tune_report: Option<TuneReport>,
    /// Whether captured graphs recompute cheap values to lower their peak memory.
    recompute: bool,
    remat: RematReport,
}

impl Default for GraphCache {
    fn default() -> Self {
        GraphCache::new(DEFAULT_CACHE)
    }
}

impl GraphCache {
    /// A cache keeping at most `capacity` graphs (at least one).
    pub fn new(capacity: usize) -> Self {
        GraphCache {
            cache: Vec::new(),
            capacity: capacity.max(1),
            refused: None,
            retried: false,
            last: None,
            report: PassReport::default(),
            autotune: Autotune::Heuristic,
            tuned: Vec::new(),
            tune_report: None,
            recompute: false,
            remat: RematReport::default(),
        }
    }

    /// How kernels choose their variants in this cache's graphs: with [`Autotune::Search`], the
    /// first replay of each graph times the variants of its kernel calls and keeps the fastest
    /// (see [`crate::tune`]; [`GraphCache::take_tune_report`] says what it did).
    pub fn with_autotune(mut self, autotune: Autotune) -> Self {
        self.autotune = autotune;
        self
    }

    /// Whether graphs captured from now on recompute cheap values next to their late readers
    /// when that lowers their peak memory (see [`super::remat`]): less memory for a training
    /// step's activations, at the cost of the recomputations. Off by default.
    pub fn with_recompute(mut self, recompute: bool) -> Self {
        self.recompute = recompute;
        self
    }

    /// What recomputation did to the newest graph (all zero when it is off).
    pub fn remat_report(&self) -> RematReport {
        self.remat
    }

    /// What the newest search did, if one ran since the last call of this method.
    pub fn take_tune_report(&mut self) -> Option<TuneReport> {
        self.tune_report.take()
    }

    /// Runs `f(inputs)`: replays the graph captured for `inputs`' signature, or captures one by
    /// running `f` eagerly once (see [`trace`]). Once a capture is refused, every call runs `f`
    /// eagerly and [`GraphCache::eager_reason`] says why; the one exception is a capture refused
    /// only for tensors made outside the op set (a cache the function fills at its first call),
    /// which is tried once more at the next call. `f` must compute the same function at
    /// every call. A function that draws random numbers is refused: see
    /// [`GraphCache::call_with_stream`].
    pub fn call(&mut self, inputs: &[Tensor], f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>) -> Result<Vec<Tensor>> {
        self.call_inner(inputs, None, f, None).and_then(all_present)
    }

    /// [`GraphCache::call`] for a function that draws random numbers (dropout masks, random
    /// tensors) from `stream` (a model's dropout generator): the capture records the draws, and
    /// each replay moves them to start where the stream is now, then advances the stream by what
    /// one call takes, so replays draw what eager calls would, bit for bit. Every draw must be
    /// from `stream` (its offsets inside what the captured call took), else the capture is
    /// refused.
    pub fn call_with_stream(
        &mut self,
        inputs: &[Tensor],
        stream: &dyn RandomSource,
        f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
    ) -> Result<Vec<Tensor>> {
        self.call_inner(inputs, Some(stream), f, None).and_then(all_present)
    }

    /// [`GraphCache::call_with_stream`] (with no stream: [`GraphCache::call`]) whose replay hands
    /// result `k` to `ready(k, result)` as soon as it is made, when nothing later in the graph
    /// reads it or can change it (a training step's gradients, so that their reduction can
    /// start while the rest of backward runs); the replay then holds it no longer. Returns the
    /// results, `None` for those `ready` got. It gets none when the call captured the graph,
    /// ran eagerly or searched kernel variants, nor a result whose buffer something else held
    /// when it was made.
    pub fn call_handing(
        &mut self,
        inputs: &[Tensor],
        stream: Option<&dyn RandomSource>,
        ready: &mut Ready,
        f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
    ) -> Result<Vec<Option<Tensor>>> {
        self.call_inner(inputs, stream, f, Some(ready))
    }

    fn call_inner(
        &mut self,
        inputs: &[Tensor],
        stream: Option<&dyn RandomSource>,
        f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
        ready: Option<&mut Ready>,
    ) -> Result<Vec<Option<Tensor>>> {
        let none_handed = |out: Vec<Tensor>| out.into_iter().map(Some).collect();
        if let Some(reason) = &self.refused {
            self.last = Some(Outcome::Eager(reason.clone()));
            return f(inputs).map(none_handed);
        }
        let sig = signature(inputs);
        if let Some(pos) = self.cache.iter().position(|(s, _)| *s == sig) {
            let entry = self.cache.remove(pos);
            self.cache.push(entry);
            self.last = Some(Outcome::Replayed);
            let prepared = &self.cache.last().expect("just pushed").1;
            // where this call's draws start, and the stream moved past them
            let at = match (prepared.draws, stream) {
                (Some(d), Some(s)) => {
                    let at = s.offset();
                    s.set_offset(at.wrapping_add(d.taken));
                    Some(at)
                }
                (Some(_), None) => {
                    return Err(crate::error::invalid(
                        "compiled function",
                        "its graph draws random numbers: call it with its random stream (call_with_stream)",
                    ))
                }
                (None, _) => None,
            };
            if self.autotune == Autotune::Search && !self.tuned.contains(&sig) {
                let (outputs, report) = search(prepared, inputs, at)?;
                self.tuned.push(sig);
                self.tune_report = Some(report);
                return Ok(none_handed(outputs));
            }
            return match ready {
                Some(ready) => prepared.run_handing(inputs, at, ready),
                None => prepared.run(inputs, at).map(none_handed),
            };
        }
        let base = stream.map(|s| s.offset());
        let (outputs, captured) = trace_with(inputs, stream.is_some(), f)?;
        let captured = captured.and_then(|graph| match (base, stream) {
            (Some(base), Some(s)) => draws_of(&graph, s.seed(), base, s.offset()).map(|d| (graph, d)),
            _ => Ok((graph, None)),
        });
        match captured {
            Ok((mut graph, draws)) => {
                self.report = optimize(&mut graph)?;
                self.remat = if self.recompute {
                    rematerialize(&mut graph)
                } else {
                    RematReport::default()
                };
                if self.cache.len() >= self.capacity {
                    self.cache.remove(0);
                }
                let mut prepared = Prepared::new(graph);
                prepared.draws = draws;
                self.cache.push((sig, prepared));
                self.last = Some(Outcome::Captured);
            }
            Err(e) if e.may_retry && !self.retried => {
                // a lazily built cache made its tensors during this call: capture again at the next
                self.retried = true;
                self.last = Some(Outcome::Eager(e.reason));
            }
            Err(e) => {
                self.refused = Some(e.reason.clone());
                self.last = Some(Outcome::Eager(e.reason));
            }
        }
        Ok(none_handed(outputs))
    }

    /// Why calls run eagerly, once a capture was refused.
    pub fn eager_reason(&self) -> Option<&str> {
        self.refused.as_deref()
    }

    /// What the last call did.
    pub fn last_outcome(&self) -> Option<&Outcome> {
        self.last.as_ref()
    }

    /// The graph replayed for `inputs`' signature, if one was captured.
    pub fn graph_for(&self, inputs: &[Tensor]) -> Option<&Graph> {
        let sig = signature(inputs);
        self.cache.iter().find(|(s, _)| *s == sig).map(|(_, p)| &p.graph)
    }

    /// The graph used last (replayed or captured), if one was captured.
    pub fn newest_graph(&self) -> Option<&Graph> {
        self.cache.last().map(|(_, p)| &p.graph)
    }

    /// What the passes did to the newest graph.
    pub fn pass_report(&self) -> PassReport {
        self.report
    }

    /// What the latest replay did with its fusion groups (of the graph used last).
    pub fn replay_stats(&self) -> Option<super::ReplayStats> {
        self.cache.last().map(|(_, p)| p.stats())
    }

    /// Graphs held now.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }
}

/// [`Prepared::tune`], with the machine's cache file read first (once per process) and written
/// after.
fn search(prepared: &Prepared, inputs: &[Tensor], at: Option<u64>) -> Result<(Vec<Tensor>, TuneReport)> {
    let (from_file, warning) = crate::tune::load_cache_once();
    let (outputs, mut report) = prepared.tune(inputs, at)?;
    report.from_file = from_file;
    report.warnings.extend(warning);
    if !report.searched.is_empty() {
        if let Err(e) = crate::tune::save_cache() {
            report
                .warnings
                .push(format!("the autotuning cache could not be written: {e}"));
        }
    }
    Ok((outputs, report))
}

/// A random stream a function draws from (a model's dropout generator): its seed and its
/// position, read and set (see [`GraphCache::call_with_stream`]).
pub trait RandomSource {
    fn seed(&self) -> u64;
    fn offset(&self) -> u64;
    fn set_offset(&self, offset: u64);
}

impl RandomSource for std::sync::Mutex<crate::Generator> {
    fn seed(&self) -> u64 {
        self.lock().unwrap_or_else(|e| e.into_inner()).seed()
    }
    fn offset(&self) -> u64 {
        self.lock().unwrap_or_else(|e| e.into_inner()).offset()
    }
    fn set_offset(&self, offset: u64) {
        self.lock().unwrap_or_else(|e| e.into_inner()).set_offset(offset)
    }
}

/// Where the random draws of `graph` lie on the stream of seed `seed`, which was at `base` when
/// the capture started and at `end` when it ended: every draw must be of that seed and inside,
/// counters and all, else the capture is refused.
fn draws_of(graph: &Graph, seed: u64, base: u64, end: u64) -> std::result::Result<Option<Draws>, CaptureError> {
    let mut any = false;
    for node in &graph.nodes {
        let (draw_seed, offset, count) = match &node.op {
            crate::op::Op::Dropout { seed, offset, .. } => {
                let n = node
                    .inputs
                    .first()
                    .map_or(0, |&v| graph.values[v].shape.iter().product::<usize>());
                (*seed, *offset, n as u64)
            }
            crate::op::Op::Random {
                seed, offset, shape, ..
            } => (*seed, *offset, shape.iter().product::<usize>() as u64),
            _ => continue,
        };
        any = true;
        if draw_seed != seed || offset < base || offset.saturating_add(count) > end {
            return Err(CaptureError {
                reason: format!(
                    "a random draw (seed {draw_seed}, counters {offset}..{}) is not from the function's random \
                     stream (seed {seed}, counters {base}..{end} during the call); a replay could not move it",
                    offset.saturating_add(count)
                ),
                may_retry: false,
            });
        }
    }
    Ok(any.then_some(Draws {
        base,
        taken: end.saturating_sub(base),
    }))
}

/// A function compiled by [`compile`]: a [`GraphCache`] with its function.
pub struct Compiled<F> {
    f: F,
    cache: GraphCache,
}

/// Wraps `f`: its first call with each input signature runs it once eagerly while capturing a
/// graph, optimizes the graph and keeps it; later calls with that signature replay it. Tensors
/// `f` reads that are not its arguments (parameters) are read at every replay, so updates made in
/// place between calls are seen. A function that cannot be captured runs eagerly from then on,
/// and [`Compiled::eager_reason`] says why.
///
/// A compiled function records no autograd: it runs its own backward and returns the gradients
/// it needs (`loss.backward()`, then each parameter's `grad()`), or runs under `no_grad`.
pub fn compile<F>(f: F) -> Compiled<F>
where
    F: FnMut(&[Tensor]) -> Result<Vec<Tensor>>,
{
    Compiled {
        f,
        cache: GraphCache::default(),
    }
}

impl<F> Compiled<F>
where
    F: FnMut(&[Tensor]) -> Result<Vec<Tensor>>,
{
    /// Keeps at most `n` graphs (at least one).
    pub fn with_cache_capacity(mut self, n: usize) -> Self {
        self.cache.capacity = n.max(1);
        self
    }

    /// Recomputes cheap values to lower the peak memory of graphs captured from now on (see
    /// [`GraphCache::with_recompute`]).
    pub fn with_recompute(mut self, recompute: bool) -> Self {
        self.cache.recompute = recompute;
        self
    }

    /// Calls the function on `inputs`: replays a cached graph, or captures one.
    pub fn call(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let f = &mut self.f;
        self.cache.call(inputs, |xs| f(xs))
    }
}

impl<F> std::ops::Deref for Compiled<F> {
    type Target = GraphCache;
    fn deref(&self) -> &GraphCache {
        &self.cache
    }
}
