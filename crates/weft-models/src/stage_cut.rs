//! How a model's blocks are shared out among pipeline stages: consecutive runs of blocks, the
//! first stage also holding what comes before the blocks (embeddings), the last what comes after
//! them (final norm, output layer).

use std::ops::Range;

use weft_core::Result;

use crate::config_error;

/// How a model's blocks are shared out among pipeline stages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum StageCut {
    /// As equal a number of blocks per stage as they allow (earlier stages take the extra).
    #[default]
    Blocks,
    /// The contiguous cut whose largest stage holds the fewest parameters (what comes before
    /// the blocks counts on the first stage, what comes after on the last).
    Parameters,
    /// So many blocks per stage, in stage order.
    Given(Vec<usize>),
}

/// Parameter counts the [`StageCut::Parameters`] cut balances.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageWeights {
    /// Parameters of each block, in order.
    pub blocks: Vec<usize>,
    /// Parameters the first stage holds besides its blocks.
    pub first: usize,
    /// Parameters the last stage holds besides its blocks.
    pub last: usize,
}

impl StageCut {
    /// The blocks of each of `stages` stages of a model of `n` blocks (`weights` is asked for
    /// only by the parameter-balanced cut). Errors when there are more stages than blocks, or
    /// given block counts do not fit the model.
    pub fn ranges(&self, stages: usize, weights: impl FnOnce() -> StageWeights, n: usize) -> Result<Vec<Range<usize>>> {
        if stages == 0 || stages > n {
            return Err(config_error(
                "n_layer",
                format!("{n} blocks cannot make parallel.pp = {stages} pipeline stages (at most one stage per block)"),
            ));
        }
        let counts = match self {
            StageCut::Blocks => (0..stages).map(|s| n / stages + usize::from(s < n % stages)).collect(),
            StageCut::Parameters => balanced_by_parameters(&weights(), stages),
            StageCut::Given(counts) => {
                if counts.len() != stages || counts.iter().sum::<usize>() != n || counts.contains(&0) {
                    return Err(weft_core::Error::Invalid {
                        op: "model config",
                        msg: format!(
                            "parallel.stage_blocks: {counts:?} must give each of the {stages} stages at least one \
                             block, {n} in all"
                        ),
                    });
                }
                counts.clone()
            }
        };
        let mut out = Vec::with_capacity(stages);
        let mut start = 0;
        for len in counts {
            out.push(start..start + len);
            start += len;
        }
        Ok(out)
    }
}

/// Block counts per stage minimizing the largest stage's parameters.
fn balanced_by_parameters(w: &StageWeights, stages: usize) -> Vec<usize> {
    let n = w.blocks.len();
    let (block, first, last) = (&w.blocks, w.first, w.last);
    let mut prefix = vec![0usize; n + 1];
    for i in 0..n {
        prefix[i + 1] = prefix[i] + block[i];
    }
    // stage s covering blocks a..b
    let cost = |s: usize, a: usize, b: usize| {
        prefix[b] - prefix[a] + if s == 0 { first } else { 0 } + if s + 1 == stages { last } else { 0 }
    };
    // best[s][j]: the smallest largest stage when stages 0..=s cover blocks 0..j
    let mut best = vec![vec![usize::MAX; n + 1]; stages];
    let mut from = vec![vec![0usize; n + 1]; stages];
    for (j, b) in best[0].iter_mut().enumerate().skip(1) {
        *b = cost(0, 0, j);
    }
    for s in 1..stages {
        for j in s + 1..=n {
            for i in s..j {
                let c = best[s - 1][i].max(cost(s, i, j));
                if c < best[s][j] {
                    best[s][j] = c;
                    from[s][j] = i;
                }
            }
        }
    }
    let mut counts = vec![0; stages];
    let mut j = n;
    for s in (0..stages).rev() {
        let i = if s == 0 { 0 } else { from[s][j] };
        counts[s] = j - i;
        j = i;
    }
    counts
}
