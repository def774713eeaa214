//! Optimizer state between its sharded form (each rank keeps the state of its own spans, keyed
//! `"{param}.{field}"` with 1-D moments of the span's length) and the whole form a
//! single-process optimizer keeps (moments of the parameter's shape), which checkpoints store.

use std::collections::BTreeMap;

use weft_core::Tensor;

use super::engine::Engine;
use super::units::Span;
use crate::error::{Error, Result};
use crate::reduce::ReduceOp;

/// Splits `"{param}.{field}"` where `param` is one of `names`.
fn split_key<'a>(key: &'a str, engine: &Engine) -> Option<(usize, &'a str)> {
    let (param, field) = key.rsplit_once('.')?;
    engine.params.iter().position(|(n, _)| n == param).map(|i| (i, field))
}

/// Collective: every rank's sharded `state` becomes the whole state of every parameter (on
/// every rank). Fields of rank 0 (step counts) are taken from any rank that has them; 1-D
/// fields are moments, gathered like the parameters. Every rank must keep the same fields.
pub(crate) fn consolidate(engine: &Engine, state: Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>> {
    let mut by_param: Vec<BTreeMap<String, Tensor>> = vec![BTreeMap::new(); engine.params.len()];
    let mut moments = std::collections::BTreeSet::new();
    let mut scalars = std::collections::BTreeSet::new();
    for (key, t) in state {
        let (i, field) = split_key(&key, engine)
            .ok_or_else(|| Error::Invalid(format!("zero: optimizer state {key:?} names no parameter")))?;
        let t = if t.rank() == 0 {
            scalars.insert(field.to_string());
            t
        } else {
            moments.insert(field.to_string());
            // moments are gathered in their parameter's dtype
            t.cast(engine.params[i].1.dtype())?
        };
        by_param[i].insert(field.to_string(), t);
    }
    agree_on_fields(engine, &moments, &scalars)?;
    let ranks = engine.pg.size();
    let mut out = Vec::new();
    for (u, unit) in engine.units.iter().enumerate() {
        for field in &moments {
            let shard = Tensor::zeros(&[unit.shard], unit.dtype)?;
            // a moment covers exactly its span: read it from element 0
            let spans: Vec<Span> = engine.spans[u].iter().map(|s| Span { lo: 0, ..s.clone() }).collect();
            let missing = spans.iter().find(|s| !by_param[s.param].contains_key(field));
            if let Some(s) = missing {
                return Err(Error::Invalid(format!(
                    "zero: rank {} has no optimizer state \"{}.{field}\"",
                    engine.pg.rank(),
                    engine.params[s.param].0
                )));
            }
            super::units::copy_into_shard(&spans, &shard, |i| by_param[i][field].clone())?;
            let flat = Tensor::zeros(&[unit.padded(ranks)], unit.dtype)?;
            engine.pg.all_gather(&flat, &shard)?.wait()?;
            for (&i, &off) in unit.members.iter().zip(&unit.offsets) {
                let p = &engine.params[i].1;
                let whole = flat.narrow(0, off, p.numel())?.contiguous_copy()?.view(p.shape())?;
                out.push((format!("{}.{field}", engine.params[i].0), whole));
            }
        }
    }
    for field in &scalars {
        let values: Vec<f64> = by_param
            .iter()
            .map(|m| m.get(field).map_or(f64::NEG_INFINITY, |t| t.to_vec_f64()[0]))
            .collect();
        let n = values.len();
        let t = Tensor::from_vec(values, &[n])?;
        engine.pg.all_reduce(&t, ReduceOp::Max)?.wait()?;
        for (i, v) in t.to_vec::<f64>()?.into_iter().enumerate() {
            if v.is_finite() {
                out.push((format!("{}.{field}", engine.params[i].0), Tensor::scalar(v)));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// Every rank must keep the same fields, or the gathers would not pair up.
fn agree_on_fields(
    engine: &Engine,
    moments: &std::collections::BTreeSet<String>,
    scalars: &std::collections::BTreeSet<String>,
) -> Result<()> {
    let desc = format!("{moments:?}/{scalars:?}");
    // FNV-1a, cut to 52 bits so that it survives a trip through f64
    let hash = desc.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    }) & ((1 << 52) - 1);
    let t = Tensor::from_vec(vec![hash as f64, -(hash as f64)], &[2])?;
    engine.pg.all_reduce(&t, ReduceOp::Max)?.wait()?;
    let v = t.to_vec::<f64>()?;
    if v[0] != -v[1] {
        return Err(Error::Invalid(format!(
            "zero: rank {} keeps optimizer state fields {desc}, and another rank keeps different ones",
            engine.pg.rank()
        )));
    }
    Ok(())
}

/// This rank's share of a whole optimizer `state` (as [`consolidate`] returns it, or as a
/// single-process run saved it): moments cut to this rank's spans, step counts copied. Keys of
/// parameters this rank holds no span of are dropped. Errors: a key that names no parameter,
/// or a moment whose size is not its parameter's.
pub(crate) fn shard(engine: &Engine, state: &BTreeMap<String, Tensor>) -> Result<BTreeMap<String, Tensor>> {
    let mut spans_of: Vec<Option<&Span>> = vec![None; engine.params.len()];
    for s in engine.spans.iter().flatten() {
        spans_of[s.param] = Some(s);
    }
    let mut out = BTreeMap::new();
    for (key, t) in state {
        let (i, _) = split_key(key, engine)
            .ok_or_else(|| Error::Invalid(format!("optimizer state {key:?} names no parameter of the model")))?;
        let Some(span) = spans_of[i] else { continue };
        let piece = if t.rank() == 0 {
            t.contiguous_copy()?
        } else {
            let p = &engine.params[i].1;
            if t.numel() != p.numel() {
                return Err(Error::Invalid(format!(
                    "optimizer state {key:?} has shape {:?}, but parameter {:?} has shape {:?}",
                    t.shape(),
                    engine.params[i].0,
                    p.shape()
                )));
            }
            t.contiguous_copy()?
                .reshape(&[-1])?
                .narrow(0, span.lo, span.len)?
                .contiguous_copy()?
        };
        out.insert(key.clone(), piece);
    }
    Ok(out)
}
