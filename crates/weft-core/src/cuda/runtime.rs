//! One [`Gpu`] per device ordinal, opened on first use and kept for the process: its context, its
//! one compute stream, its caching allocator and its compiled kernel modules.
//!
//! Nothing here panics on a machine without CUDA: the driver library is looked for before any
//! call into it (cudarc panics when a library it loads lazily is missing), and every driver
//! failure becomes an [`Error::Device`] naming the device.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{sys, CudaContext, CudaFunction, CudaModule, CudaStream, DriverError};

use super::cache::{block_size, BlockCache, MemoryStats};
use super::kernels::Module;
use crate::error::{Error, Result};
use crate::Device;

/// An open GPU.
pub struct Gpu {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// `compute_90` on an H200: what NVRTC compiles the kernels for.
    arch: &'static str,
    cache: Mutex<BlockCache>,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gpu(cuda:{}, {})", self.ordinal, self.arch)
    }
}

/// Why the CUDA driver cannot be used on this machine, checked once: `None` when it can.
fn driver_problem() -> Option<&'static str> {
    static PROBLEM: OnceLock<Option<String>> = OnceLock::new();
    PROBLEM
        .get_or_init(|| {
            // SAFETY: only tries to open the library (dlopen) and closes it again.
            if !unsafe { sys::is_culib_present() } {
                return Some("no NVIDIA driver on this machine (libcuda.so could not be loaded)".to_string());
            }
            cudarc::driver::result::init()
                .err()
                .map(|e| format!("the NVIDIA driver did not start: {}", describe(e)))
        })
        .as_deref()
}

/// The number of CUDA devices, or why there are none to use.
pub fn device_count() -> Result<usize> {
    if let Some(p) = driver_problem() {
        return Err(Error::Device(format!("cuda: {p}")));
    }
    let n = CudaContext::device_count().map_err(|e| Error::Device(format!("cuda: {}", describe(e))))?;
    Ok(n.max(0) as usize)
}

/// Ok when `device` can be used: always for the CPU, for `cuda:N` when the driver works and
/// there are more than N devices. The error is one line naming the device and the cause.
pub fn check(device: Device) -> Result<()> {
    let Device::Cuda(ordinal) = device else {
        return Ok(());
    };
    let count = device_count().map_err(|e| Error::Device(format!("{device} is not available: {e}")))?;
    if ordinal >= count {
        let have = match count {
            0 => "no CUDA devices".to_string(),
            1 => "1 CUDA device (cuda:0)".to_string(),
            n => format!("{n} CUDA devices (cuda:0 to cuda:{})", n - 1),
        };
        return Err(Error::Device(format!(
            "{device} does not exist: this machine has {have}"
        )));
    }
    Ok(())
}

/// The open GPU of `ordinal`, opened on first use.
pub fn gpu(ordinal: usize) -> Result<Arc<Gpu>> {
    static OPEN: OnceLock<Mutex<HashMap<usize, Arc<Gpu>>>> = OnceLock::new();
    let mut open = OPEN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(g) = open.get(&ordinal) {
        return Ok(g.clone());
    }
    let device = Device::Cuda(ordinal);
    check(device)?;
    let fail = |what: &str, e: DriverError| Error::Device(format!("{device}: {what}: {}", describe(e)));
    let ctx = CudaContext::new(ordinal).map_err(|e| fail("cannot open the device", e))?;
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| fail("cannot read the compute capability", e))?;
    let g = Arc::new(Gpu {
        ordinal,
        stream: ctx.default_stream(),
        ctx,
        arch: arch_name(major, minor),
        cache: Mutex::new(BlockCache::default()),
        modules: Mutex::new(HashMap::new()),
    });
    open.insert(ordinal, g.clone());
    Ok(g)
}

/// NVRTC's name for a compute capability (`compute_90`); names are static so they can be handed
/// to cudarc's compile options.
fn arch_name(major: i32, minor: i32) -> &'static str {
    static NAMES: OnceLock<Mutex<HashMap<(i32, i32), &'static str>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    names
        .entry((major, minor))
        .or_insert_with(|| Box::leak(format!("compute_{major}{minor}").into_boxed_str()))
}

/// A driver error as the driver names it ("CUDA_ERROR_OUT_OF_MEMORY, out of memory").
pub(crate) fn describe(e: DriverError) -> String {
    match (e.error_name(), e.error_string()) {
        (Ok(name), Ok(text)) => format!("{}, {}", name.to_string_lossy(), text.to_string_lossy()),
        _ => format!("{e:?}"),
    }
}

impl Gpu {
    pub fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub(crate) fn fail(&self, op: &str, e: DriverError) -> Error {
        Error::Device(format!("{op} on {}: {}", self.device(), describe(e)))
    }

    /// Makes this GPU's context current on the calling thread (each driver call needs it).
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| self.fail("bind", e))
    }

    /// Waits for every kernel and copy queued on this GPU's stream.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(|e| self.fail("synchronize", e))
    }

    /// A block of at least `bytes` bytes: from the cache when a freed block of its size class is
    /// there, else from the driver; when the driver refuses, the cache is returned to it and the
    /// request tried once more. Returns the pointer and the block's size (pass both to
    /// [`Gpu::release`]).
    pub(crate) fn allocate(&self, op: &'static str, bytes: usize) -> Result<(u64, usize)> {
        let oom = |free: u64, total: u64| Error::DeviceOutOfMemory {
            op,
            device: self.device(),
            bytes: bytes as u64,
            free,
            total,
        };
        let size = block_size(bytes).ok_or_else(|| oom(0, 0))?;
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ptr) = cache.take(size) {
            return Ok((ptr, size));
        }
        self.bind()?;
        // SAFETY: a plain allocation on the bound context; the memory is handed out uninitialized
        // and every op writes its output before it is read.
        let first = unsafe { cudarc::driver::result::malloc_sync(size) };
        let ptr = match first {
            Ok(p) => p,
            Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY => {
                // cached blocks may still be read or written by queued kernels (the stream
                // orders reuse, not freeing): let them finish before the driver takes the blocks
                self.synchronize()?;
                for (p, _) in cache.drain() {
                    // SAFETY: cached blocks are owned by the cache alone.
                    unsafe { cudarc::driver::result::free_sync(p) }.map_err(|e| self.fail("free", e))?;
                }
                // SAFETY: as above.
                match unsafe { cudarc::driver::result::malloc_sync(size) } {
                    Ok(p) => p,
                    Err(_) => {
                        let (free, total) = self.ctx.mem_get_info().unwrap_or((0, 0));
                        return Err(oom(free as u64, total as u64));
                    }
                }
            }
            Err(e) => return Err(self.fail(op, e)),
        };
        cache.add_new(size);
        Ok((ptr, size))
    }

    /// Gives a block back to the cache. Safe while kernels that use it are still queued: every
    /// kernel runs on the one stream, so the block's next user runs after them.
    pub(crate) fn release(&self, ptr: u64, size: usize) {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).put(ptr, size);
    }

    pub fn memory_stats(&self) -> MemoryStats {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).stats()
    }

    pub fn reset_peak(&self) {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).reset_peak()
    }

    /// The kernel `name` of `module`, compiling the module with NVRTC the first time it is asked
    /// for in this process.
    pub(crate) fn function(&self, module: &Module, name: &str) -> Result<CudaFunction> {
        let m = {
            let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
            match modules.get(module.name) {
                Some(m) => m.clone(),
                None => {
                    let ptx = super::kernels::compile(module, self.arch)?;
                    self.bind()?;
                    let m = self.ctx.load_module(ptx).map_err(|e| self.fail(module.name, e))?;
                    modules.insert(module.name, m.clone());
                    m
                }
            }
        };
        m.load_function(name)
            .map_err(|e| Error::Device(format!("kernel {name} of {}: {}", module.name, describe(e))))
    }
}
