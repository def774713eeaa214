//! State shared by the layers of one model: train/eval mode and the dropout random stream.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use weft_core::Generator;

/// Train/eval mode and the random stream of a model's dropout layers. Cloning shares the state,
/// so one `set_training` switches every layer built with this context.
#[derive(Clone, Debug)]
pub struct Context(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    training: AtomicBool,
    rng: Mutex<Generator>,
}

impl Context {
    /// Training mode, with dropout drawing from a stream seeded by `seed`.
    pub fn new(seed: u64) -> Self {
        Context(Arc::new(Inner {
            training: AtomicBool::new(true),
            rng: Mutex::new(Generator::new(seed)),
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
}

impl Default for Context {
    fn default() -> Self {
        Context::new(0)
    }
}
