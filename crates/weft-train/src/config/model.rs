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
    /// Checks the config against the shapes of the tensors it is to be loaded from (a state
    /// dict's, or a checkpoint index's, by name), before anything of the config's size is built:
    /// the sizes as the model checks them, then every parameter's shape; the error names the key
    /// and the tensor.
    pub fn check_shapes(&self, shapes: &std::collections::BTreeMap<String, Vec<usize>>) -> weft_core::Result<()> {
        match self {
            ModelConfig::Gpt(g) => g.to_config().check_shapes(shapes),
            ModelConfig::Llama(l) => l.to_config().check_shapes(shapes),
            ModelConfig::Mlp(m) => super::classifier_shapes::check_mlp(m, shapes),
            ModelConfig::Convnet(c) => super::classifier_shapes::check_convnet(c, shapes),
        }
    }

    /// The model's own checks of its sizes (what building it checks first), without building
    /// anything: the error names the key (`model.n_embd: 16 does not divide by n_head = 3`).
    pub fn validate(&self) -> weft_core::Result<()> {
        match self {
            ModelConfig::Gpt(g) => g.to_config().validate(),
            ModelConfig::Llama(l) => l.to_config().validate(),
            ModelConfig::Mlp(m) => m.to_config()?.validate(),
            ModelConfig::Convnet(c) => c.to_config().validate(),
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

impl MlpKeys {
    /// The model's own config; an unknown `activation` is an error naming the key.
    pub fn to_config(&self) -> weft_core::Result<weft_models::mlp::MlpConfig> {
        let activation =
            weft_nn::layers::Activation::parse(&self.activation).ok_or_else(|| weft_core::Error::Invalid {
                op: "model config",
                msg: format!("model.activation: {:?} is not one of relu, gelu, tanh", self.activation),
            })?;
        Ok(weft_models::mlp::MlpConfig {
            in_features: self.in_features,
            hidden: self.hidden.clone(),
            out_features: self.out_features,
            activation,
        })
    }
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

impl ConvnetKeys {
    /// The model's own config.
    pub fn to_config(&self) -> weft_models::convnet::ConvNetConfig {
        weft_models::convnet::ConvNetConfig {
            in_channels: self.in_channels,
            image_size: self.image_size,
            channels: self.channels.clone(),
            num_classes: self.num_classes,
        }
    }
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
    /// How the rotary frequencies are stretched (none: plain rotary embeddings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<RopeScalingKeys>,
    #[serde(default = "default_norm_eps")]
    pub norm_eps: f64,
    #[serde(default)]
    pub tie_embeddings: bool,
    /// Biases on the q, k and v projections (Qwen2's attention).
    #[serde(default)]
    pub qkv_bias: bool,
    /// Width of one head when it is not `n_embd / n_head` (transformers' `head_dim`: Qwen3,
    /// Mistral NeMo); absent, `n_embd / n_head`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// An RMSNorm over each query and key head before the rotary embedding (Qwen3's attention).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub qk_norm: bool,
    /// The token id whose embedding row gets no gradient from its lookups (transformers'
    /// `pad_token_id`, `torch.nn.Embedding`'s `padding_idx`); absent, every row learns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub padding_idx: Option<usize>,
}

/// `[model] rope_scaling` of a llama, in transformers' names: `{ rope_type = "linear", factor }`
/// or `{ rope_type = "llama3", factor, low_freq_factor, high_freq_factor,
/// original_max_position_embeddings }` ([`weft_models::llama::RopeScaling`] has the formulas).
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq)]
#[serde(tag = "rope_type", rename_all = "lowercase", deny_unknown_fields)]
pub enum RopeScalingKeys {
    Linear {
        factor: f64,
    },
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
}

impl RopeScalingKeys {
    /// The model's own form.
    pub fn to_scaling(self) -> weft_models::llama::RopeScaling {
        use weft_models::llama::RopeScaling;
        match self {
            RopeScalingKeys::Linear { factor } => RopeScaling::Linear { factor },
            RopeScalingKeys::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            },
        }
    }
}

fn default_rope_theta() -> f64 {
    weft_models::llama::LlamaConfig::DEFAULT_ROPE_THETA
}

fn default_norm_eps() -> f64 {
    weft_models::llama::LlamaConfig::DEFAULT_NORM_EPS
}

impl LlamaKeys {
    /// Leaves `head_dim` out where it is `n_embd / n_head`, the width it would have without it:
    /// the same model, recorded (in checkpoints, which a resume compares) in one form.
    pub fn drop_derived_head_dim(&mut self) {
        if self.n_head > 0
            && self.n_embd.is_multiple_of(self.n_head)
            && self.head_dim == Some(self.n_embd / self.n_head)
        {
            self.head_dim = None;
        }
    }

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
            rope_scaling: self.rope_scaling.map(RopeScalingKeys::to_scaling),
            norm_eps: self.norm_eps,
            tie_embeddings: self.tie_embeddings,
            qkv_bias: self.qkv_bias,
            head_dim: self.head_dim,
            qk_norm: self.qk_norm,
            padding_idx: self.padding_idx,
        }
    }
}

impl<'de> Deserialize<'de> for ModelConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        by_kind(d, "model", &["mlp", "convnet", "gpt", "llama"], |kind, v| {
            Ok(match kind {
                "mlp" => ModelConfig::Mlp(serde_path_to_error::deserialize(v)?),
                "convnet" => ModelConfig::Convnet(serde_path_to_error::deserialize(v)?),
                "llama" => ModelConfig::Llama(serde_path_to_error::deserialize(v)?),
                _ => ModelConfig::Gpt(serde_path_to_error::deserialize(v)?),
            })
        })
    }
}
