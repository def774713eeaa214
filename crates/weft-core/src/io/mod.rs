//! Reading and writing tensors.

pub mod atomic;
pub mod regular;
pub mod safetensors;
