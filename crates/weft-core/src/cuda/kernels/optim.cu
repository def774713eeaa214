// Fused optimizer updates and gradient clipping, op for op as the CPU's (weft-nn's optim/adam.rs,
// optim/sgd.rs and clip.rs), so the two devices round alike: explicit fma where the CPU fuses,
// and the _rn intrinsics elsewhere so that the compiler cannot contract a multiply and an add
// that the CPU rounds separately. Parameters and state are f32 or f64.

__device__ __forceinline__ float mul_(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add_(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float sub_(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double sub_(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float div_(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double div_(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float fma_(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double fma_(double a, double b, double c) { return fma(a, b, c); }
__device__ __forceinline__ float sqrt_(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double sqrt_(double a) { return __dsqrt_rn(a); }

// The per-step scalars of Adam/AdamW, already rounded to T by the host (crate::cuda::optim).
template <typename T> struct AdamScalars {
    T l2, decay, lerp_w, lerp_w_minus_one, beta2, one_minus_beta2, bias_correction2_sqrt, eps, neg_step_size;
    int has_l2, has_decay, lerp_small, pad;
};

template <typename T>
__device__ void adam(T* p, T* m, T* v, const T* grad, AdamScalars<T> c, u64 n) {
    FOR_EACH(i, n) {
        T pv = p[i], g = grad[i], mi = m[i], vi = v[i];
        if (c.has_l2) g = fma_(pv, c.l2, g);                   // grad.add(param, alpha=wd)
        if (c.has_decay) pv = mul_(pv, c.decay);               // param.mul_(1 - lr wd)
        T mv = c.lerp_small ? fma_(c.lerp_w, sub_(g, mi), mi)  // exp_avg.lerp_(grad, 1 - b1)
                            : fma_(c.lerp_w_minus_one, sub_(g, mi), g);
        T vv = fma_(mul_(c.one_minus_beta2, g), g, mul_(vi, c.beta2));
        T denom = add_(div_(sqrt_(vv), c.bias_correction2_sqrt), c.eps);
        p[i] = add_(pv, div_(mul_(c.neg_step_size, mv), denom));
        m[i] = mv;
        v[i] = vv;
    }
}
extern "C" __global__ void adam_f32(float* p, float* m, float* v, const float* g, AdamScalars<float> c, u64 n) { adam(p, m, v, g, c, n); }
extern "C" __global__ void adam_f64(double* p, double* m, double* v, const double* g, AdamScalars<double> c, u64 n) { adam(p, m, v, g, c, n); }

template <typename T> struct SgdScalars {
    T weight_decay, momentum, one_minus_dampening, neg_lr;
    int has_weight_decay, nesterov, first, pad;
};

template <typename T>
__device__ void sgd(T* p, T* buf, const T* grad, SgdScalars<T> c, u64 n) {
    FOR_EACH(i, n) {
        T pv = p[i], g = grad[i];
        if (c.has_weight_decay) g = fma_(pv, c.weight_decay, g);
        T d = g;
        if (buf) {
            T b = c.first ? g : fma_(g, c.one_minus_dampening, mul_(buf[i], c.momentum));
            buf[i] = b;
            d = c.nesterov ? fma_(b, c.momentum, g) : b;
        }
        p[i] = fma_(d, c.neg_lr, pv);
    }
}
extern "C" __global__ void sgd_f32(float* p, float* buf, const float* g, SgdScalars<float> c, u64 n) { sgd(p, buf, g, c, n); }
extern "C" __global__ void sgd_f64(double* p, double* buf, const double* g, SgdScalars<double> c, u64 n) { sgd(p, buf, g, c, n); }

// Sum of squares in double: each block adds a grid-stride share of x and writes one partial;
// `sum_partials` then adds the partials in one block. Deterministic for a given launch size.
template <typename T>
__device__ void sum_sq(double* partial, const T* x, u64 n) {
    __shared__ double scratch[32];
    double acc = 0.0;
    FOR_EACH(i, n) { double v = (double)ld(x, i); acc += v * v; }
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}
extern "C" __global__ void sum_sq_f32(double* partial, const float* x, u64 n) { sum_sq(partial, x, n); }
extern "C" __global__ void sum_sq_f64(double* partial, const double* x, u64 n) { sum_sq(partial, x, n); }
extern "C" __global__ void sum_sq_bf16(double* partial, const bf16* x, u64 n) { sum_sq(partial, x, n); }
extern "C" __global__ void sum_sq_f16(double* partial, const f16* x, u64 n) { sum_sq(partial, x, n); }
extern "C" __global__ void sum_partials(double* out, const double* partial, u64 n) {
    __shared__ double scratch[32];
    double acc = 0.0;
    for (u64 i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) out[0] = acc;
}

// x *= c in place (c rounded to x's dtype by the host for f32; bf16/f16 scaled in f32).
extern "C" __global__ void scale_f32(float* x, float c, u64 n) { FOR_EACH(i, n) x[i] = mul_(x[i], c); }
extern "C" __global__ void scale_f64(double* x, double c, u64 n) { FOR_EACH(i, n) x[i] = mul_(x[i], c); }
extern "C" __global__ void scale_bf16(bf16* x, double c, u64 n) { FOR_EACH(i, n) st(x, i, (float)((double)ld(x, i) * c)); }
extern "C" __global__ void scale_f16(f16* x, double c, u64 n) { FOR_EACH(i, n) st(x, i, (float)((double)ld(x, i) * c)); }
