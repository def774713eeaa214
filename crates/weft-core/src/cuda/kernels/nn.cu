// nn kernels (crate::cuda::families::nn): softmax / log-softmax, layer and RMS norm,
// cross-entropy and dropout, with their backward kernels, each instantiated per dtype
// (NAME_f32, NAME_f64, NAME_bf16, NAME_f16). bf16/f16 compute in f32 and f64 in double, as the
// CPU kernels (crate::cpu::nn) do after `to_compute`.
//
// Row kernels run one block per row (grid-stride over rows when there are more rows than
// blocks); blockDim.x is a multiple of 32 and at most 1024; a row longer than the block is
// walked in strides of blockDim.x. Every reduction has a fixed order for a given launch shape
// (no atomics), so results are bit-for-bit reproducible.

__device__ __forceinline__ float nn_exp(float v) { return expf(v); }
__device__ __forceinline__ double nn_exp(double v) { return exp(v); }
__device__ __forceinline__ float nn_log(float v) { return logf(v); }
__device__ __forceinline__ double nn_log(double v) { return log(v); }
__device__ __forceinline__ float nn_sqrt(float v) { return sqrtf(v); }
__device__ __forceinline__ double nn_sqrt(double v) { return sqrt(v); }
// The larger of a and b; a NaN b wins (as crate::cpu::lanes::max, so NaN propagates).
template <typename A> __device__ __forceinline__ A nn_larger(A a, A b) { return (b > a || b != b) ? b : a; }
template <typename A> __device__ __forceinline__ A nn_nan();
template <> __device__ __forceinline__ float nn_nan<float>() { return __int_as_float(0x7fc00000); }
template <> __device__ __forceinline__ double nn_nan<double>() { return __longlong_as_double(0x7ff8000000000000ll); }

// A double stored as T (through f32 for bf16/f16).
__device__ __forceinline__ void st_double(float* p, double v) { p[0] = (float)v; }
__device__ __forceinline__ void st_double(double* p, double v) { p[0] = v; }
__device__ __forceinline__ void st_double(bf16* p, double v) { st(p, 0, (float)v); }
__device__ __forceinline__ void st_double(f16* p, double v) { st(p, 0, (float)v); }

// ---------------------------------------------------------------- softmax

// y = softmax(x) (or log_softmax) of each of `rows` rows of `len` contiguous elements.
template <typename T>
__device__ void softmax_impl(const T* x, T* y, u64 rows, u64 len, u32 is_log) {
    typedef typename Acc<T>::type A;
    __shared__ A scratch[32];
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * len;
        T* yr = y + r * len;
        A m = neg_inf<A>();
        for (u64 j = threadIdx.x; j < len; j += blockDim.x) m = nn_larger(m, ld(xr, j));
        m = block_max(m, scratch);
        A s = (A)0;
        for (u64 j = threadIdx.x; j < len; j += blockDim.x) s += nn_exp(ld(xr, j) - m);
        s = block_sum(s, scratch);
        if (is_log) {
            A lse = m + nn_log(s);
            for (u64 j = threadIdx.x; j < len; j += blockDim.x) st(yr, j, ld(xr, j) - lse);
        } else {
            A inv = (A)1 / s;
            for (u64 j = threadIdx.x; j < len; j += blockDim.x) {
                A e = nn_exp(ld(xr, j) - m);
                st(yr, j, e * inv);
            }
        }
    }
}

// dx from the forward's output y and the output gradient g (same layout as softmax_impl):
// log: dx = g - exp(y) * sum(g); else dx = y * (g - sum(y * g)).
template <typename T>
__device__ void softmax_backward_impl(const T* y, const T* g, T* dx, u64 rows, u64 len, u32 is_log) {
    typedef typename Acc<T>::type A;
    __shared__ A scratch[32];
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* yr = y + r * len;
        const T* gr = g + r * len;
        T* dr = dx + r * len;
        A s = (A)0;
        if (is_log) {
            for (u64 j = threadIdx.x; j < len; j += blockDim.x) s += ld(gr, j);
        } else {
            for (u64 j = threadIdx.x; j < len; j += blockDim.x) s += ld(yr, j) * ld(gr, j);
        }
        s = block_sum(s, scratch);
        if (is_log) {
            for (u64 j = threadIdx.x; j < len; j += blockDim.x) st(dr, j, ld(gr, j) - nn_exp(ld(yr, j)) * s);
        } else {
            for (u64 j = threadIdx.x; j < len; j += blockDim.x) st(dr, j, ld(yr, j) * (ld(gr, j) - s));
        }
    }
}

// ---------------------------------------------------------------- layer / RMS norm

// y = (x - mean) * rstd * w + b per row (w, b may be null), with mean = 0 when `rms`, and
// rstd = 1 / sqrt(mean((x - mean)^2) + eps); writes mean[r] and rstd[r] in the compute type.
template <typename T>
__device__ void norm_impl(const T* x, const T* w, const T* b, T* y, typename Acc<T>::type* mean,
                          typename Acc<T>::type* rstd, u64 rows, u64 len, double eps, u32 rms) {
    typedef typename Acc<T>::type A;
    __shared__ A scratch[32];
    const A n = (A)len, e = (A)eps;
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * len;
        T* yr = y + r * len;
        A mu = (A)0;
        if (!rms) {
            A s = (A)0;
            for (u64 j = threadIdx.x; j < len; j += blockDim.x) s += ld(xr, j);
            mu = block_sum(s, scratch) / n;
        }
        A q = (A)0;
        for (u64 j = threadIdx.x; j < len; j += blockDim.x) {
            A d = ld(xr, j) - mu;
            q += d * d;
        }
        q = block_sum(q, scratch);
        const A rs = (A)1 / nn_sqrt(q / n + e);
        if (threadIdx.x == 0) {
            mean[r] = mu;
            rstd[r] = rs;
        }
        for (u64 j = threadIdx.x; j < len; j += blockDim.x) {
            A v = (ld(xr, j) - mu) * rs;
            if (w) v = v * ld(w, j);
            if (b) v = v + ld(b, j);
            st(yr, j, v);
        }
    }
}

// dx of the norm per row, from x, the weight (or null), the output gradient g and the saved
// mean and rstd: xhat = (x - mean) * rstd, gw = g * w,
// dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), with mean(gw) taken as 0 when `rms`.
template <typename T>
__device__ void norm_backward_impl(const T* x, const T* w, const T* g, const typename Acc<T>::type* mean,
                                   const typename Acc<T>::type* rstd, T* dx, u64 rows, u64 len, u32 rms) {
    typedef typename Acc<T>::type A;
    __shared__ A scratch[32];
    const A n = (A)len;
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * len;
        const T* gr = g + r * len;
        T* dr = dx + r * len;
        const A mu = mean[r], rs = rstd[r];
        A sgw = (A)0, sgwx = (A)0;
        for (u64 j = threadIdx.x; j < len; j += blockDim.x) {
            A gw = ld(gr, j);
            if (w) gw = gw * ld(w, j);
            A xh = (ld(xr, j) - mu) * rs;
            sgw += gw;
            sgwx += gw * xh;
        }
        sgw = block_sum(sgw, scratch);
        sgwx = block_sum(sgwx, scratch);
        const A mean_gw = rms ? (A)0 : sgw / n;
        const A mean_gwx = sgwx / n;
        for (u64 j = threadIdx.x; j < len; j += blockDim.x) {
            A gw = ld(gr, j);
            if (w) gw = gw * ld(w, j);
            A xh = (ld(xr, j) - mu) * rs;
            st(dr, j, rs * (gw - mean_gw - xh * mean_gwx));
        }
    }
}

// Partial sums of dweight = sum_r g * xhat and dbias = sum_r g over the rows
// [blockIdx.y * rows_per_block, ...) for column blockIdx.x * blockDim.x + threadIdx.x, into
// pw/pb[blockIdx.y * len + column] (the compute type).
template <typename T>
__device__ void norm_partials_impl(const T* x, const T* g, const typename Acc<T>::type* mean,
                                   const typename Acc<T>::type* rstd, typename Acc<T>::type* pw,
                                   typename Acc<T>::type* pb, u64 rows, u64 len, u64 rows_per_block) {
    typedef typename Acc<T>::type A;
    const u64 c = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= len) return;
    const u64 rb = blockIdx.y;
    const u64 r0 = rb * rows_per_block;
    const u64 r1 = r0 + rows_per_block < rows ? r0 + rows_per_block : rows;
    A sw = (A)0, sb = (A)0;
    for (u64 r = r0; r < r1; ++r) {
        const A gv = ld(g, r * len + c);
        const A xh = (ld(x, r * len + c) - mean[r]) * rstd[r];
        sw += gv * xh;
        sb += gv;
    }
    pw[rb * len + c] = sw;
    pb[rb * len + c] = sb;
}

// dweight[c] / dbias[c] = the sum over the `blocks` partials of column c, in block order (either
// output may be null).
template <typename T>
__device__ void norm_colsum_impl(const typename Acc<T>::type* pw, const typename Acc<T>::type* pb, T* dw, T* db,
                                 u64 blocks, u64 len) {
    typedef typename Acc<T>::type A;
    FOR_EACH(c, len) {
        A sw = (A)0, sb = (A)0;
        for (u64 k = 0; k < blocks; ++k) {
            sw += pw[k * len + c];
            sb += pb[k * len + c];
        }
        if (dw) st(dw, c, sw);
        if (db) st(db, c, sb);
    }
}

// ---------------------------------------------------------------- cross-entropy

// Per row of logits x [rows, c]: lse[r] = log-sum-exp of the row; loss[r] = 0 when the target
// is ignore_index, else (1 - s) * (lse - x[t]) + s * (lse - mean(x)) (just lse - x[t] when
// s == 0); NaN for a target outside 0..c (the host checked them before the launch).
template <typename T>
__device__ void cross_entropy_impl(const T* x, const i64* t, typename Acc<T>::type* loss, typename Acc<T>::type* lse,
                                   u64 rows, u64 c, i64 ignore, double smoothing) {
    typedef typename Acc<T>::type A;
    __shared__ A scratch[32];
    const A s = (A)smoothing;
    for (u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* xr = x + r * c;
        A m = neg_inf<A>();
        for (u64 j = threadIdx.x; j < c; j += blockDim.x) m = nn_larger(m, ld(xr, j));
        m = block_max(m, scratch);
        A se = (A)0;
        for (u64 j = threadIdx.x; j < c; j += blockDim.x) se += nn_exp(ld(xr, j) - m);
        se = block_sum(se, scratch);
        const A l = m + nn_log(se);
        A sx = (A)0;
        if (s != (A)0) {
            for (u64 j = threadIdx.x; j < c; j += blockDim.x) sx += ld(xr, j);
            sx = block_sum(sx, scratch);
        }
        if (threadIdx.x == 0) {
            lse[r] = l;
            const i64 tr = t[r];
            A out;
            if (tr == ignore) {
                out = (A)0;
            } else if (tr < 0 || (u64)tr >= c) {
                out = nn_nan<A>();
            } else {
                const A nll = l - ld(xr, (u64)tr);
                out = s == (A)0 ? nll : ((A)1 - s) * nll + s * (l - sx / (A)c);
            }
            loss[r] = out;
        }
    }
}

// out[0] = (sum of loss[0..rows], in double) / valid, as T; NaN when valid is 0. One block.
template <typename T>
__device__ void cross_entropy_mean_impl(const typename Acc<T>::type* loss, T* out, u64 rows, u64 valid) {
    __shared__ double scratch[32];
    double s = 0.0;
    for (u64 i = threadIdx.x; i < rows; i += blockDim.x) s += (double)loss[i];
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) st_double(out, s / (double)valid);
}

// scale[0] = grad[0] / (number of targets that are not ignore_index), in double (NaN or inf
// when every row is ignored, as on the CPU). One block.
template <typename T>
__device__ void cross_entropy_scale_impl(const i64* t, u64 rows, i64 ignore, const T* grad, double* scale) {
    __shared__ u64 scratch[32];
    u64 k = 0;
    for (u64 i = threadIdx.x; i < rows; i += blockDim.x) k += t[i] != ignore ? 1ull : 0ull;
    k = block_sum(k, scratch);
    if (threadIdx.x == 0) scale[0] = (double)ld(grad, 0) / (double)k;
}

// dx[r, j] = scale * (exp(x - lse[r]) - s / c) - [j == t[r]] * scale * (1 - s) for the n = rows * c
// elements; 0 on rows whose target is ignore_index.
template <typename T>
__device__ void cross_entropy_backward_impl(const T* x, const i64* t, const typename Acc<T>::type* lse,
                                            const double* scale_p, T* dx, u64 n, u64 c, i64 ignore,
                                            double smoothing) {
    typedef typename Acc<T>::type A;
    const A scale = (A)scale_p[0];
    const A s = (A)smoothing;
    const A eps_c = s / (A)c;
    const A hit = scale * ((A)1 - s);
    FOR_EACH(i, n) {
        const u64 r = i / c, j = i % c;
        const i64 tr = t[r];
        A d = (A)0;
        if (tr != ignore) {
            d = scale * (nn_exp(ld(x, i) - lse[r]) - eps_c);
            if ((i64)j == tr) d -= hit;
        }
        st(dx, i, d);
    }
}

// ---------------------------------------------------------------- dropout

// y[i] = 0 where philox_uniform(seed, offset + i) < p, else x[i] * scale, for the n elements of
// the view `src` of x in row-major order (crate::ops::nn's dropout, bit for bit).
template <typename T>
__device__ void dropout_impl(const T* x, Strided src, T* y, u64 n, double p, double scale, u64 seed, u64 offset) {
    typedef typename Acc<T>::type A;
    const A sc = (A)scale;
    FOR_EACH(i, n) {
        const A v = ld(x, strided_offset(src, i));
        st(y, i, philox_uniform(seed, offset + i) < p ? (A)0 : v * sc);
    }
}

// ---------------------------------------------------------------- entry points

#define NN_KERNELS(T, S) \
extern "C" __global__ void softmax_##S(const T* x, T* y, u64 rows, u64 len, u32 is_log) { \
    softmax_impl<T>(x, y, rows, len, is_log); \
} \
extern "C" __global__ void softmax_backward_##S(const T* y, const T* g, T* dx, u64 rows, u64 len, u32 is_log) { \
    softmax_backward_impl<T>(y, g, dx, rows, len, is_log); \
} \
extern "C" __global__ void norm_##S(const T* x, const T* w, const T* b, T* y, Acc<T>::type* mean, \
                                    Acc<T>::type* rstd, u64 rows, u64 len, double eps, u32 rms) { \
    norm_impl<T>(x, w, b, y, mean, rstd, rows, len, eps, rms); \
} \
extern "C" __global__ void norm_backward_##S(const T* x, const T* w, const T* g, const Acc<T>::type* mean, \
                                             const Acc<T>::type* rstd, T* dx, u64 rows, u64 len, u32 rms) { \
    norm_backward_impl<T>(x, w, g, mean, rstd, dx, rows, len, rms); \
} \
extern "C" __global__ void norm_partials_##S(const T* x, const T* g, const Acc<T>::type* mean, \
                                             const Acc<T>::type* rstd, Acc<T>::type* pw, Acc<T>::type* pb, \
                                             u64 rows, u64 len, u64 rows_per_block) { \
    norm_partials_impl<T>(x, g, mean, rstd, pw, pb, rows, len, rows_per_block); \
} \
extern "C" __global__ void norm_colsum_##S(const Acc<T>::type* pw, const Acc<T>::type* pb, T* dw, T* db, \
                                           u64 blocks, u64 len) { \
    norm_colsum_impl<T>(pw, pb, dw, db, blocks, len); \
} \
extern "C" __global__ void cross_entropy_##S(const T* x, const i64* t, Acc<T>::type* loss, Acc<T>::type* lse, \
                                             u64 rows, u64 c, i64 ignore, double smoothing) { \
    cross_entropy_impl<T>(x, t, loss, lse, rows, c, ignore, smoothing); \
} \
extern "C" __global__ void cross_entropy_mean_##S(const Acc<T>::type* loss, T* out, u64 rows, u64 valid) { \
    cross_entropy_mean_impl<T>(loss, out, rows, valid); \
} \
extern "C" __global__ void cross_entropy_scale_##S(const i64* t, u64 rows, i64 ignore, const T* grad, double* scale) { \
    cross_entropy_scale_impl<T>(t, rows, ignore, grad, scale); \
} \
extern "C" __global__ void cross_entropy_backward_##S(const T* x, const i64* t, const Acc<T>::type* lse, \
                                                      const double* scale, T* dx, u64 n, u64 c, i64 ignore, \
                                                      double smoothing) { \
    cross_entropy_backward_impl<T>(x, t, lse, scale, dx, n, c, ignore, smoothing); \
} \
extern "C" __global__ void dropout_##S(const T* x, Strided src, T* y, u64 n, double p, double scale, u64 seed, \
                                       u64 offset) { \
    dropout_impl<T>(x, src, y, n, p, scale, seed, offset); \
}

NN_KERNELS(float, f32)
NN_KERNELS(double, f64)
NN_KERNELS(bf16, bf16)
NN_KERNELS(f16, f16)
