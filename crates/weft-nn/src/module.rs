//! The `Module` trait: a value holding named parameters.

use weft_core::Tensor;

/// Something with parameters. Names follow PyTorch's `state_dict` keys (dot-separated paths in
/// registration order), so weights saved by PyTorch load by name.
pub trait Module {
    /// `(name, parameter)` pairs in registration order. Parameters are leaf tensors that require
    /// grad; the same tensor object is returned on every call (clones share storage and gradient).
    fn parameters(&self) -> Vec<(String, Tensor)>;

    /// Number of scalar parameters.
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(|(_, t)| t.numel()).sum()
    }

    /// Clears every parameter's gradient (as `zero_grad(set_to_none=True)`).
    fn zero_grad(&self) {
        for (_, p) in self.parameters() {
            p.set_grad(None);
        }
    }
}

/// Prefixes each name with `prefix.` (parameters, or anything else kept by parameter name,
/// such as tensor-parallel splits).
pub fn prefixed<T>(prefix: &str, named: Vec<(String, T)>) -> Vec<(String, T)> {
    named.into_iter().map(|(n, t)| (format!("{prefix}.{n}"), t)).collect()
}
