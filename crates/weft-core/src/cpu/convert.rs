//! Conversions between f32 and bf16 over whole buffers: branch-free loops that the compiler
//! vectorizes (compiled for the widest vector unit, as the pointwise kernels), on the pool for
//! large buffers. They give the bits `half`'s per-element conversions give.

use std::mem::MaybeUninit;

use half::bf16;

use super::elementwise::{par_chunks2, simd_dispatch};

/// The bf16 nearest to `x`, ties to even (overflow to infinity); a NaN stays a NaN of the same
/// sign and high mantissa bits, made quiet: bit for bit `half::bf16::from_f32`.
#[inline(always)]
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    // adding 0x7fff, plus the lowest kept bit, carries into the kept bits exactly when the
    // dropped half is above one half, or equal to it with an odd kept part
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
    let quiet_nan = (b >> 16) | 0x40;
    (if b & 0x7fff_ffff > 0x7f80_0000 {
        quiet_nan
    } else {
        rounded
    }) as u16
}

/// `x` as f32 (exact); a NaN made quiet: bit for bit `half::bf16::to_f32`.
#[inline(always)]
pub fn bf16_to_f32(x: bf16) -> f32 {
    let b = u32::from(x.to_bits());
    let quiet = if b & 0x7fff > 0x7f80 { 0x40 } else { 0 };
    f32::from_bits((b | quiet) << 16)
}

simd_dispatch!(narrow_serial(src: &[f32], dst: &mut [MaybeUninit<bf16>]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        d.write(bf16::from_bits(f32_to_bf16_bits(x)));
    }
});

simd_dispatch!(widen_serial(src: &[bf16], dst: &mut [MaybeUninit<f32>]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        d.write(bf16_to_f32(x));
    }
});

/// Writes every element of `dst` with `src`'s rounded to bf16 (`dst.len() == src.len()`).
pub fn narrow_to_bf16(src: &[f32], dst: &mut [MaybeUninit<bf16>]) {
    assert_eq!(src.len(), dst.len(), "narrow_to_bf16 of buffers of different lengths");
    par_chunks2(src, dst, narrow_serial);
}

/// Writes every element of `dst` with `src`'s as f32 (`dst.len() == src.len()`).
pub fn widen_to_f32(src: &[bf16], dst: &mut [MaybeUninit<f32>]) {
    assert_eq!(src.len(), dst.len(), "widen_to_f32 of buffers of different lengths");
    par_chunks2(src, dst, widen_serial);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_to_bf16_gives_the_bits_of_half() {
        // every sign, exponent and high mantissa, with dropped halves below, at and above one
        // half (ties with an even and an odd kept part), and NaNs of every payload class
        let lows = [
            0u32, 1, 0x3fff, 0x7ffe, 0x7fff, 0x8000, 0x8001, 0xbfff, 0xfffe, 0xffff, 0x1234, 0xa5a5,
        ];
        for high in 0..=0xffffu32 {
            for &low in &lows {
                let x = f32::from_bits(high << 16 | low);
                assert_eq!(
                    f32_to_bf16_bits(x),
                    bf16::from_f32(x).to_bits(),
                    "{:#010x}",
                    x.to_bits()
                );
            }
            let h = bf16::from_bits(high as u16);
            assert_eq!(bf16_to_f32(h).to_bits(), h.to_f32().to_bits(), "{high:#06x}");
        }
    }

    #[test]
    fn buffers_convert_whole_on_the_pool() {
        let src: Vec<f32> = (0..100_003).map(|i| (i as f32 - 5e4) * 1.37e-3).collect();
        let mut narrow = vec![MaybeUninit::uninit(); src.len()];
        narrow_to_bf16(&src, &mut narrow);
        // SAFETY: every element was written.
        let narrow: Vec<bf16> = narrow.into_iter().map(|x| unsafe { x.assume_init() }).collect();
        assert!(narrow
            .iter()
            .zip(&src)
            .all(|(n, &x)| n.to_bits() == bf16::from_f32(x).to_bits()));
        let mut wide = vec![MaybeUninit::uninit(); src.len()];
        widen_to_f32(&narrow, &mut wide);
        // SAFETY: every element was written.
        let wide: Vec<f32> = wide.into_iter().map(|x| unsafe { x.assume_init() }).collect();
        assert!(wide
            .iter()
            .zip(&narrow)
            .all(|(w, n)| w.to_bits() == n.to_f32().to_bits()));
    }
}
