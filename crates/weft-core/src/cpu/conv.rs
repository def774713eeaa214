//! 2-D convolution by im2col + gemm, and max / average pooling. All NCHW, contiguous.

use super::matmul::{gemm, gemm_parallel, mat, mat_t, MatMut, MatRef};
use super::pool::{self, Chunks};
use crate::alloc;
use crate::dtype::Float;
use crate::error::Result;
use crate::op::{Conv2dParams, Pool2dParams};

/// Sizes of a convolution: input `[n, c, h, w]`, weight `[o, c / groups, kh, kw]`, output
/// `[n, o, oh, ow]`.
#[derive(Clone, Copy, Debug)]
pub struct ConvDims {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub o: usize,
    pub kh: usize,
    pub kw: usize,
    pub oh: usize,
    pub ow: usize,
    pub p: Conv2dParams,
}

impl ConvDims {
    fn cg(&self) -> usize {
        self.c / self.p.groups
    }
    fn og(&self) -> usize {
        self.o / self.p.groups
    }
    /// Rows of the column matrix of one group: `c/groups * kh * kw`.
    fn ck(&self) -> usize {
        self.cg() * self.kh * self.kw
    }
    fn spatial(&self) -> usize {
        self.oh * self.ow
    }
    /// Input coordinate for output coordinate `o` and kernel tap `k` along one axis, if inside.
    #[inline(always)]
    fn src(o: usize, k: usize, stride: usize, pad: usize, dil: usize, size: usize) -> Option<usize> {
        let i = (o * stride + k * dil) as isize - pad as isize;
        (i >= 0 && (i as usize) < size).then_some(i as usize)
    }
}

/// Output size along one axis (PyTorch's formula); `None` when the window does not fit.
pub fn out_size(size: usize, k: usize, stride: usize, pad: usize, dil: usize) -> Option<usize> {
    let span = dil * (k - 1) + 1;
    (size + 2 * pad >= span).then(|| (size + 2 * pad - span) / stride + 1)
}

/// The output columns `ox` whose input column `ox * stride + k * dil - pad` lies in `0..size`.
#[inline(always)]
fn valid_range(out: usize, k: usize, stride: usize, pad: usize, dil: usize, size: usize) -> (usize, usize) {
    let off = (k * dil) as isize - pad as isize;
    // smallest ox with ox * stride + off >= 0
    let lo = if off >= 0 {
        0
    } else {
        ((-off) as usize).div_ceil(stride)
    };
    // largest ox with ox * stride + off < size, plus one
    let hi = if (size as isize) <= off {
        0
    } else {
        ((size as isize - off - 1) as usize / stride + 1).min(out)
    };
    (lo.min(hi), hi)
}

/// Columns of one image and group: `cols[ck, oh*ow]`. Each output row of each tap is a run of
/// input elements (contiguous for stride 1) with zeros where the window hangs over the padding.
fn im2col<T: Float>(d: &ConvDims, x: &[T], g: usize, cols: &mut [T]) {
    let (sp, p) = (d.spatial(), d.p);
    for ci in 0..d.cg() {
        let plane = &x[(g * d.cg() + ci) * d.h * d.w..][..d.h * d.w];
        for ky in 0..d.kh {
            for kx in 0..d.kw {
                let row = &mut cols[((ci * d.kh + ky) * d.kw + kx) * sp..][..sp];
                let (lo, hi) = valid_range(d.ow, kx, p.stride.1, p.padding.1, p.dilation.1, d.w);
                for oy in 0..d.oh {
                    let out = &mut row[oy * d.ow..(oy + 1) * d.ow];
                    let Some(iy) = ConvDims::src(oy, ky, p.stride.0, p.padding.0, p.dilation.0, d.h) else {
                        out.iter_mut().for_each(|v| *v = T::zero());
                        continue;
                    };
                    out[..lo].iter_mut().for_each(|v| *v = T::zero());
                    out[hi..].iter_mut().for_each(|v| *v = T::zero());
                    if lo < hi {
                        let ix0 = lo * p.stride.1 + kx * p.dilation.1 - p.padding.1;
                        let src = &plane[iy * d.w..(iy + 1) * d.w];
                        if p.stride.1 == 1 {
                            out[lo..hi].copy_from_slice(&src[ix0..ix0 + hi - lo]);
                        } else {
                            for (j, v) in out[lo..hi].iter_mut().enumerate() {
                                *v = src[ix0 + j * p.stride.1];
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Adds columns back into one image and group (the adjoint of [`im2col`]).
fn col2im<T: Float>(d: &ConvDims, cols: &[T], g: usize, dx: &mut [T]) {
    let (sp, p) = (d.spatial(), d.p);
    for ci in 0..d.cg() {
        let plane = &mut dx[(g * d.cg() + ci) * d.h * d.w..][..d.h * d.w];
        for ky in 0..d.kh {
            for kx in 0..d.kw {
                let row = &cols[((ci * d.kh + ky) * d.kw + kx) * sp..][..sp];
                for oy in 0..d.oh {
                    let Some(iy) = ConvDims::src(oy, ky, p.stride.0, p.padding.0, p.dilation.0, d.h) else {
                        continue;
                    };
                    for ox in 0..d.ow {
                        if let Some(ix) = ConvDims::src(ox, kx, p.stride.1, p.padding.1, p.dilation.1, d.w) {
                            plane[iy * d.w + ix] += row[oy * d.ow + ox];
                        }
                    }
                }
            }
        }
    }
}

/// `y[n, o, oh, ow] = sum w[o, c, ky, kx] * x[n, c, ...]` per group. Fails (every image's task
/// having run) when an image's scratch buffer (its columns, or its padded copy) cannot be
/// allocated.
pub fn conv2d<T: Float + Default>(d: ConvDims, x: &[T], w: &[T], y: &mut [T]) -> Result<()> {
    let sp = d.spatial();
    let threads = super::threads::num_threads();
    // The rule: the shifted products for stride 1, else im2col; images in parallel when there
    // are enough of them (their gemms then run on the task's thread), otherwise one after the
    // other, each gemm split across the pool. A tuned choice may say otherwise.
    let variant = crate::tune::pick(crate::tune::Kernel::Conv2d, || {
        format!(
            "{} n={} c={} h={} w={} o={} k={}x{} stride={:?} pad={:?} dil={:?} groups={} threads={threads}",
            std::any::type_name::<T>(),
            d.n,
            d.c,
            d.h,
            d.w,
            d.o,
            d.kh,
            d.kw,
            d.p.stride,
            d.p.padding,
            d.p.dilation,
            d.p.groups
        )
    });
    let stride1 = d.p.stride == (1, 1);
    let (shifted, images_parallel) = match variant {
        1 if stride1 => (true, true),
        2 if stride1 => (true, false),
        3 => (false, true),
        4 => (false, false),
        _ => (stride1, d.n >= threads),
    };
    crate::tune::plan(|| format!("conv2d: shifted {shifted}, images in parallel {images_parallel}"));
    let per_image = |i: usize, y: &mut [T]| {
        let xi = &x[i * d.c * d.h * d.w..][..d.c * d.h * d.w];
        if shifted {
            conv_image_shifted(&d, xi, w, y)
        } else {
            conv_image_im2col(&d, xi, w, y)
        }
    };
    if images_parallel {
        pool::try_for_each_chunk(y, d.o * sp, per_image)
    } else {
        y.chunks_mut(d.o * sp)
            .enumerate()
            .try_for_each(|(i, y)| per_image(i, y))
    }
}

/// One image by im2col + one gemm per group.
fn conv_image_im2col<T: Float + Default>(d: &ConvDims, xi: &[T], w: &[T], y: &mut [T]) -> Result<()> {
    let one = T::from_f64(1.0);
    let (ck, sp, og) = (d.ck(), d.spatial(), d.og());
    let mut cols = alloc::filled("conv2d", ck * sp, T::zero())?;
    for g in 0..d.p.groups {
        im2col(d, xi, g, &mut cols);
        let dst = MatMut {
            ptr: y[g * og * sp..].as_mut_ptr(),
            row_stride: sp as isize,
            accumulate: false,
        };
        // SAFETY: w_g is og x ck, cols is ck x sp, dst is og x sp inside y.
        unsafe { gemm_parallel(og, sp, ck, dst, mat(&w[g * og * ck..], ck), mat(&cols, sp), one, one) };
    }
    Ok(())
}

/// One image with stride 1, without im2col: the input is copied once into a zero-padded buffer of
/// width `wp = w + 2 pad`; then for each kernel tap `(ky, kx)` the shifted padded input, read as a
/// `[c, oh * wp]` matrix starting at `ky * dil * wp + kx * dil`, is multiplied by that tap's weights
/// and accumulated into an output computed on the padded width. The `wp - ow` extra columns of
/// each output row are dropped at the end.
fn conv_image_shifted<T: Float + Default>(d: &ConvDims, xi: &[T], w: &[T], y: &mut [T]) -> Result<()> {
    let one = T::from_f64(1.0);
    let p = d.p;
    let (hp, wp) = (d.h + 2 * p.padding.0, d.w + 2 * p.padding.1);
    let taps = d.kh * d.kw;
    let (cg, og) = (d.cg(), d.og());
    // the last tap's matrix reads up to dil * (kw - 1) elements past the padded plane
    let plane = hp * wp;
    let margin = p.dilation.1 * (d.kw - 1);
    let mut xp = alloc::filled("conv2d", d.c * plane + margin, T::zero())?;
    for c in 0..d.c {
        for iy in 0..d.h {
            let dst = c * plane + (iy + p.padding.0) * wp + p.padding.1;
            xp[dst..dst + d.w].copy_from_slice(&xi[(c * d.h + iy) * d.w..][..d.w]);
        }
    }
    let cols = d.oh * wp;
    let mut acc = alloc::filled("conv2d", og * cols, T::zero())?;
    for g in 0..p.groups {
        for ky in 0..d.kh {
            for kx in 0..d.kw {
                let tap = ky * d.kw + kx;
                let shift = ky * p.dilation.0 * wp + kx * p.dilation.1;
                // weights of this tap: [og, cg] at w[(g*og + o) * cg * taps + ci * taps + tap]
                let wg = &w[g * og * cg * taps + tap..];
                let a = MatRef {
                    ptr: wg.as_ptr(),
                    row_stride: (cg * taps) as isize,
                    col_stride: taps as isize,
                };
                let b = MatRef {
                    ptr: xp[g * cg * plane + shift..].as_ptr(),
                    row_stride: plane as isize,
                    col_stride: 1,
                };
                let dst = MatMut {
                    ptr: acc.as_mut_ptr(),
                    row_stride: cols as isize,
                    accumulate: tap > 0,
                };
                // SAFETY: a is og x cg inside w; b is cg x cols inside xp (the margin covers the
                // last row's overhang); dst is og x cols.
                unsafe { gemm_parallel(og, cols, cg, dst, a, b, one, one) };
            }
        }
        for o in 0..og {
            for oy in 0..d.oh {
                let src = &acc[o * cols + oy * wp..][..d.ow];
                y[((g * og + o) * d.oh + oy) * d.ow..][..d.ow].copy_from_slice(src);
            }
        }
    }
    Ok(())
}

/// Gradients of [`conv2d`]: writes `dx` (zeroed here) and `dw` given `dy`. Fails when an image's
/// scratch buffers cannot be allocated.
pub fn conv2d_backward<T: Float + Default>(
    d: ConvDims,
    x: &[T],
    w: &[T],
    dy: &[T],
    dx: &mut [T],
    dw: &mut [T],
) -> Result<()> {
    let one = T::from_f64(1.0);
    let (ck, sp, og) = (d.ck(), d.spatial(), d.og());
    let image = d.c * d.h * d.w;
    let dxs = Chunks::new(dx, image);
    let partials = pool::map(d.n, |i| {
        // SAFETY: `map` calls each image once, and each takes its own chunk.
        let dxi = unsafe { dxs.take(i) };
        dxi.iter_mut().for_each(|v| *v = T::zero());
        let op = "conv2d_backward";
        let mut dw_part = alloc::filled(op, dw.len(), T::zero())?;
        let mut cols = alloc::filled(op, ck * sp, T::zero())?;
        let mut dcols = alloc::filled(op, ck * sp, T::zero())?;
        let xi = &x[i * image..][..image];
        let dyi = &dy[i * d.o * sp..][..d.o * sp];
        for g in 0..d.p.groups {
            im2col(&d, xi, g, &mut cols);
            let dyg = &dyi[g * og * sp..];
            // SAFETY: shapes og x sp (dy_g), ck x sp (cols), og x ck (dw_g, w_g) as allocated.
            unsafe {
                let dwg = MatMut {
                    ptr: dw_part[g * og * ck..].as_mut_ptr(),
                    row_stride: ck as isize,
                    accumulate: false,
                };
                gemm(og, ck, sp, dwg, mat(dyg, sp), mat_t(&cols, sp), one, one);
                let dc = MatMut {
                    ptr: dcols.as_mut_ptr(),
                    row_stride: sp as isize,
                    accumulate: false,
                };
                gemm(ck, sp, og, dc, mat_t(&w[g * og * ck..], ck), mat(dyg, sp), one, one);
            }
            col2im(&d, &dcols, g, dxi);
        }
        Ok(dw_part)
    });
    // per-image partial weight gradients, added in image order (reproducible)
    let mut partial = alloc::filled("conv2d_backward", dw.len(), T::zero())?;
    for p in partials {
        partial.iter_mut().zip(p?).for_each(|(a, b)| *a += b);
    }
    dw.copy_from_slice(&partial);
    Ok(())
}

/// Pooling sizes: `planes` = n * c planes of `h x w` to `oh x ow`.
#[derive(Clone, Copy, Debug)]
pub struct PoolDims {
    pub planes: usize,
    pub h: usize,
    pub w: usize,
    pub oh: usize,
    pub ow: usize,
    pub p: Pool2dParams,
}

/// Max pooling; `idx` gets the flat `h*w` position of each window's max (first on ties).
pub fn max_pool2d<T: Float>(d: PoolDims, x: &[T], y: &mut [T], idx: &mut [i64]) {
    let p = d.p;
    let (ys, idxs) = (Chunks::new(y, d.oh * d.ow), Chunks::new(idx, d.oh * d.ow));
    pool::run(ys.count(), |pl| {
        // SAFETY: `run` calls each plane once.
        let (y, idx) = unsafe { (ys.take(pl), idxs.take(pl)) };
        let plane = &x[pl * d.h * d.w..][..d.h * d.w];
        for oy in 0..d.oh {
            for ox in 0..d.ow {
                let mut best = T::neg_infinity();
                let mut at = -1i64;
                for ky in 0..p.kernel.0 {
                    let Some(iy) = ConvDims::src(oy, ky, p.stride.0, p.padding.0, 1, d.h) else {
                        continue;
                    };
                    for kx in 0..p.kernel.1 {
                        let Some(ix) = ConvDims::src(ox, kx, p.stride.1, p.padding.1, 1, d.w) else {
                            continue;
                        };
                        let v = plane[iy * d.w + ix];
                        if v > best || at < 0 || crate::dtype::is_nan(v) {
                            best = v;
                            at = (iy * d.w + ix) as i64;
                        }
                    }
                }
                y[oy * d.ow + ox] = best;
                idx[oy * d.ow + ox] = at;
            }
        }
    });
}

/// Gradient of [`max_pool2d`]: each output gradient goes to its window's max.
pub fn max_pool2d_backward<T: Float>(d: PoolDims, idx: &[i64], dy: &[T], dx: &mut [T]) {
    pool::for_each_chunk(dx, d.h * d.w, |pl, dx| {
        dx.iter_mut().for_each(|v| *v = T::zero());
        let s = pl * d.oh * d.ow;
        for (&i, &g) in idx[s..s + d.oh * d.ow].iter().zip(&dy[s..s + d.oh * d.ow]) {
            if i >= 0 {
                dx[i as usize] += g;
            }
        }
    });
}

/// Average pooling counting padded positions (PyTorch's default `count_include_pad=True`).
pub fn avg_pool2d<T: Float>(d: PoolDims, x: &[T], y: &mut [T]) {
    let p = d.p;
    let inv = T::from_f64(1.0 / (p.kernel.0 * p.kernel.1) as f64);
    pool::for_each_chunk(y, d.oh * d.ow, |pl, y| {
        let plane = &x[pl * d.h * d.w..][..d.h * d.w];
        for oy in 0..d.oh {
            for ox in 0..d.ow {
                let mut sum = T::zero();
                for ky in 0..p.kernel.0 {
                    let Some(iy) = ConvDims::src(oy, ky, p.stride.0, p.padding.0, 1, d.h) else {
                        continue;
                    };
                    for kx in 0..p.kernel.1 {
                        if let Some(ix) = ConvDims::src(ox, kx, p.stride.1, p.padding.1, 1, d.w) {
                            sum += plane[iy * d.w + ix];
                        }
                    }
                }
                y[oy * d.ow + ox] = sum * inv;
            }
        }
    });
}

/// Gradient of [`avg_pool2d`].
pub fn avg_pool2d_backward<T: Float>(d: PoolDims, dy: &[T], dx: &mut [T]) {
    let p = d.p;
    let inv = T::from_f64(1.0 / (p.kernel.0 * p.kernel.1) as f64);
    pool::for_each_chunk(dx, d.h * d.w, |pl, dx| {
        dx.iter_mut().for_each(|v| *v = T::zero());
        let dy = &dy[pl * d.oh * d.ow..][..d.oh * d.ow];
        for oy in 0..d.oh {
            for ox in 0..d.ow {
                let g = dy[oy * d.ow + ox] * inv;
                for ky in 0..p.kernel.0 {
                    let Some(iy) = ConvDims::src(oy, ky, p.stride.0, p.padding.0, 1, d.h) else {
                        continue;
                    };
                    for kx in 0..p.kernel.1 {
                        if let Some(ix) = ConvDims::src(ox, kx, p.stride.1, p.padding.1, 1, d.w) {
                            dx[iy * d.w + ix] += g;
                        }
                    }
                }
            }
        }
    });
}
