//! The parameter shapes a [`GptConfig`] implies, and the check of a config against the shapes of
//! a state dict before a model is built from it: a config read from a file (a checkpoint's
//! index, a safetensors header) may claim sizes its tensors do not have, and building the model
//! first would allocate what the config claims (a `block_size` of 10^9 is 10^9 x `n_embd`
//! floats) before the loading could refuse it.

use std::collections::BTreeMap;

use weft_core::Result;

use super::GptConfig;
use crate::config_check::{check_layout, ExpectedDim};
use crate::config_error;

/// One dimension of a parameter: `times` x the config value `key`.
#[derive(Clone, Copy, Debug)]
struct Dim {
    key: &'static str,
    times: usize,
}

const fn dim(key: &'static str, times: usize) -> Dim {
    Dim { key, times }
}

const C: Dim = dim("n_embd", 1);

impl GptConfig {
    fn value(&self, key: &str) -> usize {
        match key {
            "vocab_size" => self.vocab_size,
            "block_size" => self.block_size,
            _ => self.n_embd,
        }
    }

    /// The size of `d` (saturating: a forged config's product must not overflow).
    fn size(&self, d: &Dim) -> usize {
        d.times.saturating_mul(self.value(d.key))
    }

    /// Every parameter's PyTorch name and dims, in [`Gpt`](super::Gpt)'s `parameters()` order
    /// (the tied `lm_head.weight` not included).
    fn layout(&self) -> Vec<(String, Vec<Dim>)> {
        let mut out = vec![
            ("transformer.wte.weight".to_string(), vec![dim("vocab_size", 1), C]),
            ("transformer.wpe.weight".to_string(), vec![dim("block_size", 1), C]),
        ];
        let mut add = |name: String, weight: Vec<Dim>, bias: Dim| {
            out.push((format!("{name}.weight"), weight));
            if self.bias {
                out.push((format!("{name}.bias"), vec![bias]));
            }
        };
        for i in 0..self.n_layer {
            let h = format!("transformer.h.{i}");
            add(format!("{h}.ln_1"), vec![C], C);
            add(format!("{h}.attn.c_attn"), vec![dim("n_embd", 3), C], dim("n_embd", 3));
            add(format!("{h}.attn.c_proj"), vec![C, C], C);
            add(format!("{h}.ln_2"), vec![C], C);
            add(format!("{h}.mlp.c_fc"), vec![dim("n_embd", 4), C], dim("n_embd", 4));
            add(format!("{h}.mlp.c_proj"), vec![C, dim("n_embd", 4)], C);
        }
        add("transformer.ln_f".to_string(), vec![C], C);
        out
    }

    /// Every parameter's PyTorch name and shape, in [`Gpt`](super::Gpt)'s `parameters()` order
    /// (the tied `lm_head.weight` not included). Allocates one entry per parameter: call
    /// [`check_shapes`](Self::check_shapes) first on a config from outside.
    pub fn parameter_shapes(&self) -> Vec<(String, Vec<usize>)> {
        self.layout()
            .into_iter()
            .map(|(name, dims)| (name, dims.iter().map(|d| self.size(d)).collect()))
            .collect()
    }

    /// Checks the config (as [`validate`](Self::validate)) and then against `shapes`, a state
    /// dict's tensor shapes by name, before anything of the config's size is allocated: the
    /// number of blocks (`transformer.h.{i}.*`), biases or none, and every parameter's shape.
    /// The error names the config key, its value and the tensor with its shape. Tensors the
    /// model does not have are left to the loading to refuse. `n_head` sets no shape, so only
    /// its division of `n_embd` is checked.
    pub fn check_shapes(&self, shapes: &BTreeMap<String, Vec<usize>>) -> Result<()> {
        self.validate()?;
        crate::config_check::numbered_blocks(shapes, "transformer.h.", "block", self.n_layer)?;
        let bias = "transformer.ln_f.bias";
        match (self.bias, shapes.get(bias)) {
            (true, None) => {
                return Err(config_error(
                    "bias",
                    format!("true, but the state dict has no {bias} (a model without biases)"),
                ))
            }
            (false, Some(shape)) => {
                return Err(config_error(
                    "bias",
                    format!("false, but the state dict holds {bias} of shape {shape:?}"),
                ))
            }
            _ => {}
        }
        let expected = |d: &Dim| ExpectedDim {
            key: d.key,
            symbol: match d.times {
                1 => d.key.to_string(),
                t => format!("{t} {}", d.key),
            },
            size: self.size(d),
            value: self.value(d.key),
        };
        let layout = self
            .layout()
            .into_iter()
            .map(|(name, dims)| (name, dims.iter().map(expected).collect()));
        check_layout(shapes, layout.collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpt::Gpt;
    use weft_nn::Module;

    fn config(bias: bool) -> GptConfig {
        GptConfig {
            vocab_size: 11,
            block_size: 6,
            n_layer: 2,
            n_head: 2,
            n_embd: 8,
            bias,
            dropout: 0.0,
            activation: weft_core::UnaryOp::Gelu,
        }
    }

    fn shapes_of(cfg: &GptConfig) -> BTreeMap<String, Vec<usize>> {
        Gpt::new(cfg.clone(), 0)
            .unwrap()
            .parameters()
            .into_iter()
            .map(|(n, t)| (n, t.shape().to_vec()))
            .collect()
    }

    #[test]
    fn the_shapes_are_the_models() {
        for bias in [true, false] {
            let cfg = config(bias);
            let built: Vec<(String, Vec<usize>)> = Gpt::new(cfg.clone(), 0)
                .unwrap()
                .parameters()
                .into_iter()
                .map(|(n, t)| (n, t.shape().to_vec()))
                .collect();
            assert_eq!(cfg.parameter_shapes(), built);
            cfg.check_shapes(&shapes_of(&cfg)).unwrap();
        }
    }

    /// The error of checking `cfg` against `base`'s shapes.
    fn mismatch(cfg: GptConfig) -> String {
        cfg.check_shapes(&shapes_of(&config(true))).unwrap_err().to_string()
    }

    fn assert_names(e: &str, needles: &[&str]) {
        for n in needles {
            assert!(e.contains(n), "{n:?} in {e:?}");
        }
    }

    #[test]
    fn a_config_the_tensors_do_not_match_names_the_key_and_the_tensor() {
        let e = mismatch(GptConfig {
            block_size: 1_000_000_000,
            ..config(true)
        });
        assert_names(
            &e,
            &[
                "model.block_size: 1000000000",
                "transformer.wpe.weight has shape [6, 8]",
                "[block_size, n_embd]",
            ],
        );
        let e = mismatch(GptConfig {
            vocab_size: 65,
            ..config(true)
        });
        assert_names(
            &e,
            &["model.vocab_size: 65", "transformer.wte.weight has shape [11, 8]"],
        );
        let e = mismatch(GptConfig {
            n_embd: 16,
            n_head: 4,
            ..config(true)
        });
        assert_names(&e, &["model.n_embd: 16", "transformer.wte.weight has shape [11, 8]"]);
        let e = mismatch(GptConfig {
            n_layer: 1_000_000_000,
            ..config(true)
        });
        assert_names(
            &e,
            &["model.n_layer: 1000000000", "no transformer.h.2.*", "holds 2 blocks"],
        );
        let e = mismatch(GptConfig {
            n_layer: 1,
            ..config(true)
        });
        assert_names(&e, &["model.n_layer: 1", "transformer.h.1.", "holds 2 blocks"]);
        let e = mismatch(config(false));
        assert_names(&e, &["model.bias: false", "transformer.ln_f.bias of shape [8]"]);
        let e = config(true)
            .check_shapes(&shapes_of(&config(false)))
            .unwrap_err()
            .to_string();
        assert_names(&e, &["model.bias: true", "no transformer.ln_f.bias"]);
        let e = mismatch(GptConfig {
            n_head: 3,
            ..config(true)
        });
        assert_names(&e, &["model.n_embd", "n_head = 3"]);
        // one block's tensor of another width
        let mut shapes = shapes_of(&config(true));
        shapes.insert("transformer.h.1.mlp.c_fc.weight".into(), vec![30, 8]);
        let e = config(true).check_shapes(&shapes).unwrap_err().to_string();
        assert_names(
            &e,
            &[
                "model.n_embd: 8",
                "transformer.h.1.mlp.c_fc.weight has shape [30, 8]",
                "[4 n_embd, n_embd] = [32, 8]",
            ],
        );
        // a missing tensor and a block missing in the middle
        let mut shapes = shapes_of(&config(true));
        shapes.remove("transformer.h.0.attn.c_proj.weight");
        let e = config(true).check_shapes(&shapes).unwrap_err().to_string();
        assert_names(&e, &["no transformer.h.0.attn.c_proj.weight"]);
        let shapes: BTreeMap<String, Vec<usize>> = shapes_of(&config(true))
            .into_iter()
            .filter(|(n, _)| !n.starts_with("transformer.h.0."))
            .collect();
        let e = config(true).check_shapes(&shapes).unwrap_err().to_string();
        assert_names(&e, &["model.n_layer: 2", "no transformer.h.0.*"]);
        // a wrong rank
        let mut shapes = shapes_of(&config(true));
        shapes.insert("transformer.wpe.weight".into(), vec![48]);
        let e = config(true).check_shapes(&shapes).unwrap_err().to_string();
        assert_names(&e, &["model.block_size: 6", "transformer.wpe.weight has shape [48]"]);
    }
}
