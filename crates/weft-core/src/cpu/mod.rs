//! CPU kernels: plain functions over row-major slices. The ops in `crate::ops` validate shapes and
//! dtypes, make inputs contiguous, and call these.

pub mod amx;
pub mod attention;
pub mod bf16_gemm;
pub mod conv;
pub mod convert;
pub mod elementwise;
pub mod f32_view;
pub mod lanes;
pub mod math;
pub mod matmul;
pub mod nn;
pub mod pool;
pub mod reduce;
pub mod skinny;
pub mod small_gemm;
pub mod threads;
pub mod transpose;

/// Below this many elements a kernel stays on the calling thread.
pub const PARALLEL_THRESHOLD: usize = 1 << 15;

/// The buffer of [`crate::alloc::uninit`] once written.
///
/// # Safety
/// Every element must have been written.
pub(crate) unsafe fn assume_init<T>(v: Vec<std::mem::MaybeUninit<T>>) -> Vec<T> {
    let mut v = std::mem::ManuallyDrop::new(v);
    // SAFETY: MaybeUninit<T> has T's layout; the caller promises every element is initialized.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr() as *mut T, v.len(), v.capacity()) }
}

/// Zero-fills a block of an [`crate::alloc::uninit`] buffer and returns it initialized. Called by the kernel
/// task that then writes the block, so the fill runs in parallel and leaves the block in that
/// core's cache (for kernels that use their output as scratch before its final values).
pub(crate) fn zeroed<T: crate::dtype::Float>(v: &mut [std::mem::MaybeUninit<T>]) -> &mut [T] {
    for x in v.iter_mut() {
        x.write(T::zero());
    }
    // SAFETY: every element was just written; MaybeUninit<T> has T's layout.
    unsafe { &mut *(v as *mut [std::mem::MaybeUninit<T>] as *mut [T]) }
}
