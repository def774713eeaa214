//! [`execute`]: the GPU side of `crate::ops::execute`. The ops layer has validated the inputs
//! (shapes, dtypes, ranges that need no data) before this is called, exactly as for the CPU; this
//! picks the family that runs the op on the inputs' GPU.

use super::families;
use crate::error::{Error, Result};
use crate::op::Op;
use crate::tensor::Tensor;

/// Runs `op` on `inputs`, all on one GPU. Outputs are as the CPU's: the result first, then the
/// tensors the forward saves for the backward (or the further outputs of a backward op).
pub fn execute(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    match op {
        Op::Custom(_) | Op::ToDevice(_) | Op::Fill { .. } | Op::Arange { .. } | Op::Random { .. } => {
            unreachable!("{} is executed by ops::execute", op.name())
        }
        Op::Unary(_)
        | Op::UnaryBackward(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Affine { .. }
        | Op::PowScalar(_)
        | Op::Clamp { .. }
        | Op::Where
        | Op::Cast(_) => families::elementwise::forward(op, inputs),
        Op::Reduce { .. } | Op::ArgMax { .. } | Op::Var { .. } => families::reduce::forward(op, inputs),
        Op::Matmul | Op::WideMatmul | Op::Linear { .. } => families::matmul::forward(op, inputs),
        Op::LinearActBackward(act) => {
            // the GPU's own UnaryBackward kernel, then the column sums
            let g = families::elementwise::forward(&Op::UnaryBackward(*act), inputs)?.remove(0);
            let gb = g.sum(&[0], false)?;
            Ok(vec![g, gb])
        }
        Op::Reshape(_) | Op::Permute(_) | Op::Narrow { .. } | Op::Expand(_) | Op::Contiguous | Op::Cat { .. } => {
            families::shape::forward(op, inputs)
        }
        Op::IndexSelect { .. }
        | Op::IndexAdd { .. }
        | Op::Gather { .. }
        | Op::ScatterAdd { .. }
        | Op::OneHot { .. } => families::index::forward(op, inputs),
        Op::Softmax { .. }
        | Op::SoftmaxBackward { .. }
        | Op::Norm { .. }
        | Op::NormBackward { .. }
        | Op::CrossEntropy { .. }
        | Op::CrossEntropyBackward { .. }
        | Op::Dropout { .. } => families::nn::forward(op, inputs),
        Op::Attention { .. }
        | Op::AttentionBackward { .. }
        | Op::QkvAttention { .. }
        | Op::QkvAttentionBackward { .. } => families::attention::forward(op, inputs),
        Op::Conv2d(_)
        | Op::Conv2dBackward(_)
        | Op::MaxPool2d(_)
        | Op::MaxPool2dBackward(_)
        | Op::AvgPool2d(_)
        | Op::AvgPool2dBackward(_) => families::conv::forward(op, inputs),
    }
}

/// The error of an op (or a dtype of it) that has no GPU kernel yet.
pub(crate) fn not_on_gpu(op: &Op, inputs: &[&Tensor]) -> Error {
    let device = inputs
        .first()
        .map(|t| t.device().to_string())
        .unwrap_or_else(|| "cuda".into());
    Error::Device(format!("{}: not available on {device} yet", op.name()))
}
