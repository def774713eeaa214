//! Reading and writing tensors.

pub mod safetensors;
