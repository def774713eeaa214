//! Creation ops: fill, arange, and counter-based random tensors.

use crate::dtype::DType;
use crate::dtype::Element;
use crate::error::{invalid, Result};
use crate::op::{Distribution, Op};
use crate::rng::{self, Generator};
use crate::shape::checked_numel;
use crate::storage::{CpuStorage, StorageElement};
use crate::tensor::Tensor;

impl Tensor {
    /// A tensor of `shape` filled with `value`.
    pub fn full(shape: &[usize], value: f64, dtype: DType) -> Result<Tensor> {
        checked_numel("full", shape)?;
        super::apply(
            Op::Fill {
                shape: shape.to_vec(),
                value,
                dtype,
            },
            &[],
        )
    }

    pub fn zeros(shape: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::full(shape, 0.0, dtype)
    }

    pub fn ones(shape: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::full(shape, 1.0, dtype)
    }

    /// A tensor of `shape` filled with `value`, made on `device` (no host copy on a GPU).
    pub fn full_on(shape: &[usize], value: f64, dtype: DType, device: crate::Device) -> Result<Tensor> {
        match device {
            crate::Device::Cpu => Tensor::full(shape, value, dtype),
            #[cfg(feature = "cuda")]
            crate::Device::Cuda(_) => {
                checked_numel("full", shape)?;
                crate::cuda::copy::full(device, shape, value, dtype)
            }
            #[cfg(not(feature = "cuda"))]
            crate::Device::Cuda(_) => crate::cuda::check(device).and_then(|_| Tensor::full(shape, value, dtype)),
        }
    }

    pub fn zeros_on(shape: &[usize], dtype: DType, device: crate::Device) -> Result<Tensor> {
        Tensor::full_on(shape, 0.0, dtype, device)
    }

    /// Zeros of `t`'s shape and dtype, on `t`'s device.
    pub fn zeros_like(t: &Tensor) -> Result<Tensor> {
        Tensor::full_on(t.shape(), 0.0, t.dtype(), t.device())
    }

    /// Ones of `t`'s shape and dtype, on `t`'s device.
    pub fn ones_like(t: &Tensor) -> Result<Tensor> {
        Tensor::full_on(t.shape(), 1.0, t.dtype(), t.device())
    }

    /// `start, start + step, ...` below `end` (as `torch.arange`).
    pub fn arange(start: f64, end: f64, step: f64, dtype: DType) -> Result<Tensor> {
        if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
            return Err(invalid("arange", format!("bad range {start}..{end} step {step}")));
        }
        let len = ((end - start) / step).ceil().max(0.0) as usize;
        super::apply(
            Op::Arange {
                start,
                step,
                len,
                dtype,
            },
            &[],
        )
    }

    /// Uniform numbers in `[0, 1)` drawn from `generator`.
    pub fn rand(shape: &[usize], dtype: DType, generator: &mut Generator) -> Result<Tensor> {
        Tensor::random(shape, dtype, Distribution::Uniform, generator)
    }

    /// Standard normal numbers drawn from `generator`.
    pub fn randn(shape: &[usize], dtype: DType, generator: &mut Generator) -> Result<Tensor> {
        Tensor::random(shape, dtype, Distribution::Normal, generator)
    }

    /// Uniform numbers in `[0, 1)` drawn from `generator`, made on `device`: the same values as
    /// [`Tensor::rand`] on the CPU (one counter-based stream for every device).
    pub fn rand_on(shape: &[usize], dtype: DType, generator: &mut Generator, device: crate::Device) -> Result<Tensor> {
        Tensor::random_on(shape, dtype, Distribution::Uniform, generator, device)
    }

    /// Standard normal numbers drawn from `generator`, made on `device` (the CPU's values).
    pub fn randn_on(shape: &[usize], dtype: DType, generator: &mut Generator, device: crate::Device) -> Result<Tensor> {
        Tensor::random_on(shape, dtype, Distribution::Normal, generator, device)
    }

    fn random_on(
        shape: &[usize],
        dtype: DType,
        dist: Distribution,
        generator: &mut Generator,
        device: crate::Device,
    ) -> Result<Tensor> {
        if device == crate::Device::Cpu {
            return Tensor::random(shape, dtype, dist, generator);
        }
        crate::cuda::check(device)?;
        if !dtype.is_float() {
            return Err(crate::Error::UnsupportedDType { op: "random", dtype });
        }
        #[cfg(feature = "cuda")]
        {
            let (seed, offset) = generator.take(checked_numel("random", shape)?);
            crate::cuda::copy::random(device, shape, dtype, dist, seed, offset)
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = generator;
            Err(crate::Error::Device(format!(
                "{device}: this build has no CUDA backend"
            )))
        }
    }

    fn random(shape: &[usize], dtype: DType, dist: Distribution, generator: &mut Generator) -> Result<Tensor> {
        if !dtype.is_float() {
            return Err(crate::Error::UnsupportedDType { op: "random", dtype });
        }
        let (seed, offset) = generator.take(checked_numel("random", shape)?);
        super::apply(
            Op::Random {
                shape: shape.to_vec(),
                dtype,
                dist,
                seed,
                offset,
            },
            &[],
        )
    }
}

/// The largest value a draw of `dist` may take in `dtype` before rounding: a uniform is capped at
/// the largest `dtype` value below 1, so that rounding to a narrower float keeps it in `[0, 1)`
/// (f64 draws have 53 bits and stay below 1; normals are not capped). Shared with the GPU's
/// random kernels.
pub(crate) fn uniform_cap(dtype: DType, dist: Distribution) -> f64 {
    match (dist, dtype) {
        (Distribution::Normal, _) | (_, DType::F64) => f64::INFINITY,
        // 24, 8 and 11 significant bits
        (_, DType::BF16) => 1.0 - f64::powi(2.0, -8),
        (_, DType::F16) => 1.0 - f64::powi(2.0, -11),
        _ => 1.0 - f64::powi(2.0, -24),
    }
}

pub(super) fn forward(op: &Op) -> Result<Vec<Tensor>> {
    let name = op.name();
    let t = match op {
        Op::Fill { shape, value, dtype } => Tensor::from_storage(
            CpuStorage::filled(name, *dtype, checked_numel(name, shape)?, *value)?,
            shape,
        ),
        Op::Arange {
            start,
            step,
            len,
            dtype,
        } => {
            let (start, step, len) = (*start, *step, *len);
            let data = crate::dtype_dispatch!(dtype, T => T::wrap(crate::alloc::collect(
                name,
                len,
                (0..len).map(|i| T::from_f64(start + step * i as f64)),
            )?));
            Tensor::from_storage(data, &[len])
        }
        Op::Random {
            shape,
            dtype,
            dist,
            seed,
            offset,
        } => {
            let (seed, offset, dist) = (*seed, *offset, *dist);
            let below_one = uniform_cap(*dtype, dist);
            const PER_TASK: usize = 4096;
            // drawn in f64 and rounded once, straight into the output
            let data = crate::dtype_dispatch!(dtype, T => {
                let mut v = crate::alloc::uninit::<T>(name, checked_numel(name, shape)?)?;
                crate::cpu::pool::for_each_chunk(&mut v, PER_TASK, |c, xs| {
                    for (j, x) in xs.iter_mut().enumerate() {
                        let i = (c * PER_TASK + j) as u64;
                        let u = match dist {
                            Distribution::Uniform => rng::uniform(seed, offset + i),
                            Distribution::Normal => rng::normal(seed, offset + i),
                        };
                        x.write(T::from_f64(u.min(below_one)));
                    }
                });
                // SAFETY: the chunks cover the buffer and every element of each was written.
                T::wrap(unsafe { crate::cpu::assume_init(v) })
            });
            Tensor::from_storage(data, shape)
        }
        _ => unreachable!("creation::forward called with {op:?}"),
    };
    Ok(vec![t])
}
