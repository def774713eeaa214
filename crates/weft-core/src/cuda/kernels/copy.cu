// Copies and fills by element size (1, 2, 4 or 8 bytes): every dtype moves as raw words.

// out[i] = in[strided_offset(src, i)] for the n elements of a view: makes any view contiguous,
// and broadcasts with zero strides.
#define GATHER(T, NAME) \
extern "C" __global__ void NAME(T* out, const T* in, Strided src, u64 n) { \
    FOR_EACH(i, n) out[i] = in[strided_offset(src, i)]; \
}
GATHER(unsigned char, gather_1)
GATHER(unsigned short, gather_2)
GATHER(u32, gather_4)
GATHER(u64, gather_8)

// out[strided_offset(dst, i)] = in[i]: writes a contiguous block into a view (copy_from, cat).
#define SCATTER(T, NAME) \
extern "C" __global__ void NAME(T* out, const T* in, Strided dst, u64 n) { \
    FOR_EACH(i, n) out[strided_offset(dst, i)] = in[i]; \
}
SCATTER(unsigned char, scatter_1)
SCATTER(unsigned short, scatter_2)
SCATTER(u32, scatter_4)
SCATTER(u64, scatter_8)

// out[i] = pattern for n elements (the pattern is the value already encoded in the dtype).
#define FILL(T, NAME) \
extern "C" __global__ void NAME(T* out, T pattern, u64 n) { \
    FOR_EACH(i, n) out[i] = pattern; \
}
FILL(unsigned char, fill_1)
FILL(unsigned short, fill_2)
FILL(u32, fill_4)
FILL(u64, fill_8)

// Random numbers as crate::ops::creation's Op::Random: element i is uniform(seed, offset + i) or
// normal(seed, offset + i) drawn in double, capped at `cap` (the host's uniform_cap: the largest
// value of the dtype below 1 for a uniform, infinity otherwise), and rounded once to the dtype as
// the CPU's from_f64 rounds (bf16 through the half crate's rule, f16 through f32 as the half
// crate does on x86 with F16C).
__device__ __forceinline__ double draw(u64 seed, u64 index, int normal, double cap) {
    double u = normal ? philox_normal(seed, index) : philox_uniform(seed, index);
    return u < cap ? u : cap;
}
extern "C" __global__ void random_f32(float* out, u64 seed, u64 offset, u64 n, int normal, double cap) {
    FOR_EACH(i, n) out[i] = (float)draw(seed, offset + i, normal, cap);
}
extern "C" __global__ void random_f64(double* out, u64 seed, u64 offset, u64 n, int normal, double cap) {
    FOR_EACH(i, n) out[i] = draw(seed, offset + i, normal, cap);
}
extern "C" __global__ void random_bf16(bf16* out, u64 seed, u64 offset, u64 n, int normal, double cap) {
    FOR_EACH(i, n) out[i].bits = half_f64_to_bf16(draw(seed, offset + i, normal, cap));
}
extern "C" __global__ void random_f16(f16* out, u64 seed, u64 offset, u64 n, int normal, double cap) {
    FOR_EACH(i, n) out[i] = f32_to_f16((float)draw(seed, offset + i, normal, cap));
}
