//! Reading and writing tensors.

pub mod atomic;
pub mod safetensors;
