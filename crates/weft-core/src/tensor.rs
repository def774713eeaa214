//! [`Tensor`]: shared storage plus a layout, a dtype, and (when it takes part in autograd) the node
//! that produced it.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::autograd::{GradHook, Node};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::op::Op;
use crate::shape::numel;
use crate::storage::{CpuStorage, Storage, StorageElement};
use crate::Device;

static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

/// A unique, increasing id per tensor; autograd processes larger ids (newer tensors) first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub(crate) usize);

/// The id the next tensor made will get (every tensor made from now on has this id or a larger one).
pub(crate) fn next_tensor_id() -> TensorId {
    TensorId(NEXT_ID.load(Ordering::Relaxed))
}

pub(crate) struct TensorInner {
    pub(crate) id: TensorId,
    pub(crate) storage: Arc<Storage>,
    pub(crate) layout: Layout,
    pub(crate) dtype: DType,
    pub(crate) requires_grad: AtomicBool,
    /// What produced this tensor (non-leaves); shared with the tensor's backward handle
    /// ([`Tensor::backward_handle`]).
    pub(crate) node: Option<Arc<Node>>,
    pub(crate) grad: Mutex<Option<Tensor>>,
    /// Grad-ready hooks, shared with the tensor's backward handle.
    pub(crate) hooks: Arc<Mutex<Vec<GradHook>>>,
}

/// An n-dimensional array. Cloning is cheap (a reference count); clones share data and gradient.
#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<TensorInner>);

impl Tensor {
    pub(crate) fn build(storage: Arc<Storage>, layout: Layout, dtype: DType, node: Option<Node>) -> Tensor {
        let requires_grad = node.is_some();
        Tensor(Arc::new(TensorInner {
            id: TensorId(NEXT_ID.fetch_add(1, Ordering::Relaxed)),
            storage,
            layout,
            dtype,
            requires_grad: AtomicBool::new(requires_grad),
            node: node.map(Arc::new),
            grad: Mutex::new(None),
            hooks: Arc::new(Mutex::new(Vec::new())),
        }))
    }

    /// An error when this is a backward handle, whose elements autograd let go: a backward
    /// formula read an input its op's [`crate::BackwardReads`] says it does not.
    pub(crate) fn check_not_released(&self, op: &'static str) -> Result<()> {
        if self.0.storage.is_released() {
            return Err(Error::Autograd(format!(
                "{op}: reads the elements of a tensor of shape {:?} that autograd did not keep (an op's \
                 backward reads more than its backward_reads says)",
                self.shape()
            )));
        }
        Ok(())
    }

    /// Whether this is a backward handle ([`Tensor::backward_handle`]).
    pub(crate) fn is_backward_handle(&self) -> bool {
        self.0.storage.is_released()
    }

    /// This tensor as autograd's graph needs it when no backward formula reads its elements:
    /// the same id, shape, dtype, device, node and hooks, over an empty storage. A node keeps
    /// this in place of an input whose data its backward does not read, so that the input's
    /// buffer is freed when nothing else holds it (what PyTorch's saved-tensor rule does).
    /// Reading its elements is an error ([`Tensor::check_not_released`]). Its `requires_grad`
    /// is the tensor's when the op was recorded (as PyTorch's graph edges are fixed then).
    pub(crate) fn backward_handle(&self) -> Tensor {
        Tensor(Arc::new(TensorInner {
            id: self.0.id,
            storage: Arc::new(Storage::released(self.dtype(), self.device())),
            layout: self.0.layout.clone(),
            dtype: self.0.dtype,
            requires_grad: AtomicBool::new(self.requires_grad()),
            node: self.0.node.clone(),
            grad: Mutex::new(None),
            hooks: self.0.hooks.clone(),
        }))
    }

    /// A contiguous tensor owning `data` (which must hold `numel(shape)` elements).
    pub(crate) fn from_storage(data: CpuStorage, shape: &[usize]) -> Tensor {
        debug_assert_eq!(data.len(), numel(shape));
        let dtype = data.dtype();
        Tensor::build(Arc::new(Storage::new(data)), Layout::contiguous(shape), dtype, None)
    }

    /// A contiguous tensor owning a GPU buffer (which must hold `numel(shape)` elements).
    #[cfg(feature = "cuda")]
    pub(crate) fn from_gpu(buffer: crate::cuda::Buffer, shape: &[usize]) -> Tensor {
        debug_assert_eq!(buffer.len(), numel(shape));
        let dtype = buffer.dtype();
        Tensor::build(
            Arc::new(Storage::on_gpu(buffer)),
            Layout::contiguous(shape),
            dtype,
            None,
        )
    }

    /// The GPU buffer under this tensor, when it lives on a GPU.
    #[cfg(feature = "cuda")]
    pub(crate) fn gpu_buffer(&self) -> Option<&crate::cuda::Buffer> {
        self.0.storage.gpu_buffer()
    }

    /// A host copy of this tensor when it lives on a GPU (`None` on the CPU): what the host
    /// accessors (`to_vec`, `item`, `Debug`, ...) read.
    fn host_copy(&self, op: &'static str) -> Result<Option<Tensor>> {
        self.check_not_released(op)?;
        #[cfg(feature = "cuda")]
        if self.device().is_cuda() {
            return Ok(Some(crate::cuda::to_device(self, Device::Cpu)?));
        }
        Ok(None)
    }

    /// This tensor on `device` (itself when it is there already), differentiable: the gradient
    /// goes back to the source's device. `device` must exist (`crate::cuda::check`).
    pub fn to(&self, device: Device) -> Result<Tensor> {
        if self.device() == device {
            return Ok(self.clone());
        }
        crate::cuda::check(device)?;
        crate::ops::apply(Op::ToDevice(device), &[self])
    }

    /// The same contiguous storage under another shape of equal size, with no autograd node.
    pub(crate) fn reshape_raw(&self, shape: &[usize]) -> Tensor {
        debug_assert!(self.is_contiguous() && numel(shape) == self.numel());
        self.with_layout(Layout {
            shape: shape.to_vec(),
            strides: crate::shape::contiguous_strides(shape),
            offset: self.0.layout.offset,
        })
    }

    /// A view of this tensor's storage with another layout, with no autograd node.
    pub(crate) fn with_layout(&self, layout: Layout) -> Tensor {
        Tensor::build(self.0.storage.clone(), layout, self.0.dtype, None)
    }

    /// A tensor from a `Vec` and a shape.
    pub fn from_vec<T: StorageElement>(data: Vec<T>, shape: &[usize]) -> Result<Tensor> {
        if data.len() != numel(shape) {
            return Err(crate::error::invalid(
                "from_vec",
                format!(
                    "{} elements cannot have shape {shape:?} ({} elements)",
                    data.len(),
                    numel(shape)
                ),
            ));
        }
        Ok(Tensor::from_storage(T::wrap(data), shape))
    }

    /// A 0-d tensor.
    pub fn scalar<T: StorageElement>(v: T) -> Tensor {
        Tensor::from_storage(T::wrap(vec![v]), &[])
    }

    pub fn id(&self) -> TensorId {
        self.0.id
    }

    pub fn shape(&self) -> &[usize] {
        &self.0.layout.shape
    }

    /// Size of one dim (negative counts from the end).
    pub fn dim(&self, dim: isize) -> Result<usize> {
        let d = crate::shape::resolve_dim("dim", dim, self.rank())?;
        Ok(self.shape()[d])
    }

    pub fn rank(&self) -> usize {
        self.0.layout.rank()
    }

    pub fn numel(&self) -> usize {
        self.0.layout.numel()
    }

    pub fn dtype(&self) -> DType {
        self.0.dtype
    }

    pub fn device(&self) -> Device {
        self.0.storage.device()
    }

    pub fn layout(&self) -> &Layout {
        &self.0.layout
    }

    pub fn strides(&self) -> &[usize] {
        &self.0.layout.strides
    }

    pub fn is_contiguous(&self) -> bool {
        self.0.layout.is_contiguous()
    }

    /// The shared storage (for in-place updates by optimizers and collectives).
    pub fn storage(&self) -> &Arc<Storage> {
        &self.0.storage
    }

    /// True when both tensors view the same storage.
    pub fn same_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0.storage, &other.0.storage)
    }

    /// The op that produced this tensor, if it was recorded for autograd.
    pub fn op(&self) -> Option<&Op> {
        self.0.node.as_ref().map(|n| &n.op)
    }

    /// The elements in row-major order. The dtype must be `T`'s.
    pub fn to_vec<T: StorageElement>(&self) -> Result<Vec<T>> {
        crate::graph::host_access(self, false, "to_vec");
        if let Some(h) = self.host_copy("to_vec")? {
            return h.to_vec();
        }
        let guard = self.0.storage.read();
        let data = T::slice(&guard).ok_or(Error::DTypeMismatch {
            op: "to_vec",
            lhs: self.dtype(),
            rhs: T::DTYPE,
        })?;
        crate::storage::gather_slice("to_vec", data, &self.0.layout)
    }

    /// The elements converted to f64, in row-major order (any dtype). Allocates as `Vec` does
    /// (aborting when memory runs out): for small tensors, logs and tests;
    /// [`Tensor::try_to_vec_f64`] fails instead.
    pub fn to_vec_f64(&self) -> Vec<f64> {
        crate::graph::host_access(self, false, "to_vec_f64");
        if let Ok(Some(h)) = self.host_copy("to_vec_f64") {
            return h.to_vec_f64();
        }
        let mut out = Vec::with_capacity(self.numel());
        self.extend_f64(&mut out);
        out
    }

    /// [`Tensor::to_vec_f64`], with an [`Error::OutOfMemory`] when the buffer cannot be allocated.
    pub fn try_to_vec_f64(&self) -> Result<Vec<f64>> {
        crate::graph::host_access(self, false, "to_vec_f64");
        if let Some(h) = self.host_copy("to_vec_f64")? {
            return h.try_to_vec_f64();
        }
        let mut out = crate::alloc::with_capacity("to_vec_f64", self.numel())?;
        self.extend_f64(&mut out);
        Ok(out)
    }

    /// Appends the elements converted to f64, in row-major order.
    fn extend_f64(&self, out: &mut Vec<f64>) {
        let guard = self.0.storage.read();
        crate::with_storage!(&*guard, v => self.0.layout.for_each_row(|start, stride, len| {
            out.extend((0..len).map(|i| crate::Element::to_f64(v[start + i * stride])))
        }))
    }

    /// The value of a one-element tensor as f64.
    pub fn item(&self) -> Result<f64> {
        if self.numel() != 1 {
            return Err(crate::error::invalid(
                "item",
                format!(
                    "tensor of shape {:?} has {} elements, not 1",
                    self.shape(),
                    self.numel()
                ),
            ));
        }
        Ok(self.try_to_vec_f64()?[0])
    }

    /// A contiguous copy of this tensor's elements as a `CpuStorage` (no copy of a view's
    /// surroundings; `offset` 0). An [`Error::OutOfMemory`] naming `op` when it cannot be
    /// allocated.
    pub fn contiguous_storage(&self, op: &'static str) -> Result<CpuStorage> {
        if let Some(h) = self.host_copy(op)? {
            return h.contiguous_storage(op);
        }
        let guard = self.0.storage.read();
        if self.is_contiguous() && self.0.layout.offset == 0 && guard.len() == self.numel() {
            return guard.try_clone(op);
        }
        guard.gather(op, &self.0.layout)
    }

    /// This tensor's elements converted to `dtype` in a new contiguous buffer (one pass from the
    /// storage when the tensor covers it, a gathered copy first otherwise); `op` is named when a
    /// buffer cannot be allocated.
    pub(crate) fn cast_storage(&self, op: &'static str, dtype: DType) -> Result<CpuStorage> {
        if let Some(h) = self.host_copy(op)? {
            return h.cast_storage(op, dtype);
        }
        let guard = self.0.storage.read();
        if self.is_contiguous() && self.0.layout.offset == 0 && guard.len() == self.numel() {
            return guard.cast(op, dtype);
        }
        let data = guard.gather(op, &self.0.layout)?;
        if data.dtype() == dtype {
            return Ok(data);
        }
        data.cast(op, dtype)
    }

    /// Runs `f` on the elements as a row-major slice (borrowed when the tensor is contiguous, a
    /// copy otherwise). Fails when the dtype is not `T`'s.
    pub fn with_data<T: StorageElement, R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        crate::graph::host_access(self, false, "with_data");
        Ok(f(&self.contig::<T>("with_data")?))
    }

    /// Runs `f` on this tensor's elements in place, for fused updates (optimizer steps,
    /// collectives). Not recorded by autograd. The tensor must be contiguous and of `T`'s dtype.
    pub fn with_data_mut<T: StorageElement, R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        crate::graph::host_access(self, true, "with_data_mut");
        self.check_not_released("with_data_mut")?;
        if self.device() != Device::Cpu {
            return Err(Error::Device(format!(
                "with_data_mut: the tensor lives on {}; host code cannot update it in place",
                self.device()
            )));
        }
        let l = &self.0.layout;
        if !l.is_contiguous() {
            return Err(crate::error::invalid(
                "with_data_mut",
                format!("tensor of shape {:?} is not contiguous", l.shape),
            ));
        }
        let mut guard = self.0.storage.write();
        let dtype = guard.dtype();
        let data = T::slice_mut(&mut guard).ok_or(Error::DTypeMismatch {
            op: "with_data_mut",
            lhs: dtype,
            rhs: T::DTYPE,
        })?;
        Ok(f(&mut data[l.offset..l.offset + l.numel()]))
    }

    /// The elements as a row-major slice: borrowed from the storage when the layout is contiguous,
    /// gathered into a new buffer otherwise. Fails when the dtype is not `T`'s.
    pub(crate) fn contig<T: StorageElement>(&self, op: &'static str) -> Result<Contig<'_, T>> {
        if let Some(h) = self.host_copy(op)? {
            return Ok(Contig::Owned(h.to_vec()?));
        }
        let guard = self.0.storage.read();
        if T::slice(&guard).is_none() {
            return Err(Error::DTypeMismatch {
                op,
                lhs: self.dtype(),
                rhs: T::DTYPE,
            });
        }
        let l = &self.0.layout;
        if l.is_contiguous() {
            return Ok(Contig::Borrowed(
                guard,
                l.offset..l.offset + l.numel(),
                std::marker::PhantomData,
            ));
        }
        let v = crate::storage::gather_slice(op, T::slice(&guard).expect("checked"), l)?;
        Ok(Contig::Owned(v))
    }

    /// Overwrites this tensor's elements with `src`'s (same shape; `src` is cast to this dtype).
    /// Not recorded by autograd: for optimizer steps, initialisation and collectives.
    pub fn copy_from(&self, src: &Tensor) -> Result<()> {
        crate::graph::host_access(self, true, "copy_from");
        if src.shape() != self.shape() {
            return Err(Error::ShapeMismatch {
                op: "copy_from",
                lhs: self.shape().to_vec(),
                rhs: src.shape().to_vec(),
            });
        }
        #[cfg(feature = "cuda")]
        if self.device().is_cuda() {
            return crate::cuda::copy::copy_from(self, src);
        }
        let data = src.cast_storage("copy_from", self.dtype())?;
        let layout = self.0.layout.clone();
        let mut guard = self.0.storage.write();
        fn put<T: StorageElement>(dst: &mut CpuStorage, src: &CpuStorage, layout: &Layout) {
            let d = T::slice_mut(dst).expect("dtype checked");
            let s = T::slice(src).expect("dtype checked");
            let mut pos = 0;
            layout.for_each_row(|start, stride, len| {
                if stride == 1 {
                    d[start..start + len].copy_from_slice(&s[pos..pos + len]);
                } else {
                    for i in 0..len {
                        d[start + i * stride] = s[pos + i];
                    }
                }
                pos += len;
            });
        }
        crate::dtype_dispatch!(self.dtype(), T => put::<T>(&mut guard, &data, &layout));
        Ok(())
    }
}

/// A row-major view of a tensor's elements (see [`Tensor::contig`]).
pub(crate) enum Contig<'a, T> {
    Borrowed(
        std::sync::RwLockReadGuard<'a, CpuStorage>,
        std::ops::Range<usize>,
        std::marker::PhantomData<T>,
    ),
    Owned(Vec<T>),
}

impl<T: StorageElement> std::ops::Deref for Contig<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Contig::Borrowed(guard, range, _) => &T::slice(guard).expect("dtype checked")[range.clone()],
            Contig::Owned(v) => v,
        }
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.numel();
        write!(f, "Tensor(shape={:?}, dtype={:?}", self.shape(), self.dtype())?;
        if self.device() != Device::Cpu {
            write!(f, ", device={}", self.device())?;
        }
        if n <= 16 {
            write!(f, ", data={:?}", self.to_vec_f64())?;
        }
        if self.requires_grad() {
            write!(f, ", requires_grad")?;
        }
        write!(f, ")")
    }
}
