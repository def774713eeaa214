//! GPU forward of the matmul family (see `crate::ops::matmul` and `crate::ops::linear` for the CPU's).

use crate::cuda::dispatch::not_on_gpu;
use crate::error::Result;
use crate::op::Op;
use crate::tensor::Tensor;

/// The kernels of `kernels/linear.cu` that this family launches (checked by the compile test).
pub const KERNELS: &[&str] = &[];

pub fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    Err(not_on_gpu(op, inputs))
}
