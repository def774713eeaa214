//! The CUDA backend's public surface in a build without the `cuda` feature: every device query
//! answers that this build has no GPU backend.

#[path = "cuda/cache.rs"]
pub mod cache;

pub use cache::MemoryStats;

use crate::error::{Error, Result};
use crate::Device;

fn absent() -> Error {
    Error::Device("cuda: this build of weft has no CUDA backend (built without the `cuda` feature)".to_string())
}

pub fn device_count() -> Result<usize> {
    Err(absent())
}

pub fn is_available() -> bool {
    false
}

pub fn check(device: Device) -> Result<()> {
    match device {
        Device::Cpu => Ok(()),
        Device::Cuda(_) => Err(Error::Device(format!("{device} is not available: {}", absent()))),
    }
}

pub fn memory_stats(device: Device) -> Result<MemoryStats> {
    check(device).map(|_| MemoryStats::default())
}

pub fn reset_peak(device: Device) -> Result<()> {
    check(device)
}

pub fn synchronize(device: Device) -> Result<()> {
    check(device)
}

/// `x` on `device`: itself on the CPU; no other device exists in this build.
pub fn to_device(x: &crate::Tensor, device: Device) -> Result<crate::Tensor> {
    check(device).map(|_| x.clone())
}
