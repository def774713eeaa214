//! GPU forward of views and layout ops: views share the buffer exactly as on the CPU; copies
//! (a reshape that cannot be a view, `contiguous`, `cat`) run the copy kernels.

use crate::cuda::copy::{contiguous, empty, gpu_of, write_into};
use crate::error::Result;
use crate::op::Op;
use crate::tensor::Tensor;

pub fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
    let x = inputs[0];
    let out = match op {
        Op::Reshape(shape) => match x.layout().reshape_view(shape) {
            Some(view) => x.with_layout(view),
            None => contiguous(x)?.reshape_raw(shape),
        },
        Op::Permute(perm) => x.with_layout(x.layout().permute(perm)?),
        Op::Narrow { dim, start, len } => x.with_layout(x.layout().narrow(*dim, *start, *len)?),
        Op::Expand(shape) => x.with_layout(x.layout().expand(shape)?),
        Op::Contiguous => contiguous(x)?,
        Op::Cat { dim } => cat(inputs, *dim)?,
        _ => unreachable!("shape::forward called with {op:?}"),
    };
    Ok(vec![out])
}

/// Each input written into its window of the output along `dim`.
fn cat(inputs: &[&Tensor], dim: usize) -> Result<Tensor> {
    let mut shape = inputs[0].shape().to_vec();
    shape[dim] = inputs.iter().map(|t| t.shape()[dim]).sum();
    let out = empty(&gpu_of(inputs[0])?, "cat", inputs[0].dtype(), &shape)?;
    let mut start = 0;
    for t in inputs {
        let len = t.shape()[dim];
        let window = out.with_layout(out.layout().narrow(dim, start, len)?);
        let src = if t.is_contiguous() {
            (*t).clone()
        } else {
            contiguous(t)?
        };
        write_into(&window, &src)?;
        start += len;
    }
    Ok(out)
}
