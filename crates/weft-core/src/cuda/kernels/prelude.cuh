// Shared by every kernel module (prepended to each .cu source before NVRTC compiles it).
// Self-contained: no CUDA headers, so only NVRTC itself is needed at run time.

typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

// bf16 and f16 are stored as 16-bit patterns and computed in f32.
struct bf16 { unsigned short bits; };
struct f16 { unsigned short bits; };

__device__ __forceinline__ float bf16_to_f32(bf16 x) { return __uint_as_float(((u32)x.bits) << 16); }
__device__ __forceinline__ bf16 f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    bf16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) { r.bits = (unsigned short)((u >> 16) | 0x40u); return r; }  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    r.bits = (unsigned short)(u >> 16);
    return r;
}
__device__ __forceinline__ float f16_to_f32(f16 x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
}
__device__ __forceinline__ f16 f32_to_f16(float f) {
    f16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(f));
    return r;
}

// The bf16 nearest an f64 as the `half` crate's bf16::from_f64 (convert::f64_to_bf16) computes it,
// bit for bit: it rounds on the top 32 bits of the double only. The CPU converts f64 results
// (casts, var) to bf16 through it.
__device__ __forceinline__ unsigned short half_f64_to_bf16(double value) {
    u64 val = (u64)__double_as_longlong(value);
    u32 x = (u32)(val >> 32);
    u32 sign = x & 0x80000000u, expo = x & 0x7FF00000u, man = x & 0x000FFFFFu;
    if (expo == 0x7FF00000u) {
        u32 nan_bit = (man == 0 && (u32)val == 0) ? 0u : 0x0040u;
        return (unsigned short)((sign >> 16) | 0x7F80u | nan_bit | (man >> 13));
    }
    u32 half_sign = sign >> 16;
    i64 half_exp = (i64)(expo >> 20) - 1023 + 127;
    if (half_exp >= 0xFF) return (unsigned short)(half_sign | 0x7F80u);
    if (half_exp <= 0) {
        if (7 - half_exp > 21) return (unsigned short)half_sign;
        u32 m = man | 0x00100000u;
        u32 half_man = m >> (u32)(14 - half_exp);
        u32 round_bit = 1u << (u32)(13 - half_exp);
        if ((m & round_bit) != 0 && (m & (3u * round_bit - 1u)) != 0) half_man += 1;
        return (unsigned short)(half_sign | half_man);
    }
    u32 he = ((u32)half_exp) << 7;
    u32 hm = man >> 13;
    u32 round_bit = 0x00001000u;
    if ((man & round_bit) != 0 && (man & (3u * round_bit - 1u)) != 0) return (unsigned short)((half_sign | he | hm) + 1u);
    return (unsigned short)(half_sign | he | hm);
}

// Rust's `v as i64` / `as i32` / `as u8`: truncate toward zero, saturate, NaN -> 0.
__device__ __forceinline__ i64 sat_i64(double v) {
    if (v != v) return 0;
    if (v >= 9223372036854775807.0) return 0x7fffffffffffffffll;
    if (v <= -9223372036854775808.0) return (i64)0x8000000000000000ull;
    return (i64)v;
}
__device__ __forceinline__ int sat_i32(double v) {
    if (v != v) return 0;
    if (v >= 2147483647.0) return 2147483647;
    if (v <= -2147483648.0) return (int)0x80000000u;
    return (int)v;
}
__device__ __forceinline__ unsigned char sat_u8(double v) {
    if (!(v > 0.0)) return 0;  // NaN, negatives and zero
    if (v >= 255.0) return 255;
    return (unsigned char)(int)v;
}

// Load/store in the compute type: f32 for f32/bf16/f16, f64 for f64.
__device__ __forceinline__ float ld(const float* p, u64 i) { return p[i]; }
__device__ __forceinline__ double ld(const double* p, u64 i) { return p[i]; }
__device__ __forceinline__ float ld(const bf16* p, u64 i) { return bf16_to_f32(p[i]); }
__device__ __forceinline__ float ld(const f16* p, u64 i) { return f16_to_f32(p[i]); }
__device__ __forceinline__ void st(float* p, u64 i, float v) { p[i] = v; }
__device__ __forceinline__ void st(double* p, u64 i, double v) { p[i] = v; }
__device__ __forceinline__ void st(bf16* p, u64 i, float v) { p[i] = f32_to_bf16(v); }
__device__ __forceinline__ void st(f16* p, u64 i, float v) { p[i] = f32_to_f16(v); }

// The compute type of a storage type.
template <typename T> struct Acc { typedef float type; };
template <> struct Acc<double> { typedef double type; };

// A view's geometry (crate::cuda::launch::Strided): element i of the row-major result is at
// offset + sum_d index_d(i) * strides[d] in the storage. Rank at most 8; strides may be 0
// (broadcast).
#define MAX_RANK 8
struct Strided {
    u64 shape[MAX_RANK];
    u64 strides[MAX_RANK];
    u64 offset;
    u32 rank;
    u32 pad;
};
__device__ __forceinline__ u64 strided_offset(const Strided& s, u64 i) {
    u64 off = s.offset;
    for (int d = (int)s.rank - 1; d >= 0; --d) {
        u64 n = s.shape[d];
        off += (i % n) * s.strides[d];
        i /= n;
    }
    return off;
}

// Grid-stride loop over n elements.
#define FOR_EACH(i, n) for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (u64)(n); i += (u64)gridDim.x * blockDim.x)

// Sums over a warp, then over a block (blockDim.x a multiple of 32, at most 1024); every thread
// gets the total. `scratch` holds 32 values of shared memory.
template <typename T> __device__ __forceinline__ T warp_sum(T v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <typename T> __device__ __forceinline__ T warp_max(T v) {
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
template <typename T> __device__ T block_sum(T v, T* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : (T)0;
    return warp_sum(v);
}
template <typename T> __device__ __forceinline__ T neg_inf();
template <> __device__ __forceinline__ float neg_inf<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double neg_inf<double>() { return __longlong_as_double(0xfff0000000000000ll); }
template <typename T> __device__ T block_max(T v, T* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : neg_inf<T>();
    return warp_max(v);
}

// Philox4x32-10, as crate::rng: element `index` of a draw under `seed` uses the counter
// (index lo, index hi, 0, 0) and the key (seed lo, seed hi).
struct Words { u32 w[4]; };
__device__ __forceinline__ Words philox(u64 seed, u64 index) {
    u32 c0 = (u32)index, c1 = (u32)(index >> 32), c2 = 0, c3 = 0;
    u32 k0 = (u32)seed, k1 = (u32)(seed >> 32);
    for (int r = 0; r < 10; ++r) {
        u64 p0 = (u64)0xD2511F53u * c0;
        u64 p1 = (u64)0xCD9E8D57u * c2;
        u32 hi0 = (u32)(p0 >> 32), lo0 = (u32)p0, hi1 = (u32)(p1 >> 32), lo1 = (u32)p1;
        u32 n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
    Words out; out.w[0] = c0; out.w[1] = c1; out.w[2] = c2; out.w[3] = c3;
    return out;
}
// A uniform double in [0, 1) (53 bits), as crate::rng::uniform.
__device__ __forceinline__ double philox_uniform(u64 seed, u64 index) {
    Words w = philox(seed, index);
    u64 bits = (((u64)w.w[0]) << 21) ^ (u64)w.w[1];
    return (double)(bits & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}
// A standard normal, as crate::rng::normal.
__device__ __forceinline__ double philox_normal(u64 seed, u64 index) {
    Words w = philox(seed, index);
    double u1 = ((double)w.w[2] + 1.0) / 4294967296.0;
    double u2 = (double)w.w[3] / 4294967296.0;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2);
}
