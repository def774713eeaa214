//! What this rank owns of the model and optimizer state, for a sharded checkpoint: found from
//! the layout alone, without communication.
//!
//! A parameter is written by the pipeline stage that owns it (a tied weight by its first
//! stage); by every tensor-parallel rank when it is cut, else by tensor-parallel rank 0; under
//! ZeRO by every data-parallel rank (each its own flat run), else by data-parallel rank 0. Its
//! optimizer moments follow it piece for piece; its 0-d state (step counts) is written by the
//! one rank whose piece starts at element 0.

use std::collections::BTreeMap;

use super::whole::param_of;
use super::Trainer;
use crate::checkpoint::{Piece, Shard, TpPart};
use crate::error::Result;

/// Where this rank's piece of one parameter lies.
struct Owned {
    /// The whole parameter's shape.
    shape: Vec<usize>,
    tp: Option<TpPart>,
    offset: usize,
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
        let mut shard = Shard::default();
        let mut owned: BTreeMap<String, Owned> = BTreeMap::new();
        match self.zero() {
            Some(z) => {
                for (piece, values) in z.pieces().iter().zip(z.piece_values()?) {
                    if !writes(&piece.name)? {
                        continue;
                    }
                    let (shape, tp) = place(&piece.name, &piece.param_shape);
                    owned.insert(
                        piece.name.clone(),
                        Owned {
                            shape: shape.clone(),
                            tp: tp.clone(),
                            offset: piece.offset,
                        },
                    );
                    shard.model.push(Piece {
                        name: piece.name.clone(),
                        shape,
                        tp,
                        offset: piece.offset,
                        tensor: values,
                    });
                }
            }
            None if self.rank_and_size().0 == 0 => {
                for (name, p) in &self.params {
                    if !writes(name)? {
                        continue;
                    }
                    let (shape, tp) = place(name, p.shape());
                    owned.insert(
                        name.clone(),
                        Owned {
                            shape: shape.clone(),
                            tp: tp.clone(),
                            offset: 0,
                        },
                    );
                    shard.model.push(Piece {
                        name: name.clone(),
                        shape,
                        tp,
                        offset: 0,
                        // the next steps change the parameters in place
                        tensor: p.detach().contiguous_copy()?,
                    });
                }
            }
            None => {}
        }
        // the optimizer's state is a copy already
        for (key, t) in self.optimizer.state() {
            let Some(o) = owned.get(param_of(&key)) else {
                continue;
            };
            let piece = if t.rank() == 0 {
                // one rank of the tensor-parallel group and of the ZeRO shards writes it
                if o.offset != 0 || o.tp.as_ref().is_some_and(|t| t.rank != 0) {
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
                    shape: o.shape.clone(),
                    tp: o.tp.clone(),
                    offset: o.offset,
                    tensor: t,
                }
            };
            shard.optimizer.push(piece);
        }
        Ok(shard)
    }
}
