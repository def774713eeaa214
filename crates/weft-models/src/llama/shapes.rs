//! The parameter shapes a [`LlamaConfig`] implies, and the check of a config against the shapes
//! of a state dict before a model is built from it (a config read from a file may claim sizes
//! its tensors do not have; building first would allocate what it claims).

use std::collections::BTreeMap;

use weft_core::Result;

use super::LlamaConfig;
use crate::config_check::{check_layout, ExpectedDim};
use crate::config_error;

/// One dimension of a parameter: its size, the config key that sets it, and how it is written.
#[derive(Clone, Debug)]
struct Dim {
    size: usize,
    key: &'static str,
    symbol: &'static str,
}

impl LlamaConfig {
    fn dim(&self, key: &'static str) -> Dim {
        let own = self.head_dim.is_some();
        let (size, key, symbol) = match key {
            "vocab_size" => (self.vocab_size, key, "vocab_size"),
            "intermediate_size" => (self.intermediate_size, key, "intermediate_size"),
            // the queries' width: n_embd itself, unless head_dim sets the heads apart (and is
            // then named for a q_proj of another width, most likely its cause)
            "n_head" if own => (
                self.n_head.saturating_mul(self.head_dim()),
                "head_dim",
                "n_head * head_dim",
            ),
            "n_kv_head" if own => (
                self.n_kv_head.saturating_mul(self.head_dim()),
                key,
                "n_kv_head * head_dim",
            ),
            "n_kv_head" => (
                self.n_kv_head.saturating_mul(self.head_dim()),
                key,
                "n_kv_head * n_embd / n_head",
            ),
            "head_dim" if own => (self.head_dim(), key, "head_dim"),
            "head_dim" => (self.head_dim(), "n_embd", "n_embd / n_head"),
            _ => (self.n_embd, "n_embd", "n_embd"),
        };
        Dim { size, key, symbol }
    }

    /// Every parameter's name and dims, in [`Llama`](super::Llama)'s `parameters()` order
    /// (`lm_head.weight` only when not tied).
    fn layout(&self) -> Vec<(String, Vec<Dim>)> {
        let (v, c, i, q, kv, hd) = (
            self.dim("vocab_size"),
            self.dim("n_embd"),
            self.dim("intermediate_size"),
            self.dim("n_head"),
            self.dim("n_kv_head"),
            self.dim("head_dim"),
        );
        let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v.clone(), c.clone()])];
        for l in 0..self.n_layer {
            let p = format!("model.layers.{l}");
            out.push((format!("{p}.input_layernorm.weight"), vec![c.clone()]));
            for (proj, out_dim) in [("q_proj", &q), ("k_proj", &kv), ("v_proj", &kv)] {
                out.push((format!("{p}.self_attn.{proj}.weight"), vec![out_dim.clone(), c.clone()]));
                if self.qkv_bias {
                    out.push((format!("{p}.self_attn.{proj}.bias"), vec![out_dim.clone()]));
                }
            }
            out.push((format!("{p}.self_attn.o_proj.weight"), vec![c.clone(), q.clone()]));
            if self.qk_norm {
                for norm in ["q_norm", "k_norm"] {
                    out.push((format!("{p}.self_attn.{norm}.weight"), vec![hd.clone()]));
                }
            }
            out.push((format!("{p}.post_attention_layernorm.weight"), vec![c.clone()]));
            out.push((format!("{p}.mlp.gate_proj.weight"), vec![i.clone(), c.clone()]));
            out.push((format!("{p}.mlp.up_proj.weight"), vec![i.clone(), c.clone()]));
            out.push((format!("{p}.mlp.down_proj.weight"), vec![c.clone(), i.clone()]));
        }
        out.push(("model.norm.weight".to_string(), vec![c.clone()]));
        if !self.tie_embeddings {
            out.push(("lm_head.weight".to_string(), vec![v, c]));
        }
        out
    }

    /// Every parameter's name and shape, in [`Llama`](super::Llama)'s `parameters()` order
    /// (`lm_head.weight` only when not tied). Call [`check_shapes`](Self::check_shapes) first on
    /// a config from outside.
    pub fn parameter_shapes(&self) -> Vec<(String, Vec<usize>)> {
        self.layout()
            .into_iter()
            .map(|(name, dims)| (name, dims.iter().map(|d| d.size).collect()))
            .collect()
    }

    /// Checks the config (as [`validate`](Self::validate)) and then against `shapes`, a state
    /// dict's tensor shapes by name, before anything of the config's size is allocated: the
    /// number of layers (`model.layers.{i}.*`), an output head or a tied one, and every
    /// parameter's shape. The error names the config key, its value and the tensor with its
    /// shape. `block_size`, `rope_theta` and `norm_eps` set no shape. A tied model's state dict
    /// may hold `lm_head.weight` (the tied copy written when saving).
    pub fn check_shapes(&self, shapes: &BTreeMap<String, Vec<usize>>) -> Result<()> {
        self.validate()?;
        crate::config_check::numbered_blocks(shapes, "model.layers.", "layer", self.n_layer)?;
        if !self.tie_embeddings && !shapes.contains_key("lm_head.weight") {
            return Err(config_error(
                "tie_embeddings",
                "false, but the state dict has no lm_head.weight (a model with tied embeddings)",
            ));
        }
        let value = |key: &str| match key {
            "vocab_size" => self.vocab_size,
            "intermediate_size" => self.intermediate_size,
            "n_kv_head" => self.n_kv_head,
            "head_dim" => self.head_dim(),
            _ => self.n_embd,
        };
        let mut layout = self.layout();
        if self.tie_embeddings && shapes.contains_key("lm_head.weight") {
            // the tied copy must still be the embedding's shape
            let (v, c) = (self.dim("vocab_size"), self.dim("n_embd"));
            layout.push(("lm_head.weight".to_string(), vec![v, c]));
        }
        let expected = |dims: Vec<Dim>| {
            dims.into_iter()
                .map(|d| ExpectedDim {
                    key: d.key,
                    symbol: d.symbol.to_string(),
                    size: d.size,
                    value: value(d.key),
                })
                .collect()
        };
        check_layout(
            shapes,
            layout.into_iter().map(|(name, dims)| (name, expected(dims))).collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llama::Llama;
    use weft_nn::Module;

    fn config(tie: bool) -> LlamaConfig {
        LlamaConfig {
            vocab_size: 11,
            block_size: 6,
            n_layer: 2,
            n_head: 4,
            n_kv_head: 2,
            n_embd: 8,
            intermediate_size: 12,
            rope_theta: 10000.0,
            rope_scaling: None,
            norm_eps: 1e-5,
            tie_embeddings: tie,
            qkv_bias: false,
            head_dim: None,
            qk_norm: false,
            padding_idx: None,
        }
    }

    fn shapes_of(cfg: &LlamaConfig) -> BTreeMap<String, Vec<usize>> {
        Llama::new(cfg.clone(), 0)
            .unwrap()
            .parameters()
            .into_iter()
            .map(|(n, t)| (n, t.shape().to_vec()))
            .collect()
    }

    fn assert_names(e: &str, needles: &[&str]) {
        for n in needles {
            assert!(e.contains(n), "{n:?} in {e:?}");
        }
    }

    #[test]
    fn the_shapes_are_the_models() {
        for tie in [false, true] {
            let cfg = config(tie);
            let built: Vec<(String, Vec<usize>)> = Llama::new(cfg.clone(), 0)
                .unwrap()
                .parameters()
                .into_iter()
                .map(|(n, t)| (n, t.shape().to_vec()))
                .collect();
            assert_eq!(cfg.parameter_shapes(), built);
            cfg.check_shapes(&shapes_of(&cfg)).unwrap();
        }
        // a tied model's saved copy of the head is accepted
        let mut with_copy = shapes_of(&config(true));
        with_copy.insert("lm_head.weight".into(), vec![11, 8]);
        config(true).check_shapes(&with_copy).unwrap();
    }

    #[test]
    fn a_config_the_tensors_do_not_match_names_the_key_and_the_tensor() {
        let base = shapes_of(&config(false));
        let mismatch = |cfg: LlamaConfig| cfg.check_shapes(&base).unwrap_err().to_string();
        let e = mismatch(LlamaConfig {
            vocab_size: 65,
            ..config(false)
        });
        assert_names(
            &e,
            &["model.vocab_size: 65", "model.embed_tokens.weight has shape [11, 8]"],
        );
        let e = mismatch(LlamaConfig {
            n_kv_head: 4,
            ..config(false)
        });
        assert_names(
            &e,
            &[
                "model.n_kv_head: 4",
                "k_proj.weight has shape [4, 8]",
                "[n_kv_head * n_embd / n_head, n_embd]",
            ],
        );
        let e = mismatch(LlamaConfig {
            intermediate_size: 1_000_000_000,
            ..config(false)
        });
        assert_names(
            &e,
            &[
                "model.intermediate_size: 1000000000",
                "gate_proj.weight has shape [12, 8]",
            ],
        );
        let e = mismatch(LlamaConfig {
            n_layer: 1_000_000_000,
            ..config(false)
        });
        assert_names(
            &e,
            &["model.n_layer: 1000000000", "no model.layers.2.*", "holds 2 layers"],
        );
        let e = mismatch(LlamaConfig {
            n_layer: 1,
            ..config(false)
        });
        assert_names(&e, &["model.n_layer: 1", "model.layers.1.", "holds 2 layers"]);
        let e = config(false)
            .check_shapes(&shapes_of(&config(true)))
            .unwrap_err()
            .to_string();
        assert_names(&e, &["model.tie_embeddings: false", "no lm_head.weight"]);
        let e = mismatch(LlamaConfig {
            n_kv_head: 3,
            ..config(false)
        });
        assert_names(&e, &["model.n_head", "n_kv_head = 3"]);
        let mut shapes = base.clone();
        shapes.remove("model.layers.0.mlp.down_proj.weight");
        let e = config(false).check_shapes(&shapes).unwrap_err().to_string();
        assert_names(&e, &["no model.layers.0.mlp.down_proj.weight"]);
        let mut shapes = base.clone();
        shapes.insert("model.norm.weight".into(), vec![8, 1]);
        let e = config(false).check_shapes(&shapes).unwrap_err().to_string();
        assert_names(&e, &["model.n_embd: 8", "model.norm.weight has shape [8, 1]"]);
    }

    #[test]
    fn validation_names_the_keys() {
        let bad = |cfg: LlamaConfig| cfg.validate().unwrap_err().to_string();
        assert_names(
            &bad(LlamaConfig {
                n_kv_head: 3,
                ..config(false)
            }),
            &["model.n_head: 4 does not divide by n_kv_head = 3"],
        );
        assert_names(
            &bad(LlamaConfig {
                n_embd: 12,
                ..config(false)
            }),
            &["model.n_embd", "head dim of 3", "even"],
        );
        assert_names(
            &bad(LlamaConfig {
                n_embd: 10,
                ..config(false)
            }),
            &["model.n_embd: 10 does not divide by n_head = 4"],
        );
        assert_names(
            &bad(LlamaConfig {
                intermediate_size: 0,
                ..config(false)
            }),
            &["model.intermediate_size: must be positive"],
        );
        assert_names(
            &bad(LlamaConfig {
                rope_theta: -1.0,
                ..config(false)
            }),
            &["model.rope_theta"],
        );
    }
}
