//! Moving tensors between devices, and the layout work every GPU family leans on: making a view
//! contiguous on the GPU, writing into a view, filling, allocating outputs.

use std::sync::Arc;

use cudarc::driver::PushKernelArg;

use super::buffer::Buffer;
use super::kernels::COPY;
use super::launch::{for_elements, Strided};
use super::runtime::{gpu, Gpu};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::storage::CpuStorage;
use crate::tensor::Tensor;
use crate::Device;

/// The kernels of `kernels/copy.cu` launched here (checked by the compile test).
pub const KERNELS: &[&str] = &[
    "gather_1",
    "gather_2",
    "gather_4",
    "gather_8",
    "scatter_1",
    "scatter_2",
    "scatter_4",
    "scatter_8",
    "fill_1",
    "fill_2",
    "fill_4",
    "fill_8",
    "random_f32",
    "random_f64",
    "random_bf16",
    "random_f16",
];

/// `x`'s elements on `device` (a contiguous copy; `x` itself when it is there already). Not
/// recorded by autograd: `Tensor::to` is the differentiable form.
pub fn to_device(x: &Tensor, device: Device) -> Result<Tensor> {
    if x.device() == device {
        return Ok(x.clone());
    }
    // through host memory: a GPU source's elements come back first (GPU to GPU too, for now)
    let data = match x.device() {
        Device::Cpu => x.contiguous_storage("to")?,
        Device::Cuda(_) => to_host(x)?,
    };
    match device {
        Device::Cpu => Ok(Tensor::from_storage(data, x.shape())),
        Device::Cuda(n) => Ok(Tensor::from_gpu(Buffer::from_host(&gpu(n)?, "to", &data)?, x.shape())),
    }
}

/// A GPU tensor's elements in row-major order in host memory (gathered on the GPU first when the
/// tensor is a view that does not cover its buffer).
pub(crate) fn to_host(x: &Tensor) -> Result<CpuStorage> {
    let buf = buffer(x)?;
    if x.is_contiguous() && x.layout().offset == 0 && buf.len() == x.numel() {
        return buf.to_host("to");
    }
    let dense = contiguous(x)?;
    buffer(&dense)?.to_host("to")
}

/// The GPU buffer under `x`; an error when `x` is not on a GPU.
pub(crate) fn buffer(x: &Tensor) -> Result<&Buffer> {
    x.gpu_buffer()
        .ok_or_else(|| Error::Device(format!("expected a tensor on a GPU, found one on {}", x.device())))
}

/// The GPU that `x` lives on.
pub(crate) fn gpu_of(x: &Tensor) -> Result<Arc<Gpu>> {
    Ok(buffer(x)?.gpu().clone())
}

/// The device address of `x`'s first element (its layout's offset applied): for kernels that
/// read a contiguous input.
pub(crate) fn ptr(x: &Tensor) -> Result<u64> {
    Ok(buffer(x)?.ptr_at(x.layout().offset))
}

/// A new, uninitialized, contiguous GPU tensor (every kernel writes its whole output).
pub(crate) fn empty(g: &Arc<Gpu>, op: &'static str, dtype: DType, shape: &[usize]) -> Result<Tensor> {
    let n = crate::shape::checked_numel(op, shape)?;
    Ok(Tensor::from_gpu(Buffer::uninit(g, op, dtype, n)?, shape))
}

/// `x` when its layout is contiguous (any offset), else a contiguous copy made on the GPU.
pub(crate) fn dense(x: &Tensor) -> Result<Tensor> {
    if x.is_contiguous() {
        Ok(x.clone())
    } else {
        contiguous(x)
    }
}

/// A contiguous copy of `x` (offset 0, its own buffer), made on the GPU.
pub(crate) fn contiguous(x: &Tensor) -> Result<Tensor> {
    let g = gpu_of(x)?;
    let out = empty(&g, "contiguous", x.dtype(), x.shape())?;
    let n = x.numel();
    if n == 0 {
        return Ok(out);
    }
    let src = Strided::of("contiguous", x.layout())?;
    let f = g.function(&COPY, &format!("gather_{}", x.dtype().size_in_bytes()))?;
    let (o, i, n64) = (buffer(&out)?.ptr(), buffer(x)?.ptr(), n as u64);
    g.bind()?;
    // SAFETY: `out` holds `n` elements; every offset the view selects lies inside `x`'s buffer
    // (layouts are checked against their storage when built); the kernel reads `in` through
    // `src` and writes out[0..n].
    unsafe {
        g.stream()
            .launch_builder(&f)
            .arg(&o)
            .arg(&i)
            .arg(&src)
            .arg(&n64)
            .launch(for_elements(n))
    }
    .map_err(|e| g.fail("contiguous", e))?;
    Ok(out)
}

/// Writes the contiguous GPU tensor `src` (same dtype, `dst`'s numel) into the view `dst`.
pub(crate) fn write_into(dst: &Tensor, src: &Tensor) -> Result<()> {
    let g = gpu_of(dst)?;
    let n = dst.numel();
    if n == 0 {
        return Ok(());
    }
    debug_assert!(src.is_contiguous() && src.numel() == n && src.dtype() == dst.dtype());
    let view = Strided::of("copy_from", dst.layout())?;
    let f = g.function(&COPY, &format!("scatter_{}", dst.dtype().size_in_bytes()))?;
    let (o, i, n64) = (buffer(dst)?.ptr(), ptr(src)?, n as u64);
    g.bind()?;
    // SAFETY: the view's offsets lie inside `dst`'s buffer; `src` holds `n` contiguous elements.
    unsafe {
        g.stream()
            .launch_builder(&f)
            .arg(&o)
            .arg(&i)
            .arg(&view)
            .arg(&n64)
            .launch(for_elements(n))
    }
    .map_err(|e| g.fail("copy_from", e))?;
    Ok(())
}

/// `Tensor::copy_from` for a destination on a GPU: `src` (any device, any dtype, `dst`'s shape)
/// converted to `dst`'s dtype and written into `dst`'s view.
pub(crate) fn copy_from(dst: &Tensor, src: &Tensor) -> Result<()> {
    let src = crate::no_grad(|| -> Result<Tensor> {
        let s = to_device(src, dst.device())?;
        let s = if s.dtype() == dst.dtype() {
            s
        } else {
            s.cast(dst.dtype())?
        };
        // a source in the destination's own buffer (overlapping views of one tensor) is read
        // whole before any element is written, as on the CPU: the scatter's threads would
        // otherwise read elements others already overwrote
        if Arc::ptr_eq(s.storage(), dst.storage()) {
            s.contiguous_copy()
        } else {
            dense(&s)
        }
    })?;
    write_into(dst, &src)
}

/// A contiguous GPU tensor of `shape` with every element `value` (converted to `dtype` as the
/// CPU converts it).
pub(crate) fn full(device: Device, shape: &[usize], value: f64, dtype: DType) -> Result<Tensor> {
    let Device::Cuda(ordinal) = device else {
        return Tensor::full(shape, value, dtype);
    };
    let g = gpu(ordinal)?;
    let out = empty(&g, "full", dtype, shape)?;
    let n = out.numel();
    if n == 0 {
        return Ok(out);
    }
    let one = CpuStorage::filled("full", dtype, 1, value)?;
    let mut word = [0u8; 8];
    let size = dtype.size_in_bytes();
    crate::with_storage!(&one, v => {
        // SAFETY: one plain element of `size` bytes (see `buffer::host_bytes`).
        let bytes = unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), size) };
        word[..size].copy_from_slice(bytes);
    });
    let f = g.function(&COPY, &format!("fill_{size}"))?;
    let (o, n64) = (buffer(&out)?.ptr(), n as u64);
    let cfg = for_elements(n);
    g.bind()?;
    let mut b = g.stream().launch_builder(&f);
    b.arg(&o);
    let (p1, p2, p4, p8) = (
        word[0],
        u16::from_ne_bytes([word[0], word[1]]),
        u32::from_ne_bytes([word[0], word[1], word[2], word[3]]),
        u64::from_ne_bytes(word),
    );
    match size {
        1 => b.arg(&p1),
        2 => b.arg(&p2),
        4 => b.arg(&p4),
        _ => b.arg(&p8),
    };
    b.arg(&n64);
    // SAFETY: `out` holds `n` elements of `size` bytes; the pattern is one element of its dtype.
    unsafe { b.launch(cfg) }.map_err(|e| g.fail("full", e))?;
    Ok(out)
}

/// Random numbers of `shape` on `device`, element `i` drawn from counter `offset + i` under
/// `seed` exactly as the CPU's `Op::Random` draws it (the same values, rounded the same way).
pub(crate) fn random(
    device: Device,
    shape: &[usize],
    dtype: DType,
    dist: crate::op::Distribution,
    seed: u64,
    offset: u64,
) -> Result<Tensor> {
    let Device::Cuda(ordinal) = device else {
        return Err(Error::Device("random: expected a GPU".to_string()));
    };
    let g = gpu(ordinal)?;
    let name = match dtype {
        DType::F32 => "random_f32",
        DType::F64 => "random_f64",
        DType::BF16 => "random_bf16",
        DType::F16 => "random_f16",
        d => return Err(Error::UnsupportedDType { op: "random", dtype: d }),
    };
    let out = empty(&g, "random", dtype, shape)?;
    let n = out.numel();
    if n == 0 {
        return Ok(out);
    }
    let (o, n64, normal) = (
        buffer(&out)?.ptr(),
        n as u64,
        (dist == crate::op::Distribution::Normal) as i32,
    );
    let cap = crate::ops::creation::uniform_cap(dtype, dist);
    let f = g.function(&COPY, name)?;
    g.bind()?;
    // SAFETY: `out` holds `n` elements of the kernel's type.
    unsafe {
        g.stream()
            .launch_builder(&f)
            .arg(&o)
            .arg(&seed)
            .arg(&offset)
            .arg(&n64)
            .arg(&normal)
            .arg(&cap)
            .launch(for_elements(n))
    }
    .map_err(|e| g.fail("random", e))?;
    Ok(out)
}
