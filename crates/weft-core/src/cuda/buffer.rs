//! [`Buffer`]: one tensor's elements in GPU memory, a block of the device's caching allocator
//! that goes back to the cache when the last tensor viewing it is dropped.

use std::sync::Arc;

use super::runtime::Gpu;
use crate::dtype::DType;
use crate::error::Result;
use crate::storage::CpuStorage;
use crate::Device;

/// `len` elements of `dtype` on one GPU.
pub struct Buffer {
    gpu: Arc<Gpu>,
    ptr: u64,
    /// The block's size in bytes (at least `len * dtype.size_in_bytes()`).
    block: usize,
    len: usize,
    dtype: DType,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({:?} x {}, {})", self.dtype, self.len, self.gpu.device())
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        self.gpu.release(self.ptr, self.block);
    }
}

impl Buffer {
    /// Uninitialized room for `len` elements of `dtype`; `op` is named when the device is out of
    /// memory.
    pub fn uninit(gpu: &Arc<Gpu>, op: &'static str, dtype: DType, len: usize) -> Result<Buffer> {
        let bytes = len
            .checked_mul(dtype.size_in_bytes())
            .ok_or(crate::Error::DeviceOutOfMemory {
                op,
                device: gpu.device(),
                bytes: u64::MAX,
                free: 0,
                total: 0,
            })?;
        let (ptr, block) = gpu.allocate(op, bytes)?;
        Ok(Buffer {
            gpu: gpu.clone(),
            ptr,
            block,
            len,
            dtype,
        })
    }

    /// A copy of host data on `gpu`.
    pub fn from_host(gpu: &Arc<Gpu>, op: &'static str, data: &CpuStorage) -> Result<Buffer> {
        let buf = Buffer::uninit(gpu, op, data.dtype(), data.len())?;
        gpu.bind()?;
        let bytes = host_bytes(data);
        // SAFETY: the block holds at least `bytes.len()` bytes; the copy is synchronous, so the
        // host slice outlives it, and it is ordered after the stream's earlier work by the
        // synchronize below (the block may have been released by a kernel still queued).
        unsafe {
            gpu.synchronize()?;
            cudarc::driver::result::memcpy_htod_sync(buf.ptr, bytes).map_err(|e| gpu.fail(op, e))?;
        }
        Ok(buf)
    }

    /// The elements copied back to host memory (waits for the kernels that write them).
    pub fn to_host(&self, op: &'static str) -> Result<CpuStorage> {
        let mut out = CpuStorage::filled(op, self.dtype, self.len, 0.0)?;
        self.gpu.synchronize()?;
        // SAFETY: `out` holds exactly `len` elements of `dtype`, the bytes the block starts with.
        unsafe {
            cudarc::driver::result::memcpy_dtoh_sync(host_bytes_mut(&mut out), self.ptr)
                .map_err(|e| self.gpu.fail(op, e))?;
        }
        Ok(out)
    }

    /// Copies `len` elements starting at element `from` of `src` to element `to` of this buffer,
    /// in stream order (same dtype and device).
    pub fn copy_within_device(&self, to: usize, src: &Buffer, from: usize, len: usize) -> Result<()> {
        let size = self.dtype.size_in_bytes();
        debug_assert!(src.dtype == self.dtype && to + len <= self.len && from + len <= src.len);
        self.gpu.bind()?;
        // SAFETY: both ranges lie inside their blocks (checked by the callers, asserted above);
        // the copy is queued on the one stream that orders every kernel of this GPU.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                self.ptr + (to * size) as u64,
                src.ptr + (from * size) as u64,
                len * size,
                self.gpu.stream().cu_stream(),
            )
            .map_err(|e| self.gpu.fail("copy", e))
        }
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    pub fn device(&self) -> Device {
        self.gpu.device()
    }

    /// The device address of element 0, for kernel arguments.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The device address of element `i`.
    pub fn ptr_at(&self, i: usize) -> u64 {
        self.ptr + (i * self.dtype.size_in_bytes()) as u64
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }
}

/// The bytes of a host buffer (every element type is plain data).
fn host_bytes(data: &CpuStorage) -> &[u8] {
    crate::with_storage!(data, v => {
        // SAFETY: every storage element type is plain old data without padding (bool is one byte,
        // 0 or 1), so its memory may be read as bytes.
        unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(&v[..])) }
    })
}

/// The bytes of a host buffer, writable. Only for buffers of numbers and bools that the device
/// wrote from values of the same type (a bool byte is always 0 or 1).
fn host_bytes_mut(data: &mut CpuStorage) -> &mut [u8] {
    crate::with_storage!(data, v => {
        // SAFETY: as in `host_bytes`; the bytes written come from a buffer of the same dtype,
        // so they are valid values of it.
        unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(&v[..])) }
    })
}
