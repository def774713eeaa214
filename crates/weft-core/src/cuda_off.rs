//! The CUDA backend's public surface in a build without the `cuda` feature: every device query
//! answers that this build has no GPU backend.

#[path = "cuda/cache.rs"]
pub mod cache;

#[path = "cuda/scalars.rs"]
pub mod scalars;

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

/// Gradient accumulation fusion on a GPU: no GPU tensor exists in this build.
pub(crate) fn add_product_into(_: &crate::Tensor, _: &crate::Tensor, _: &crate::Tensor) -> Result<bool> {
    Ok(false)
}

/// The fused optimizer updates: no GPU tensor exists in this build, so these are never reached
/// with one; they answer as every device query here does.
pub mod optim {
    pub use super::scalars::{AdamScalars, SgdScalars};
    use crate::{Result, Tensor};

    pub fn adam_step(_: &Tensor, _: &Tensor, _: &Tensor, _: &Tensor, _: &AdamScalars) -> Result<()> {
        Err(super::absent())
    }

    pub fn sgd_step(_: &Tensor, _: Option<&Tensor>, _: &Tensor, _: &SgdScalars) -> Result<()> {
        Err(super::absent())
    }

    pub fn sum_of_squares(_: &Tensor) -> Result<f64> {
        Err(super::absent())
    }

    pub fn scale_(_: &Tensor, _: f64) -> Result<()> {
        Err(super::absent())
    }
}
