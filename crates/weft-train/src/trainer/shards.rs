//! What this rank owns of the model and optimizer state, for a sharded checkpoint: found from
//! the layout alone, without communication.
//!
//! A parameter is written by the pipeline stage that owns it (a tied weight by its first
//! stage); by every tensor-parallel rank when it is cut, else by tensor-parallel rank 0; under
//! ZeRO by every data-parallel rank (each its own flat run), else by data-parallel rank 0. Its
//! optimizer moments follow it piece for piece; its 0-d state (step counts) is written by the
//! one rank whose piece starts at element 0.

use std::collections::BTreeMap;

use weft_core::Tensor;

use super::whole::param_of;
use super::Trainer;
use crate::checkpoint::{Piece, Shard, TpPart};
use crate::error::Result;

/// A run of one parameter's elements this rank holds.
struct Held {
    name: String,
    /// The parameter's shape on this rank (its tensor-parallel part).
    local: Vec<usize>,
    /// Its first element, in the row-major numbering of `local`.
    offset: usize,
    values: Tensor,
}

impl Trainer {
    /// This rank's share of the checkpoint: copies of the pieces it owns (see the module docs).
    pub(super) fn local_shard(&self) -> Result<Shard> {
        let tp = self.tensor_parallel.as_ref();
        let tp_rank = tp.map_or(0, |t| t.group.rank());
        // the whole shape and tensor-parallel part of this rank's (local) parameter `name`
        let place = |name: &str, local: &[usize]| -> (Vec<usize>, Option<TpPart>) {
            match tp.and_then(|t| t.splits.get(name).map(|s| (t, s))) {
                Some((t, s)) => {
                    let mut shape = local.to_vec();
                    shape[s.dim] = s.len;
                    let part = TpPart {
                        dim: s.dim,
                        blocks: s.blocks,
                        rank: t.group.rank(),
                        ranks: t.group.size(),
                    };
                    (shape, Some(part))
                }
                None => (local.to_vec(), None),
            }
        };
        let writes = |name: &str| -> Result<bool> {
            let stage = match &self.pipeline {
                Some(pp) => pp.owner(name)? == pp.stage(),
                None => true,
            };
            let cut = tp.is_some_and(|t| t.splits.contains_key(name));
            Ok(stage && (cut || tp_rank == 0))
        };
        // what this rank holds of each parameter; ZeRO's values are copies already, the
        // parameters are copied below (the next steps change them in place)
        let (held, copy): (Vec<Held>, bool) = match self.zero() {
            Some(z) => {
                let pieces = z.pieces().iter().zip(z.piece_values()?);
                let held = pieces.map(|(p, values)| Held {
                    name: p.name.clone(),
                    local: p.param_shape.clone(),
                    offset: p.offset,
                    values,
                });
                (held.collect(), false)
            }
            None if self.rank_and_size().0 == 0 => {
                let held = self.params.iter().map(|(name, p)| Held {
                    name: name.clone(),
                    local: p.shape().to_vec(),
                    offset: 0,
                    values: p.detach(),
                });
                (held.collect(), true)
            }
            None => (Vec::new(), false),
        };
        let mut shard = Shard::default();
        for h in held {
            if !writes(&h.name)? {
                continue;
            }
            let (shape, tp) = place(&h.name, &h.local);
            let tensor = if copy { h.values.contiguous_copy()? } else { h.values };
            shard.model.push(Piece {
                name: h.name,
                shape,
                tp,
                offset: h.offset,
                tensor,
            });
        }
        // the optimizer's state (a copy already) goes with its parameter's pieces
        let owned: BTreeMap<&str, &Piece> = shard.model.iter().map(|p| (p.name.as_str(), p)).collect();
        let mut optimizer = Vec::new();
        for (key, t) in self.optimizer.state() {
            let Some(p) = owned.get(param_of(&key)) else {
                continue;
            };
            let piece = if t.rank() == 0 {
                // one rank of the tensor-parallel group and of the ZeRO shards writes it
                if p.offset != 0 || p.tp.as_ref().is_some_and(|t| t.rank != 0) {
                    continue;
                }
                Piece {
                    name: key,
                    shape: Vec::new(),
                    tp: None,
                    offset: 0,
                    tensor: t,
                }
            } else {
                Piece {
                    name: key,
                    shape: p.shape.clone(),
                    tp: p.tp.clone(),
                    offset: p.offset,
                    tensor: t,
                }
            };
            optimizer.push(piece);
        }
        shard.optimizer = optimizer;
        Ok(shard)
    }
}
