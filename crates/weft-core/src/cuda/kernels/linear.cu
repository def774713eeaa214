// Linear's epilogue (families/matmul/linear.rs), run after cuBLAS wrote the product
// x weight^T [M, N]: adds the bias, applies the activation and adds the residual.
//
// The activations are those of the CPU (crate::cpu::elementwise: unary_scalar for f64, the f32
// kernels for f32 and the half types), codes as in linear.rs:
// 0 none, 1 Neg, 2 Exp, 3 Log, 4 Sqrt, 5 Rsqrt, 6 Abs, 7 Tanh, 8 Sigmoid, 9 Relu, 10 Gelu (erf),
// 11 GeluTanh, 12 Silu.

__device__ __forceinline__ float linear_act(u32 act, float x) {
    switch (act) {
        case 1: return -x;
        case 2: return expf(x);
        case 3: return logf(x);
        case 4: return sqrtf(x);
        case 5: return 1.0f / sqrtf(x);
        case 6: return fabsf(x);
        case 7: return tanhf(x);
        case 8: return 1.0f / (1.0f + expf(-x));
        case 9: return x > 0.0f ? x : 0.0f;
        case 10: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
        case 11: {
            float inner = 0.7978845608028654f * (x + 0.044715f * x * x * x);
            return 0.5f * x * (1.0f + tanhf(inner));
        }
        case 12: return x * (1.0f / (1.0f + expf(-x)));
        default: return x;
    }
}

__device__ __forceinline__ double linear_act(u32 act, double x) {
    switch (act) {
        case 1: return -x;
        case 2: return exp(x);
        case 3: return log(x);
        case 4: return sqrt(x);
        case 5: return 1.0 / sqrt(x);
        case 6: return fabs(x);
        case 7: return tanh(x);
        case 8: return 1.0 / (1.0 + exp(-x));
        case 9: return x > 0.0 ? x : 0.0;
        case 10: return x * (0.5 * (1.0 + erf(x * 0.70710678118654752440)));
        case 11: {
            double t = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
            return 0.5 * x * (1.0 + t);
        }
        case 12: return x * (1.0 / (1.0 + exp(-x)));
        default: return x;
    }
}

// For the n = M * N elements of the contiguous product `prod` (in the compute type; `cols` = N):
// h = prod[i] + bias[i % cols]; with act != 0, pre[i] = h and y = act(h), else y = h; with a
// residual (non-null, contiguous [M, N]), y += res[i]; out[i] = y. Each element is read before
// it is written by the same thread, so `out` (without act) or `pre` (with one) may be `prod`
// itself when the types agree.
template <typename T>
__device__ void linear_epilogue(const typename Acc<T>::type* prod, const T* bias, const T* res, T* out, T* pre, u32 act, u64 cols, u64 n) {
    typedef typename Acc<T>::type A;
    FOR_EACH(i, n) {
        A h = prod[i] + ld(bias, i % cols);
        A y = h;
        if (act != 0) {
            st(pre, i, h);
            y = linear_act(act, h);
        }
        if (res != nullptr) y += ld(res, i);
        st(out, i, y);
    }
}
#define LINEAR_EPILOGUE(T, NAME) \
extern "C" __global__ void NAME(const typename Acc<T>::type* prod, const T* bias, const T* res, T* out, T* pre, u32 act, u64 cols, u64 n) { \
    linear_epilogue<T>(prod, bias, res, out, pre, act, cols, n); \
}
LINEAR_EPILOGUE(float, linear_epilogue_f32)
LINEAR_EPILOGUE(double, linear_epilogue_f64)
LINEAR_EPILOGUE(bf16, linear_epilogue_bf16)
LINEAR_EPILOGUE(f16, linear_epilogue_f16)
