//! The ranks of a job as a `pp × dp × tp` grid (tensor parallelism innermost, so that the ranks
//! of one tensor-parallel group are neighbours and share a host; then data parallelism; pipeline
//! stages outermost, as Megatron-LM orders them), with the process groups along each axis.
//!
//! Rank `r` sits at `tp_rank = r mod tp`, `dp_rank = (r / tp) mod dp`, `pp_rank = r / (tp·dp)`.

use crate::error::{Error, Result};
use crate::group::ProcessGroup;

/// This rank's place in the grid and its groups along each axis (a group of one rank where an
/// axis has size 1).
pub struct DeviceMesh {
    pub dp: usize,
    pub tp: usize,
    pub pp: usize,
    pub world: ProcessGroup,
    /// The ranks that differ from this one only in their data-parallel index.
    pub dp_group: ProcessGroup,
    /// The ranks that differ only in their tensor-parallel index.
    pub tp_group: ProcessGroup,
    /// The ranks that differ only in their pipeline stage.
    pub pp_group: ProcessGroup,
    /// With several stages, on the first and the last stage: the two ranks of this (dp, tp)
    /// position on those stages (weights tied across them, such as a gpt's token embedding and
    /// output layer, sum their gradients over it). `None` elsewhere.
    pub ends_group: Option<ProcessGroup>,
}

impl DeviceMesh {
    /// Builds the groups. Every rank of `world` must call this with the same sizes (the groups
    /// are created in the same order everywhere). Errors when `dp · tp · pp` is not the world
    /// size, or a size is 0.
    pub fn new(world: &ProcessGroup, dp: usize, tp: usize, pp: usize) -> Result<DeviceMesh> {
        let n = world.size();
        if dp == 0 || tp == 0 || pp == 0 || dp * tp * pp != n {
            return Err(Error::Invalid(format!(
                "device mesh: dp x tp x pp = {dp} x {tp} x {pp} = {}, but the group has {n} ranks",
                dp * tp * pp
            )));
        }
        let rank = |p: usize, d: usize, t: usize| (p * dp + d) * tp + t;
        let mine = |lists: Vec<Vec<usize>>| -> Result<ProcessGroup> {
            let mut found = None;
            for ranks in lists {
                let global: Vec<usize> = ranks.iter().map(|&r| world.ranks()[r]).collect();
                if let Some(g) = world.new_group(&global)? {
                    found = Some(g);
                }
            }
            found.ok_or_else(|| Error::Invalid("device mesh: this rank is in no group of an axis".into()))
        };
        let tp_group = mine(
            (0..pp)
                .flat_map(|p| (0..dp).map(move |d| (0..tp).map(|t| rank(p, d, t)).collect()))
                .collect(),
        )?;
        let dp_group = mine(
            (0..pp)
                .flat_map(|p| (0..tp).map(move |t| (0..dp).map(|d| rank(p, d, t)).collect()))
                .collect(),
        )?;
        let pp_group = mine(
            (0..dp)
                .flat_map(|d| (0..tp).map(move |t| (0..pp).map(|p| rank(p, d, t)).collect()))
                .collect(),
        )?;
        let mut ends_group = None;
        if pp > 1 {
            for d in 0..dp {
                for t in 0..tp {
                    let global = [world.ranks()[rank(0, d, t)], world.ranks()[rank(pp - 1, d, t)]];
                    if let Some(g) = world.new_group(&global)? {
                        ends_group = Some(g);
                    }
                }
            }
        }
        Ok(DeviceMesh {
            ends_group,
            dp,
            tp,
            pp,
            world: world.clone(),
            dp_group,
            tp_group,
            pp_group,
        })
    }

    /// This rank's (dp, tp, pp) indices.
    pub fn coords(&self) -> (usize, usize, usize) {
        (self.dp_group.rank(), self.tp_group.rank(), self.pp_group.rank())
    }
}
