//! The state machine behind [`super::ShardedDataParallel`]: gradient reduce-scatters started
//! from gradient-ready hooks (stages 2 and 3), and for stage 3 the gathering and freeing of each
//! unit's parameters around its forward and backward.

use std::sync::{Arc, Mutex, MutexGuard, Weak};

use weft_core::{DType, Tensor};

use super::units::{self, Span, Unit};
use crate::error::{Error, Result};
use crate::group::{ProcessGroup, Work};
use crate::reduce::ReduceOp;

/// Where a unit's whole parameters are (stage 3).
pub(crate) enum Gathered {
    /// Only the shards exist.
    Released,
    /// An all-gather into the flat buffer is running.
    Pending(Work, Tensor),
    /// The parameters hold their elements.
    Whole,
}

pub(crate) struct Engine {
    pub pg: ProcessGroup,
    pub stage: usize,
    pub params: Vec<(String, Tensor)>,
    pub units: Vec<Unit>,
    /// Unit of each parameter.
    pub unit_of: Vec<usize>,
    /// Named units (the root, when present, is the unit after them).
    pub named: usize,
    /// This rank's spans of each unit.
    pub spans: Vec<Vec<Span>>,
    /// Units in the order their gradients are reduced: named units last to first, then the root.
    order: Vec<usize>,
    ready: Vec<bool>,
    missing: Vec<usize>,
    /// Flat gradients assembled and waiting for their turn to be reduced.
    flat_grads: Vec<Option<Tensor>>,
    next_launch: usize,
    /// This rank's averaged gradient shard of each unit (stages 2, 3).
    pub grad_shards: Vec<Tensor>,
    /// Running reductions, with the shard they write when it is not `grad_shards` itself
    /// (communication in bf16, or a reduction added to the accumulated shard).
    reducing: Vec<Option<(Work, Option<Tensor>)>>,
    /// Communicate in bf16 (gradients reduced, parameters gathered), keeping f32 shards.
    pub bf16: bool,
    /// This rank's parameter shard of each unit (stage 3, or any stage communicating in bf16):
    /// what the optimizer updates. Empty when the optimizer updates the parameters in place.
    pub master: Vec<Tensor>,
    pub gathered: Vec<Gathered>,
    /// The model's parameters hold every element in full precision and are the truth (the
    /// shards may be stale): stage 3 between `gather_all` and `reshard`; stages 1 and 2 in bf16
    /// from the start or a full-precision gather until the next step's bf16 gather.
    pub whole: bool,
    /// The first error met by a hook, reported by `finish`.
    error: Option<Error>,
    /// `grad_shards` hold the sum of earlier backward passes of this step (gradient
    /// accumulation): the next reductions are added to them instead of replacing them.
    pub accumulated: bool,
    /// The gradient-ready hooks are registered (stages 2, 3); else `finish` and `accumulate`
    /// take the gradients the parameters hold.
    hooked: bool,
}

pub(crate) fn lock(e: &Mutex<Engine>) -> MutexGuard<'_, Engine> {
    e.lock().unwrap_or_else(|p| p.into_inner())
}

impl Engine {
    pub fn new(
        pg: ProcessGroup,
        stage: usize,
        bf16: bool,
        params: Vec<(String, Tensor)>,
        units: Vec<Unit>,
        named: usize,
    ) -> Result<Engine> {
        let mut unit_of = vec![0; params.len()];
        for (u, unit) in units.iter().enumerate() {
            for &i in &unit.members {
                unit_of[i] = u;
            }
        }
        let spans = units.iter().map(|u| u.spans(pg.rank(), &params)).collect();
        let order = (0..named).rev().chain(named..units.len()).collect();
        let shards = |on: bool| -> Result<Vec<Tensor>> {
            if !on {
                return Ok(Vec::new());
            }
            units
                .iter()
                .map(|u| Tensor::zeros(&[u.shard], u.dtype).map_err(Error::from))
                .collect()
        };
        let grad_shards = shards(stage >= 2)?;
        let master = shards(stage == 3 || bf16)?;
        Ok(Engine {
            pg,
            stage,
            ready: vec![false; params.len()],
            missing: units.iter().map(|u| u.members.len()).collect(),
            flat_grads: units.iter().map(|_| None).collect(),
            next_launch: 0,
            reducing: units.iter().map(|_| None).collect(),
            gathered: units.iter().map(|_| Gathered::Whole).collect(),
            whole: true,
            error: None,
            accumulated: false,
            hooked: false,
            bf16,
            params,
            unit_of,
            named,
            spans,
            order,
            grad_shards,
            master,
            units,
        })
    }

    /// The dtype unit `u`'s collectives move.
    pub fn comm_dtype(&self, u: usize) -> DType {
        if self.bf16 {
            DType::BF16
        } else {
            self.units[u].dtype
        }
    }

    /// Copies this rank's spans of the whole parameters into the shards.
    pub fn fill_master(&mut self) -> Result<()> {
        for u in 0..self.master.len() {
            let params = &self.params;
            units::copy_into_shard(&self.spans[u], &self.master[u], |i| params[i].1.clone())?;
        }
        Ok(())
    }

    pub fn root(&self) -> Option<usize> {
        (self.units.len() > self.named).then_some(self.named)
    }

    /// Whether [`Engine::register_hooks`] ran.
    pub fn hooked(&self) -> bool {
        self.hooked
    }

    /// Registers each parameter's gradient-ready hook (stages 2, 3), once.
    pub fn register_hooks(engine: &Arc<Mutex<Engine>>) {
        let params: Vec<Tensor> = {
            let mut e = lock(engine);
            if std::mem::replace(&mut e.hooked, true) {
                return;
            }
            e.params.iter().map(|(_, p)| p.clone()).collect()
        };
        for (i, p) in params.iter().enumerate() {
            let e = Arc::downgrade(engine);
            p.register_grad_ready_hook(move |_| {
                if let Some(e) = e.upgrade() {
                    lock(&e).gradient_ready(i);
                }
            });
        }
    }

    /// What the hooks would have done during backward, after it (no hooks registered): every
    /// parameter holding a gradient not handed over yet hands it over, last parameter first as
    /// backward produces them; each unit is flattened and its reduce-scatter started, in
    /// reduction order, as soon as all of its gradients are in. A parameter without a gradient
    /// stays missing (the error `finish` reports).
    fn take_held_gradients(&mut self) {
        for i in (0..self.params.len()).rev() {
            if self.params[i].1.grad().is_some() && !self.ready[i] {
                self.gradient_ready(i);
            }
        }
    }

    /// A caller without hooks: parameter `i`'s gradient is final for this backward (see
    /// [`Engine::gradient_ready`]); an error is kept for `finish`.
    pub fn hand_gradient(&mut self, i: usize) {
        if self.error.is_some() {
            return;
        }
        let n = self.params.len();
        let wrong = if self.hooked {
            Some(format!(
                "zero: hand_gradient({i}) on a wrapper whose hooks are registered (they take every gradient)"
            ))
        } else if i >= n {
            Some(format!("zero: hand_gradient({i}) names no parameter (there are {n})"))
        } else {
            None
        };
        match wrong {
            Some(msg) => self.error = Some(Error::Invalid(msg)),
            None => self.gradient_ready(i),
        }
    }

    /// Parameter `i`'s gradient is final for this backward (its hook, or
    /// [`Engine::hand_gradient`]); an error is kept for `finish`.
    fn gradient_ready(&mut self, i: usize) {
        if self.error.is_some() {
            return;
        }
        if let Err(e) = self.take_gradient(i) {
            self.error = Some(e);
        }
    }

    fn take_gradient(&mut self, i: usize) -> Result<()> {
        if self.ready[i] {
            return Err(Error::Invalid(format!(
                "zero: parameter {:?} got a second gradient before finish() (call finish() after each backward)",
                self.params[i].0
            )));
        }
        self.ready[i] = true;
        let u = self.unit_of[i];
        self.missing[u] -= 1;
        if self.missing[u] == 0 {
            // the unit's gradients are final: flatten them, free them, and (stage 3) free the
            // whole parameters too, which no backward step needs any more
            let unit = &self.units[u];
            let flat = Tensor::zeros(&[unit.padded(self.pg.size())], self.comm_dtype(u))?;
            units::gather_grads(unit, &self.params, &flat)?;
            for &m in &unit.members {
                self.params[m].1.set_grad(None);
            }
            self.flat_grads[u] = Some(flat);
            if self.stage == 3 && Some(u) != self.root() {
                self.release(u)?;
            }
        }
        self.launch_ready()
    }

    /// Starts, in reduction order, every unit whose flat gradient is assembled.
    fn launch_ready(&mut self) -> Result<()> {
        while let Some(&u) = self.order.get(self.next_launch) {
            let Some(flat) = self.flat_grads[u].take() else { break };
            let _s = crate::trace::span("compute", "launch reduce_scatter");
            // a separate output when it must be cast into the shard or added to it
            let out = if self.bf16 || self.accumulated {
                Some(Tensor::zeros(&[self.units[u].shard], self.comm_dtype(u))?)
            } else {
                None
            };
            let dst = out.as_ref().unwrap_or(&self.grad_shards[u]);
            let work = self.pg.reduce_scatter(dst, &flat, ReduceOp::Avg)?;
            self.reducing[u] = Some((work, out));
            self.next_launch += 1;
        }
        Ok(())
    }

    /// After backward (stages 2, 3): checks every gradient arrived, waits for the reductions
    /// (added to the shards when earlier backward passes of the step were kept by
    /// [`Engine::accumulate`]) and (stage 3) frees the root unit. Ready for the next step
    /// whatever happened.
    pub fn finish(&mut self) -> Result<()> {
        let result = self.finish_backward();
        self.accumulated = false;
        result
    }

    /// After a backward whose gradients the step's next backward passes add to (stages 2, 3):
    /// as [`Engine::finish`], but the next ones add their reductions to the shards.
    pub fn accumulate(&mut self) -> Result<()> {
        let result = self.finish_backward();
        self.accumulated = result.is_ok();
        result
    }

    fn finish_backward(&mut self) -> Result<()> {
        if !self.hooked {
            self.take_held_gradients();
        }
        let result = self.finish_inner();
        self.ready.iter_mut().for_each(|r| *r = false);
        for (u, unit) in self.units.iter().enumerate() {
            self.missing[u] = unit.members.len();
            self.flat_grads[u] = None;
            self.reducing[u] = None;
        }
        self.next_launch = 0;
        self.error = None;
        result
    }

    fn finish_inner(&mut self) -> Result<()> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let unused: Vec<&str> = (0..self.params.len())
            .filter(|&i| !self.ready[i])
            .map(|i| self.params[i].0.as_str())
            .collect();
        if !unused.is_empty() {
            return Err(Error::Invalid(format!(
                "zero: rank {}: parameters {unused:?} received no gradient in this backward pass (with ZeRO \
                 stages 2 and 3 every parameter must take part in the loss on every rank)",
                self.pg.global_rank()
            )));
        }
        for u in 0..self.units.len() {
            if let Some((work, reduced)) = self.reducing[u].take() {
                work.wait()?;
                // a separate buffer when the reduction ran in bf16 or into an accumulation
                match reduced {
                    Some(b) if self.accumulated => {
                        let shard = &self.grad_shards[u];
                        shard.copy_from(&shard.add(&b.cast(shard.dtype())?)?)?;
                    }
                    Some(b) => self.grad_shards[u].copy_from(&b)?,
                    None => {}
                }
            }
        }
        if self.stage == 3 {
            self.release_all()?;
        }
        Ok(())
    }

    /// Starts gathering unit `u`'s parameters when they are released.
    pub fn prefetch(&mut self, u: usize) -> Result<()> {
        self.prefetch_as(u, self.comm_dtype(u))
    }

    /// [`Engine::prefetch`] moving elements of `dtype`.
    fn prefetch_as(&mut self, u: usize, dtype: DType) -> Result<()> {
        if matches!(self.gathered[u], Gathered::Released) {
            let unit = &self.units[u];
            let flat = Tensor::zeros(&[unit.padded(self.pg.size())], dtype)?;
            let work = self.pg.all_gather(&flat, &self.master[u].cast(flat.dtype())?)?;
            self.gathered[u] = Gathered::Pending(work, flat);
        }
        Ok(())
    }

    /// Makes unit `u`'s parameters whole (gathering them, or waiting for the prefetch). On an
    /// error the parameters are filled with zeros, so that nothing reads a freed buffer, and
    /// the error is returned.
    pub fn ensure_whole(&mut self, u: usize) -> Result<()> {
        self.prefetch(u)?;
        let state = std::mem::replace(&mut self.gathered[u], Gathered::Whole);
        let Gathered::Pending(work, flat) = state else {
            return Ok(());
        };
        let waited = work.wait();
        let unit = &self.units[u];
        if waited.is_err() {
            flat.copy_from(&Tensor::zeros(flat.shape(), flat.dtype())?)?;
        }
        for (&i, &off) in unit.members.iter().zip(&unit.offsets) {
            units::fill_param(&self.params[i].1, &flat, off)?;
        }
        waited
    }

    /// As [`Engine::ensure_whole`] from a hook that cannot return an error: keeps the first.
    pub fn ensure_whole_in_hook(&mut self, u: usize) {
        if let Err(e) = self.ensure_whole(u) {
            self.error.get_or_insert(e);
        }
    }

    /// Frees unit `u`'s whole parameters (stage 3), waiting for a gather still running.
    pub fn release(&mut self, u: usize) -> Result<()> {
        if let Gathered::Pending(..) = self.gathered[u] {
            self.ensure_whole(u)?;
        }
        for &i in &self.units[u].members {
            units::release_param(&self.params[i].1);
        }
        self.gathered[u] = Gathered::Released;
        Ok(())
    }

    pub fn release_all(&mut self) -> Result<()> {
        for u in 0..self.units.len() {
            self.release(u)?;
        }
        Ok(())
    }

    /// Stage 3: every unit whole (the parameters hold their elements again).
    /// In full precision (f32 even when communicating in bf16), as checkpoints need them.
    pub fn gather_all(&mut self) -> Result<()> {
        if self.whole {
            return Ok(());
        }
        // units gathered in bf16 (none between steps) are gathered again in full
        self.release_all()?;
        for u in 0..self.units.len() {
            self.prefetch_as(u, self.units[u].dtype)?;
        }
        for u in 0..self.units.len() {
            self.ensure_whole(u)?;
        }
        self.whole = true;
        Ok(())
    }

    /// Stage 3: takes this rank's shards from the whole parameters and frees them.
    pub fn reshard(&mut self) -> Result<()> {
        if !self.whole {
            return Ok(());
        }
        self.fill_master()?;
        self.release_all()?;
        self.whole = false;
        Ok(())
    }

    /// Stages 1, 2 after the optimizer updated this rank's spans (of the parameters, or of
    /// the shards when communicating in bf16): every rank's updated spans are gathered into
    /// every parameter, in the communication dtype, or in full precision when `full`.
    pub fn gather_updated(&mut self, full: bool) -> Result<()> {
        let ranks = self.pg.size();
        let mut pending = Vec::with_capacity(self.units.len());
        for (u, unit) in self.units.iter().enumerate() {
            let dtype = if full { unit.dtype } else { self.comm_dtype(u) };
            let shard = if self.master.is_empty() {
                let shard = Tensor::zeros(&[unit.shard], unit.dtype)?;
                let params = &self.params;
                units::copy_into_shard(&self.spans[u], &shard, |i| params[i].1.clone())?;
                shard
            } else {
                self.master[u].cast(dtype)?
            };
            let flat = Tensor::zeros(&[unit.padded(ranks)], dtype)?;
            pending.push((self.pg.all_gather(&flat, &shard)?, flat));
        }
        for (unit, (work, flat)) in self.units.iter().zip(pending) {
            work.wait()?;
            for (&i, &off) in unit.members.iter().zip(&unit.offsets) {
                units::fill_param(&self.params[i].1, &flat, off)?;
            }
        }
        Ok(())
    }

    /// The unit named `name` (a named unit, not the root).
    pub fn unit_named(&self, name: &str) -> Result<usize> {
        self.units[..self.named]
            .iter()
            .position(|u| u.name == name)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "zero: the model ran unit {name:?}, which is not one of the units it listed ({:?})",
                    self.units[..self.named].iter().map(|u| &u.name).collect::<Vec<_>>()
                ))
            })
    }

    /// Before unit `u`'s forward (stage 3): its parameters whole, the next unit's on their way.
    pub fn before_forward(&mut self, u: usize) -> Result<()> {
        if self.whole {
            return Ok(());
        }
        self.ensure_whole(u)?;
        if u + 1 < self.named {
            self.prefetch(u + 1)?;
        }
        Ok(())
    }

    /// After unit `u`'s forward (stage 3): frees its parameters, and when `output` will get a
    /// gradient, gathers them again just before the unit's backward (prefetching the unit
    /// before it).
    pub fn after_forward(engine: &Arc<Mutex<Engine>>, u: usize, output: &Tensor) -> Result<()> {
        {
            let mut e = lock(engine);
            if e.whole {
                return Ok(());
            }
            e.release(u)?;
        }
        if output.requires_grad() && weft_core::is_grad_enabled() {
            let e: Weak<Mutex<Engine>> = Arc::downgrade(engine);
            output.register_grad_ready_hook(move |_| {
                if let Some(e) = e.upgrade() {
                    let mut e = lock(&e);
                    e.ensure_whole_in_hook(u);
                    if u > 0 {
                        if let Err(err) = e.prefetch(u - 1) {
                            e.error.get_or_insert(err);
                        }
                    }
                }
            });
        }
        Ok(())
    }
}
