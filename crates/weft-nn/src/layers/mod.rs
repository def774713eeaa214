//! Layers. Each holds its parameters as leaf tensors under PyTorch's names and has a `forward`.

mod activation;
mod attention;
mod conv;
mod dropout;
mod embedding;
mod linear;
mod mlp;
mod norm;
mod sequential;

pub use activation::Activation;
pub use attention::CausalSelfAttention;
pub use conv::{Conv2d, MaxPool2d};
pub use dropout::Dropout;
pub use embedding::Embedding;
pub use linear::Linear;
pub use mlp::Mlp;
pub use norm::{LayerNorm, RmsNorm};
pub use sequential::{Forward, Sequential};
