//! State dicts: a module's parameters by PyTorch name, saved to and loaded from safetensors.

use std::collections::BTreeMap;
use std::path::Path;

use weft_core::io::safetensors;
use weft_core::{Error, Result, Tensor};

use crate::module::Module;

/// Copies `tensors` into `module`'s parameters by name. `aliases` lists `(alternative, canonical)`
/// names (for tied weights such as `lm_head.weight` = `transformer.wte.weight`): a file may hold
/// either name or both. Every parameter must be present with its exact shape; names the module
/// does not have are an error too. Values are cast to each parameter's dtype. `source` names the
/// origin (a path) in messages.
pub fn load_state_dict(
    module: &dyn Module,
    tensors: &BTreeMap<String, Tensor>,
    aliases: &[(&str, &str)],
    source: &str,
) -> Result<()> {
    load_state_dict_only(module, tensors, aliases, source, &|_| true)
}

/// [`load_state_dict`] for the parameters `only` accepts (those a pipeline stage trains, when
/// a checkpoint was read for that stage alone): the others need not be in `tensors` and are
/// left as they are.
pub fn load_state_dict_only(
    module: &dyn Module,
    tensors: &BTreeMap<String, Tensor>,
    aliases: &[(&str, &str)],
    source: &str,
    only: &dyn Fn(&str) -> bool,
) -> Result<()> {
    let params: Vec<(String, Tensor)> = module.parameters().into_iter().filter(|(n, _)| only(n)).collect();
    let all = module.parameters();
    let known: BTreeMap<&str, &Tensor> = all.iter().map(|(n, t)| (n.as_str(), t)).collect();
    for name in tensors.keys() {
        let canonical = aliases
            .iter()
            .find(|(alt, _)| alt == name)
            .map(|(_, c)| *c)
            .unwrap_or(name);
        if !known.contains_key(canonical) {
            return Err(Error::Io(format!(
                "{source}: unexpected tensor {name:?} (the model has no parameter of that name)"
            )));
        }
    }
    for (name, param) in &params {
        let alias = aliases.iter().find(|(_, c)| c == name).map(|(a, _)| *a);
        let src = tensors
            .get(name)
            .or_else(|| alias.and_then(|a| tensors.get(a)))
            .ok_or_else(|| Error::Io(format!("{source}: missing tensor {name:?}")))?;
        if src.shape() != param.shape() {
            return Err(Error::Io(format!(
                "{source}: tensor {name:?} has shape {:?}, the model expects {:?}",
                src.shape(),
                param.shape()
            )));
        }
        param.copy_from(src)?;
    }
    Ok(())
}

/// Loads a safetensors file into `module` (see [`load_state_dict`]).
pub fn load_file(module: &dyn Module, path: &Path, aliases: &[(&str, &str)]) -> Result<()> {
    let file = safetensors::load(path)?;
    load_state_dict(module, &file.tensors, aliases, &path.display().to_string())
}

/// Saves `module`'s parameters to a safetensors file under their PyTorch names, atomically.
/// `extra` adds more names for the same tensors (such as a tied `lm_head.weight`).
pub fn save_file(
    module: &dyn Module,
    path: &Path,
    extra: &[(&str, &str)],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let params = module.parameters();
    let mut named: Vec<(String, Tensor)> = params.clone();
    for (alt, canonical) in extra {
        if let Some((_, t)) = params.iter().find(|(n, _)| n == canonical) {
            named.push((alt.to_string(), t.clone()));
        }
    }
    safetensors::save(path, named.iter().map(|(n, t)| (n.as_str(), t)), metadata)
}
