//! Pointwise kernels. f32 loops are compiled three times (AVX-512, AVX2+FMA, baseline) and the
//! widest one the CPU supports is chosen at run time; the math in `math.rs` keeps them branch-free
//! so they vectorize.

use std::mem::MaybeUninit;

use super::math::{erf_and_gauss_f32, erf_f32, exp_f32, sigmoid_f32, tanh_f32};
use super::PARALLEL_THRESHOLD;
use crate::dtype::Float;
use crate::op::{BinaryOp, UnaryOp};

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_TANH_C: f64 = 0.044_715;
const FRAC_1_SQRT_2: f64 = std::f64::consts::FRAC_1_SQRT_2;
const FRAC_1_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

/// Runs `$body` (a block using the slices) inside a function compiled for the widest vector unit.
macro_rules! simd_dispatch {
    ($name:ident ( $($arg:ident : $ty:ty),* ) $body:block) => {
        #[allow(clippy::too_many_arguments)]
        fn $name($($arg: $ty),*) {
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn __simd_body($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn v4($($arg: $ty),*) { __simd_body($($arg),*) }
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn v3($($arg: $ty),*) { __simd_body($($arg),*) }
                if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bw") && std::arch::is_x86_feature_detected!("avx512vl") {
                    // SAFETY: the CPU supports the features v4 was compiled for.
                    return unsafe { v4($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                    // SAFETY: the CPU supports the features v3 was compiled for.
                    return unsafe { v3($($arg),*) };
                }
            }
            __simd_body($($arg),*)
        }
    };
}
pub(crate) use simd_dispatch;

/// Elements per task of a pointwise kernel over `len` elements: about four tasks per thread,
/// none under 4096 elements.
fn chunk_len(len: usize) -> usize {
    len.div_ceil(super::threads::num_threads() * 4).max(4096)
}

/// Splits `dst` (and the matching `src` ranges) into chunks for the pool when large.
pub(super) fn par_chunks2<A: Sync, B: Send>(src: &[A], dst: &mut [B], f: impl Fn(&[A], &mut [B]) + Sync) {
    if dst.len() < PARALLEL_THRESHOLD {
        f(src, dst);
        return;
    }
    let chunk = chunk_len(dst.len());
    super::pool::for_each_chunk(dst, chunk, |i, d| f(&src[i * chunk..i * chunk + d.len()], d));
}

/// `dst[i] += src[i]` over equal lengths, on the pool when large.
pub(crate) fn add_assign<T: Copy + std::ops::AddAssign + Send + Sync>(dst: &mut [T], src: &[T]) {
    debug_assert_eq!(dst.len(), src.len());
    par_chunks2(src, dst, |s, d| {
        for (d, &s) in d.iter_mut().zip(s) {
            *d += s;
        }
    });
}

fn par_chunks3<A: Sync, B: Sync, C: Send>(a: &[A], b: &[B], dst: &mut [C], f: impl Fn(&[A], &[B], &mut [C]) + Sync) {
    if dst.len() < PARALLEL_THRESHOLD {
        f(a, b, dst);
        return;
    }
    let chunk = chunk_len(dst.len());
    super::pool::for_each_chunk(dst, chunk, |i, d| {
        let r = i * chunk..i * chunk + d.len();
        f(&a[r.clone()], &b[r], d)
    });
}

#[inline(always)]
fn gelu_f32(x: f32) -> f32 {
    0.5 * x * (1.0 + erf_f32(x * FRAC_1_SQRT_2 as f32))
}

#[inline(always)]
fn gelu_tanh_f32(x: f32) -> f32 {
    let inner = SQRT_2_OVER_PI as f32 * (x + GELU_TANH_C as f32 * x * x * x);
    0.5 * x * (1.0 + tanh_f32(inner))
}

simd_dispatch!(unary_f32_serial(op: UnaryOp, src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    macro_rules! each {
        ($f:expr) => {
            for (d, &s) in dst.iter_mut().zip(src) {
                d.write($f(s));
            }
        };
    }
    match op {
        UnaryOp::Neg => each!(|x: f32| -x),
        UnaryOp::Exp => each!(exp_f32),
        UnaryOp::Log => each!(|x: f32| x.ln()),
        UnaryOp::Sqrt => each!(|x: f32| x.sqrt()),
        UnaryOp::Rsqrt => each!(|x: f32| 1.0 / x.sqrt()),
        UnaryOp::Abs => each!(|x: f32| x.abs()),
        UnaryOp::Tanh => each!(tanh_f32),
        UnaryOp::Sigmoid => each!(sigmoid_f32),
        UnaryOp::Relu => each!(|x: f32| if x > 0.0 { x } else { 0.0 }),
        UnaryOp::Gelu => each!(gelu_f32),
        UnaryOp::GeluTanh => each!(gelu_tanh_f32),
        UnaryOp::Silu => each!(|x: f32| x * sigmoid_f32(x)),
    }
});

simd_dispatch!(binary_bf16_serial(op: BinaryOp, a: &[half::bf16], b: &[half::bf16], dst: &mut [MaybeUninit<half::bf16>]) {
    use super::convert::{bf16_to_f32, f32_to_bf16_bits};
    macro_rules! each {
        ($f:expr) => {
            for ((d, &x), &y) in dst.iter_mut().zip(a).zip(b) {
                let r: f32 = $f(bf16_to_f32(x), bf16_to_f32(y));
                d.write(half::bf16::from_bits(f32_to_bf16_bits(r)));
            }
        };
    }
    match op {
        BinaryOp::Add => each!(|x: f32, y: f32| x + y),
        BinaryOp::Sub => each!(|x: f32, y: f32| x - y),
        BinaryOp::Mul => each!(|x: f32, y: f32| x * y),
        BinaryOp::Div => each!(|x: f32, y: f32| x / y),
        BinaryOp::Maximum => each!(|x: f32, y: f32| if y > x { y } else { x }),
        BinaryOp::Minimum => each!(|x: f32, y: f32| if y < x { y } else { x }),
        BinaryOp::Pow => each!(|x: f32, y: f32| x.powf(y)),
    }
});

/// `dst[i] = op(a[i], b[i])` of bf16 values computed in f32 and rounded once (nearest, ties to
/// even): in one pass, bit for bit what widening both operands, the f32 op and narrowing its
/// result give (every element of `dst` written; the three of one length).
pub fn binary_bf16(op: BinaryOp, a: &[half::bf16], b: &[half::bf16], dst: &mut [MaybeUninit<half::bf16>]) {
    assert!(
        a.len() == dst.len() && b.len() == dst.len(),
        "binary_bf16 of buffers of different lengths"
    );
    par_chunks3(a, b, dst, |a, b, d| binary_bf16_serial(op, a, b, d));
}

/// `dst[i] = op(src[i])` for f32 (every element of `dst` written).
pub fn unary_f32(op: UnaryOp, src: &[f32], dst: &mut [MaybeUninit<f32>]) {
    par_chunks2(src, dst, |s, d| unary_f32_serial(op, s, d));
}

simd_dispatch!(unary_backward_f32_serial(op: UnaryOp, x: &[f32], g: &[f32], dst: &mut [MaybeUninit<f32>]) {
    macro_rules! each {
        ($f:expr) => {
            for ((d, &x), &g) in dst.iter_mut().zip(x).zip(g) {
                d.write(g * $f(x));
            }
        };
    }
    match op {
        UnaryOp::Neg => each!(|_x: f32| -1.0),
        UnaryOp::Exp => each!(exp_f32),
        UnaryOp::Log => each!(|x: f32| 1.0 / x),
        UnaryOp::Sqrt => each!(|x: f32| 0.5 / x.sqrt()),
        UnaryOp::Rsqrt => each!(|x: f32| -0.5 / (x * x.sqrt())),
        UnaryOp::Abs => each!(|x: f32| if x > 0.0 { 1.0 } else if x < 0.0 { -1.0 } else { 0.0 }),
        UnaryOp::Tanh => each!(|x: f32| { let t = tanh_f32(x); 1.0 - t * t }),
        UnaryOp::Sigmoid => each!(|x: f32| { let s = sigmoid_f32(x); s * (1.0 - s) }),
        UnaryOp::Relu => each!(|x: f32| if x > 0.0 { 1.0 } else { 0.0 }),
        UnaryOp::Gelu => each!(|x: f32| {
            // erf(x / sqrt 2) and e^(-x^2 / 2) from one exponential
            let (erf, gauss) = erf_and_gauss_f32(x * FRAC_1_SQRT_2 as f32);
            let cdf = 0.5 * (1.0 + erf);
            let pdf = FRAC_1_SQRT_2PI as f32 * gauss;
            cdf + x * pdf
        }),
        UnaryOp::GeluTanh => each!(|x: f32| {
            let x2 = x * x;
            let inner = SQRT_2_OVER_PI as f32 * (x + GELU_TANH_C as f32 * x2 * x);
            let t = tanh_f32(inner);
            let dinner = SQRT_2_OVER_PI as f32 * (1.0 + 3.0 * GELU_TANH_C as f32 * x2);
            0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner
        }),
        UnaryOp::Silu => each!(|x: f32| { let s = sigmoid_f32(x); s * (1.0 + x * (1.0 - s)) }),
    }
});

/// `dst[i] = g[i] * op'(x[i])` for f32 (every element of `dst` written).
pub fn unary_backward_f32(op: UnaryOp, x: &[f32], g: &[f32], dst: &mut [MaybeUninit<f32>]) {
    par_chunks3(x, g, dst, |x, g, d| unary_backward_f32_serial(op, x, g, d));
}

/// The value and derivative of `op` at `x`, in full precision (the f64 path and the reference).
#[inline]
pub fn unary_scalar<T: Float>(op: UnaryOp, x: T) -> (T, T) {
    let one = T::from_f64(1.0);
    let half = T::from_f64(0.5);
    match op {
        UnaryOp::Neg => (-x, -one),
        UnaryOp::Exp => (x.exp(), x.exp()),
        UnaryOp::Log => (x.ln(), one / x),
        UnaryOp::Sqrt => (x.sqrt(), half / x.sqrt()),
        UnaryOp::Rsqrt => (one / x.sqrt(), -half / (x * x.sqrt())),
        UnaryOp::Abs => {
            let z = T::zero();
            (
                x.abs(),
                if x > z {
                    one
                } else if x < z {
                    -one
                } else {
                    z
                },
            )
        }
        UnaryOp::Tanh => {
            let t = x.tanh();
            (t, one - t * t)
        }
        UnaryOp::Sigmoid => {
            let s = one / (one + (-x).exp());
            (s, s * (one - s))
        }
        UnaryOp::Relu => {
            let z = T::zero();
            if x > z {
                (x, one)
            } else {
                (z, z)
            }
        }
        UnaryOp::Gelu => {
            let cdf = half * (one + (x * T::from_f64(FRAC_1_SQRT_2)).erf());
            let pdf = T::from_f64(FRAC_1_SQRT_2PI) * (-half * x * x).exp();
            (x * cdf, cdf + x * pdf)
        }
        UnaryOp::GeluTanh => {
            let c = T::from_f64(SQRT_2_OVER_PI);
            let k = T::from_f64(GELU_TANH_C);
            let t = (c * (x + k * x * x * x)).tanh();
            let d = half * (one + t) + half * x * (one - t * t) * c * (one + T::from_f64(3.0) * k * x * x);
            (half * x * (one + t), d)
        }
        UnaryOp::Silu => {
            let s = one / (one + (-x).exp());
            (x * s, s * (one + x * (one - s)))
        }
    }
}

/// `dst[i] = op(src[i])` for f64 (full-precision scalar math; every element of `dst` written).
pub fn unary_f64(op: UnaryOp, src: &[f64], dst: &mut [MaybeUninit<f64>]) {
    par_chunks2(src, dst, |s, d| {
        for (d, &x) in d.iter_mut().zip(s) {
            d.write(unary_scalar(op, x).0);
        }
    });
}

/// `dst[i] = op(src[i])` on the calling thread, for a kernel task applying `op` to its own block
/// (the f32 path is the one [`unary_f32`] runs, so results are the same bits).
pub fn unary_serial<T: Float>(op: UnaryOp, src: &[T], dst: &mut [MaybeUninit<T>]) {
    match (super::f32_view::as_f32(src), super::f32_view::as_f32_uninit(dst)) {
        (Some(s), Some(d)) => unary_f32_serial(op, s, d),
        _ => {
            for (d, &x) in dst.iter_mut().zip(src) {
                d.write(unary_scalar(op, x).0);
            }
        }
    }
}

/// `dst[i] = g[i] * op'(x[i])` on the calling thread (the f32 path is the one
/// [`unary_backward_f32`] runs).
pub fn unary_backward_serial<T: Float>(op: UnaryOp, x: &[T], g: &[T], dst: &mut [MaybeUninit<T>]) {
    match (
        super::f32_view::as_f32(x),
        super::f32_view::as_f32(g),
        super::f32_view::as_f32_uninit(dst),
    ) {
        (Some(x), Some(g), Some(d)) => unary_backward_f32_serial(op, x, g, d),
        _ => {
            for ((d, &x), &g) in dst.iter_mut().zip(x).zip(g) {
                d.write(g * unary_scalar(op, x).1);
            }
        }
    }
}

/// `dst = g * op'(x)` over `[rows, inner]` and the column sums of `dst` (`[inner]`): the
/// gradient through a linear layer's activation and its bias gradient in one pass. The sums
/// are those of `reduce_columns` on `dst`, bit for bit.
pub fn unary_backward_column_sums<T: Float>(
    op: UnaryOp,
    x: &[T],
    g: &[T],
    inner: usize,
    dst: &mut [MaybeUninit<T>],
) -> Vec<T> {
    let block = (super::reduce::COLUMN_BLOCK_ROWS * inner).max(1);
    let blocks = super::pool::Chunks::new(dst, block);
    let partials = super::pool::map(blocks.count(), |i| {
        // SAFETY: `map` calls each block once.
        let d = unsafe { blocks.take(i) };
        let r = i * block..i * block + d.len();
        unary_backward_serial(op, &x[r.clone()], &g[r], d);
        // SAFETY: the block was written just above.
        let d = unsafe { &*(d as *const [MaybeUninit<T>] as *const [T]) };
        super::reduce::block_partial(crate::op::ReduceOp::Sum, d, inner)
    });
    super::reduce::combine_partials(crate::op::ReduceOp::Sum, &partials, inner)
}

/// `dst[i] = g[i] * op'(x[i])` for f64 (every element of `dst` written).
pub fn unary_backward_f64(op: UnaryOp, x: &[f64], g: &[f64], dst: &mut [MaybeUninit<f64>]) {
    par_chunks3(x, g, dst, |x, g, d| {
        for ((d, &x), &g) in d.iter_mut().zip(x).zip(g) {
            d.write(g * unary_scalar(op, x).1);
        }
    });
}

/// `dst[i] = f(src[i])`, in parallel when large (every element of `dst` written).
pub fn map<A: Copy + Sync, B: Send>(src: &[A], dst: &mut [MaybeUninit<B>], f: impl Fn(A) -> B + Sync) {
    par_chunks2(src, dst, |s, d| {
        for (d, &x) in d.iter_mut().zip(s) {
            d.write(f(x));
        }
    });
}

/// `dst[i] = f(a[i], b[i])` for equal-length slices, in parallel when large (every element of
/// `dst` written).
pub fn zip_map<A: Copy + Sync, B: Copy + Sync, C: Send>(
    a: &[A],
    b: &[B],
    dst: &mut [MaybeUninit<C>],
    f: impl Fn(A, B) -> C + Sync,
) {
    par_chunks3(a, b, dst, |a, b, d| {
        for ((d, &x), &y) in d.iter_mut().zip(a).zip(b) {
            d.write(f(x, y));
        }
    });
}
