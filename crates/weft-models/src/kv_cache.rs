//! Generation with a key/value cache: each sequence keeps the keys and values its past tokens
//! made at every layer, so a new token costs one row through the model instead of the whole
//! context again. Several sequences of different lengths run in one call (continuous batching):
//! their new tokens are stacked into one row block, so every projection and MLP is one matrix
//! product for all of them, and only attention runs per sequence, against its own cache.

use weft_core::{DType, Result, Tensor};

use crate::sampling::invalid;

/// Keys and values of one sequence's cached positions, per layer.
#[derive(Debug)]
pub struct KvCache {
    /// Per layer: keys and values `[heads, capacity, head_dim]` each (key/value heads for
    /// grouped-query attention); positions `0..len` hold data. `None` until the first token.
    layers: Vec<Option<(Tensor, Tensor)>>,
    /// Positions cached (the same at every layer between calls).
    len: usize,
    /// The most positions the model takes (its `block_size`).
    max_len: usize,
}

impl KvCache {
    /// An empty cache for a model of `n_layer` layers taking at most `max_len` positions.
    pub fn new(n_layer: usize, max_len: usize) -> Self {
        KvCache {
            layers: vec![None; n_layer],
            len: 0,
            max_len,
        }
    }

    /// Positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No position cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions that can still be added before the model's `block_size` is reached.
    pub fn room(&self) -> usize {
        self.max_len - self.len
    }

    /// Forgets every position (the buffers stay for reuse).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// A copy of this cache that shares no buffer with it: the same positions, keys and values,
    /// for a sequence that goes on from the same tokens (several completions of one prompt,
    /// which runs once). The cache is not `Clone`: tensors share their storage when cloned, so a
    /// clone would write the same positions as its original.
    pub fn fork(&self) -> Result<KvCache> {
        let layers = self
            .layers
            .iter()
            .map(|slot| {
                slot.as_ref()
                    .map(|(k, v)| -> Result<(Tensor, Tensor)> {
                        let copy = |z: &Tensor| -> Result<Tensor> {
                            let fresh = Tensor::zeros_on(z.shape(), z.dtype(), z.device())?;
                            if self.len > 0 {
                                fresh.narrow(1, 0, self.len)?.copy_from(&z.narrow(1, 0, self.len)?)?;
                            }
                            Ok(fresh)
                        };
                        Ok((copy(k)?, copy(v)?))
                    })
                    .transpose()
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(KvCache {
            layers,
            len: self.len,
            max_len: self.max_len,
        })
    }

    /// Bytes the buffers hold (allocated capacity, not only the used positions).
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|(k, v)| (k.numel() + v.numel()) * k.dtype().size_in_bytes())
            .sum()
    }

    /// Writes layer `layer`'s keys and values of `t` new positions, `k`, `v` `[heads, t, hd]`,
    /// after the cached ones and returns views of all of them, `[heads, len + t, hd]`. The
    /// buffers grow by doubling (at most to `max_len` positions). The cache's length moves on at
    /// [`KvCache::advance`], once every layer has been written.
    pub(crate) fn append(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let (heads, t, hd) = (k.dim(0)?, k.dim(1)?, k.dim(2)?);
        let need = self.len + t;
        if need > self.max_len {
            return Err(invalid(format!(
                "{need} positions do not fit in the cache of a model with block_size {}",
                self.max_len
            )));
        }
        let n_layer = self.layers.len();
        let slot = self
            .layers
            .get_mut(layer)
            .ok_or_else(|| invalid(format!("layer {layer} is not in a cache of {n_layer} layers")))?;
        let capacity = slot.as_ref().map_or(0, |(kb, _)| kb.shape()[1]);
        if capacity < need {
            let grown = need.next_power_of_two().max(16).min(self.max_len);
            let fresh = || Tensor::zeros_on(&[heads, grown, hd], k.dtype(), k.device());
            let (kb, vb) = (fresh()?, fresh()?);
            if let Some((old_k, old_v)) = slot.as_ref() {
                if self.len > 0 {
                    kb.narrow(1, 0, self.len)?.copy_from(&old_k.narrow(1, 0, self.len)?)?;
                    vb.narrow(1, 0, self.len)?.copy_from(&old_v.narrow(1, 0, self.len)?)?;
                }
            }
            *slot = Some((kb, vb));
        }
        let (kb, vb) = slot.as_ref().expect("allocated above");
        kb.narrow(1, self.len, t)?.copy_from(k)?;
        vb.narrow(1, self.len, t)?.copy_from(v)?;
        Ok((kb.narrow(1, 0, need)?, vb.narrow(1, 0, need)?))
    }

    /// Moves the length on by `t` positions, after all layers have appended them.
    pub(crate) fn advance(&mut self, t: usize) {
        self.len += t;
    }
}

/// One sequence's part of a cached forward: its new token ids and its cache.
#[derive(Debug)]
pub struct CachedTokens<'a> {
    /// Ids to run, in order, after the cached positions (at least one).
    pub tokens: &'a [i64],
    /// The sequence's cache; it gains `tokens.len()` positions.
    pub cache: &'a mut KvCache,
}

/// Checks the sequences of a cached forward for a model of `vocab_size` tokens and `n_layer`
/// layers (`op` names the model): each has new tokens, fits in its cache, and every id is in the
/// vocabulary. Returns the ids of all sequences stacked, I64 `[1, N]`, and the position of each
/// id (its sequence's cached length plus its index), I64 `[N]`.
pub(crate) fn stacked_ids(
    op: &'static str,
    seqs: &[CachedTokens],
    vocab_size: usize,
    n_layer: usize,
) -> Result<(Tensor, Tensor)> {
    if seqs.is_empty() {
        return Err(invalid(format!("{op}: a cached forward needs at least one sequence")));
    }
    let mut ids = Vec::new();
    let mut pos = Vec::new();
    for (s, seq) in seqs.iter().enumerate() {
        if seq.tokens.is_empty() {
            return Err(invalid(format!("{op}: sequence {s} has no new tokens")));
        }
        if seq.cache.layers.len() != n_layer {
            return Err(invalid(format!(
                "{op}: sequence {s}'s cache has {} layers, the model {n_layer}",
                seq.cache.layers.len()
            )));
        }
        if seq.tokens.len() > seq.cache.room() {
            return Err(invalid(format!(
                "{op}: sequence {s}: {} cached + {} new positions exceed block_size {}",
                seq.cache.len,
                seq.tokens.len(),
                seq.cache.max_len
            )));
        }
        if let Some(&bad) = seq.tokens.iter().find(|&&t| t < 0 || t as usize >= vocab_size) {
            return Err(invalid(format!(
                "{op}: sequence {s}: token id {bad} is outside the vocabulary (vocab_size = {vocab_size})"
            )));
        }
        ids.extend_from_slice(seq.tokens);
        pos.extend((seq.cache.len..seq.cache.len + seq.tokens.len()).map(|p| p as i64));
    }
    let n = ids.len();
    Ok((Tensor::from_vec(ids, &[1, n])?, Tensor::from_vec(pos, &[n])?))
}

/// Causal attention of one sequence's `t` new queries against its cached and new keys:
/// `q` `[heads, t, hd]`, `k`, `v` `[kv_heads, t, hd]` (appended to `cache` at `layer`; each
/// key/value head serves `heads / kv_heads` query heads) -> `[t, heads * hd]`, scaled by
/// `1/sqrt(hd)`, query `i` (position `len + i`) seeing keys `0..=len + i`.
pub(crate) fn attend(q: &Tensor, k: &Tensor, v: &Tensor, cache: &mut KvCache, layer: usize) -> Result<Tensor> {
    let before = cache.len;
    let (heads, t, hd) = (q.dim(0)?, q.dim(1)?, q.dim(2)?);
    let (k, v) = cache.append(layer, k, v)?;
    let (kv_heads, s) = (k.dim(0)?, k.dim(1)?);
    let y = if before == 0 || t == 1 {
        // the whole prompt (t == s, causal) or one new token (it sees every key); the key/value
        // heads read in place by their query heads
        Tensor::grouped_query_attention(q, &k, &v, before == 0 && t > 1, None)?
    } else {
        let (k, v) = if kv_heads == heads {
            (k, v)
        } else {
            let rep = |z: Tensor| -> Result<Tensor> {
                z.view(&[kv_heads, 1, s, hd])?
                    .expand(&[kv_heads, heads / kv_heads, s, hd])?
                    .reshape(&[heads as isize, s as isize, hd as isize])
            };
            (rep(k)?, rep(v)?)
        };
        // new tokens after cached ones: query i sees keys 0..=before + i
        let scores = q.matmul(&k.t()?)?.mul_scalar(1.0 / (hd as f64).sqrt())?;
        let j = Tensor::arange(0.0, s as f64, 1.0, DType::F64)?;
        let i = Tensor::arange(before as f64, (before + t) as f64, 1.0, DType::F64)?;
        let mask = j.view(&[1, s])?.gt(&i.view(&[t, 1])?)?.to(q.device())?;
        scores.masked_fill(&mask, f64::NEG_INFINITY)?.softmax(-1)?.matmul(&v)?
    };
    y.transpose(0, 1)?.reshape(&[t as isize, (heads * hd) as isize])
}

/// The rows of `x` `[1, N, C]` that hold each sequence's last new token: `[S, C]`.
pub(crate) fn last_rows(x: &Tensor, seqs: &[CachedTokens]) -> Result<Tensor> {
    let mut end = 0i64;
    let rows: Vec<i64> = seqs
        .iter()
        .map(|s| {
            end += s.tokens.len() as i64;
            end - 1
        })
        .collect();
    let n = rows.len();
    let index = Tensor::from_vec(rows, &[n])?.to(x.device())?;
    x.reshape(&[x.dim(1)? as isize, x.dim(2)? as isize])?
        .index_select(0, &index)
}

/// Runs `per_seq` on each sequence's rows of the stacked new tokens and stacks the results
/// again: `per_seq(s, start, t)` gets sequence `s`'s first row `start` and count `t` and returns
/// `[t, C']`; the result is `[1, N, C']`.
pub(crate) fn per_sequence(
    seqs: &mut [CachedTokens],
    mut per_seq: impl FnMut(&mut CachedTokens, usize, usize) -> Result<Tensor>,
) -> Result<Tensor> {
    let mut parts = Vec::with_capacity(seqs.len());
    let mut start = 0;
    for seq in seqs.iter_mut() {
        let t = seq.tokens.len();
        parts.push(per_seq(seq, start, t)?);
        start += t;
    }
    let refs: Vec<&Tensor> = parts.iter().collect();
    let y = if refs.len() == 1 {
        parts[0].clone()
    } else {
        Tensor::cat(&refs, 0)?
    };
    y.unsqueeze(0)
}

/// Moves every sequence's cache on past its new tokens (after the last layer).
pub(crate) fn advance_all(seqs: &mut [CachedTokens]) {
    for s in seqs.iter_mut() {
        let t = s.tokens.len();
        s.cache.advance(t);
    }
}
