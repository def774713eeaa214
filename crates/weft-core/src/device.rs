//! Where a tensor's storage lives.

use std::fmt;
use std::str::FromStr;

/// A compute device; every op dispatches on its inputs' device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// Host memory, executed by the CPU kernels.
    #[default]
    Cpu,
    /// The NVIDIA GPU of this ordinal (as `cuda:N` in PyTorch), executed by `crate::cuda`.
    Cuda(usize),
}

impl Device {
    pub fn is_cuda(self) -> bool {
        matches!(self, Device::Cuda(_))
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => write!(f, "cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl FromStr for Device {
    type Err = String;

    /// `cpu`, `cuda` (the first GPU) or `cuda:N`, as PyTorch spells them. Says only whether the
    /// name is well formed; whether the device exists is `crate::cuda::check`'s question.
    fn from_str(s: &str) -> Result<Device, String> {
        let bad = || format!("unknown device {s:?} (expected \"cpu\", \"cuda\" or \"cuda:N\")");
        match s.trim() {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            t => {
                let n = t.strip_prefix("cuda:").ok_or_else(bad)?;
                if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                n.parse().map(Device::Cuda).map_err(|_| bad())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print_as_pytorch_spells_them() {
        assert_eq!("cpu".parse::<Device>(), Ok(Device::Cpu));
        assert_eq!("cuda".parse::<Device>(), Ok(Device::Cuda(0)));
        assert_eq!("cuda:3".parse::<Device>(), Ok(Device::Cuda(3)));
        assert_eq!(Device::Cuda(3).to_string(), "cuda:3");
        assert_eq!(Device::Cpu.to_string(), "cpu");
        for bad in [
            "gpu",
            "cuda:",
            "cuda:-1",
            "cuda:x",
            "cuda:1:2",
            "CUDA",
            "cuda:99999999999999999999999",
        ] {
            let err = bad.parse::<Device>().unwrap_err();
            assert!(err.contains("unknown device"), "{bad}: {err}");
        }
    }
}
