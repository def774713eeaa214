//! `[model]`: which model (`kind`) and its keys.

use serde::{Deserialize, Serialize};

use super::by_kind;

/// `[model]`: which model (`kind`) and its sizes.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ModelConfig {
    Mlp(MlpKeys),
    Convnet(ConvnetKeys),
    Gpt(GptKeys),
    Llama(LlamaKeys),
}

impl ModelConfig {
    /// Checks a language model's config (gpt, llama) against the shapes of the tensors it is to
    /// be loaded from, before anything of the config's size is built: the error names the key
    /// and the tensor. A classifier's (mlp, convnet) are checked when its parameters load.
    pub fn check_shapes(&self, shapes: &std::collections::BTreeMap<String, Vec<usize>>) -> weft_core::Result<()> {
        match self {
            ModelConfig::Gpt(g) => g.to_config().check_shapes(shapes),
            ModelConfig::Llama(l) => l.to_config().check_shapes(shapes),
            ModelConfig::Mlp(_) | ModelConfig::Convnet(_) => Ok(()),
        }
    }

    /// `(vocab_size, block_size)` of a language model (gpt, llama); `None` for the others.
    pub fn language_model_sizes(&self) -> Option<(usize, usize)> {
        match self {
            ModelConfig::Gpt(g) => Some((g.vocab_size, g.block_size)),
            ModelConfig::Llama(l) => Some((l.vocab_size, l.block_size)),
            ModelConfig::Mlp(_) | ModelConfig::Convnet(_) => None,
        }
    }

    /// The `[model] kind` this is.
    pub fn kind(&self) -> &'static str {
        match self {
            ModelConfig::Mlp(_) => "mlp",
            ModelConfig::Convnet(_) => "convnet",
            ModelConfig::Gpt(_) => "gpt",
            ModelConfig::Llama(_) => "llama",
        }
    }
}

/// `[model]` keys of `kind = "mlp"`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MlpKeys {
    pub in_features: usize,
    pub hidden: Vec<usize>,
    pub out_features: usize,
    /// `relu` | `gelu` | `tanh`.
    pub activation: String,
}

/// `[model]` keys of `kind = "convnet"`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConvnetKeys {
    pub in_channels: usize,
    pub image_size: usize,
    pub channels: Vec<usize>,
    pub num_classes: usize,
}

/// `[model]` keys of `kind = "gpt"`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GptKeys {
    pub vocab_size: usize,
    pub block_size: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_embd: usize,
    pub bias: bool,
    pub dropout: f64,
    /// The MLP's activation: `"gelu"` (exact, the default) or `"gelu_tanh"` (GPT-2's `gelu_new`).
    #[serde(
        default = "default_gpt_activation",
        skip_serializing_if = "is_default_gpt_activation"
    )]
    pub activation: String,
}

fn default_gpt_activation() -> String {
    "gelu".into()
}

fn is_default_gpt_activation(a: &String) -> bool {
    a == "gelu"
}

impl GptKeys {
    /// The model's own config.
    pub fn to_config(&self) -> weft_models::gpt::GptConfig {
        weft_models::gpt::GptConfig {
            vocab_size: self.vocab_size,
            block_size: self.block_size,
            n_layer: self.n_layer,
            n_head: self.n_head,
            n_embd: self.n_embd,
            bias: self.bias,
            dropout: self.dropout,
            activation: match self.activation.as_str() {
                "gelu_tanh" => weft_core::UnaryOp::GeluTanh,
                _ => weft_core::UnaryOp::Gelu,
            },
        }
    }
}

/// `[model]` keys of `kind = "llama"` (transformers' `LlamaForCausalLM`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LlamaKeys {
    pub vocab_size: usize,
    pub block_size: usize,
    pub n_layer: usize,
    pub n_head: usize,
    /// Key/value heads (grouped-query attention); `n_head` must divide by it.
    pub n_kv_head: usize,
    pub n_embd: usize,
    pub intermediate_size: usize,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default = "default_norm_eps")]
    pub norm_eps: f64,
    #[serde(default)]
    pub tie_embeddings: bool,
}

fn default_rope_theta() -> f64 {
    weft_models::llama::LlamaConfig::DEFAULT_ROPE_THETA
}

fn default_norm_eps() -> f64 {
    weft_models::llama::LlamaConfig::DEFAULT_NORM_EPS
}

impl LlamaKeys {
    /// The model's own config.
    pub fn to_config(&self) -> weft_models::llama::LlamaConfig {
        weft_models::llama::LlamaConfig {
            vocab_size: self.vocab_size,
            block_size: self.block_size,
            n_layer: self.n_layer,
            n_head: self.n_head,
            n_kv_head: self.n_kv_head,
            n_embd: self.n_embd,
            intermediate_size: self.intermediate_size,
            rope_theta: self.rope_theta,
            norm_eps: self.norm_eps,
            tie_embeddings: self.tie_embeddings,
        }
    }
}

impl<'de> Deserialize<'de> for ModelConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        by_kind(d, &["mlp", "convnet", "gpt", "llama"], |kind, v| {
            Ok(match kind {
                "mlp" => ModelConfig::Mlp(serde_path_to_error::deserialize(v)?),
                "convnet" => ModelConfig::Convnet(serde_path_to_error::deserialize(v)?),
                "llama" => ModelConfig::Llama(serde_path_to_error::deserialize(v)?),
                _ => ModelConfig::Gpt(serde_path_to_error::deserialize(v)?),
            })
        })
    }
}
