//! Sharded data parallelism (ZeRO, as DeepSpeed's stages and PyTorch's FSDP): data parallelism
//! where each of the `N` ranks keeps only its shard of the optimizer state (stage 1), also of
//! the gradients (stage 2), and also of the parameters (stage 3). For Adam in f32, with `Ψ`
//! parameters, a rank holds `16Ψ` bytes of model state under plain data parallelism, `8Ψ +
//! 8Ψ/N` at stage 1, `4Ψ + 12Ψ/N` at stage 2 and `16Ψ/N` at stage 3 (Rajbhandari et al., "ZeRO:
//! Memory Optimizations Toward Training Trillion Parameter Models", 2020, figure 1).
//!
//! Layout: the parameters are grouped into units (the model's [`units`](ShardedDataParallel::new)
//! such as transformer blocks, plus a root unit of everything else). Each unit's parameters are
//! concatenated into one flat run, padded to a multiple of `N`, and rank `r` owns the `r`-th of
//! `N` equal contiguous shards. The part of a parameter inside this rank's shard is a
//! [`Piece`]: a 1-D tensor the optimizer updates (and keys its state by, under the parameter's
//! own name), with the gradient set to the matching part of the averaged gradient.
//!
//! A step:
//! - stage 1: gradients are averaged by all-reduce as in [`crate::DataParallel`] (buckets
//!   started during backward); each rank updates its pieces; the updated shards are all-gathered
//!   into every parameter ([`ShardedDataParallel::after_step`]).
//! - stage 2: when a unit's gradients are all final (during backward), they are reduce-scattered
//!   (average) so that each rank keeps only its shard, and the whole gradients are freed; then
//!   as stage 1.
//! - stage 3: between steps the parameters hold no elements (their storage is released; the
//!   tensors stay valid). [`ShardedDataParallel::begin_forward`] gathers the root unit; the model
//!   runs each unit inside `Context::unit`, whose hooks ([`ShardedDataParallel::before_unit`],
//!   [`ShardedDataParallel::after_unit`]) gather the unit (prefetching the next one) and free it
//!   after its forward; a hook on the unit's output gathers it again just before its backward
//!   (prefetching the one before), and it is freed once its gradients are reduce-scattered.
//!   The optimizer updates the shards directly; nothing is gathered after the step.
//!
//! Every rank must call these methods in the same order; the collectives pair up by order.

mod engine;
mod state;
mod units;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use weft_core::Tensor;

use crate::ddp::{DataParallel, DdpOptions};
use crate::error::{Error, Result};
use crate::group::ProcessGroup;
use engine::{lock, Engine};

/// Settings of [`ShardedDataParallel`].
#[derive(Clone, Debug)]
pub struct ZeroOptions {
    /// 1: optimizer state sharded; 2: also gradients; 3: also parameters.
    pub stage: usize,
    /// Stage 1 averages gradients with these buckets.
    pub ddp: DdpOptions,
    /// Communicate in bf16: parameters are gathered in bf16 (so the model computes with
    /// bf16-rounded weights) from f32 shards that the optimizer updates (master weights), and at
    /// stages 2 and 3 gradients are reduce-scattered in bf16 and kept as f32 shards. Halves the
    /// bytes moved. Stage 1 still averages gradients in f32.
    pub bf16: bool,
}

/// This rank's part of one parameter: what the optimizer sees.
#[derive(Clone, Debug)]
pub struct Piece {
    /// The parameter's name (the optimizer keys its state by it).
    pub name: String,
    /// 1-D, the piece's elements, updated in place by the optimizer; its gradient is set by
    /// [`ShardedDataParallel::finish`].
    pub tensor: Tensor,
    /// Where the piece starts in the parameter's own (row-major, flat) numbering of elements.
    pub offset: usize,
    /// The whole parameter's shape (weight decay groups go by its number of dimensions).
    pub param_shape: Vec<usize>,
}

/// Keeps sharded model replicas in step across a group; see the module docs.
pub struct ShardedDataParallel {
    engine: Arc<Mutex<Engine>>,
    /// Stage 1's gradient averaging.
    ddp: Option<DataParallel>,
    pieces: Vec<Piece>,
}

/// Bytes of model state a rank holds (buffers counted once, whatever views them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeldBytes {
    pub params: usize,
    pub grads: usize,
}

impl ShardedDataParallel {
    /// Broadcasts `params` from group rank 0 (every rank passes the same names, shapes and
    /// dtypes in the same order) and lays them out in shards. `units` names the model's units
    /// in forward order (parameters named `"{unit}.*"`); the rest form the root unit. At stage
    /// 3 the parameters stay whole until the first [`ShardedDataParallel::begin_forward`].
    ///
    /// Errors: a stage outside 1-3; a parameter that is not a contiguous f32/f64 tensor or is
    /// listed twice; a unit without parameters or with mixed dtypes; a failed broadcast.
    pub fn new(
        params: Vec<(String, Tensor)>,
        units: &[String],
        pg: &ProcessGroup,
        options: ZeroOptions,
    ) -> Result<ShardedDataParallel> {
        let zero = Self::build(params, units, pg, options)?;
        zero.attach_hooks();
        Ok(zero)
    }

    /// As [`ShardedDataParallel::new`] at stage 1 or 2 without registering gradient-ready hooks:
    /// backward passes have no side effects (they can be captured as a graph and replayed). The
    /// caller hands gradients over as they are made ([`ShardedDataParallel::hand_gradient`]);
    /// [`ShardedDataParallel::finish`] and [`ShardedDataParallel::accumulate`] take those the
    /// parameters hold that were not, starting the same reductions in the same order (those do
    /// not overlap backward; the averages are the same). [`ShardedDataParallel::attach_hooks`]
    /// registers them later. Errors as `new`, and at stage 3, whose parameters are gathered for
    /// backward by hooks.
    pub fn new_unhooked(
        params: Vec<(String, Tensor)>,
        units: &[String],
        pg: &ProcessGroup,
        options: ZeroOptions,
    ) -> Result<ShardedDataParallel> {
        if options.stage == 3 {
            return Err(Error::Invalid(
                "zero: stage 3 gathers the parameters for backward from hooks; it cannot run without them".into(),
            ));
        }
        Self::build(params, units, pg, options)
    }

    /// The layout, the broadcast and the pieces; no hooks.
    fn build(
        params: Vec<(String, Tensor)>,
        units: &[String],
        pg: &ProcessGroup,
        options: ZeroOptions,
    ) -> Result<ShardedDataParallel> {
        if !(1..=3).contains(&options.stage) {
            return Err(Error::Invalid(format!(
                "zero: stage {} is not a ZeRO stage (1, 2 or 3; 0 is plain data parallelism)",
                options.stage
            )));
        }
        let plan = units::plan(&params, units, pg.size())?;
        let ddp = if options.stage == 1 {
            Some(DataParallel::new_unhooked(params.clone(), pg, options.ddp)?)
        } else {
            for (_, p) in &params {
                pg.broadcast(p, 0)?.wait()?;
            }
            None
        };
        let mut engine = Engine::new(pg.clone(), options.stage, options.bf16, params, plan, units.len())?;
        if options.stage < 3 && options.bf16 {
            // the shards start from the broadcast parameters; the gathers round the
            // parameters to bf16 from the first step on
            engine.fill_master()?;
        }
        let mut pieces = Vec::new();
        for (u, spans) in engine.spans.iter().enumerate() {
            for s in spans {
                let (name, p) = &engine.params[s.param];
                let tensor = if !engine.master.is_empty() {
                    engine.master[u].narrow(0, s.at, s.len)?
                } else {
                    p.detach().reshape(&[-1])?.narrow(0, s.lo, s.len)?
                };
                pieces.push(Piece {
                    name: name.clone(),
                    tensor,
                    offset: s.lo,
                    param_shape: p.shape().to_vec(),
                });
            }
        }
        let engine = Arc::new(Mutex::new(engine));
        Ok(ShardedDataParallel { engine, ddp, pieces })
    }

    /// Registers the gradient-ready hooks (once; later calls do nothing): from the next
    /// backward on, reductions start while backward runs. Hooks cannot be removed again.
    pub fn attach_hooks(&self) {
        match &self.ddp {
            Some(ddp) => ddp.attach_hooks(),
            None => Engine::register_hooks(&self.engine),
        }
    }

    /// Whether the gradient-ready hooks are registered.
    pub fn hooked(&self) -> bool {
        match &self.ddp {
            Some(ddp) => ddp.hooked(),
            None => lock(&self.engine).hooked(),
        }
    }

    /// Without hooks (stages 1 and 2): parameter `i` (in the order given to
    /// [`ShardedDataParallel::new_unhooked`]) holds its final gradient of this backward; hands it
    /// over now, as its hook would: at stage 1 into its data-parallel bucket, at stage 2 into
    /// its unit, whose reduce-scatter starts once the unit is complete (and earlier units have
    /// started). [`ShardedDataParallel::finish`] and [`ShardedDataParallel::accumulate`] take
    /// the gradients not handed over this way; errors are reported there (as is handing one to
    /// a wrapper whose hooks are registered, which take every gradient themselves).
    pub fn hand_gradient(&self, i: usize) {
        match &self.ddp {
            Some(ddp) => ddp.hand_gradient(i),
            None => lock(&self.engine).hand_gradient(i),
        }
    }

    pub fn stage(&self) -> usize {
        lock(&self.engine).stage
    }

    /// This rank's pieces of the parameters, to pass to the optimizer.
    pub fn pieces(&self) -> &[Piece] {
        &self.pieces
    }

    /// Copies of this rank's pieces' current values, in the order of [`Self::pieces`]: what a
    /// sharded checkpoint saves. They come from the parameters while those hold the truth
    /// (before the first forward, after [`Self::gather_parameters`] or a loaded checkpoint),
    /// else from the shards the optimizer updates. No communication.
    pub fn piece_values(&self) -> Result<Vec<Tensor>> {
        let e = lock(&self.engine);
        let from_params = e.whole || e.master.is_empty();
        // the pieces were made from the spans, in this order
        let spans = e.spans.iter().flatten();
        self.pieces
            .iter()
            .zip(spans)
            .map(|(piece, span)| {
                let t = if from_params {
                    e.params[span.param]
                        .1
                        .detach()
                        .reshape(&[-1])?
                        .narrow(0, span.lo, span.len)?
                        .contiguous_copy()?
                } else {
                    piece.tensor.contiguous_copy()?
                };
                Ok(t)
            })
            .collect()
    }

    /// The unit names and the parameter names of each, the root unit (named `""`) last.
    pub fn units(&self) -> Vec<(String, Vec<String>)> {
        let e = lock(&self.engine);
        e.units
            .iter()
            .map(|u| {
                let names = u.members.iter().map(|&i| e.params[i].0.clone()).collect();
                (u.name.clone(), names)
            })
            .collect()
    }

    /// Before each forward pass (stage 3): shards the parameters if they are whole, and gathers
    /// the root unit (prefetching the first named unit). Nothing at stages 1 and 2.
    pub fn begin_forward(&self) -> Result<()> {
        let mut e = lock(&self.engine);
        if e.stage != 3 {
            if e.bf16 && e.whole {
                // the parameters hold full-precision values (the start, a checkpoint saved or
                // loaded) and are the truth: the shards take them, and the parameters go back
                // to the bf16-rounded values every step computes with
                e.fill_master()?;
                e.gather_updated(false)?;
                e.whole = false;
            }
            return Ok(());
        }
        e.reshard()?;
        if let Some(root) = e.root() {
            e.ensure_whole(root)?;
        }
        if e.named > 0 {
            e.prefetch(0)?;
        }
        Ok(())
    }

    /// After a forward pass that is not followed by backward (evaluation, stage 3): frees every
    /// gathered unit.
    pub fn end_forward(&self) -> Result<()> {
        let mut e = lock(&self.engine);
        if e.stage == 3 && !e.whole {
            e.release_all()?;
        }
        Ok(())
    }

    /// Called by the model before unit `unit`'s forward (through `Context::unit`).
    pub fn before_unit(&self, unit: &str) -> Result<()> {
        let mut e = lock(&self.engine);
        if e.stage != 3 {
            return Ok(());
        }
        let u = e.unit_named(unit)?;
        e.before_forward(u)
    }

    /// Called by the model after unit `unit`'s forward produced `output`.
    pub fn after_unit(&self, unit: &str, output: &Tensor) -> Result<()> {
        let u = {
            let e = lock(&self.engine);
            if e.stage != 3 {
                return Ok(());
            }
            e.unit_named(unit)?
        };
        Engine::after_forward(&self.engine, u, output)
    }

    /// Runs `f` (forward and backward passes) without averaging gradients, which accumulate
    /// locally until the next backward outside it (gradient accumulation, micro-batches), as
    /// [`DataParallel::no_sync`]. Stage 1 only: stages 2 and 3 reduce every backward's
    /// gradients as they come (see [`ShardedDataParallel::accumulate`]), and a second backward
    /// before `finish` or `accumulate` is an error there.
    pub fn no_sync<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.ddp {
            Some(ddp) => ddp.no_sync(f),
            None => f(),
        }
    }

    /// Gradient accumulation at stages 2 and 3, as DeepSpeed does it: after a backward that is
    /// not the step's last, waits for its gradients' reduce-scatters and keeps them in the
    /// gradient shards; every later backward's averaged shard is added to them, up to the
    /// [`ShardedDataParallel::finish`] of the step's last backward. (Stage 3 frees the units
    /// again: call [`ShardedDataParallel::begin_forward`] before each forward.) At stage 1 use
    /// [`ShardedDataParallel::no_sync`]; this is an error there.
    pub fn accumulate(&self) -> Result<()> {
        let mut e = lock(&self.engine);
        if e.stage < 2 {
            return Err(Error::Invalid(
                "zero: accumulate() is for stages 2 and 3; stage 1 accumulates inside no_sync()".into(),
            ));
        }
        let result = e.accumulate();
        if let Err(err) = &result {
            e.pg.abort(&err.to_string());
        }
        result
    }

    /// After backward: waits for the gradient reductions and sets each piece's gradient to its
    /// part of the group's average. A parameter without a gradient is an error naming it (the
    /// group is aborted with the same message, so every rank stops).
    pub fn finish(&self) -> Result<()> {
        let result = self.finish_inner();
        if let Err(e) = &result {
            lock(&self.engine).pg.abort(&e.to_string());
        }
        result
    }

    fn finish_inner(&self) -> Result<()> {
        if let Some(ddp) = &self.ddp {
            ddp.finish()?;
        }
        let mut e = lock(&self.engine);
        if e.stage >= 2 {
            e.finish()?;
        }
        let mut k = 0;
        for (u, spans) in e.spans.iter().enumerate() {
            for s in spans {
                let grad = if e.stage == 1 {
                    let (name, p) = &e.params[s.param];
                    let g = p
                        .grad()
                        .ok_or_else(|| Error::Invalid(format!("zero: parameter {name:?} has no gradient")))?;
                    g.reshape(&[-1])?.narrow(0, s.lo, s.len)?
                } else {
                    e.grad_shards[u].narrow(0, s.at, s.len)?
                };
                self.pieces[k].tensor.set_grad(Some(grad));
                k += 1;
            }
        }
        Ok(())
    }

    /// After the optimizer updated the pieces: at stages 1 and 2, every rank's updated shards
    /// are gathered into the whole parameters, and the gradients are cleared. At stage 3 the
    /// shards are the parameters: only the gradients are cleared.
    pub fn after_step(&self) -> Result<()> {
        let mut e = lock(&self.engine);
        for p in &self.pieces {
            p.tensor.set_grad(None);
        }
        for (_, p) in &e.params {
            p.set_grad(None);
        }
        if e.stage <= 2 {
            e.gather_updated(false)?;
            e.whole = false;
        }
        Ok(())
    }

    /// Stage 3: gathers every unit so that the model's parameters hold their elements (to save
    /// them, sample from the model, or hand it to code that knows nothing of sharding), in
    /// full precision. The next [`ShardedDataParallel::begin_forward`] shards them again,
    /// taking this rank's shard from the parameters (so changes made to them meanwhile, such as
    /// loading a checkpoint, are kept). At stages 1 and 2, whose parameters are always whole,
    /// this only matters when communicating in bf16: the parameters get the full-precision
    /// values of the shards until the next `begin_forward`.
    pub fn gather_parameters(&self) -> Result<()> {
        let mut e = lock(&self.engine);
        if e.stage == 3 {
            e.gather_all()?;
        } else if e.bf16 && !e.whole {
            e.gather_updated(true)?;
            e.whole = true;
        }
        Ok(())
    }

    /// Collective: the whole optimizer state of every parameter (as a single-process optimizer
    /// keeps it) from every rank's state of its pieces (`Optimizer::state()` output).
    pub fn consolidate_state(&self, state: Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>> {
        state::consolidate(&lock(&self.engine), state)
    }

    /// This rank's part of a whole optimizer state (see [`ShardedDataParallel::consolidate_state`]),
    /// for `Optimizer::load_state`.
    pub fn shard_state(&self, state: &BTreeMap<String, Tensor>) -> Result<BTreeMap<String, Tensor>> {
        state::shard(&lock(&self.engine), state)
    }

    /// Bytes of parameters (whole parameters still held, and shards) and gradients (of the
    /// parameters, and gradient shards) this rank holds now.
    pub fn held_bytes(&self) -> HeldBytes {
        let e = lock(&self.engine);
        let mut distinct = weft_core::storage::DistinctBytes::default();
        let mut bytes = |t: &Tensor| distinct.add(t);
        let mut held = HeldBytes::default();
        for (_, p) in &e.params {
            held.params += bytes(p);
        }
        for m in &e.master {
            held.params += bytes(m);
        }
        for (_, p) in &e.params {
            held.grads += p.grad().map_or(0, |g| bytes(&g));
        }
        for p in &self.pieces {
            held.grads += p.tensor.grad().map_or(0, |g| bytes(&g));
        }
        for g in &e.grad_shards {
            held.grads += bytes(g);
        }
        held
    }
}
