//! The dispatcher: [`apply`] executes an [`Op`] on its inputs' backend and, when gradients are
//! wanted, records the autograd node. [`backward`] maps an op to its gradient formula.
//!
//! One file per op family holds the family's public `Tensor` methods (validation, output shape),
//! its forward (calling the CPU kernels in `crate::cpu`) and its backward.

pub(crate) mod accumulate;
pub mod attention;
pub mod conv;
pub mod creation;
pub mod elementwise;
pub mod index;
pub mod linear;
pub mod matmul;
pub mod nn;
pub mod reduce;
pub mod rotary;
pub mod shape;
pub mod swiglu;

use crate::autograd::{is_grad_enabled, Node};
use crate::error::{Error, Result};
use crate::function::BackwardReads;
use crate::op::Op;
use crate::tensor::Tensor;
use crate::DType;

/// Executes `op` on `inputs`. The first output is the op's result; any others are tensors the
/// forward saves for the backward (or further results of a multi-output backward op).
pub fn execute(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    for t in inputs {
        t.check_not_released(op.name())?;
    }
    if crate::graph::recording() {
        if matches!(op, Op::Custom(_)) && crate::graph::inlining() {
            // the function's own ops are recorded
            return execute_on_backend(op, inputs);
        }
        let _nested = crate::graph::RecordGuard::enter();
        let outputs = execute_on_backend(op, inputs)?;
        crate::graph::record_op(op, inputs, &outputs);
        return Ok(outputs);
    }
    execute_on_backend(op, inputs)
}

/// [`execute`] without the tracer's hook.
fn execute_on_backend(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    if let Op::ToDevice(device) = op {
        return Ok(vec![crate::cuda::to_device(inputs[0], *device)?]);
    }
    let device = inputs.iter().map(|t| t.device()).find(|d| *d != crate::Device::Cpu);
    #[cfg(feature = "cuda")]
    if let (Some(device), false) = (device, matches!(op, Op::Custom(_))) {
        let moved = same_device(op, inputs, device)?;
        let inputs: Vec<&Tensor> = moved.iter().collect();
        return crate::cuda::execute(op, &inputs);
    }
    if let Some(device) = device {
        same_device(op, inputs, device)?;
    }
    match op {
        Op::ToDevice(_) => unreachable!("handled above"),
        Op::Custom(c) => c.forward(inputs),
        Op::Fill { .. } | Op::Arange { .. } | Op::Random { .. } => creation::forward(op),
        Op::Unary(_)
        | Op::UnaryBackward(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Affine { .. }
        | Op::PowScalar(_)
        | Op::Clamp { .. }
        | Op::Where
        | Op::Cast(_) => elementwise::forward(op, inputs),
        Op::Reduce { .. } | Op::ArgMax { .. } | Op::Var { .. } => reduce::forward(op, inputs),
        Op::Matmul => matmul::forward(inputs),
        Op::WideMatmul => matmul::wide_forward(inputs),
        Op::Linear { act, bias, .. } => linear::forward(inputs, *act, *bias),
        Op::LinearActBackward(act) => linear::act_backward(*act, inputs[0], inputs[1]),
        Op::Reshape(_) | Op::Permute(_) | Op::Narrow { .. } | Op::Expand(_) | Op::Contiguous | Op::Cat { .. } => {
            shape::forward(op, inputs)
        }
        Op::IndexSelect { .. }
        | Op::IndexAdd { .. }
        | Op::Gather { .. }
        | Op::ScatterAdd { .. }
        | Op::OneHot { .. } => index::forward(op, inputs),
        Op::Softmax { .. }
        | Op::SoftmaxBackward { .. }
        | Op::Norm { .. }
        | Op::NormBackward { .. }
        | Op::CrossEntropy { .. }
        | Op::CrossEntropyBackward { .. }
        | Op::Dropout { .. } => nn::forward(op, inputs),
        Op::Attention { .. }
        | Op::AttentionBackward { .. }
        | Op::QkvAttention { .. }
        | Op::QkvAttentionBackward { .. } => attention::forward(op, inputs),
        Op::Conv2d(_)
        | Op::Conv2dBackward(_)
        | Op::MaxPool2d(_)
        | Op::MaxPool2dBackward(_)
        | Op::AvgPool2d(_)
        | Op::AvgPool2dBackward(_) => conv::forward(op, inputs),
    }
}

/// The inputs with each 0-d CPU tensor moved to `device` (a scalar may meet GPU tensors, as in
/// PyTorch); any other input off `device` is an error naming both devices.
fn same_device(op: &Op, inputs: &[&Tensor], device: crate::Device) -> Result<Vec<Tensor>> {
    inputs
        .iter()
        .map(|&t| match t.device() {
            d if d == device => Ok(t.clone()),
            crate::Device::Cpu if t.rank() == 0 => crate::cuda::to_device(t, device),
            d => Err(crate::error::invalid(
                op.name(),
                format!("inputs live on different devices: {device} and {d}"),
            )),
        })
        .collect()
}

/// Gradients of `op`'s inputs given the gradient of its output; `None` where an input gets none.
/// `sinks` (by input; empty for none) are where autograd offers to take an input's gradient as
/// it is made (gradient accumulation fusion, [`accumulate`]): the products use those they can,
/// leaving that input's gradient out (`None`, the sink's `added()` true); other ops ignore them.
pub(crate) fn backward(
    op: &Op,
    inputs: &[Tensor],
    output: &Tensor,
    saved: &[Tensor],
    grad: &Tensor,
    sinks: &[Option<accumulate::Sink>],
) -> Result<Vec<Option<Tensor>>> {
    match op {
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Affine { .. }
        | Op::PowScalar(_)
        | Op::Clamp { .. }
        | Op::Where
        | Op::Cast(_) => elementwise::backward(op, inputs, output, grad),
        Op::Reduce { .. } | Op::Var { .. } => reduce::backward(op, inputs, output, grad),
        Op::Matmul => matmul::backward(inputs, grad, sinks),
        Op::Linear { act, bias, .. } => linear::backward(inputs, saved, grad, *act, *bias, sinks),
        Op::Reshape(_) | Op::Permute(_) | Op::Narrow { .. } | Op::Expand(_) | Op::Contiguous | Op::Cat { .. } => {
            shape::backward(op, inputs, grad)
        }
        Op::IndexSelect { .. } | Op::IndexAdd { .. } | Op::Gather { .. } | Op::ScatterAdd { .. } => {
            index::backward(op, inputs, grad)
        }
        Op::Softmax { .. } | Op::Norm { .. } | Op::CrossEntropy { .. } | Op::Dropout { .. } => {
            nn::backward(op, inputs, output, saved, grad)
        }
        Op::Attention { .. } | Op::QkvAttention { .. } => attention::backward(op, inputs, output, saved, grad),
        Op::Conv2d(_) | Op::MaxPool2d(_) | Op::AvgPool2d(_) => conv::backward(op, inputs, saved, grad),
        Op::Custom(c) => c.0.backward(inputs, output, grad),
        Op::ToDevice(_) => Ok(vec![Some(grad.to(inputs[0].device())?)]),
        _ => Err(Error::Autograd(format!("{} is not differentiable", op.name()))),
    }
}

/// What of an input a node keeps for the backward: the tensor itself when `read` (its formula
/// reads the elements), when it is a leaf that takes a gradient (the gradient lands in it), or
/// when the op that made it reads its own output in its backward; otherwise its backward
/// handle, which holds no elements, so that the buffer is freed once nothing else holds it.
fn kept_for_backward(t: &Tensor, read: bool) -> Tensor {
    let output_read = t.0.node.as_ref().is_some_and(|n| backward_reads(&n.op).output);
    if read || output_read || (t.requires_grad() && t.is_leaf()) {
        t.clone()
    } else {
        t.backward_handle()
    }
}

/// Which inputs' and outputs' elements `op`'s backward formula (in [`backward`]) reads; every
/// arm is checked against the formula it names. Shapes, dtypes and devices are always there.
pub(crate) fn backward_reads(op: &Op) -> BackwardReads {
    use crate::op::{BinaryOp, ReduceOp};
    const X: BackwardReads = BackwardReads::inputs(&[0]);
    const X_Y: BackwardReads = BackwardReads::inputs(&[0, 1]);
    match op {
        // elementwise::backward
        Op::Unary(_) | Op::PowScalar(_) | Op::Clamp { .. } | Op::Where => X,
        Op::Binary(BinaryOp::Add | BinaryOp::Sub) => BackwardReads::NOTHING,
        Op::Binary(BinaryOp::Mul | BinaryOp::Maximum | BinaryOp::Minimum) => X_Y,
        Op::Binary(BinaryOp::Div) => BackwardReads::inputs(&[1]).and_output(),
        Op::Binary(BinaryOp::Pow) => X_Y.and_output(),
        Op::Affine { .. } | Op::Cast(_) => BackwardReads::NOTHING,
        // reduce::backward
        Op::Reduce {
            op: ReduceOp::Sum | ReduceOp::Mean,
            ..
        } => BackwardReads::NOTHING,
        Op::Reduce { .. } => X.and_output(),
        Op::Var { .. } => X,
        // matmul::backward, linear::backward (the bias and the residual: shapes only)
        Op::Matmul | Op::Linear { .. } => X_Y,
        // shape::backward
        Op::Reshape(_) | Op::Permute(_) | Op::Narrow { .. } | Op::Expand(_) | Op::Contiguous | Op::Cat { .. } => {
            BackwardReads::NOTHING
        }
        // index::backward: the index only
        Op::IndexSelect { .. } | Op::IndexAdd { .. } | Op::Gather { .. } | Op::ScatterAdd { .. } => {
            BackwardReads::inputs(&[1])
        }
        // nn::backward
        Op::Softmax { .. } => BackwardReads::inputs(&[]).and_output(),
        // the input and the weight (input 1 only when there is one; else the bias)
        Op::Norm { has_weight: true, .. } | Op::CrossEntropy { .. } => X_Y,
        Op::Norm { .. } => X,
        Op::Dropout { .. } => BackwardReads::NOTHING,
        Op::ToDevice(_) => BackwardReads::NOTHING,
        Op::Custom(c) => c.0.backward_reads(),
        // attention and convolution formulas, and anything not differentiable
        _ => BackwardReads::ALL,
    }
}

/// Whether `op` records an autograd node when an input requires grad.
fn differentiable(op: &Op) -> bool {
    !matches!(
        op,
        Op::Fill { .. }
            | Op::Arange { .. }
            | Op::Random { .. }
            | Op::Compare(_)
            | Op::ArgMax { .. }
            | Op::OneHot { .. }
            | Op::UnaryBackward(_)
            | Op::LinearActBackward(_)
            | Op::WideMatmul
            | Op::SoftmaxBackward { .. }
            | Op::NormBackward { .. }
            | Op::CrossEntropyBackward { .. }
            | Op::AttentionBackward { .. }
            | Op::QkvAttentionBackward { .. }
            | Op::Conv2dBackward(_)
            | Op::MaxPool2dBackward(_)
            | Op::AvgPool2dBackward(_)
    ) && !matches!(op, Op::Cast(d) if !d.is_float())
}

/// Executes `op` and records it for autograd when needed; returns the primary output.
pub(crate) fn apply(op: Op, inputs: &[&Tensor]) -> Result<Tensor> {
    let mut outputs = execute(&op, inputs)?;
    let out = outputs.remove(0);
    let record = is_grad_enabled() && differentiable(&op) && inputs.iter().any(|t| t.requires_grad());
    if !record {
        return Ok(out);
    }
    let reads = backward_reads(&op);
    let node = Node {
        inputs: inputs
            .iter()
            .enumerate()
            .map(|(i, &t)| kept_for_backward(t, reads.reads_input(i)))
            .collect(),
        op,
        saved: outputs,
    };
    Ok(Tensor::build(
        out.0.storage.clone(),
        out.layout().clone(),
        out.dtype(),
        Some(node),
    ))
}

/// Executes a multi-output op (the backward kernels) without recording it.
pub(crate) fn apply_multi(op: Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    execute(&op, inputs)
}

/// Checks that `t` has dtype `want`.
pub(crate) fn expect_dtype(op: &'static str, t: &Tensor, want: DType) -> Result<()> {
    if t.dtype() != want {
        return Err(Error::DTypeMismatch {
            op,
            lhs: t.dtype(),
            rhs: want,
        });
    }
    Ok(())
}

/// Checks that `t` is a float tensor.
pub(crate) fn expect_float(op: &'static str, t: &Tensor) -> Result<()> {
    if !t.dtype().is_float() {
        return Err(Error::UnsupportedDType { op, dtype: t.dtype() });
    }
    Ok(())
}

/// Runs `$body` with `$T` bound to the Rust type of the compute dtype (f32 or f64).
#[macro_export]
#[doc(hidden)]
macro_rules! float_dispatch {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            _ => {
                type $T = f32;
                $body
            }
        }
    };
}

/// Casts a bf16/f16 tensor to f32 for computing (f32 and f64 pass through unchanged). Not
/// recorded by autograd: for use inside the forward of `op` (named when the copy cannot be
/// allocated).
pub(crate) fn to_compute(op: &'static str, t: &Tensor) -> Result<Tensor> {
    let c = t.dtype().compute_float();
    if t.dtype() == c {
        Ok(t.clone())
    } else {
        Ok(Tensor::from_storage(t.cast_storage(op, c)?, t.shape()))
    }
}
