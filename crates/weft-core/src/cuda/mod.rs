//! The CUDA backend: tensors on NVIDIA GPUs.
//!
//! - [`runtime`]: one open [`Gpu`] per device ordinal (context, one compute stream, the caching
//!   allocator, compiled kernel modules); [`device_count`] and [`check`] answer whether a device
//!   can be used without ever panicking on a machine that has no driver.
//! - [`cache`]: the caching allocator's size classes and counters ([`MemoryStats`]).
//! - [`buffer`]: [`Buffer`], a tensor's elements in GPU memory.
//! - [`kernels`]: the CUDA C sources, compiled at run time by NVRTC.
//! - [`dispatch`]: [`execute`], the GPU side of `ops::execute`, one file per op family beside it.
//!
//! Every GPU kernel of a device runs on that device's one stream, in the order the ops were
//! called; host code waits only where it reads results (copies to the host, `item`).

pub mod buffer;
pub mod cache;
pub mod kernels;
pub mod launch;
pub mod optim;
pub mod runtime;
pub mod scalars;

pub(crate) mod copy;
pub(crate) mod dispatch;
pub(crate) mod families;

pub use buffer::Buffer;
pub use cache::MemoryStats;
pub use copy::to_device;
pub use dispatch::execute;
pub use families::kernel_names;
pub(crate) use families::matmul::add_product_into;
pub use families::matmul::{allow_tf32, set_allow_tf32};
pub use runtime::{check, device_count, gpu, Gpu};

use crate::error::Result;
use crate::Device;

/// Whether at least one CUDA device can be used.
pub fn is_available() -> bool {
    device_count().is_ok_and(|n| n > 0)
}

/// The caching allocator's counters of `device` (zeros for the CPU).
pub fn memory_stats(device: Device) -> Result<MemoryStats> {
    match device {
        Device::Cpu => Ok(MemoryStats::default()),
        Device::Cuda(n) => Ok(gpu(n)?.memory_stats()),
    }
}

/// Starts `device`'s peak-allocated counter over.
pub fn reset_peak(device: Device) -> Result<()> {
    if let Device::Cuda(n) = device {
        gpu(n)?.reset_peak();
    }
    Ok(())
}

/// Waits for every kernel queued on `device` (nothing to wait for on the CPU).
pub fn synchronize(device: Device) -> Result<()> {
    match device {
        Device::Cpu => Ok(()),
        Device::Cuda(n) => gpu(n)?.synchronize(),
    }
}
