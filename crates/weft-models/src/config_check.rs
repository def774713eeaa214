//! Checks the language models' configs share: positive sizes, one size dividing another, and a
//! state dict's numbered blocks against `n_layer`. Every error names the config key.

use std::collections::BTreeMap;

use weft_core::Result;

use crate::config_error;

/// The first of `sizes` (`(key, value)`) that is 0 is an error naming its key.
pub(crate) fn positive(sizes: &[(&str, usize)]) -> Result<()> {
    match sizes.iter().find(|(_, v)| *v == 0) {
        Some((key, _)) => Err(config_error(key, "must be positive")),
        None => Ok(()),
    }
}

/// `key = value` must divide by `by_key = by` (`by > 0`).
pub(crate) fn divides(key: &str, value: usize, by_key: &str, by: usize) -> Result<()> {
    if value.is_multiple_of(by) {
        Ok(())
    } else {
        Err(config_error(key, format!("{value} does not divide by {by_key} = {by}")))
    }
}

/// The blocks a state dict holds (names `{prefix}{i}.*`, e.g. `transformer.h.` or
/// `model.layers.`) must be exactly `0..n_layer`: the first one missing, or the first one past
/// `n_layer` (with one of its tensors and its shape), is an error naming `n_layer`. `unit` is
/// what a block is called (`block`, `layer`).
pub(crate) fn numbered_blocks(
    shapes: &BTreeMap<String, Vec<usize>>,
    prefix: &str,
    unit: &str,
    n_layer: usize,
) -> Result<()> {
    let mut held: Vec<usize> = shapes.keys().filter_map(|n| block_index(n, prefix)).collect();
    held.sort_unstable();
    held.dedup();
    let count = match held.len() {
        1 => format!("1 {unit}"),
        n => format!("{n} {unit}s"),
    };
    if let Some(missing) = (0..n_layer.min(held.len() + 1)).find(|i| held.binary_search(i).is_err()) {
        return Err(config_error(
            "n_layer",
            format!(
                "{n_layer} needs {unit}s 0 to {}, but the state dict has no {prefix}{missing}.* (it holds {count})",
                n_layer.saturating_sub(1)
            ),
        ));
    }
    if let Some(&extra) = held.iter().find(|&&b| b >= n_layer) {
        let first = format!("{prefix}{extra}.");
        if let Some((name, shape)) = shapes.iter().find(|(n, _)| n.starts_with(&first)) {
            return Err(config_error(
                "n_layer",
                format!("{n_layer}, but the state dict holds {name} of shape {shape:?} (it holds {count})"),
            ));
        }
    }
    Ok(())
}

/// The block number `i` of a parameter named `{prefix}{i}.…` (`transformer.h.3.attn…` with
/// prefix `transformer.h.`), `None` for a name outside the blocks.
pub(crate) fn block_index(name: &str, prefix: &str) -> Option<usize> {
    name.strip_prefix(prefix)?.split('.').next()?.parse().ok()
}

/// One dimension of a parameter's expected shape, for [`check_layout`].
pub(crate) struct ExpectedDim {
    /// The config key it comes from (named when the shapes disagree).
    pub key: &'static str,
    /// How messages write it (`n_embd`, `3 n_embd`).
    pub symbol: String,
    pub size: usize,
    /// The key's value in the config.
    pub value: usize,
}

/// Checks that `shapes` (a state dict's, by name) holds every parameter of `layout` with its
/// expected shape. The error names the parameter missing, or the config key of the first
/// dimension that disagrees (the first dimension's when the ranks differ).
pub(crate) fn check_layout(
    shapes: &BTreeMap<String, Vec<usize>>,
    layout: Vec<(String, Vec<ExpectedDim>)>,
) -> Result<()> {
    for (name, dims) in layout {
        let want: Vec<usize> = dims.iter().map(|d| d.size).collect();
        let symbols: Vec<&str> = dims.iter().map(|d| d.symbol.as_str()).collect();
        let symbolic = format!("[{}]", symbols.join(", "));
        let Some(have) = shapes.get(&name) else {
            return Err(weft_core::Error::Invalid {
                op: "model config",
                msg: format!("the state dict has no {name} (of shape {symbolic} = {want:?})"),
            });
        };
        let culprit = if have.len() != dims.len() {
            dims.first()
        } else {
            dims.iter().zip(have).find(|(d, h)| **h != d.size).map(|(d, _)| d)
        };
        if let Some(d) = culprit {
            return Err(config_error(
                d.key,
                format!("{}, but {name} has shape {have:?}, not {symbolic} = {want:?}", d.value),
            ));
        }
    }
    Ok(())
}
