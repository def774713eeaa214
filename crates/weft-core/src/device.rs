//! Where a tensor's storage lives.

/// A compute device. Only the CPU exists today; CUDA devices get their own variant
/// when the CUDA backend lands, and every op dispatches on this value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// Host memory, executed by the CPU kernels.
    #[default]
    Cpu,
}
