//! Random search: each parameter uniform on its internal scale (log-uniform for `log_uniform`,
//! every integer equally likely for `int_uniform`, every listed value equally likely).

use super::{Observation, Sampler};
use crate::rng::Rng;
use crate::space::{Param, Space, Value};

/// Independent uniform draws, seeded per trial.
#[derive(Debug, Clone)]
pub struct Random {
    seed: u64,
}

impl Random {
    pub fn new(seed: u64) -> Random {
        Random { seed }
    }
}

/// One uniform draw of `param`.
pub(crate) fn draw(param: &Param, rng: &mut Rng) -> Value {
    let (lo, hi) = param.bounds();
    param.from_internal(rng.range(lo, hi))
}

impl Sampler for Random {
    fn suggest(&mut self, trial: u64, space: &Space, _history: &[Observation]) -> Option<Vec<Value>> {
        let mut rng = Rng::stream(self.seed, trial);
        Some(space.params.iter().map(|p| draw(p, &mut rng)).collect())
    }
}
