//! Rotation of the two halves of each row by tables (rotary position embeddings in Hugging
//! Face's `rotate_half` layout): `y = x * cos + swap_halves(x) * sin`, one pass forward and one
//! backward.
//!
//! It is a custom [`Function`] rather than an op of the op set: on CPU its forward and backward
//! each run one kernel; anywhere else (a GPU tensor, bf16 or f16 data, an ONNX export that
//! inlines functions, layouts the kernel does not take) they run the composition of narrow, cat,
//! mul and add, whose results the kernel equals bit for bit (the same products and sums, in f32
//! or f64, no fused multiply-add). Compiled mode records the function as one node and replays it
//! through the same code; an export records the composition, which every backend and ONNX
//! already know. No backend needs a kernel of its own.

use std::sync::Arc;

use crate::cpu::elementwise::simd_dispatch;
use crate::error::{invalid, Result};
use crate::function::Function;
use crate::layout::Layout;
use crate::storage::StorageElement;
use crate::tensor::Tensor;
use crate::{DType, Device, Float};

impl Tensor {
    /// `self * cos + swap_halves(self) * sin`, where `swap_halves` exchanges the first and second
    /// halves of the last dim: rotary position embeddings with `sin` signed as `[-sin, sin]`
    /// (`rotate_half(x) * sin == swap_halves(x) * signed_sin`). `cos` and `sin` broadcast to
    /// `self`'s shape and get no gradient.
    /// # Shapes
    /// `self` `[..., D]` (`D` even), `cos`, `sin` broadcastable to it -> `self`'s shape.
    pub fn rotate_halves(&self, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let d = self.dim(-1)?;
        if !d.is_multiple_of(2) {
            return Err(invalid(
                "rotate_halves",
                format!("the last dim must be even, got {:?}", self.shape()),
            ));
        }
        for (name, table) in [("cos", cos), ("sin", sin)] {
            if table.layout().expand(self.shape()).is_err() {
                return Err(invalid(
                    "rotate_halves",
                    format!(
                        "{name} {:?} does not broadcast to the input's shape {:?}",
                        table.shape(),
                        self.shape()
                    ),
                ));
            }
        }
        Tensor::apply_function(Arc::new(RotateHalves { transposed: false }), &[self, cos, sin])
    }
}

/// `x` with the two halves of its last dim exchanged.
fn swap_halves(x: &Tensor) -> Result<Tensor> {
    let half = x.dim(-1)? / 2;
    Tensor::cat(&[&x.narrow(-1, half, half)?, &x.narrow(-1, 0, half)?], -1)
}

/// The rotation (`transposed: false`, `y = x cos + swap(x) sin`) or its transpose, the gradient
/// map (`transposed: true`, `y = x cos + swap(x sin)`; `swap` is its own transpose). Each is the
/// other's backward. Inputs `(x, cos, sin)`.
struct RotateHalves {
    transposed: bool,
}

impl Function for RotateHalves {
    fn name(&self) -> &'static str {
        "rotary"
    }

    fn forward(&self, inputs: &[&Tensor]) -> Result<Tensor> {
        let (x, cos, sin) = (inputs[0], inputs[1], inputs[2]);
        if let Some(y) = cpu_rotate(x, cos, sin, self.transposed)? {
            return Ok(y);
        }
        if self.transposed {
            x.mul(cos)?.add(&swap_halves(&x.mul(sin)?)?)
        } else {
            x.mul(cos)?.add(&swap_halves(x)?.mul(sin)?)
        }
    }

    fn backward_reads(&self) -> crate::BackwardReads {
        // the cos and sin tables
        crate::BackwardReads::inputs(&[1, 2])
    }

    fn backward(&self, inputs: &[Tensor], _output: &Tensor, grad: &Tensor) -> Result<Vec<Option<Tensor>>> {
        let f = Arc::new(RotateHalves {
            transposed: !self.transposed,
        });
        Ok(vec![
            Some(Tensor::apply_function(f, &[grad, &inputs[1], &inputs[2]])?),
            None,
            None,
        ])
    }
}

/// Row starts of a `[..., D]` layout's rows, in row-major order.
fn row_starts(l: &Layout) -> Result<Vec<usize>> {
    let r = l.rank();
    Layout {
        shape: l.shape[..r - 1].to_vec(),
        strides: l.strides[..r - 1].to_vec(),
        offset: l.offset,
    }
    .offsets("rotary")
}

/// The rotation computed by the CPU kernel, or `None` where the composition runs instead: off
/// the CPU, dtypes other than f32 and f64 (or mixed), an export inlining functions (it records
/// the composition's ops), a last dim not contiguous in any input.
fn cpu_rotate(x: &Tensor, cos: &Tensor, sin: &Tensor, transposed: bool) -> Result<Option<Tensor>> {
    let dtype = x.dtype();
    let on_cpu = [x, cos, sin].iter().all(|t| t.device() == Device::Cpu);
    if !on_cpu || !matches!(dtype, DType::F32 | DType::F64) || cos.dtype() != dtype || sin.dtype() != dtype {
        return Ok(None);
    }
    if crate::graph::inlining() || x.rank() == 0 || x.numel() == 0 {
        return Ok(None);
    }
    let (Ok(cl), Ok(sl)) = (cos.layout().expand(x.shape()), sin.layout().expand(x.shape())) else {
        return Ok(None);
    };
    let xl = x.layout();
    let r = xl.rank();
    if [xl, &cl, &sl].iter().any(|l| l.strides[r - 1] != 1) {
        return Ok(None);
    }
    let d = xl.shape[r - 1];
    let (xo, co, so) = (row_starts(xl)?, row_starts(&cl)?, row_starts(&sl)?);
    crate::float_dispatch!(dtype, T => {
        let (xg, cg, sg) = (x.storage().read(), cos.storage().read(), sin.storage().read());
        let (Some(xs), Some(cs), Some(ss)) = (T::slice(&xg), T::slice(&cg), T::slice(&sg)) else {
            return Ok(None);
        };
        let mut out = crate::alloc::uninit::<T>("rotary", x.numel())?;
        let rows = xo.len();
        let chunk_rows = if x.numel() < crate::cpu::PARALLEL_THRESHOLD {
            rows
        } else {
            rows.div_ceil(crate::cpu::threads::num_threads() * 4).max(4096usize.div_ceil(d))
        };
        let src = Src { x: xs, xo: &xo, c: cs, co: &co, s: ss, so: &so, d, transposed };
        crate::cpu::pool::for_each_chunk(&mut out, chunk_rows * d, |task, chunk| {
            rotate_rows(&src, task * chunk_rows, chunk);
        });
        drop((xg, cg, sg));
        // SAFETY: every row of the output was written.
        let out = unsafe { crate::cpu::assume_init(out) };
        Ok(Some(Tensor::from_vec(out, x.shape())?))
    })
}

/// The kernel's inputs: `x`, `cos` and `sin` in their storages, each row's start, the row length.
struct Src<'a, T> {
    x: &'a [T],
    xo: &'a [usize],
    c: &'a [T],
    co: &'a [usize],
    s: &'a [T],
    so: &'a [usize],
    d: usize,
    transposed: bool,
}

/// Rows `first..` of the rotation into `out` (whole rows). Forward, with halves `lo`, `hi`:
/// `y_lo = x_lo c_lo + x_hi s_lo`, `y_hi = x_hi c_hi + x_lo s_hi`; transposed:
/// `y_lo = x_lo c_lo + x_hi s_hi`, `y_hi = x_hi c_hi + x_lo s_lo` (the composition's products
/// and sums, element by element).
#[inline(always)]
fn rotate_rows_generic<T: Float>(src: &Src<'_, T>, first: usize, out: &mut [std::mem::MaybeUninit<T>]) {
    let (d, h) = (src.d, src.d / 2);
    for (i, o) in out.chunks_exact_mut(d).enumerate() {
        let row = first + i;
        let x = &src.x[src.xo[row]..][..d];
        let c = &src.c[src.co[row]..][..d];
        let s = &src.s[src.so[row]..][..d];
        let (xl, xh) = x.split_at(h);
        let (cl, ch) = c.split_at(h);
        let (sl, sh) = s.split_at(h);
        let (s_for_lo, s_for_hi) = if src.transposed { (sh, sl) } else { (sl, sh) };
        let (ol, oh) = o.split_at_mut(h);
        for j in 0..h {
            ol[j].write(xl[j] * cl[j] + xh[j] * s_for_lo[j]);
        }
        for j in 0..h {
            oh[j].write(xh[j] * ch[j] + xl[j] * s_for_hi[j]);
        }
    }
}

simd_dispatch!(rotate_rows_f32(src: &Src<'_, f32>, first: usize, out: &mut [std::mem::MaybeUninit<f32>]) {
    rotate_rows_generic(src, first, out)
});

/// [`rotate_rows_generic`], vectorized for f32.
trait RotateRows: Float {
    fn rotate_rows(src: &Src<'_, Self>, first: usize, out: &mut [std::mem::MaybeUninit<Self>]);
}

impl RotateRows for f32 {
    fn rotate_rows(src: &Src<'_, f32>, first: usize, out: &mut [std::mem::MaybeUninit<f32>]) {
        rotate_rows_f32(src, first, out)
    }
}

impl RotateRows for f64 {
    fn rotate_rows(src: &Src<'_, f64>, first: usize, out: &mut [std::mem::MaybeUninit<f64>]) {
        rotate_rows_generic(src, first, out)
    }
}

fn rotate_rows<T: RotateRows>(src: &Src<'_, T>, first: usize, out: &mut [std::mem::MaybeUninit<T>]) {
    T::rotate_rows(src, first, out)
}
