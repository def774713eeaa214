//! Fallible allocation of tensor-sized buffers.
//!
//! `vec![x; n]` and `Vec::with_capacity(n)` abort the process when the allocator refuses a buffer
//! ("memory allocation of N bytes failed", exit 134), and a size whose byte count overflows
//! panics. Sizes often come from outside input (a config's batch size or width, a file's header),
//! so every tensor-sized buffer of `weft-core` is allocated here instead, and an impossible size
//! is an [`Error::OutOfMemory`] naming the op and the bytes.
//!
//! Two checks per buffer, one comparison and one `try_reserve_exact`:
//!
//! 1. No single buffer may be larger than the machine's memory ([`machine_memory`]). Linux
//!    overcommits: a reservation far above what the machine can back succeeds, and the process is
//!    killed later, when the pages are touched. Refusing it up front turns that into an error.
//! 2. `Vec::try_reserve_exact`, which fails (instead of aborting) when the allocator refuses.
//!
//! Nothing here fills memory: [`uninit`] keeps the kernels' uninitialized outputs (see
//! `crate::cpu::assume_init`).

use std::mem::MaybeUninit;
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// Bytes of memory this process can have at most ([`crate::memory::total`]), read once and
/// cached. `None` where unknown (other systems, or Linux without `/proc`).
pub fn machine_memory() -> Option<u64> {
    static MEMORY: OnceLock<Option<u64>> = OnceLock::new();
    *MEMORY.get_or_init(crate::memory::total)
}

/// `bytes` in decimal units with one decimal ("51.2 GB").
pub fn human_bytes(bytes: u128) -> String {
    const UNITS: [&str; 8] = ["kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"];
    if bytes < 1000 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1000.0;
    let mut unit = 0;
    while v >= 999.95 && unit + 1 < UNITS.len() {
        v /= 1000.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// The reason part of an [`Error::OutOfMemory`] message.
pub(crate) fn why(memory: Option<u64>) -> String {
    match memory {
        Some(m) => format!("more than this machine's {} of memory", human_bytes(m as u128)),
        None => "out of memory".to_string(),
    }
}

/// Fails unless one buffer of `n` elements of `T` may be allocated: its byte count fits in the
/// address space and is at most [`machine_memory`]. Returns the byte count. For a buffer built
/// by code that cannot fail (a `Vec` from another library), checked before it is built.
pub fn check<T>(op: &'static str, n: usize) -> Result<usize> {
    let bytes = n as u128 * std::mem::size_of::<T>() as u128;
    check_bytes(op, bytes)?;
    Ok(bytes as usize)
}

/// [`check`] for a byte count.
pub fn check_bytes(op: &'static str, bytes: u128) -> Result<()> {
    let memory = machine_memory();
    if let Some(m) = memory.filter(|&m| bytes > m as u128) {
        return Err(Error::OutOfMemory {
            op,
            bytes,
            memory: Some(m),
        });
    }
    if bytes > isize::MAX as u128 {
        return Err(Error::OutOfMemory { op, bytes, memory });
    }
    Ok(())
}

/// An empty `Vec` with room for exactly `n` elements (to `extend` without reallocating).
pub fn with_capacity<T>(op: &'static str, n: usize) -> Result<Vec<T>> {
    let bytes = check::<T>(op, n)?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::OutOfMemory {
        op,
        bytes: bytes as u128,
        memory: None,
    })?;
    Ok(v)
}

/// A buffer of `n` elements for a kernel that writes every one of them: no zero fill (which, done
/// by the thread that allocates, is serial work in front of each parallel kernel). Once written,
/// `crate::cpu::assume_init` turns it into a `Vec<T>`.
pub fn uninit<T>(op: &'static str, n: usize) -> Result<Vec<MaybeUninit<T>>> {
    let mut v = with_capacity(op, n)?;
    // SAFETY: the capacity is at least n, and MaybeUninit needs no initialization.
    unsafe { v.set_len(n) };
    Ok(v)
}

/// `n` copies of `value`.
pub fn filled<T: Clone>(op: &'static str, n: usize, value: T) -> Result<Vec<T>> {
    let mut v = with_capacity(op, n)?;
    v.resize(n, value);
    Ok(v)
}

/// The `n` items of `items` in a `Vec` allocated here (`items` must yield `n` items; more would
/// grow the `Vec` infallibly).
pub fn collect<T>(op: &'static str, n: usize, items: impl IntoIterator<Item = T>) -> Result<Vec<T>> {
    let mut v = with_capacity(op, n)?;
    v.extend(items);
    debug_assert_eq!(v.len(), n);
    Ok(v)
}

/// A copy of `src`.
pub fn copy<T: Copy>(op: &'static str, src: &[T]) -> Result<Vec<T>> {
    let mut v = with_capacity(op, src.len())?;
    v.extend_from_slice(src);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_decimal_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(51_200_000_000), "51.2 GB");
        assert_eq!(human_bytes(999_999), "1.0 MB");
        assert_eq!(human_bytes(4_398_046_511_104), "4.4 TB");
        assert!(human_bytes(u128::MAX).ends_with(" YB"));
    }

    #[test]
    fn impossible_sizes_are_errors_naming_the_op_and_the_bytes() {
        // a byte count past the address space, whatever the machine
        let e = with_capacity::<u64>("test_op", usize::MAX).unwrap_err();
        let bytes = usize::MAX as u128 * 8;
        assert!(
            matches!(e, Error::OutOfMemory { op: "test_op", bytes: b, .. } if b == bytes),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(
            msg.starts_with("test_op: cannot allocate ") && msg.contains(&format!("({bytes} bytes)")),
            "{msg}"
        );
        assert!(uninit::<f32>("u", usize::MAX / 2).is_err());
        assert!(filled::<u8>("f", usize::MAX, 0).is_err());
    }

    #[test]
    fn more_than_the_machine_has_is_refused_up_front() {
        let Some(m) = machine_memory() else {
            return; // not known here: only the allocator's refusal applies
        };
        assert!(m > 1 << 20, "{m}");
        let n = (m / 4 + 1) as usize;
        let msg = uninit::<f32>("matmul", n).unwrap_err().to_string();
        let want = format!(
            "matmul: cannot allocate {} ({} bytes): more than this machine's {} of memory",
            human_bytes(n as u128 * 4),
            n as u128 * 4,
            human_bytes(m as u128)
        );
        assert_eq!(msg, want);
        // and a buffer that fits is allocated as asked, uninitialized or filled
        assert_eq!(uninit::<f32>("matmul", 1000).unwrap().len(), 1000);
        assert_eq!(filled("fill", 3, 7i64).unwrap(), vec![7, 7, 7]);
        assert_eq!(collect("c", 3, (0..3).map(|i| i * 2)).unwrap(), vec![0, 2, 4]);
        assert_eq!(copy("c", &[1u8, 2]).unwrap(), vec![1, 2]);
    }
}
