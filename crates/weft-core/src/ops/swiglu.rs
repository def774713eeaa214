//! SwiGLU's product `silu(gate) * up` as one pass forward and one backward (both gradients in
//! one pass), a custom [`Function`] like the rotation in `rotary.rs`: on CPU in f32 a kernel;
//! anywhere else (another dtype or device, an ONNX export inlining functions) the composition
//! of `silu` and `mul`. The kernel's results equal those of `linear_act(.., Silu)` followed by
//! `mul` bit for bit (the same sigmoid, products and sums, element by element).

use std::mem::MaybeUninit;
use std::sync::Arc;

use crate::cpu::elementwise::simd_dispatch;
use crate::cpu::math::sigmoid_f32;
use crate::error::{invalid, Error, Result};
use crate::function::Function;
use crate::tensor::Tensor;
use crate::{DType, Device};

impl Tensor {
    /// `silu(self) * up` (SwiGLU: `self` the gate projection before its activation). Both
    /// inputs get gradients.
    /// # Shapes
    /// `self`, `up` of one shape -> that shape.
    pub fn silu_mul(&self, up: &Tensor) -> Result<Tensor> {
        if self.shape() != up.shape() {
            return Err(Error::ShapeMismatch {
                op: "silu_mul",
                lhs: self.shape().to_vec(),
                rhs: up.shape().to_vec(),
            });
        }
        Tensor::apply_function(Arc::new(SiluMul), &[self, up])
    }
}

/// Whether the kernels take these tensors: all f32 on the CPU, and no export inlining functions.
fn on_kernel(ts: &[&Tensor]) -> bool {
    ts.iter().all(|t| t.device() == Device::Cpu && t.dtype() == DType::F32) && !crate::graph::inlining()
}

/// Elements per task: about four tasks per thread, none under 4096 elements.
fn chunk_len(len: usize) -> usize {
    if len < crate::cpu::PARALLEL_THRESHOLD {
        len.max(1)
    } else {
        len.div_ceil(crate::cpu::threads::num_threads() * 4).max(4096)
    }
}

/// `silu(gate) * up`; inputs `(gate, up)`.
struct SiluMul;

impl Function for SiluMul {
    fn name(&self) -> &'static str {
        "silu_mul"
    }

    fn forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        let (x, u) = (inputs[0], inputs[1]);
        if !on_kernel(&[x, u]) || x.numel() == 0 {
            return x.silu()?.mul(u);
        }
        let (xs, us) = (x.contig::<f32>("silu_mul")?, u.contig::<f32>("silu_mul")?);
        let mut out = crate::alloc::uninit::<f32>("silu_mul", xs.len())?;
        let chunk = chunk_len(xs.len());
        crate::cpu::pool::for_each_chunk(&mut out, chunk, |i, o| {
            let r = i * chunk..i * chunk + o.len();
            silu_mul_f32(&xs[r.clone()], &us[r], o);
        });
        // SAFETY: every element was written.
        let out = unsafe { crate::cpu::assume_init(out) };
        Tensor::from_vec(out, x.shape())
    }

    fn backward_reads(&self) -> crate::BackwardReads {
        crate::BackwardReads::inputs(&[0, 1])
    }

    fn backward(&self, inputs: &[Tensor], _output: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let (x, u) = (&inputs[0], &inputs[1]);
        if on_kernel(&[x, u, grad]) && x.numel() > 0 {
            // one pass for both gradients, recorded as one node (compiled mode replays it)
            let both = Tensor::apply_function(Arc::new(SiluMulBackward), &[x, u, grad])?;
            let shape: Vec<isize> = x.shape().iter().map(|&d| d as isize).collect();
            let part = |i: usize| both.narrow(0, i, 1)?.reshape(&shape);
            return Ok(vec![Some(part(0)?), Some(part(1)?)]);
        }
        // d/dx silu(x) = s (1 + x (1 - s)), s = sigmoid(x)
        let s = x.sigmoid()?;
        let ds = s.mul(&x.mul(&s.neg()?.add_scalar(1.0)?)?.add_scalar(1.0)?)?;
        Ok(vec![Some(grad.mul(u)?.mul(&ds)?), Some(grad.mul(&x.silu()?)?)])
    }
}

/// A task's pieces of the two gradients.
type Halves<'a> = (&'a mut [MaybeUninit<f32>], &'a mut [MaybeUninit<f32>]);

/// Both gradients of [`SiluMul`] stacked, `[2, ...]`: `(g u) silu'(x)` then `g silu(x)`; inputs
/// `(x, u, g)`, on the kernel only (f32, CPU).
struct SiluMulBackward;

impl Function for SiluMulBackward {
    fn name(&self) -> &'static str {
        "silu_mul_backward"
    }

    fn forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        let (x, u, g) = (inputs[0], inputs[1], inputs[2]);
        let (xs, us, gs) = (
            x.contig::<f32>("silu_mul")?,
            u.contig::<f32>("silu_mul")?,
            g.contig::<f32>("silu_mul")?,
        );
        let n = xs.len();
        let mut out = crate::alloc::uninit::<f32>("silu_mul", 2 * n)?;
        let chunk = chunk_len(n);
        {
            let (dx, du) = out.split_at_mut(n);
            let mut pairs: Vec<Halves<'_>> = dx.chunks_mut(chunk).zip(du.chunks_mut(chunk)).collect();
            crate::cpu::pool::for_each_chunk(&mut pairs, 1, |i, p| {
                let (dx, du) = &mut p[0];
                let r = i * chunk..i * chunk + dx.len();
                silu_mul_backward_f32(&xs[r.clone()], &us[r.clone()], &gs[r], dx, du);
            });
        }
        // SAFETY: every element of both halves was written.
        let out = unsafe { crate::cpu::assume_init(out) };
        let mut shape = vec![2];
        shape.extend_from_slice(x.shape());
        Tensor::from_vec(out, &shape)
    }

    fn backward(&self, _inputs: &[Tensor], _output: &Tensor, _grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        Err(invalid("silu_mul", "no second derivative".to_string()))
    }
}

simd_dispatch!(silu_mul_f32(x: &[f32], u: &[f32], out: &mut [MaybeUninit<f32>]) {
    for ((o, &x), &u) in out.iter_mut().zip(x).zip(u) {
        // silu as linear_act's epilogue computes it, then the product as mul does
        let silu = x * sigmoid_f32(x);
        o.write(silu * u);
    }
});

simd_dispatch!(silu_mul_backward_f32(x: &[f32], u: &[f32], g: &[f32], dx: &mut [MaybeUninit<f32>], du: &mut [MaybeUninit<f32>]) {
    for ((((dx, du), &x), &u), &g) in dx.iter_mut().zip(du.iter_mut()).zip(x).zip(u).zip(g) {
        let s = sigmoid_f32(x);
        // mul's gradient of silu(x), then the activation's backward: g' * act'(x)
        let g_silu = g * u;
        dx.write(g_silu * (s * (1.0 + x * (1.0 - s))));
        // mul's gradient of up: g * silu(x)
        du.write(g * (x * s));
    }
});
