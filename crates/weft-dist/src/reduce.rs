//! Element-wise reductions on the raw bytes of a buffer, for every dtype. Values arrive from
//! peers as bytes; they are read with `from_ne_bytes` (no alignment needed) and bool bytes are
//! checked to be 0 or 1 before they are written into a bool tensor.

use weft_core::DType;

use crate::error::{Error, Result};

/// How a collective combines values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    /// The sum divided by the group size (floating dtypes only).
    Avg,
    Max,
    Min,
}

impl ReduceOp {
    pub(crate) fn code(self) -> u8 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Avg => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
        }
    }
}

pub(crate) fn dtype_code(d: DType) -> u8 {
    match d {
        DType::F32 => 0,
        DType::F64 => 1,
        DType::BF16 => 2,
        DType::F16 => 3,
        DType::I64 => 4,
        DType::I32 => 5,
        DType::U8 => 6,
        DType::Bool => 7,
    }
}

pub(crate) fn dtype_name(code: u8) -> String {
    const NAMES: [&str; 8] = ["f32", "f64", "bf16", "f16", "i64", "i32", "u8", "bool"];
    NAMES
        .get(code as usize)
        .map_or_else(|| format!("dtype#{code}"), |s| s.to_string())
}

/// Checks that `op` is defined for `dtype`.
pub(crate) fn check_op(op: ReduceOp, dtype: DType) -> Result<()> {
    if op == ReduceOp::Avg && !dtype.is_float() {
        return Err(Error::Invalid(format!(
            "all_reduce: avg needs a floating dtype, got {dtype:?}"
        )));
    }
    Ok(())
}

macro_rules! fold_native {
    ($T:ty, $dst:expr, $src:expr, $f:expr) => {{
        const N: usize = std::mem::size_of::<$T>();
        for (d, s) in $dst.chunks_exact_mut(N).zip($src.chunks_exact(N)) {
            let a = <$T>::from_ne_bytes(d.try_into().expect("N bytes"));
            let b = <$T>::from_ne_bytes(s.try_into().expect("N bytes"));
            d.copy_from_slice(&$f(a, b).to_ne_bytes());
        }
    }};
}

macro_rules! fold_half {
    ($H:ty, $dst:expr, $src:expr, $f:expr) => {{
        for (d, s) in $dst.chunks_exact_mut(2).zip($src.chunks_exact(2)) {
            let a = <$H>::from_bits(u16::from_ne_bytes([d[0], d[1]])).to_f32();
            let b = <$H>::from_bits(u16::from_ne_bytes([s[0], s[1]])).to_f32();
            d.copy_from_slice(&<$H>::from_f32($f(a, b)).to_bits().to_ne_bytes());
        }
    }};
}

/// `dst[i] = op(dst[i], src[i])` over elements of `dtype` (for `Avg`, the sum: the division
/// comes once at the end, see [`scale_avg`]). `src` comes from `peer` (named in errors).
pub(crate) fn reduce_into(dst: &mut [u8], src: &[u8], dtype: DType, op: ReduceOp, peer: usize) -> Result<()> {
    if dst.len() != src.len() {
        return Err(Error::Io(format!(
            "rank {peer} sent {} bytes where {} were expected",
            src.len(),
            dst.len()
        )));
    }
    macro_rules! by_op {
        ($fold:ident, $T:ty) => {
            match op {
                ReduceOp::Sum | ReduceOp::Avg => $fold!($T, dst, src, |a, b| a + b),
                // NaN wins, whichever side it is on (as torch.maximum), so every rank agrees
                #[allow(clippy::eq_op)]
                ReduceOp::Max => $fold!($T, dst, src, |a: _, b: _| if b > a || b != b { b } else { a }),
                #[allow(clippy::eq_op)]
                ReduceOp::Min => $fold!($T, dst, src, |a: _, b: _| if b < a || b != b { b } else { a }),
            }
        };
    }
    macro_rules! by_op_int {
        ($T:ty) => {
            match op {
                ReduceOp::Sum | ReduceOp::Avg => fold_native!($T, dst, src, |a: $T, b: $T| a.wrapping_add(b)),
                ReduceOp::Max => fold_native!($T, dst, src, |a: $T, b: $T| a.max(b)),
                ReduceOp::Min => fold_native!($T, dst, src, |a: $T, b: $T| a.min(b)),
            }
        };
    }
    match dtype {
        DType::F32 => by_op!(fold_native, f32),
        DType::F64 => by_op!(fold_native, f64),
        DType::BF16 => by_op!(fold_half, half::bf16),
        DType::F16 => by_op!(fold_half, half::f16),
        DType::I64 => by_op_int!(i64),
        DType::I32 => by_op_int!(i32),
        DType::U8 => by_op_int!(u8),
        DType::Bool => {
            check_bools(src, peer)?;
            for (d, &s) in dst.iter_mut().zip(src) {
                // sum and max: logical or; min: logical and
                *d = if op == ReduceOp::Min { *d & s } else { *d | s };
            }
        }
    }
    Ok(())
}

/// Copies elements received from `peer` into `dst`, checking bool bytes.
pub(crate) fn copy_into(dst: &mut [u8], src: &[u8], dtype: DType, peer: usize) -> Result<()> {
    if dst.len() != src.len() {
        return Err(Error::Io(format!(
            "rank {peer} sent {} bytes where {} were expected",
            src.len(),
            dst.len()
        )));
    }
    if dtype == DType::Bool {
        check_bools(src, peer)?;
    }
    dst.copy_from_slice(src);
    Ok(())
}

fn check_bools(src: &[u8], peer: usize) -> Result<()> {
    match src.iter().find(|&&b| b > 1) {
        Some(b) => Err(Error::Io(format!("rank {peer} sent the byte {b} as a bool"))),
        None => Ok(()),
    }
}

/// Divides every element by `n` (the end of an `Avg`).
pub(crate) fn scale_avg(buf: &mut [u8], dtype: DType, n: usize) {
    macro_rules! native {
        ($T:ty) => {
            for d in buf.chunks_exact_mut(std::mem::size_of::<$T>()) {
                let a = <$T>::from_ne_bytes((&*d).try_into().expect("element bytes"));
                d.copy_from_slice(&(a / n as $T).to_ne_bytes());
            }
        };
    }
    macro_rules! halfs {
        ($H:ty) => {
            for d in buf.chunks_exact_mut(2) {
                let a = <$H>::from_bits(u16::from_ne_bytes([d[0], d[1]])).to_f32();
                d.copy_from_slice(&<$H>::from_f32(a / n as f32).to_bits().to_ne_bytes());
            }
        };
    }
    match dtype {
        DType::F32 => native!(f32),
        DType::F64 => native!(f64),
        DType::BF16 => halfs!(half::bf16),
        DType::F16 => halfs!(half::f16),
        _ => {}
    }
}
