// Row reductions (crate::cuda::families::reduce): the input is [rows, len], contiguous (the
// reduced dims already moved last), the output has `rows` elements. One block per row (a
// grid-stride loop over rows), each thread strides over the row, then warps combine by shuffles
// and the block through shared memory. blockDim.x is a multiple of 32, at most 1024.
//
// As the CPU (ops/reduce.rs): sums and means accumulate in double for every dtype (integer sums
// too, then converted with Rust's saturating `as`); bf16/f16 results round through f32; max/min
// propagate NaN; argmax keeps the first maximum and the first NaN over everything; var is
// two-pass in double.

// ---- loads and stores ----
// Element::to_f64 of each storage type (Bool is a 0/1 byte like u8).
__device__ __forceinline__ double red_f64(const float* p, u64 i) { return (double)p[i]; }
__device__ __forceinline__ double red_f64(const double* p, u64 i) { return p[i]; }
__device__ __forceinline__ double red_f64(const bf16* p, u64 i) { return (double)bf16_to_f32(p[i]); }
__device__ __forceinline__ double red_f64(const f16* p, u64 i) { return (double)f16_to_f32(p[i]); }
__device__ __forceinline__ double red_f64(const i64* p, u64 i) { return (double)p[i]; }
__device__ __forceinline__ double red_f64(const int* p, u64 i) { return (double)p[i]; }
__device__ __forceinline__ double red_f64(const unsigned char* p, u64 i) { return (double)p[i]; }


// A sum or mean (double) stored as the CPU stores it: T::from_f64 for f32/f64/ints; bf16/f16 are
// reduced as f32 on the CPU and then rounded from f32.
__device__ __forceinline__ void st_sum(float* p, u64 i, double v) { p[i] = (float)v; }
__device__ __forceinline__ void st_sum(double* p, u64 i, double v) { p[i] = v; }
__device__ __forceinline__ void st_sum(bf16* p, u64 i, double v) { p[i] = f32_to_bf16((float)v); }
__device__ __forceinline__ void st_sum(f16* p, u64 i, double v) { p[i] = f32_to_f16((float)v); }
__device__ __forceinline__ void st_sum(i64* p, u64 i, double v) { p[i] = sat_i64(v); }
__device__ __forceinline__ void st_sum(int* p, u64 i, double v) { p[i] = sat_i32(v); }
__device__ __forceinline__ void st_sum(unsigned char* p, u64 i, double v) { p[i] = sat_u8(v); }


// A variance (double) stored as CpuStorage::cast from F64 does: `as f32`, f64, half's from_f64
// for bf16, through f32 for f16 (half's F16C path).
__device__ __forceinline__ void st_var(float* p, u64 i, double v) { p[i] = (float)v; }
__device__ __forceinline__ void st_var(double* p, u64 i, double v) { p[i] = v; }
__device__ __forceinline__ void st_var(bf16* p, u64 i, double v) { p[i].bits = half_f64_to_bf16(v); }
__device__ __forceinline__ void st_var(f16* p, u64 i, double v) { p[i] = f32_to_f16((float)v); }

// Max/min values in their own type (bf16/f16 widened to f32, exactly; u8 as int).
__device__ __forceinline__ float ext_ld(const float* p, u64 i) { return p[i]; }
__device__ __forceinline__ double ext_ld(const double* p, u64 i) { return p[i]; }
__device__ __forceinline__ float ext_ld(const bf16* p, u64 i) { return bf16_to_f32(p[i]); }
__device__ __forceinline__ float ext_ld(const f16* p, u64 i) { return f16_to_f32(p[i]); }
__device__ __forceinline__ i64 ext_ld(const i64* p, u64 i) { return p[i]; }
__device__ __forceinline__ int ext_ld(const int* p, u64 i) { return p[i]; }
__device__ __forceinline__ int ext_ld(const unsigned char* p, u64 i) { return (int)p[i]; }
__device__ __forceinline__ void ext_st(float* p, u64 i, float v) { p[i] = v; }
__device__ __forceinline__ void ext_st(double* p, u64 i, double v) { p[i] = v; }
__device__ __forceinline__ void ext_st(bf16* p, u64 i, float v) { p[i] = f32_to_bf16(v); }
__device__ __forceinline__ void ext_st(f16* p, u64 i, float v) { p[i] = f32_to_f16(v); }
__device__ __forceinline__ void ext_st(i64* p, u64 i, i64 v) { p[i] = v; }
__device__ __forceinline__ void ext_st(int* p, u64 i, int v) { p[i] = v; }
__device__ __forceinline__ void ext_st(unsigned char* p, u64 i, int v) { p[i] = (unsigned char)v; }

// The starting value of a max (MIN false) or min (MIN true): the identity of `pick`.
template <typename V, bool MIN> __device__ __forceinline__ V ext_identity();
template <> __device__ __forceinline__ float ext_identity<float, false>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ float ext_identity<float, true>() { return __int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double ext_identity<double, false>() { return __longlong_as_double(0xfff0000000000000ll); }
template <> __device__ __forceinline__ double ext_identity<double, true>() { return __longlong_as_double(0x7ff0000000000000ll); }
template <> __device__ __forceinline__ i64 ext_identity<i64, false>() { return (i64)0x8000000000000000ull; }
template <> __device__ __forceinline__ i64 ext_identity<i64, true>() { return 0x7fffffffffffffffll; }
template <> __device__ __forceinline__ int ext_identity<int, false>() { return (int)0x80000000u; }
template <> __device__ __forceinline__ int ext_identity<int, true>() { return 0x7fffffff; }

// The CPU's fold step: `if b > a || is_nan(b) { b } else { a }` (b < a for min). Any NaN wins
// (a NaN `a` stays, since nothing compares greater than it), so the combine order is free.
template <typename V, bool MIN> __device__ __forceinline__ V pick(V a, V b) {
    bool better = MIN ? (b < a) : (b > a);
    return (better || b != b) ? b : a;
}

template <typename V, bool MIN> __device__ V block_pick(V v, V* scratch) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    for (int o = 16; o > 0; o >>= 1) v = pick<V, MIN>(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : ext_identity<V, MIN>();
    for (int o = 16; o > 0; o >>= 1) v = pick<V, MIN>(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// ---- kernels ----
template <typename T> __device__ void sum_k(T* out, const T* x, u64 rows, u64 len, u32 mean) {
    __shared__ double scratch[32];
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* row = x + r * len;
        double s = 0.0;
        for (u64 j = threadIdx.x; j < len; j += blockDim.x) s += red_f64(row, j);
        s = block_sum(s, scratch);
        if (threadIdx.x == 0) st_sum(out, r, mean ? s / (double)len : s);
    }
}

template <typename T, typename V, bool MIN> __device__ void extreme_k(T* out, const T* x, u64 rows, u64 len) {
    __shared__ V scratch[32];
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* row = x + r * len;
        V v = ext_identity<V, MIN>();
        for (u64 j = threadIdx.x; j < len; j += blockDim.x) v = pick<V, MIN>(v, ext_ld(row, j));
        v = block_pick<V, MIN>(v, scratch);
        if (threadIdx.x == 0) ext_st(out, r, v);
    }
}

// Whether candidate (bv, bi) beats (av, ai) under the CPU's scan (`x > best || (is_nan(x) &&
// !is_nan(best))`, first index kept): NaN beats numbers, the larger value wins, and on ties (or
// two NaNs) the smaller index.
__device__ __forceinline__ bool arg_better(double av, u64 ai, double bv, u64 bi) {
    bool an = av != av, bn = bv != bv;
    if (an || bn) return bn && (!an || bi < ai);
    return bv > av || (bv == av && bi < ai);
}

template <typename T> __device__ void argmax_k(i64* out, const T* x, u64 rows, u64 len) {
    __shared__ double sv[32];
    __shared__ u64 si[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* row = x + r * len;
        // A thread without elements holds (-inf, u64 max): it loses to every element.
        double bv = __longlong_as_double(0xfff0000000000000ll);
        u64 bi = ~0ull;
        for (u64 j = threadIdx.x; j < len; j += blockDim.x) {
            double v = red_f64(row, j);
            if (arg_better(bv, bi, v, j)) { bv = v; bi = j; }
        }
        for (int o = 16; o > 0; o >>= 1) {
            double ov = __shfl_xor_sync(0xffffffffu, bv, o);
            u64 oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (arg_better(bv, bi, ov, oi)) { bv = ov; bi = oi; }
        }
        __syncthreads();
        if (lane == 0) { sv[warp] = bv; si[warp] = bi; }
        __syncthreads();
        if (warp == 0) {
            bv = lane < warps ? sv[lane] : __longlong_as_double(0xfff0000000000000ll);
            bi = lane < warps ? si[lane] : ~0ull;
            for (int o = 16; o > 0; o >>= 1) {
                double ov = __shfl_xor_sync(0xffffffffu, bv, o);
                u64 oi = __shfl_xor_sync(0xffffffffu, bi, o);
                if (arg_better(bv, bi, ov, oi)) { bv = ov; bi = oi; }
            }
            if (lane == 0) out[r] = (i64)bi;
        }
    }
}

// Variance over each row: mean, then the sum of squared deviations over `denom` (len -
// correction, as a double: 0 or negative as the CPU lets it be).
template <typename T> __device__ void var_k(T* out, const T* x, u64 rows, u64 len, double denom) {
    __shared__ double scratch[32];
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* row = x + r * len;
        double s = 0.0;
        for (u64 j = threadIdx.x; j < len; j += blockDim.x) s += red_f64(row, j);
        double mean = block_sum(s, scratch) / (double)len;
        double q = 0.0;
        for (u64 j = threadIdx.x; j < len; j += blockDim.x) {
            double d = red_f64(row, j) - mean;
            q += d * d;
        }
        q = block_sum(q, scratch);
        if (threadIdx.x == 0) st_var(out, r, q / denom);
    }
}

#define SUM_EXTREME(T, V, S) \
extern "C" __global__ void sum_##S(T* out, const T* x, u64 rows, u64 len, u32 mean) { sum_k<T>(out, x, rows, len, mean); } \
extern "C" __global__ void max_##S(T* out, const T* x, u64 rows, u64 len) { extreme_k<T, V, false>(out, x, rows, len); } \
extern "C" __global__ void min_##S(T* out, const T* x, u64 rows, u64 len) { extreme_k<T, V, true>(out, x, rows, len); }
SUM_EXTREME(float, float, f32)
SUM_EXTREME(double, double, f64)
SUM_EXTREME(bf16, float, bf16)
SUM_EXTREME(f16, float, f16)
SUM_EXTREME(i64, i64, i64)
SUM_EXTREME(int, int, i32)
SUM_EXTREME(unsigned char, int, u8)

#define ARGMAX(T, S) \
extern "C" __global__ void argmax_##S(i64* out, const T* x, u64 rows, u64 len) { argmax_k<T>(out, x, rows, len); }
ARGMAX(float, f32)
ARGMAX(double, f64)
ARGMAX(bf16, bf16)
ARGMAX(f16, f16)
ARGMAX(i64, i64)
ARGMAX(int, i32)
ARGMAX(unsigned char, u8)
ARGMAX(unsigned char, bool)

#define VAR(T, S) \
extern "C" __global__ void var_##S(T* out, const T* x, u64 rows, u64 len, double denom) { var_k<T>(out, x, rows, len, denom); }
VAR(float, f32)
VAR(double, f64)
VAR(bf16, bf16)
VAR(f16, f16)
