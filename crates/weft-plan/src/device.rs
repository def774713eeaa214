//! What a device (and the links between devices) can do: peak rates from datasheets, and the
//! fractions of them that real kernels and collectives reach ([`Efficiency`]).

use crate::error::{Error, Result};
use crate::model::Precision;

/// Fractions of the peak rates that real work reaches, and the memory kept free.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Efficiency {
    /// Matrix products: achieved / peak FLOP/s. The default, 0.628, is calibrated on a
    /// published anchor: with it the plan for GPT-3 175B on 96 H100 at a global batch of 1152
    /// (sequence parallelism allowed, as Megatron-LM runs) predicts 47% MFU, what Megatron-Core
    /// reports for that run (docs/plan.md).
    pub gemm: f64,
    /// Memory-bound kernels (norms, activations, residual additions, the optimizer step):
    /// achieved / peak HBM bandwidth. Default 0.70.
    pub memory_bound: f64,
    /// Collectives and point-to-point transfers: achieved bus bandwidth / link bandwidth.
    /// Default 0.80, an assumption (`weft plan calibrate` measures the `local` spec's links,
    /// which then take 1.0).
    pub collective: f64,
    /// Attention (`q k^T` and `p v`, counted without the causal mask's savings): achieved /
    /// the matrix products' achieved rate, in [0.001, 16] (above 1 where a causal kernel skips
    /// the masked half). Default 1.0; `weft plan calibrate` measures it.
    pub attention: f64,
    /// Share of device memory a plan may not use (the CUDA context, allocator fragmentation,
    /// workspaces). Default 0.10.
    pub memory_margin: f64,
}

impl Default for Efficiency {
    fn default() -> Self {
        Efficiency {
            gemm: 0.628,
            memory_bound: 0.70,
            collective: 0.80,
            attention: 1.0,
            memory_margin: 0.10,
        }
    }
}

/// What a micro-batch's pass costs beyond its FLOPs and bytes: the per-op dispatch,
/// allocation and autograd bookkeeping that a small pass pays whatever its size, and a scale
/// on the analytic time for what the op-by-op count leaves out. `weft plan calibrate`
/// measures both on the model's own passes; the built-in (GPU) specs leave them at no cost
/// and a scale of 1, as their efficiencies are fitted to a published anchor instead.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PassCost {
    /// Measured over analytic time of whole passes (forward and backward), in [0.001, 16].
    pub time_scale: f64,
    /// Seconds a block's forward and backward of one micro-batch take beyond their compute.
    pub block: f64,
    /// Seconds the embeddings', output layer's and loss's forward and backward take beyond
    /// their compute, together (split evenly between the first and the last stage).
    pub ends: f64,
}

impl Default for PassCost {
    fn default() -> Self {
        PassCost {
            time_scale: 1.0,
            block: 0.0,
            ends: 0.0,
        }
    }
}

/// A device and how devices of its kind are connected.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceSpec {
    pub name: String,
    /// Devices per node, joined by the intra-node link (NVLink).
    pub devices_per_node: usize,
    /// Dense bf16 matrix-product peak, FLOP/s.
    pub flops_bf16: f64,
    /// f32 peak, FLOP/s.
    pub flops_f32: f64,
    /// Device memory, bytes.
    pub memory_bytes: f64,
    /// Device memory bandwidth, bytes/s.
    pub memory_bandwidth: f64,
    /// Intra-node bandwidth per device and direction, bytes/s.
    pub intra_bandwidth: f64,
    /// Intra-node latency per collective step, seconds.
    pub intra_latency: f64,
    /// Inter-node bandwidth per device and direction, bytes/s.
    pub inter_bandwidth: f64,
    /// Inter-node latency per collective step, seconds.
    pub inter_latency: f64,
    /// Devices of a node that compute at their full rate at the same time, when they share
    /// compute (CPU ranks on fewer cores than ranks: the cores divided by each rank's threads,
    /// as `weft plan calibrate` measures it); `None` for devices with compute of their own.
    /// The rates above are then those of one device computing alone.
    pub shared_compute: Option<f64>,
    /// A GPU, whose attention kernels take as many key/value heads as query heads: weft repeats
    /// a grouped-query model's keys and values to every query head first (and the backward
    /// keeps the copies); `false` for CPU ranks, whose kernel reads shared heads in place.
    pub gpu: bool,
    pub efficiency: Efficiency,
    /// What a pass costs beyond its FLOPs and bytes (measured for the `local` spec).
    pub pass_cost: PassCost,
}

/// The built-in specs' names.
pub const BUILTIN: [&str; 3] = ["h100-sxm-80gb", "h200-sxm-141gb", "a100-sxm-80gb"];

/// 8 x 400 Gb/s InfiniBand (one ConnectX-7 per GPU) per node of 8: 50 GB/s per device and
/// direction.
const IB_400G_PER_GPU: f64 = 400e9 / 8.0;

impl DeviceSpec {
    /// The same device with links that cost nothing (no latency, unbounded bandwidth): its
    /// compute alone, for the shared-compute model, where waiting on a collective or a send
    /// takes no core.
    pub fn without_links(&self) -> DeviceSpec {
        DeviceSpec {
            intra_bandwidth: f64::INFINITY,
            intra_latency: 0.0,
            inter_bandwidth: f64::INFINITY,
            inter_latency: 0.0,
            ..self.clone()
        }
    }

    /// A built-in spec by name. Datasheet numbers (dense, without sparsity; memory in decimal
    /// units as the datasheets give it):
    ///
    /// - `h100-sxm-80gb`: NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): BF16 989.5
    ///   TFLOP/s, FP32 67 TFLOP/s, 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s (450 per direction).
    /// - `h200-sxm-141gb`: NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): BF16 989.5
    ///   TFLOP/s, FP32 67 TFLOP/s, 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s.
    /// - `a100-sxm-80gb`: NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM): BF16 312
    ///   TFLOP/s, FP32 19.5 TFLOP/s, 80 GB HBM2e at 2.039 TB/s, NVLink 600 GB/s (300 per
    ///   direction).
    ///
    /// Every one: 8 per node, and 8 x 400 Gb/s InfiniBand between nodes (one NIC per GPU, as
    /// the DGX H100 datasheet lists); latencies of 5 us inside a node and 10 us between nodes
    /// per collective step are assumptions, not datasheet numbers.
    pub fn builtin(name: &str) -> Result<DeviceSpec> {
        let (flops_bf16, flops_f32, memory_bytes, memory_bandwidth, nvlink) = match name {
            "h100-sxm-80gb" => (989.5e12, 67e12, 80e9, 3.35e12, 450e9),
            "h200-sxm-141gb" => (989.5e12, 67e12, 141e9, 4.8e12, 450e9),
            "a100-sxm-80gb" => (312e12, 19.5e12, 80e9, 2.039e12, 300e9),
            _ => {
                return Err(Error::UnknownDevice {
                    name: name.to_string(),
                    known: BUILTIN.join(", "),
                })
            }
        };
        Ok(DeviceSpec {
            name: name.to_string(),
            devices_per_node: 8,
            flops_bf16,
            flops_f32,
            memory_bytes,
            memory_bandwidth,
            intra_bandwidth: nvlink,
            intra_latency: 5e-6,
            inter_bandwidth: IB_400G_PER_GPU,
            inter_latency: 10e-6,
            shared_compute: None,
            gpu: true,
            efficiency: Efficiency::default(),
            pass_cost: PassCost::default(),
        })
    }

    /// Peak matrix-product rate at `precision`, FLOP/s.
    pub fn peak_flops(&self, precision: Precision) -> f64 {
        match precision {
            Precision::Bf16 => self.flops_bf16,
            Precision::F32 => self.flops_f32,
        }
    }

    /// Memory a plan may use per device, bytes (the margin taken off).
    pub fn usable_memory(&self) -> f64 {
        self.memory_bytes * (1.0 - self.efficiency.memory_margin)
    }

    /// `(bandwidth bytes/s, latency s)` of a collective over `size` devices `stride` apart
    /// (the mesh is `pp x dp x tp` with tp innermost): inside a node when the group's span
    /// divides the node (so no group straddles two), else over the inter-node link, which a
    /// ring's slowest step then crosses.
    pub fn link(&self, stride: usize, size: usize) -> (f64, f64) {
        let eff = self.efficiency.collective;
        let span = stride.saturating_mul(size);
        if self.devices_per_node.is_multiple_of(span) {
            (self.intra_bandwidth * eff, self.intra_latency)
        } else {
            (self.inter_bandwidth * eff, self.inter_latency)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_have_their_datasheet_numbers() {
        let h100 = DeviceSpec::builtin("h100-sxm-80gb").unwrap();
        assert_eq!(h100.flops_bf16, 989.5e12);
        assert_eq!(h100.memory_bytes, 80e9);
        assert_eq!(h100.inter_bandwidth, 50e9);
        let h200 = DeviceSpec::builtin("h200-sxm-141gb").unwrap();
        assert_eq!(h200.memory_bytes, 141e9);
        assert_eq!(h200.memory_bandwidth, 4.8e12);
        let a100 = DeviceSpec::builtin("a100-sxm-80gb").unwrap();
        assert_eq!(a100.flops_bf16, 312e12);
        assert_eq!(a100.intra_bandwidth, 300e9);
        let e = DeviceSpec::builtin("h100").unwrap_err();
        assert!(e.to_string().contains("h100-sxm-80gb, h200-sxm-141gb"), "{e}");
    }

    #[test]
    fn groups_inside_a_node_use_nvlink() {
        let h100 = DeviceSpec::builtin("h100-sxm-80gb").unwrap();
        assert_eq!(h100.link(1, 8).0, 450e9 * 0.8);
        assert_eq!(h100.link(8, 2).0, 50e9 * 0.8);
        assert_eq!(h100.link(2, 4).1, 5e-6);
        // 6 ranks from 0 would straddle two nodes from rank 6 on
        assert_eq!(h100.link(1, 6).0, 50e9 * 0.8);
    }
}
