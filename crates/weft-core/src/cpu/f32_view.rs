//! Generic-to-f32 slice views, so generic kernels can route f32 data to their
//! `simd_dispatch!` instantiations.

use std::mem::MaybeUninit;

/// Reinterprets a generic slice as f32 when `T` is f32.
#[inline(always)]
pub fn as_f32<T: 'static>(x: &[T]) -> Option<&[f32]> {
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>())
        // SAFETY: T is f32 (checked above), so the layout is identical.
        .then(|| unsafe { std::slice::from_raw_parts(x.as_ptr() as *const f32, x.len()) })
}

#[inline(always)]
pub fn as_f32_mut<T: 'static>(x: &mut [T]) -> Option<&mut [f32]> {
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>())
        // SAFETY: T is f32 (checked above), so the layout is identical.
        .then(|| unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr() as *mut f32, x.len()) })
}

/// [`as_f32_mut`] for a buffer still to be written.
#[inline(always)]
pub fn as_f32_uninit<T: 'static>(x: &mut [MaybeUninit<T>]) -> Option<&mut [MaybeUninit<f32>]> {
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>())
        // SAFETY: T is f32 (checked above), so the layout is identical.
        .then(|| unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr() as *mut MaybeUninit<f32>, x.len()) })
}
