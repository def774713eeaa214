//! Reference-counted element buffers. A [`Storage`] is shared by every view of it.

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use half::{bf16, f16};

use crate::alloc;
use crate::dtype::{DType, Element};
use crate::error::Result;
use crate::layout::Layout;
use crate::Device;

/// Host memory of one dtype.
#[derive(Debug, Clone)]
pub enum CpuStorage {
    F32(Vec<f32>),
    F64(Vec<f64>),
    BF16(Vec<bf16>),
    F16(Vec<f16>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    U8(Vec<u8>),
    Bool(Vec<bool>),
}

/// Runs `$body` with `$v` bound to the typed `Vec` inside a `CpuStorage` (by reference).
#[macro_export]
#[doc(hidden)]
macro_rules! with_storage {
    ($s:expr, $v:ident => $body:expr) => {
        match $s {
            $crate::storage::CpuStorage::F32($v) => $body,
            $crate::storage::CpuStorage::F64($v) => $body,
            $crate::storage::CpuStorage::BF16($v) => $body,
            $crate::storage::CpuStorage::F16($v) => $body,
            $crate::storage::CpuStorage::I64($v) => $body,
            $crate::storage::CpuStorage::I32($v) => $body,
            $crate::storage::CpuStorage::U8($v) => $body,
            $crate::storage::CpuStorage::Bool($v) => $body,
        }
    };
}

/// Runs `$body` with `$T` bound to the Rust element type of `$dtype` (every dtype).
#[macro_export]
#[doc(hidden)]
macro_rules! dtype_dispatch {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            $crate::DType::F16 => {
                type $T = half::f16;
                $body
            }
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::DType::U8 => {
                type $T = u8;
                $body
            }
            $crate::DType::Bool => {
                type $T = bool;
                $body
            }
        }
    };
}

/// Typed access to a [`CpuStorage`] variant.
pub trait StorageElement: Element {
    fn wrap(v: Vec<Self>) -> CpuStorage;
    fn slice(s: &CpuStorage) -> Option<&[Self]>;
    fn slice_mut(s: &mut CpuStorage) -> Option<&mut [Self]>;
}

macro_rules! storage_element {
    ($t:ty, $v:ident) => {
        impl StorageElement for $t {
            fn wrap(v: Vec<Self>) -> CpuStorage {
                CpuStorage::$v(v)
            }
            fn slice(s: &CpuStorage) -> Option<&[Self]> {
                match s {
                    CpuStorage::$v(v) => Some(v),
                    _ => None,
                }
            }
            fn slice_mut(s: &mut CpuStorage) -> Option<&mut [Self]> {
                match s {
                    CpuStorage::$v(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
storage_element!(f32, F32);
storage_element!(f64, F64);
storage_element!(bf16, BF16);
storage_element!(f16, F16);
storage_element!(i64, I64);
storage_element!(i32, I32);
storage_element!(u8, U8);
storage_element!(bool, Bool);

impl CpuStorage {
    pub fn dtype(&self) -> DType {
        match self {
            CpuStorage::F32(_) => DType::F32,
            CpuStorage::F64(_) => DType::F64,
            CpuStorage::BF16(_) => DType::BF16,
            CpuStorage::F16(_) => DType::F16,
            CpuStorage::I64(_) => DType::I64,
            CpuStorage::I32(_) => DType::I32,
            CpuStorage::U8(_) => DType::U8,
            CpuStorage::Bool(_) => DType::Bool,
        }
    }

    pub fn len(&self) -> usize {
        with_storage!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `n` zeros of `dtype`, allocated as `vec!` does (aborting when memory runs out): for empty
    /// and small buffers (a released parameter's storage). Tensor-sized buffers take
    /// [`CpuStorage::filled`], which fails instead.
    pub fn zeros(dtype: DType, n: usize) -> CpuStorage {
        crate::dtype_dispatch!(dtype, T => T::wrap(vec![T::zero(); n]))
    }

    /// `n` copies of `value` converted to `dtype`; an [`crate::Error::OutOfMemory`] naming `op`
    /// when the buffer cannot be allocated.
    pub fn filled(op: &'static str, dtype: DType, n: usize, value: f64) -> Result<CpuStorage> {
        Ok(crate::dtype_dispatch!(dtype, T => T::wrap(alloc::filled(op, n, T::from_f64(value))?)))
    }

    /// A copy of this buffer (`Clone` aborts when memory runs out; this fails naming `op`).
    pub fn try_clone(&self, op: &'static str) -> Result<CpuStorage> {
        Ok(with_storage!(self, v => StorageElement::wrap(alloc::copy(op, v)?)))
    }

    /// The elements selected by `layout`, in row-major order, as a new contiguous buffer.
    pub fn gather(&self, op: &'static str, layout: &Layout) -> Result<CpuStorage> {
        fn go<T: StorageElement>(op: &'static str, v: &[T], layout: &Layout) -> Result<CpuStorage> {
            Ok(T::wrap(gather_slice(op, v, layout)?))
        }
        with_storage!(self, v => go(op, v, layout))
    }

    /// Converts every element (through f64 for floats, exactly for integers in range) into a new
    /// buffer (a copy when `dtype` is already this buffer's).
    pub fn cast(&self, op: &'static str, dtype: DType) -> Result<CpuStorage> {
        if dtype == self.dtype() {
            return self.try_clone(op);
        }
        let n = self.len();
        Ok(match (self, dtype) {
            (CpuStorage::BF16(v), DType::F32) => {
                let mut out = alloc::uninit(op, n)?;
                crate::cpu::convert::widen_to_f32(v, &mut out);
                // SAFETY: the conversion wrote every element.
                CpuStorage::F32(unsafe { crate::cpu::assume_init(out) })
            }
            (CpuStorage::F16(v), DType::F32) => CpuStorage::F32(alloc::collect(op, n, v.iter().map(|x| x.to_f32()))?),
            (CpuStorage::F32(v), DType::BF16) => {
                let mut out = alloc::uninit(op, n)?;
                crate::cpu::convert::narrow_to_bf16(v, &mut out);
                // SAFETY: the conversion wrote every element.
                CpuStorage::BF16(unsafe { crate::cpu::assume_init(out) })
            }
            (CpuStorage::F32(v), DType::F16) => {
                CpuStorage::F16(alloc::collect(op, n, v.iter().map(|&x| f16::from_f32(x)))?)
            }
            (CpuStorage::I64(v), DType::I32) => CpuStorage::I32(alloc::collect(op, n, v.iter().map(|&x| x as i32))?),
            (CpuStorage::I32(v), DType::I64) => CpuStorage::I64(alloc::collect(op, n, v.iter().map(|&x| x as i64))?),
            _ => {
                crate::dtype_dispatch!(dtype, T => T::wrap(crate::with_storage!(self, v => alloc::collect(op, n, v.iter().map(|x| T::from_f64(x.to_f64())))?)))
            }
        })
    }
}

/// Copies the elements `layout` selects from `v` into a new row-major `Vec` (allocated through
/// [`crate::alloc`]: an error naming `op` when it cannot be).
pub fn gather_slice<T: Copy + 'static>(op: &'static str, v: &[T], layout: &Layout) -> Result<Vec<T>> {
    let n = layout.numel();
    if layout.is_contiguous() {
        return alloc::copy(op, &v[layout.offset..layout.offset + n]);
    }
    // the transpose of a row-major matrix (a weight's gradient through `x @ w^T`, say): in
    // blocks, not one strided read an element
    if let ([rows, cols], [1, stride]) = (layout.shape.as_slice(), layout.strides.as_slice()) {
        let (rows, cols, stride) = (*rows, *cols, *stride);
        if rows > 1 && cols > 1 && stride >= rows {
            let mut out = alloc::with_capacity(op, n)?;
            out.resize(n, v[layout.offset]);
            // the view's column j is the stored row j: `cols` stored rows of `rows` elements
            crate::cpu::transpose::transpose(&v[layout.offset..], stride, cols, rows, &mut out, cols);
            return Ok(out);
        }
    }
    let mut out = alloc::with_capacity(op, n)?;
    layout.for_each_row(|start, stride, len| {
        if stride == 1 {
            out.extend_from_slice(&v[start..start + len]);
        } else {
            out.extend((0..len).map(|i| v[start + i * stride]));
        }
    });
    Ok(out)
}

/// A shared buffer on one device: host memory behind a lock, or a GPU buffer.
///
/// For a GPU storage the host side ([`Storage::read`], [`Storage::write`]) is an empty buffer of
/// the dtype: host code reaches GPU elements only through copies (`Tensor::to`, `to_vec`), and
/// the dispatcher sends every op on GPU tensors to `crate::cuda`.
#[derive(Debug)]
pub struct Storage {
    data: RwLock<CpuStorage>,
    device: Device,
    /// Host bytes this storage added to [`crate::memory::allocated_bytes`] when it was made.
    counted: usize,
    /// Stands for a buffer autograd let go ([`Storage::released`]): no elements to read.
    released: bool,
    #[cfg(feature = "cuda")]
    gpu: Option<crate::cuda::Buffer>,
}

impl Storage {
    pub fn new(data: CpuStorage) -> Self {
        let counted = data.len() * data.dtype().size_in_bytes();
        crate::memory::count_allocated(counted);
        Storage {
            data: RwLock::new(data),
            device: Device::Cpu,
            counted,
            released: false,
            #[cfg(feature = "cuda")]
            gpu: None,
        }
    }

    /// A storage with no elements standing for one whose buffer autograd let go
    /// ([`crate::Tensor`]'s backward handle): it reports `device` and holds nothing.
    pub(crate) fn released(dtype: crate::DType, device: Device) -> Self {
        Storage {
            data: RwLock::new(CpuStorage::zeros(dtype, 0)),
            device,
            counted: 0,
            released: true,
            #[cfg(feature = "cuda")]
            gpu: None,
        }
    }

    /// Whether this storage stands for a buffer autograd let go (it holds no elements).
    pub(crate) fn is_released(&self) -> bool {
        self.released
    }

    /// A storage holding a GPU buffer.
    #[cfg(feature = "cuda")]
    pub fn on_gpu(buffer: crate::cuda::Buffer) -> Self {
        Storage {
            data: RwLock::new(CpuStorage::zeros(buffer.dtype(), 0)),
            device: buffer.device(),
            counted: 0,
            released: false,
            gpu: Some(buffer),
        }
    }

    /// The GPU buffer of a GPU storage.
    #[cfg(feature = "cuda")]
    pub fn gpu_buffer(&self) -> Option<&crate::cuda::Buffer> {
        self.gpu.as_ref()
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// Elements held, on whichever device.
    pub fn len(&self) -> usize {
        #[cfg(feature = "cuda")]
        if let Some(b) = &self.gpu {
            return b.len();
        }
        self.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Read access to host elements; many readers at once.
    pub fn read(&self) -> RwLockReadGuard<'_, CpuStorage> {
        self.data.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Write access, for in-place updates (optimizer steps, gradient accumulation, collectives).
    pub fn write(&self) -> RwLockWriteGuard<'_, CpuStorage> {
        self.data.write().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        crate::memory::count_freed(self.counted);
    }
}

/// Counts the bytes held by distinct storages: each buffer once, however many tensors view it
/// (parameters and the gradients that are views of one bucket, say).
#[derive(Debug, Default)]
pub struct DistinctBytes {
    seen: std::collections::HashSet<*const Storage>,
}

impl DistinctBytes {
    /// The bytes of `t`'s storage the first time it is seen, 0 after.
    pub fn add(&mut self, t: &crate::Tensor) -> usize {
        if self.seen.insert(std::sync::Arc::as_ptr(t.storage())) {
            t.storage().len() * t.dtype().size_in_bytes()
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The transposed-matrix path of `gather_slice` against element-by-element reads, at
    /// sizes around the 16 x 16 blocks, with an offset and rows longer than the view (a
    /// narrowed matrix).
    #[test]
    fn a_transposed_matrix_is_gathered_as_read_element_by_element() {
        for (rows, cols, stride, offset) in [(2, 3, 2, 0), (17, 33, 20, 5), (32, 16, 32, 0), (40, 45, 41, 3)] {
            let v: Vec<f32> = (0..offset + cols * stride + 7).map(|i| i as f32).collect();
            let layout = Layout {
                shape: vec![rows, cols],
                strides: vec![1, stride],
                offset,
            };
            let want: Vec<f32> = (0..rows)
                .flat_map(|i| (0..cols).map(move |j| (offset + i + j * stride) as f32))
                .collect();
            assert_eq!(gather_slice("test", &v, &layout).unwrap(), want, "{rows} x {cols}");
            let v64: Vec<f64> = v.iter().map(|&x| x as f64).collect();
            let want64: Vec<f64> = want.iter().map(|&x| x as f64).collect();
            assert_eq!(
                gather_slice("test", &v64, &layout).unwrap(),
                want64,
                "{rows} x {cols} f64"
            );
        }
    }
}
