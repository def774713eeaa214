//! Differentiable functions defined outside the op set (PyTorch's `torch.autograd.Function`):
//! a forward and a backward written as code, recorded by autograd as one node. Tensor
//! parallelism's communication operators are functions: the identity whose backward all-reduces
//! the gradient, and the all-reduce whose backward is the identity.

use std::sync::Arc;

use crate::autograd::GradModeGuard;
use crate::error::Result;
use crate::op::Op;
use crate::tensor::Tensor;

/// A differentiable function of one or more tensors to one tensor.
pub trait Function: Send + Sync {
    /// A short name, for errors and traces.
    fn name(&self) -> &'static str;

    /// The output, computed from `inputs`; runs with gradient recording off.
    fn forward(&self, inputs: &[&Tensor]) -> Result<Tensor>;

    /// The gradient of each input (`None` where an input gets none), given the inputs, the
    /// output and `grad`, the gradient of the output (its shape). Runs with recording off.
    fn backward(&self, inputs: &[Tensor], output: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>>;

    /// Which of the inputs' and the output's elements `backward` reads. Autograd keeps only
    /// those alive until the backward (the others are passed with their shape, dtype and
    /// device, and no elements). The default, everything, is always safe.
    fn backward_reads(&self) -> BackwardReads {
        BackwardReads::ALL
    }
}

/// Which tensors an op's backward formula reads the elements of: the inputs named by a bit
/// mask (bit `i` for input `i`; inputs past the 64th count as read unless no input is), and
/// whether the output is read. Shapes, dtypes and devices can always be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackwardReads {
    /// Bit `i`: input `i`'s elements are read.
    pub inputs: u64,
    /// The output's elements are read.
    pub output: bool,
}

impl BackwardReads {
    /// Every input and the output.
    pub const ALL: BackwardReads = BackwardReads {
        inputs: u64::MAX,
        output: true,
    };
    /// Nothing but shapes (a sum, a reshape, the identity).
    pub const NOTHING: BackwardReads = BackwardReads {
        inputs: 0,
        output: false,
    };

    /// The inputs at `indices`, and not the output.
    pub const fn inputs(indices: &[usize]) -> BackwardReads {
        let mut mask = 0u64;
        let mut i = 0;
        while i < indices.len() {
            assert!(indices[i] < 64, "BackwardReads::inputs names inputs 0 to 63");
            mask |= 1 << indices[i];
            i += 1;
        }
        BackwardReads {
            inputs: mask,
            output: false,
        }
    }

    /// Also the output.
    pub const fn and_output(self) -> BackwardReads {
        BackwardReads {
            inputs: self.inputs,
            output: true,
        }
    }

    /// Whether input `i`'s elements are read.
    pub fn reads_input(&self, i: usize) -> bool {
        if i < 64 {
            self.inputs & (1 << i) != 0
        } else {
            self.inputs != 0
        }
    }
}

/// A [`Function`] as a value of the op set ([`Op::Custom`]); two are equal when they are the
/// same function object.
#[derive(Clone)]
pub struct CustomOp(pub Arc<dyn Function>);

impl std::fmt::Debug for CustomOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CustomOp({})", self.0.name())
    }
}

impl PartialEq for CustomOp {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl CustomOp {
    pub(crate) fn forward(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let _off = GradModeGuard::new(false);
        Ok(vec![self.0.forward(inputs)?])
    }
}

impl Tensor {
    /// `f(inputs)`, recorded for autograd (when an input requires grad) so that backward
    /// calls `f.backward`.
    pub fn apply_function(f: Arc<dyn Function>, inputs: &[&Tensor]) -> Result<Tensor> {
        crate::ops::apply(Op::Custom(CustomOp(f)), inputs)
    }
}
