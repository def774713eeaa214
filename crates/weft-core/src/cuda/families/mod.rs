//! One file per op family: output shapes, kernel launches and the dtypes each handles, mirroring
//! `crate::ops`' families on the CPU.

pub mod attention;
pub mod conv;
pub mod elementwise;
pub mod index;
pub mod matmul;
pub mod nn;
pub mod reduce;
pub mod shape;

use super::kernels::{self, Module};

/// Every kernel the families launch, by module: the compile check confirms each is in its
/// module's PTX, so a misspelt name fails without a GPU.
pub fn kernel_names() -> Vec<(&'static Module, &'static [&'static str])> {
    vec![
        (&kernels::COPY, super::copy::KERNELS),
        (&kernels::ELEMENTWISE, elementwise::KERNELS),
        (&kernels::REDUCE, reduce::KERNELS),
        (&kernels::NN, nn::KERNELS),
        (&kernels::INDEX, index::KERNELS),
        (&kernels::ATTENTION, attention::KERNELS),
        (&kernels::CONV, conv::KERNELS),
        (&kernels::LINEAR, matmul::KERNELS),
        (&kernels::OPTIM, super::optim::KERNELS),
    ]
}
