//! Element types chosen at run time.

use half::{bf16, f16};

/// The element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F64,
    BF16,
    F16,
    I64,
    I32,
    U8,
    Bool,
}

impl DType {
    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// True for the floating-point types.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::BF16 | DType::F16)
    }

    /// True for the integer types (not Bool).
    pub fn is_int(self) -> bool {
        matches!(self, DType::I64 | DType::I32 | DType::U8)
    }

    /// The dtype kernels compute in: f64 stays f64, every other float computes in f32.
    pub fn compute_float(self) -> DType {
        if self == DType::F64 {
            DType::F64
        } else {
            DType::F32
        }
    }

    /// The name PyTorch and safetensors use ("float32", ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::BF16 => "bfloat16",
            DType::F16 => "float16",
            DType::I64 => "int64",
            DType::I32 => "int32",
            DType::U8 => "uint8",
            DType::Bool => "bool",
        }
    }
}

/// A Rust type that can be a tensor element.
pub trait Element: Copy + Send + Sync + 'static + std::fmt::Debug + PartialOrd {
    const DTYPE: DType;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
    fn zero() -> Self;
}

macro_rules! element {
    ($t:ty, $d:ident, $to:expr, $from:expr, $zero:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            #[inline(always)]
            fn to_f64(self) -> f64 {
                let f: fn($t) -> f64 = $to;
                f(self)
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                let f: fn(f64) -> $t = $from;
                f(v)
            }
            #[inline(always)]
            fn zero() -> Self {
                $zero
            }
        }
    };
}

element!(f32, F32, |x| x as f64, |v| v as f32, 0.0);
element!(f64, F64, |x| x, |v| v, 0.0);
element!(bf16, BF16, |x| x.to_f64(), bf16::from_f64, bf16::ZERO);
element!(f16, F16, |x| x.to_f64(), f16::from_f64, f16::ZERO);
element!(i64, I64, |x| x as f64, |v| v as i64, 0);
element!(i32, I32, |x| x as f64, |v| v as i32, 0);
element!(u8, U8, |x| x as f64, |v| v as u8, 0);
element!(bool, Bool, |x| if x { 1.0 } else { 0.0 }, |v| v != 0.0, false);

/// True for NaN (any `PartialOrd` type: a value that does not compare equal to itself).
#[inline(always)]
pub fn is_nan<T: PartialOrd>(x: T) -> bool {
    x.partial_cmp(&x).is_none()
}

/// A float type the kernels compute in (f32 or f64).
pub trait Float:
    Element
    + num_like::Num
    + std::ops::Neg<Output = Self>
    + std::iter::Sum
    + std::ops::AddAssign
    + std::ops::SubAssign
    + std::ops::MulAssign
{
    fn exp(self) -> Self;
    /// e^x for arguments `<= 0` (such as `x - max`): the vectorizable polynomial for f32
    /// (`cpu::math::exp_nonpos_f32`, no overflow handling); exact `exp` for f64.
    fn exp_nonpos(self) -> Self;
    fn ln(self) -> Self;
    fn sqrt(self) -> Self;
    fn tanh(self) -> Self;
    fn powf(self, e: Self) -> Self;
    fn abs(self) -> Self;
    fn erf(self) -> Self;
    fn max(self, o: Self) -> Self;
    fn min(self, o: Self) -> Self;
    fn neg_infinity() -> Self;
    fn from_usize(v: usize) -> Self;
}

/// Arithmetic bounds shared by the kernels' generic code.
pub mod num_like {
    pub trait Num:
        Copy
        + std::ops::Add<Output = Self>
        + std::ops::Sub<Output = Self>
        + std::ops::Mul<Output = Self>
        + std::ops::Div<Output = Self>
    {
    }
    impl<T> Num for T where
        T: Copy
            + std::ops::Add<Output = T>
            + std::ops::Sub<Output = T>
            + std::ops::Mul<Output = T>
            + std::ops::Div<Output = T>
    {
    }
}

macro_rules! float {
    (@exp_nonpos f32, $x:expr) => {
        crate::cpu::math::exp_nonpos_f32($x)
    };
    (@exp_nonpos f64, $x:expr) => {
        $x.exp()
    };
    ($t:ident) => {
        impl Float for $t {
            #[inline(always)]
            fn exp(self) -> Self {
                $t::exp(self)
            }
            #[inline(always)]
            fn exp_nonpos(self) -> Self {
                float!(@exp_nonpos $t, self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                $t::ln(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                $t::sqrt(self)
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                $t::tanh(self)
            }
            #[inline(always)]
            fn powf(self, e: Self) -> Self {
                $t::powf(self, e)
            }
            #[inline(always)]
            fn abs(self) -> Self {
                $t::abs(self)
            }
            #[inline(always)]
            fn erf(self) -> Self {
                crate::cpu::math::erf_f64(self as f64) as $t
            }
            #[inline(always)]
            fn max(self, o: Self) -> Self {
                $t::max(self, o)
            }
            #[inline(always)]
            fn min(self, o: Self) -> Self {
                $t::min(self, o)
            }
            #[inline(always)]
            fn neg_infinity() -> Self {
                $t::NEG_INFINITY
            }
            #[inline(always)]
            fn from_usize(v: usize) -> Self {
                v as $t
            }
        }
    };
}
float!(f32);
float!(f64);
