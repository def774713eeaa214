//! State shared by the layers of one model: train/eval mode, the dropout random stream, and the
//! hooks around the model's units.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use weft_core::{Generator, Result, Tensor};

/// Train/eval mode and the random stream of a model's dropout layers. Cloning shares the state,
/// so one `set_training` switches every layer built with this context.
#[derive(Clone, Debug)]
pub struct Context(Arc<Inner>);

struct Inner {
    training: AtomicBool,
    rng: Mutex<Generator>,
    units: RwLock<Option<Arc<dyn UnitHooks>>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("training", &self.training)
            .field("rng", &self.rng)
            .finish_non_exhaustive()
    }
}

/// Called around the forward of each unit of a model (a named group of parameters whose names
/// start with `"{unit}."`, such as one transformer block; see [`Context::unit`]). Sharded data
/// parallelism (ZeRO stage 3) gathers a unit's parameters before it runs and frees them after.
pub trait UnitHooks: Send + Sync {
    /// Before the unit's forward: its parameters must hold their values when this returns.
    fn before_forward(&self, unit: &str) -> Result<()>;
    /// After the unit's forward produced `output` (which the hooks may watch for its gradient).
    fn after_forward(&self, unit: &str, output: &Tensor) -> Result<()>;
}

impl Context {
    /// Training mode, with dropout drawing from a stream seeded by `seed`.
    pub fn new(seed: u64) -> Self {
        Context(Arc::new(Inner {
            training: AtomicBool::new(true),
            rng: Mutex::new(Generator::new(seed)),
            units: RwLock::new(None),
        }))
    }

    pub fn training(&self) -> bool {
        self.0.training.load(Ordering::Relaxed)
    }

    /// Training (`true`, as `model.train()`) or evaluation (`false`, as `model.eval()`).
    pub fn set_training(&self, on: bool) {
        self.0.training.store(on, Ordering::Relaxed);
    }

    /// Runs `f` with the dropout generator.
    pub fn with_rng<R>(&self, f: impl FnOnce(&mut Generator) -> R) -> R {
        f(&mut self.0.rng.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The generator's position (saved in checkpoints).
    pub fn rng_offset(&self) -> u64 {
        self.with_rng(|g| g.offset())
    }

    pub fn set_rng_offset(&self, offset: u64) {
        self.with_rng(|g| g.set_offset(offset));
    }

    /// Installs (or removes, with `None`) the hooks [`Context::unit`] calls.
    pub fn set_unit_hooks(&self, hooks: Option<Arc<dyn UnitHooks>>) {
        *self.0.units.write().unwrap_or_else(|e| e.into_inner()) = hooks;
    }

    /// Runs `forward`, the forward pass of the unit named `unit`, between the installed
    /// [`UnitHooks`] (directly when there are none). Models call this for each of the units
    /// they list in `Model::units`.
    pub fn unit(&self, unit: &str, forward: impl FnOnce() -> Result<Tensor>) -> Result<Tensor> {
        let hooks = self.0.units.read().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(hooks) = hooks else {
            return forward();
        };
        hooks.before_forward(unit)?;
        let out = forward()?;
        hooks.after_forward(unit, &out)?;
        Ok(out)
    }
}

impl Default for Context {
    fn default() -> Self {
        Context::new(0)
    }
}

/// The dropout stream as compiled mode moves it along (`weft_core::graph::GraphCache::call_with_stream`).
impl weft_core::graph::RandomSource for Context {
    fn seed(&self) -> u64 {
        self.with_rng(|g| g.seed())
    }
    fn offset(&self) -> u64 {
        self.rng_offset()
    }
    fn set_offset(&self, offset: u64) {
        self.set_rng_offset(offset)
    }
}
