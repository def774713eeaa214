//! Gradient-accumulation fusion: a weight's gradient product added straight into the gradient
//! its parameter already holds from earlier micro-batches of the step (Megatron-LM's
//! "gradient-accumulation fusion"), instead of into a new tensor that a pass of its own then
//! adds (read both, write the sum: 12 bytes a parameter in f32).
//!
//! Autograd ([`crate::autograd`]) offers a [`Sink`] for an input of a product (`Op::Matmul`,
//! `Op::Linear`'s weight) that reaches a parameter only through a transpose and/or an autocast
//! cast, when the parameter already has a gradient that nothing else holds, or when the input
//! is autocast's lower-precision copy of the parameter; the op's backward then calls
//! [`Sink::take_product`] with the two operands of that input's gradient, and leaves the
//! gradient out of its results when the sink took it.
//!
//! Under autocast a weight gradient taken by a sink is not rounded to bf16 on its way to the
//! f32 parameter (Megatron-LM's fused accumulation does the same): the product accumulates in
//! f32 and is rounded once, to f32. So that eager and compiled steps, and the first micro-batch
//! and later ones, agree, a copy's gradient always goes this way, in place or not.

use std::cell::{Cell, RefCell};

use crate::cpu::matmul::{gemm_parallel_then, Block, MatMut, MatRef};
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;

/// Where the gradient of one input of a product goes, when autograd routes it straight to the
/// parameter behind the input (reached `transposed` or not, through at most a transpose and a
/// cast): added in place into `dst`, the parameter's accumulated gradient (contiguous, held by
/// nothing else), where there is one; otherwise, when the input is a lower-precision copy of
/// the parameter (autocast's), made in the parameter's `dtype` straight from the low-precision
/// operands ([`Tensor::wide_matmul`]), not rounded to the copy's dtype first.
pub(crate) struct Sink {
    dst: Option<Tensor>,
    dtype: DType,
    transposed: bool,
    added: Cell<bool>,
    made: RefCell<Option<Tensor>>,
}

impl Sink {
    pub(crate) fn new(dst: Option<Tensor>, dtype: DType, transposed: bool) -> Sink {
        Sink {
            dst,
            dtype,
            transposed,
            added: Cell::new(false),
            made: RefCell::new(None),
        }
    }

    /// Whether a backward added its gradient into `dst`.
    pub(crate) fn added(&self) -> bool {
        self.added.get()
    }

    /// The parameter's accumulated gradient (with this product's added where [`Sink::added`])
    /// and the gradient made in the parameter's dtype instead, if one was.
    pub(crate) fn into_parts(self) -> (Option<Tensor>, Option<Tensor>) {
        (self.dst, self.made.into_inner())
    }

    /// Takes the input's gradient `a [M, K] @ b [K, N]` (2-D views, any strides; its transpose
    /// where the input is the parameter's transpose): adds it into `dst` in place, or makes it
    /// in the parameter's dtype. Returns false, touching nothing, where it does neither (shapes,
    /// dtypes or devices this does not handle, or an input of the parameter's own dtype with no
    /// `dst`); the caller then makes the gradient as usual.
    pub(crate) fn take_product(&self, a: &Tensor, b: &Tensor) -> Result<bool> {
        if self.added.get() || self.made.borrow().is_some() {
            return Ok(false);
        }
        if let Some(dst) = &self.dst {
            if add_product_into(dst, a, b, self.transposed)? {
                self.added.set(true);
                return Ok(true);
            }
        }
        let wide = self.dtype == DType::F32 && matches!(a.dtype(), DType::BF16 | DType::F16);
        if wide && a.rank() == 2 && b.rank() == 2 {
            // the product in the orientation the op's own formula makes it, then transposed as
            // the transpose's backward would (the same bits as the ops it stands for)
            let p = a.wide_matmul(b)?;
            *self.made.borrow_mut() = Some(if self.transposed { p.t()? } else { p });
            return Ok(true);
        }
        Ok(false)
    }
}

/// Offers `sink` (when there is one) the gradient `a @ b`; the gradient itself when the sink
/// did not take it, `None` when it did.
pub(crate) fn product_or_sink(sink: Option<&Sink>, a: &Tensor, b: &Tensor) -> Result<Option<Tensor>> {
    if let Some(s) = sink {
        if s.take_product(a, b)? {
            return Ok(None);
        }
    }
    a.matmul(b).map(Some)
}

/// `prev + g`, autograd's sum of two gradients of one tensor: added into `prev`'s own buffer
/// where nothing else can see it (a CPU f32 or f64 tensor whose handle and storage only autograd
/// holds, contiguous from the storage's start, of `g`'s dtype and shape; not while a graph is
/// being captured, whose tracer records ops, not writes in place), saving a new buffer and the
/// first writes to it; otherwise `prev.add(g)`. The same bits either way (`prev` + `g`, element
/// by element).
pub(crate) fn sum_gradients(prev: Tensor, g: &Tensor) -> Result<Tensor> {
    let alone = std::sync::Arc::strong_count(&prev.0) == 1 && std::sync::Arc::strong_count(prev.storage()) == 1;
    let in_place = alone
        && !crate::graph::recording()
        && prev.device() == crate::Device::Cpu
        && g.device() == crate::Device::Cpu
        && prev.dtype() == g.dtype()
        && prev.shape() == g.shape()
        && prev.is_contiguous()
        && prev.layout().offset == 0
        && !prev.is_backward_handle();
    if in_place {
        let added = match prev.dtype() {
            DType::F32 => add_into::<f32>(&prev, g)?,
            DType::F64 => add_into::<f64>(&prev, g)?,
            _ => false,
        };
        if added {
            return Ok(prev);
        }
    }
    prev.add(g)
}

/// `dst += src` in `dst`'s storage, which must hold exactly `src`'s elements; false (nothing
/// written) where it does not.
fn add_into<T>(dst: &Tensor, src: &Tensor) -> Result<bool>
where
    T: crate::storage::StorageElement + Copy + std::ops::AddAssign + Send + Sync,
{
    let src = src.contig::<T>("gradient accumulation")?;
    let mut guard = dst.storage().write();
    let Some(d) = T::slice_mut(&mut guard) else {
        return Ok(false);
    };
    if d.len() != src.len() {
        return Ok(false);
    }
    crate::cpu::elementwise::add_assign(d, &src);
    Ok(true)
}

/// `dst += a [M, K] @ b [K, N]` (`dst [M, N]`; `[N, M]` and the product's transpose when
/// `transposed`) in place on `dst`'s device. Handled: f32 or f64 `dst` with operands of its
/// dtype, and f32 `dst` with bf16 operands (autocast's copies: the product accumulates in f32 and
/// is not rounded to bf16). Returns false otherwise.
///
/// On the CPU the product is made exactly as the op's own formula makes it (the same kernel,
/// sizes and strides, so the same bits), each task's block into a scratch matrix and added into
/// `dst` by the same task right after, while the block is in its core's cache: the result is
/// bit for bit what making the gradient and adding it would give, without the new gradient
/// tensor and the pass over it. On a GPU it is one cuBLAS call with beta 1.
fn add_product_into(dst: &Tensor, a: &Tensor, b: &Tensor, transposed: bool) -> Result<bool> {
    if dst.rank() != 2 || a.rank() != 2 || b.rank() != 2 || !dst.is_contiguous() {
        return Ok(false);
    }
    let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    let want = if transposed { [n, m] } else { [m, n] };
    if b.shape()[0] != k || dst.shape() != want || m == 0 || n == 0 || k == 0 {
        return Ok(false);
    }
    let operands = a.dtype() == b.dtype()
        && match dst.dtype() {
            DType::F32 => matches!(a.dtype(), DType::F32 | DType::BF16),
            DType::F64 => a.dtype() == DType::F64,
            _ => false,
        };
    let device = dst.device();
    if !operands || a.device() != device || b.device() != device {
        return Ok(false);
    }
    for t in [dst, a, b] {
        t.check_not_released("gradient accumulation")?;
    }
    if device != crate::Device::Cpu {
        return match transposed {
            false => crate::cuda::add_product_into(dst, a, b),
            true => crate::cuda::add_product_into(dst, &b.t()?, &a.t()?),
        };
    }
    match (dst.dtype(), a.dtype()) {
        (DType::F32, DType::F32) => cpu_add_product::<f32, f32>(dst, a, b, transposed, |m, n, k, d, a, b, then| {
            // SAFETY: `cpu_add_product` hands over operands and an output valid for these sizes.
            unsafe { gemm_parallel_then(m, n, k, d, a, b, 1.0, 1.0, then) }
        }),
        (DType::F64, DType::F64) => cpu_add_product::<f64, f64>(dst, a, b, transposed, |m, n, k, d, a, b, then| {
            // SAFETY: as above.
            unsafe { gemm_parallel_then(m, n, k, d, a, b, 1.0, 1.0, then) }
        }),
        (DType::F32, DType::BF16) if crate::cpu::bf16_gemm::available() => {
            cpu_add_product::<half::bf16, f32>(dst, a, b, transposed, |m, n, k, d, a, b, then| {
                // SAFETY: the kernel is available (checked above); operands and output as above.
                unsafe { crate::cpu::bf16_gemm::gemm_parallel_then(m, n, k, d, a, b, then) }
            })
        }
        (DType::F32, DType::BF16) => {
            // no native bf16 products: the operands widened to f32 first (exactly), as
            // `Op::WideMatmul` does
            let (a, b) = (a.cast(DType::F32)?, b.cast(DType::F32)?);
            add_product_into(dst, &a, &b, transposed)
        }
        _ => Ok(false),
    }
}

/// A block of the product, handed to the task that made it.
type Then<'a, O> = &'a (dyn Fn(Block<O>) + Sync);

/// `dst += a @ b` (or its transpose) on the CPU: `product(m, n, k, scratch, a, b, then)`
/// overwrites `scratch` and runs `then` on each block it finishes, which adds the block into
/// `dst`.
#[allow(clippy::type_complexity)]
fn cpu_add_product<I, O>(
    dst: &Tensor,
    a: &Tensor,
    b: &Tensor,
    transposed: bool,
    product: impl Fn(usize, usize, usize, MatMut<O>, MatRef<I>, MatRef<I>, Then<'_, O>),
) -> Result<bool>
where
    I: crate::storage::StorageElement,
    O: crate::storage::StorageElement + std::ops::AddAssign + Default + Send + Sync + 'static,
{
    let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    let (la, lb) = (a.layout(), b.layout());
    let (ga, gb) = (a.storage().read(), b.storage().read());
    let (sa, sb) = (
        super::matmul::strided_slice::<I>("gradient accumulation", a, &ga)?,
        super::matmul::strided_slice::<I>("gradient accumulation", b, &gb)?,
    );
    let mut gd = dst.storage().write();
    let Some(sd) = O::slice_mut(&mut gd) else {
        return Ok(false);
    };
    let offset = dst.layout().offset;
    if sd.len() < offset + m * n {
        return Ok(false);
    }
    let mut scratch = crate::alloc::uninit::<O>("gradient accumulation", m * n)?;
    let base = SendPtr(scratch.as_mut_ptr() as *const O);
    let out = SendPtr(sd[offset..].as_mut_ptr() as *const O);
    let add = |blk: Block<O>| {
        // SAFETY: the block's rows, which its gemm wrote just before; its elements of `dst` (the
        // same positions, or the transposed ones) belong to this block alone, and `dst` holds
        // m x n elements from `out` (checked above).
        unsafe {
            let at = blk.ptr.offset_from(base.get()) as usize;
            let (i0, j0) = (at / n, at % n);
            let row = |r: usize| blk.ptr.offset(r as isize * blk.row_stride) as *const O;
            let out = out.get() as *mut O;
            if !transposed {
                for r in 0..blk.rows {
                    let src = std::slice::from_raw_parts(row(r), blk.cols);
                    let d = std::slice::from_raw_parts_mut(out.add((i0 + r) * n + j0), blk.cols);
                    for (o, &v) in d.iter_mut().zip(src) {
                        *o += v;
                    }
                }
                return;
            }
            // element (i, j) of the product goes to dst[j, i]: a tile at a time, transposed
            // into `tile` (16 x 16 register blocks for f32) and added along dst's rows
            const TILE: usize = 64;
            let mut tile = vec![O::default(); TILE * TILE];
            for r0 in (0..blk.rows).step_by(TILE) {
                let rs = TILE.min(blk.rows - r0);
                for c0 in (0..blk.cols).step_by(TILE) {
                    let cs = TILE.min(blk.cols - c0);
                    let src = std::slice::from_raw_parts(row(r0).add(c0), (rs - 1) * blk.row_stride as usize + cs);
                    crate::cpu::transpose::transpose(src, blk.row_stride as usize, rs, cs, &mut tile, rs);
                    for c in 0..cs {
                        let d = std::slice::from_raw_parts_mut(out.add((j0 + c0 + c) * m + i0 + r0), rs);
                        for (o, &v) in d.iter_mut().zip(&tile[c * rs..c * rs + rs]) {
                            *o += v;
                        }
                    }
                }
            }
        }
    };

    let d = MatMut {
        ptr: scratch.as_mut_ptr() as *mut O,
        row_stride: n as isize,
        accumulate: false,
    };
    let a = MatRef {
        ptr: sa[la.offset..].as_ptr(),
        row_stride: la.strides[0] as isize,
        col_stride: la.strides[1] as isize,
    };
    let b = MatRef {
        ptr: sb[lb.offset..].as_ptr(),
        row_stride: lb.strides[0] as isize,
        col_stride: lb.strides[1] as isize,
    };
    // the layouts describe valid [M, K] and [K, N] views of their storages (checked by
    // `strided_slice`); the scratch holds M x N elements, each written by the gemm before
    // its block is handed to `add`
    product(m, n, k, d, a, b, &add);
    Ok(true)
}

/// A raw pointer the product's tasks share; each touches only its own block's elements.
struct SendPtr<T>(*const T);
// SAFETY: see `cpu_add_product`: tasks write disjoint elements.
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}
impl<T> SendPtr<T> {
    fn get(&self) -> *const T {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[f32]) -> Tensor {
        Tensor::from_vec(v.to_vec(), &[v.len()]).unwrap()
    }

    #[test]
    fn a_gradient_only_autograd_holds_is_summed_in_its_own_buffer() {
        let (prev, g) = (t(&[1.0, 2.0, 3.0]), t(&[0.5, 0.25, -1.0]));
        let before = prev.storage().clone();
        // the handle `before` holds on the storage is the kind of sharing that must prevent the
        // in-place sum; drop it after taking the address
        let addr = std::sync::Arc::as_ptr(&before);
        drop(before);
        let sum = sum_gradients(prev, &g).unwrap();
        assert_eq!(std::sync::Arc::as_ptr(sum.storage()), addr, "summed into a new buffer");
        assert_eq!(sum.to_vec::<f32>().unwrap(), vec![1.5, 2.25, 2.0]);
    }

    #[test]
    fn a_gradient_shared_with_a_view_or_another_handle_is_left_alone() {
        // a view of its storage
        let prev = t(&[1.0, 2.0, 3.0]);
        let view = prev.narrow(0, 1, 2).unwrap();
        let sum = sum_gradients(prev, &t(&[1.0, 1.0, 1.0])).unwrap();
        assert!(!sum.same_storage(&view));
        assert_eq!(view.to_vec::<f32>().unwrap(), vec![2.0, 3.0]);
        assert_eq!(sum.to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0]);
        // another handle of the tensor
        let prev = t(&[1.0, 2.0]);
        let other = prev.clone();
        let sum = sum_gradients(prev, &t(&[1.0, 1.0])).unwrap();
        assert!(!sum.same_storage(&other));
        assert_eq!(other.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
        // a view that starts inside its storage, and another dtype: new tensors
        let base = t(&[1.0, 2.0, 3.0]);
        let tail = base.narrow(0, 1, 2).unwrap().contiguous().unwrap();
        assert_eq!(
            sum_gradients(tail, &t(&[1.0, 1.0])).unwrap().to_vec::<f32>().unwrap(),
            vec![3.0, 4.0]
        );
        let half = t(&[1.0, 2.0]).cast(DType::BF16).unwrap();
        let g = t(&[1.0, 1.0]).cast(DType::BF16).unwrap();
        assert_eq!(sum_gradients(half, &g).unwrap().to_vec_f64(), vec![2.0, 3.0]);
    }
}
