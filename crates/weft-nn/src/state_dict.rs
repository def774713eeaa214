//! State dicts: a module's parameters by PyTorch name, saved to and loaded from safetensors.

use std::collections::BTreeMap;
use std::path::Path;

use weft_core::io::safetensors;
use weft_core::{Error, Result, Tensor};

use crate::module::Module;

/// Where a state dict's tensors come from: a map held in memory, or a safetensors file read a
/// tensor at a time (so that names and shapes are checked before any tensor's bytes are read,
/// and a load holds one tensor beside the model, not the whole file).
pub trait TensorSource {
    /// Every tensor name.
    fn names(&self) -> Vec<&str>;
    /// Tensor `name`'s shape; `None` when there is no such tensor.
    fn shape(&self, name: &str) -> Option<Vec<usize>>;
    /// Tensor `name`, read.
    fn read(&self, name: &str) -> Result<Tensor>;
}

impl TensorSource for BTreeMap<String, Tensor> {
    fn names(&self) -> Vec<&str> {
        self.keys().map(String::as_str).collect()
    }
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.get(name).map(|t| t.shape().to_vec())
    }
    fn read(&self, name: &str) -> Result<Tensor> {
        self.get(name)
            .cloned()
            .ok_or_else(|| Error::Io(format!("no tensor {name:?}")))
    }
}

impl TensorSource for safetensors::SafeTensorsFile {
    fn names(&self) -> Vec<&str> {
        safetensors::SafeTensorsFile::names(self).collect()
    }
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.entry(name).map(|e| e.shape.clone())
    }
    fn read(&self, name: &str) -> Result<Tensor> {
        self.tensor(name)
    }
}

/// Copies `tensors` into `module`'s parameters by name. `aliases` lists `(alternative, canonical)`
/// names (for tied weights such as `lm_head.weight` = `transformer.wte.weight`): a file may hold
/// either name or both. Every parameter must be present with its exact shape; names the module
/// does not have are an error too. Values are cast to each parameter's dtype. `source` names the
/// origin (a path) in messages.
pub fn load_state_dict(
    module: &dyn Module,
    tensors: &dyn TensorSource,
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
    tensors: &dyn TensorSource,
    aliases: &[(&str, &str)],
    source: &str,
    only: &dyn Fn(&str) -> bool,
) -> Result<()> {
    let params: Vec<(String, Tensor)> = module.parameters().into_iter().filter(|(n, _)| only(n)).collect();
    let all = module.parameters();
    let known: BTreeMap<&str, &Tensor> = all.iter().map(|(n, t)| (n.as_str(), t)).collect();
    for name in tensors.names() {
        let canonical = aliases
            .iter()
            .find(|(alt, _)| *alt == name)
            .map(|(_, c)| *c)
            .unwrap_or(name);
        if !known.contains_key(canonical) {
            return Err(Error::Io(format!(
                "{source}: unexpected tensor {name:?} (the model has no parameter of that name)"
            )));
        }
    }
    // every name and shape before any tensor is read
    let mut sources = Vec::with_capacity(params.len());
    for (name, param) in &params {
        let alias = aliases.iter().find(|(_, c)| c == name).map(|(a, _)| *a);
        let (from, shape) = match (tensors.shape(name), alias.and_then(|a| tensors.shape(a))) {
            (Some(shape), _) => (name.as_str(), shape),
            (None, Some(shape)) => (alias.unwrap_or(name), shape),
            (None, None) => return Err(Error::Io(format!("{source}: missing tensor {name:?}"))),
        };
        if shape != param.shape() {
            return Err(Error::Io(format!(
                "{source}: tensor {from:?} has shape {shape:?}, the model expects {:?}",
                param.shape()
            )));
        }
        sources.push((
            name,
            param,
            from,
            alias.filter(|a| tensors.shape(a).is_some() && from == name.as_str()),
        ));
    }
    for (name, param, from, both) in sources {
        let src = tensors.read(from).map_err(|e| named(source, e))?;
        // both names: one tensor twice, or the file disagrees with itself (a tied head whose
        // second copy was changed loaded without a word, the changed copy unread)
        if let Some(a) = both {
            let other = tensors.read(a).map_err(|e| named(source, e))?;
            if !same_values(&src, &other)? {
                return Err(Error::Io(format!(
                    "{source}: tensors {name:?} and {a:?} are one tied weight of the model, but the file holds \
                     different values for them"
                )));
            }
        }
        param.copy_from(&src)?;
    }
    Ok(())
}

/// `e` naming `source` when it does not already (a file's own errors name its path).
fn named(source: &str, e: Error) -> Error {
    let text = e.to_string();
    if text.contains(source) {
        e
    } else {
        Error::Io(format!("{source}: {text}"))
    }
}

/// Whether `a` and `b` have one shape and the same values (bit for bit as f64), compared about
/// a million values at a time.
fn same_values(a: &Tensor, b: &Tensor) -> Result<bool> {
    if a.shape() != b.shape() {
        return Ok(false);
    }
    let same = |x: &Tensor, y: &Tensor| {
        let (x, y) = (x.to_vec_f64(), y.to_vec_f64());
        x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits())
    };
    let rows = match a.shape().first() {
        Some(&r) if r > 0 => r,
        _ => return Ok(same(a, b)),
    };
    let per = ((1usize << 20) / (a.numel() / rows).max(1)).max(1);
    let mut start = 0;
    while start < rows {
        let n = per.min(rows - start);
        if !same(&a.narrow(0, start, n)?, &b.narrow(0, start, n)?) {
            return Ok(false);
        }
        start += n;
    }
    Ok(true)
}

/// Loads a safetensors file into `module` (see [`load_state_dict`]).
pub fn load_file(module: &dyn Module, path: &Path, aliases: &[(&str, &str)]) -> Result<()> {
    let file = safetensors::SafeTensorsFile::open(path)?;
    load_state_dict(module, &file, aliases, &path.display().to_string())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::Linear;

    #[test]
    fn a_tied_weight_given_under_both_names_must_hold_one_value() {
        let mut rng = weft_core::Generator::new(0);
        let layer = Linear::new(3, 2, false, &mut rng).unwrap();
        let aliases = [("head.weight", "weight")];
        let w = Tensor::from_vec((0..6).map(|v| v as f32).collect::<Vec<_>>(), &[2, 3]).unwrap();
        let one = |alt: Tensor| BTreeMap::from([("weight".to_string(), w.clone()), ("head.weight".to_string(), alt)]);
        // the same values twice (and one name alone) load
        load_state_dict(&layer, &one(w.clone()), &aliases, "f").unwrap();
        load_state_dict(
            &layer,
            &BTreeMap::from([("head.weight".to_string(), w.clone())]),
            &aliases,
            "f",
        )
        .unwrap();
        assert_eq!(
            layer.parameters()[0].1.to_vec::<f32>().unwrap(),
            w.to_vec::<f32>().unwrap()
        );
        // a second copy that differs in one value, or is all zeros, is refused naming both
        let mut changed = w.to_vec::<f32>().unwrap();
        changed[5] = 7.5;
        for alt in [
            Tensor::from_vec(changed, &[2, 3]).unwrap(),
            Tensor::zeros(&[2, 3], weft_core::DType::F32).unwrap(),
        ] {
            let e = load_state_dict(&layer, &one(alt), &aliases, "f")
                .unwrap_err()
                .to_string();
            assert!(e.contains("\"weight\" and \"head.weight\" are one tied weight"), "{e}");
        }
    }

    /// From a file, names and shapes are checked before any tensor's bytes are read (a file
    /// with an extra tensor of 1.5 GB was read whole, then refused), and a load reads each
    /// parameter's bytes once.
    #[test]
    fn a_file_is_checked_before_its_tensors_are_read() {
        let mut rng = weft_core::Generator::new(0);
        let layer = Linear::new(3, 2, true, &mut rng).unwrap();
        let dir = std::env::temp_dir().join(format!("weft-nn-lazy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let w = Tensor::ones(&[2, 3], weft_core::DType::F32).unwrap();
        let b = Tensor::ones(&[2], weft_core::DType::F32).unwrap();
        let junk = Tensor::zeros(&[1000], weft_core::DType::F32).unwrap();
        let wide = Tensor::ones(&[2, 4], weft_core::DType::F32).unwrap();
        let write = |name: &str, named: &[(&str, &Tensor)]| {
            let p = dir.join(name);
            safetensors::save(&p, named.iter().copied(), &BTreeMap::new()).unwrap();
            safetensors::SafeTensorsFile::open(&p).unwrap()
        };
        for (file, want) in [
            (
                write("junk.safetensors", &[("weight", &w), ("bias", &b), ("junk", &junk)]),
                "unexpected tensor \"junk\"",
            ),
            (
                write("wide.safetensors", &[("weight", &wide), ("bias", &b)]),
                "tensor \"weight\" has shape [2, 4], the model expects [2, 3]",
            ),
            (write("short.safetensors", &[("weight", &w)]), "missing tensor \"bias\""),
        ] {
            let e = load_state_dict(&layer, &file, &[], "f").unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
            assert_eq!(file.bytes_copied(), 0, "{want}: read before refusing");
        }
        let good = write("good.safetensors", &[("weight", &w), ("bias", &b)]);
        load_state_dict(&layer, &good, &[], "f").unwrap();
        assert_eq!(good.bytes_copied(), 8 * 4);
        assert_eq!(layer.parameters()[0].1.to_vec::<f32>().unwrap(), vec![1.0; 6]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
