// Elementwise kernels (crate::cuda::families::elementwise): one thread per output element
// (grid-stride), the output contiguous and row-major, every input read through a Strided view of
// the output's shape (zero strides broadcast, so no broadcast copy is made). bf16/f16 compute in
// f32 and round once on the store, as the CPU's to_compute/back_to do; f64 computes in double.
//
// Op codes are the Rust side's (families/elementwise.rs: unary_code, binary_code, compare_code,
// dtype_code); keep them in step.

// ---- math in the compute type (explicit overloads: no CUDA headers under NVRTC) ----
__device__ __forceinline__ float m_exp(float x) { return expf(x); }
__device__ __forceinline__ double m_exp(double x) { return exp(x); }
__device__ __forceinline__ float m_log(float x) { return logf(x); }
__device__ __forceinline__ double m_log(double x) { return log(x); }
__device__ __forceinline__ float m_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double m_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float m_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double m_abs(double x) { return fabs(x); }
__device__ __forceinline__ float m_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double m_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float m_erf(float x) { return erff(x); }
__device__ __forceinline__ double m_erf(double x) { return erf(x); }
__device__ __forceinline__ float m_pow(float x, float e) { return powf(x, e); }
__device__ __forceinline__ double m_pow(double x, double e) { return pow(x, e); }
// Rust's f32::max/min: the other operand when one is NaN (fmax/fmin do the same).
__device__ __forceinline__ float m_max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double m_max(double a, double b) { return fmax(a, b); }
__device__ __forceinline__ float m_min(float a, float b) { return fminf(a, b); }
__device__ __forceinline__ double m_min(double a, double b) { return fmin(a, b); }
// Multiply and add rounded separately (the CPU does not fuse `x * m + a`).
__device__ __forceinline__ float m_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double m_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float m_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double m_add(double a, double b) { return __dadd_rn(a, b); }

#define SQRT_2_OVER_PI 0.7978845608028654
#define GELU_TANH_C 0.044715
#define FRAC_1_SQRT_2 0.7071067811865476
#define FRAC_1_SQRT_2PI 0.3989422804014327

// ---- unary (UnaryOp order: Neg Exp Log Sqrt Rsqrt Abs Tanh Sigmoid Relu Gelu GeluTanh Silu) ----
template <typename A> __device__ __forceinline__ A sigmoid_of(A x) { return (A)1 / ((A)1 + m_exp(-x)); }

template <typename A> __device__ __forceinline__ A unary_value(u32 op, A x) {
    switch (op) {
        case 0: return -x;
        case 1: return m_exp(x);
        case 2: return m_log(x);
        case 3: return m_sqrt(x);
        case 4: return (A)1 / m_sqrt(x);
        case 5: return m_abs(x);
        case 6: return m_tanh(x);
        case 7: return sigmoid_of(x);
        case 8: return x > (A)0 ? x : (A)0;
        case 9: return (A)0.5 * x * ((A)1 + m_erf(x * (A)FRAC_1_SQRT_2));
        case 10: {
            A inner = (A)SQRT_2_OVER_PI * (x + (A)GELU_TANH_C * x * x * x);
            return (A)0.5 * x * ((A)1 + m_tanh(inner));
        }
        default: return x * sigmoid_of(x);
    }
}

// The derivative of unary_value at x (crate::cpu::elementwise::unary_scalar's second half).
template <typename A> __device__ __forceinline__ A unary_derivative(u32 op, A x) {
    switch (op) {
        case 0: return (A)-1;
        case 1: return m_exp(x);
        case 2: return (A)1 / x;
        case 3: return (A)0.5 / m_sqrt(x);
        case 4: return (A)-0.5 / (x * m_sqrt(x));
        case 5: return x > (A)0 ? (A)1 : (x < (A)0 ? (A)-1 : (A)0);
        case 6: { A t = m_tanh(x); return (A)1 - t * t; }
        case 7: { A s = sigmoid_of(x); return s * ((A)1 - s); }
        case 8: return x > (A)0 ? (A)1 : (A)0;
        case 9: {
            A cdf = (A)0.5 * ((A)1 + m_erf(x * (A)FRAC_1_SQRT_2));
            A pdf = (A)FRAC_1_SQRT_2PI * m_exp((A)-0.5 * x * x);
            return cdf + x * pdf;
        }
        case 10: {
            A x2 = x * x;
            A t = m_tanh((A)SQRT_2_OVER_PI * (x + (A)GELU_TANH_C * x2 * x));
            A dinner = (A)SQRT_2_OVER_PI * ((A)1 + (A)3 * (A)GELU_TANH_C * x2);
            return (A)0.5 * ((A)1 + t) + (A)0.5 * x * ((A)1 - t * t) * dinner;
        }
        default: { A s = sigmoid_of(x); return s * ((A)1 + x * ((A)1 - s)); }
    }
}

template <typename T> __device__ void unary_k(T* out, const T* x, const Strided& sx, u64 n, u32 op) {
    typedef typename Acc<T>::type A;
    FOR_EACH(i, n) st(out, i, unary_value<A>(op, ld(x, strided_offset(sx, i))));
}
template <typename T>
__device__ void unary_backward_k(T* out, const T* x, const Strided& sx, const T* g, const Strided& sg, u64 n, u32 op) {
    typedef typename Acc<T>::type A;
    FOR_EACH(i, n) {
        A xv = ld(x, strided_offset(sx, i));
        A gv = ld(g, strided_offset(sg, i));
        st(out, i, gv * unary_derivative<A>(op, xv));
    }
}

// ---- binary (BinaryOp order: Add Sub Mul Div Pow Maximum Minimum) ----
// Maximum/Minimum as the CPU writes them: `if b > a { b } else { a }` (a NaN in `a` propagates,
// one in `b` does not).
template <typename A> __device__ __forceinline__ A binary_float(u32 op, A a, A b) {
    switch (op) {
        case 0: return a + b;
        case 1: return a - b;
        case 2: return a * b;
        case 3: return a / b;
        case 4: return m_pow(a, b);
        case 5: return b > a ? b : a;
        default: return b < a ? b : a;
    }
}
template <typename T>
__device__ void binary_float_k(T* out, const T* a, const Strided& sa, const T* b, const Strided& sb, u64 n, u32 op) {
    typedef typename Acc<T>::type A;
    FOR_EACH(i, n) st(out, i, binary_float<A>(op, ld(a, strided_offset(sa, i)), ld(b, strided_offset(sb, i))));
}
// Integers wrap on overflow (as Rust's release arithmetic): computed in the unsigned type U.
template <typename T, typename U>
__device__ void binary_int_k(T* out, const T* a, const Strided& sa, const T* b, const Strided& sb, u64 n, u32 op) {
    FOR_EACH(i, n) {
        T x = a[strided_offset(sa, i)], y = b[strided_offset(sb, i)];
        T r;
        switch (op) {
            case 0: r = (T)(U)((U)x + (U)y); break;
            case 1: r = (T)(U)((U)x - (U)y); break;
            case 2: r = (T)(U)((U)x * (U)y); break;
            case 5: r = y > x ? y : x; break;
            default: r = y < x ? y : x; break;
        }
        out[i] = r;
    }
}

// ---- compare (CompareOp order: Eq Ne Lt Le Gt Ge); Bool output as 0/1 bytes ----
// Values compared in: the compute type for floats (bf16/f16 widen exactly), the type itself for
// integers, 0/1 for Bool.
__device__ __forceinline__ float cmp_ld(const float* p, u64 i) { return p[i]; }
__device__ __forceinline__ double cmp_ld(const double* p, u64 i) { return p[i]; }
__device__ __forceinline__ float cmp_ld(const bf16* p, u64 i) { return bf16_to_f32(p[i]); }
__device__ __forceinline__ float cmp_ld(const f16* p, u64 i) { return f16_to_f32(p[i]); }
__device__ __forceinline__ i64 cmp_ld(const i64* p, u64 i) { return p[i]; }
__device__ __forceinline__ int cmp_ld(const int* p, u64 i) { return p[i]; }
__device__ __forceinline__ u32 cmp_ld(const unsigned char* p, u64 i) { return (u32)p[i]; }

template <typename T>
__device__ void compare_k(unsigned char* out, const T* a, const Strided& sa, const T* b, const Strided& sb, u64 n, u32 op) {
    FOR_EACH(i, n) {
        auto x = cmp_ld(a, strided_offset(sa, i));
        auto y = cmp_ld(b, strided_offset(sb, i));
        bool r;
        switch (op) {
            case 0: r = x == y; break;
            case 1: r = x != y; break;
            case 2: r = x < y; break;
            case 3: r = x <= y; break;
            case 4: r = x > y; break;
            default: r = x >= y; break;
        }
        out[i] = r ? 1 : 0;
    }
}

// ---- scalar ops on float tensors; the scalars come in the compute type (f32 for bf16/f16) ----
template <typename T>
__device__ void affine_k(T* out, const T* x, const Strided& sx, u64 n, typename Acc<T>::type mul, typename Acc<T>::type add) {
    FOR_EACH(i, n) st(out, i, m_add(m_mul(ld(x, strided_offset(sx, i)), mul), add));
}
// The CPU's f32 path writes x^2 as x * x and x^-1 as 1 / x; pow is exact there in f64 too.
template <typename T>
__device__ void pow_scalar_k(T* out, const T* x, const Strided& sx, u64 n, typename Acc<T>::type e) {
    typedef typename Acc<T>::type A;
    FOR_EACH(i, n) {
        A v = ld(x, strided_offset(sx, i));
        A r;
        if (e == (A)2) r = v * v;
        else if (e == (A)-1) r = (A)1 / v;
        else r = m_pow(v, e);
        st(out, i, r);
    }
}
// x.max(lo).min(hi) with Rust's NaN rule: fmax/fmin return the other operand, so NaN becomes lo.
template <typename T>
__device__ void clamp_k(T* out, const T* x, const Strided& sx, u64 n, typename Acc<T>::type lo, typename Acc<T>::type hi) {
    FOR_EACH(i, n) st(out, i, m_min(m_max(ld(x, strided_offset(sx, i)), lo), hi));
}

#define FLOAT_KERNELS(T, S) \
extern "C" __global__ void unary_##S(T* out, const T* x, Strided sx, u64 n, u32 op) { unary_k<T>(out, x, sx, n, op); } \
extern "C" __global__ void unary_backward_##S(T* out, const T* x, Strided sx, const T* g, Strided sg, u64 n, u32 op) { \
    unary_backward_k<T>(out, x, sx, g, sg, n, op); } \
extern "C" __global__ void binary_##S(T* out, const T* a, Strided sa, const T* b, Strided sb, u64 n, u32 op) { \
    binary_float_k<T>(out, a, sa, b, sb, n, op); } \
extern "C" __global__ void affine_##S(T* out, const T* x, Strided sx, u64 n, Acc<T>::type mul, Acc<T>::type add) { \
    affine_k<T>(out, x, sx, n, mul, add); } \
extern "C" __global__ void pow_scalar_##S(T* out, const T* x, Strided sx, u64 n, Acc<T>::type e) { pow_scalar_k<T>(out, x, sx, n, e); } \
extern "C" __global__ void clamp_##S(T* out, const T* x, Strided sx, u64 n, Acc<T>::type lo, Acc<T>::type hi) { \
    clamp_k<T>(out, x, sx, n, lo, hi); }
FLOAT_KERNELS(float, f32)
FLOAT_KERNELS(double, f64)
FLOAT_KERNELS(bf16, bf16)
FLOAT_KERNELS(f16, f16)

#define INT_BINARY(T, U, S) \
extern "C" __global__ void binary_##S(T* out, const T* a, Strided sa, const T* b, Strided sb, u64 n, u32 op) { \
    binary_int_k<T, U>(out, a, sa, b, sb, n, op); }
INT_BINARY(i64, u64, i64)
INT_BINARY(int, u32, i32)
INT_BINARY(unsigned char, unsigned char, u8)

#define COMPARE(T, S) \
extern "C" __global__ void compare_##S(unsigned char* out, const T* a, Strided sa, const T* b, Strided sb, u64 n, u32 op) { \
    compare_k<T>(out, a, sa, b, sb, n, op); }
COMPARE(float, f32)
COMPARE(double, f64)
COMPARE(bf16, bf16)
COMPARE(f16, f16)
COMPARE(i64, i64)
COMPARE(int, i32)
COMPARE(unsigned char, u8)
COMPARE(unsigned char, bool)

// ---- where: cond ? a : b by element size (every dtype moves as raw words) ----
#define WHERE(T, NAME) \
extern "C" __global__ void NAME(T* out, const unsigned char* c, Strided sc, const T* a, Strided sa, const T* b, Strided sb, u64 n) { \
    FOR_EACH(i, n) out[i] = c[strided_offset(sc, i)] ? a[strided_offset(sa, i)] : b[strided_offset(sb, i)]; \
}
WHERE(unsigned char, where_1)
WHERE(unsigned short, where_2)
WHERE(u32, where_4)
WHERE(u64, where_8)

// ---- cast: crate::storage::CpuStorage::cast, element for element ----
// The CPU converts through f64 (Element::to_f64, then Element::from_f64) except for the pairs it
// special-cases: i64 -> i32 wraps (`as`), f32 -> bf16/f16 round from f32. from_f64 is Rust's `as`
// for ints (truncate, saturate, NaN -> 0), `v != 0` for Bool, `as f32` for f32, and the `half`
// crate's from_f64 for bf16 (which rounds on the top 32 bits of the double only, ported below)
// and f16 (through f32 on x86 CPUs with F16C: every CPU the tests run on).

// Dtype codes (dtype_code in the Rust side).
#define D_F32 0
#define D_F64 1
#define D_BF16 2
#define D_F16 3
#define D_I64 4
#define D_I32 5
#define D_U8 6
#define D_BOOL 7



// Element::to_f64 of each source type.
__device__ __forceinline__ double src_f64(const float* p, u64 i) { return (double)p[i]; }
__device__ __forceinline__ double src_f64(const double* p, u64 i) { return p[i]; }
__device__ __forceinline__ double src_f64(const bf16* p, u64 i) { return (double)bf16_to_f32(p[i]); }
__device__ __forceinline__ double src_f64(const f16* p, u64 i) { return (double)f16_to_f32(p[i]); }
__device__ __forceinline__ double src_f64(const i64* p, u64 i) { return (double)p[i]; }
__device__ __forceinline__ double src_f64(const int* p, u64 i) { return (double)p[i]; }
__device__ __forceinline__ double src_f64(const unsigned char* p, u64 i) { return (double)p[i]; }

// SRC: the source dtype code, for the special-cased pairs.
template <typename S, int SRC>
__device__ void cast_k(void* out, const S* x, const Strided& sx, u64 n, u32 dst) {
    FOR_EACH(i, n) {
        u64 off = strided_offset(sx, i);
        double v = src_f64(x, off);
        switch (dst) {
            case D_F32: ((float*)out)[i] = (float)v; break;
            case D_F64: ((double*)out)[i] = v; break;
            case D_BF16:
                if (SRC == D_F32) ((bf16*)out)[i] = f32_to_bf16((float)v);
                else ((bf16*)out)[i].bits = half_f64_to_bf16(v);
                break;
            case D_F16: ((f16*)out)[i] = f32_to_f16((float)v); break;
            case D_I64: ((i64*)out)[i] = sat_i64(v); break;
            case D_I32:
                if (SRC == D_I64) ((int*)out)[i] = (int)(u32)(u64)((const i64*)x)[off];
                else ((int*)out)[i] = sat_i32(v);
                break;
            case D_U8: ((unsigned char*)out)[i] = sat_u8(v); break;
            default: ((unsigned char*)out)[i] = v != 0.0 ? 1 : 0; break;
        }
    }
}
#define CAST(S, CODE, NAME) \
extern "C" __global__ void cast_from_##NAME(void* out, const S* x, Strided sx, u64 n, u32 dst) { cast_k<S, CODE>(out, x, sx, n, dst); }
CAST(float, D_F32, f32)
CAST(double, D_F64, f64)
CAST(bf16, D_BF16, bf16)
CAST(f16, D_F16, f16)
CAST(i64, D_I64, i64)
CAST(int, D_I32, i32)
CAST(unsigned char, D_U8, u8)
CAST(unsigned char, D_BOOL, bool)
