//! GPU forward of the conv family (see `crate::ops::conv` for the CPU's).

use crate::cuda::dispatch::not_on_gpu;
use crate::error::Result;
use crate::op::Op;
use crate::tensor::Tensor;

/// The kernels of this family's module that it launches (checked by the compile test).
pub const KERNELS: &[&str] = &[];

pub fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    Err(not_on_gpu(op, inputs))
}
