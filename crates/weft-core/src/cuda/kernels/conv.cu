// 2-D convolution and pooling, NCHW, every tensor contiguous (the Rust side makes views dense).
// Direct kernels, no atomics: every output element is written by one thread (or one block) that
// sums its terms in a fixed order, so results are the same on every run.
//
// Geometry structs mirror crate::cuda::families::conv::{ConvGeom, PoolGeom} (all i64, same order).

// x [n, c, h, w], weight [o, c / groups, kh, kw], y [n, o, oh, ow]. Input row of output row oy
// and tap ky: oy * sh - ph + ky * dh (columns likewise).
struct ConvGeom {
    i64 n, c, h, w;
    i64 o, kh, kw, oh, ow;
    i64 sh, sw, ph, pw, dh, dw;
    i64 groups;
};

// planes = n * c planes of h x w pooled to oh x ow by kh x kw windows.
struct PoolGeom {
    i64 planes, h, w, oh, ow;
    i64 kh, kw, sh, sw, ph, pw;
};

// Products rounded before they are added (no fused multiply-add), where the CPU rounds them too.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

// y[n, oc, oy, ox] = sum over ci < c/groups, ky, kx of
//   x[n, g * cg + ci, oy*sh - ph + ky*dh, ox*sw - pw + kx*dw] * w[oc, ci, ky, kx]   (g = oc / og),
// taps in the padding contributing nothing. One thread per output element.
template <typename T>
__device__ void conv2d(T* y, const T* x, const T* wt, ConvGeom d) {
    typedef typename Acc<T>::type A;
    const i64 cg = d.c / d.groups, og = d.o / d.groups;
    const i64 total = d.n * d.o * d.oh * d.ow;
    FOR_EACH(i, total) {
        i64 r = (i64)i;
        const i64 ox = r % d.ow; r /= d.ow;
        const i64 oy = r % d.oh; r /= d.oh;
        const i64 oc = r % d.o;
        const i64 n = r / d.o;
        const i64 g = oc / og;
        const T* xg = x + (n * d.c + g * cg) * d.h * d.w;
        const T* wo = wt + oc * cg * d.kh * d.kw;
        A acc = (A)0;
        for (i64 ci = 0; ci < cg; ++ci) {
            const T* xp = xg + ci * d.h * d.w;
            const T* wp = wo + ci * d.kh * d.kw;
            for (i64 ky = 0; ky < d.kh; ++ky) {
                const i64 iy = oy * d.sh - d.ph + ky * d.dh;
                if (iy < 0 || iy >= d.h) continue;
                for (i64 kx = 0; kx < d.kw; ++kx) {
                    const i64 ix = ox * d.sw - d.pw + kx * d.dw;
                    if (ix < 0 || ix >= d.w) continue;
                    acc += ld(xp, (u64)(iy * d.w + ix)) * ld(wp, (u64)(ky * d.kw + kx));
                }
            }
        }
        st(y, i, acc);
    }
}

// dx[n, c, iy, ix] = sum over the outputs (n, oc, oy, ox) of c's group and the taps (ky, kx) with
// oy*sh - ph + ky*dh = iy and ox*sw - pw + kx*dw = ix of dy[n, oc, oy, ox] * w[oc, c % cg, ky, kx].
// One thread per input element, gathering (no atomics).
template <typename T>
__device__ void conv2d_dx(T* dx, const T* dy, const T* wt, ConvGeom d) {
    typedef typename Acc<T>::type A;
    const i64 cg = d.c / d.groups, og = d.o / d.groups;
    const i64 total = d.n * d.c * d.h * d.w;
    FOR_EACH(i, total) {
        i64 r = (i64)i;
        const i64 ix = r % d.w; r /= d.w;
        const i64 iy = r % d.h; r /= d.h;
        const i64 c = r % d.c;
        const i64 n = r / d.c;
        const i64 g = c / cg, ci = c % cg;
        A acc = (A)0;
        for (i64 j = 0; j < og; ++j) {
            const i64 oc = g * og + j;
            const T* dyp = dy + (n * d.o + oc) * d.oh * d.ow;
            const T* wp = wt + (oc * cg + ci) * d.kh * d.kw;
            for (i64 ky = 0; ky < d.kh; ++ky) {
                const i64 ty = iy + d.ph - ky * d.dh;  // = oy * sh
                if (ty < 0 || ty % d.sh != 0) continue;
                const i64 oy = ty / d.sh;
                if (oy >= d.oh) continue;
                for (i64 kx = 0; kx < d.kw; ++kx) {
                    const i64 tx = ix + d.pw - kx * d.dw;  // = ox * sw
                    if (tx < 0 || tx % d.sw != 0) continue;
                    const i64 ox = tx / d.sw;
                    if (ox >= d.ow) continue;
                    acc += ld(dyp, (u64)(oy * d.ow + ox)) * ld(wp, (u64)(ky * d.kw + kx));
                }
            }
        }
        st(dx, i, acc);
    }
}

// dw[oc, ci, ky, kx] = sum over n, oy, ox of dy[n, oc, oy, ox] * x[n, g*cg + ci, iy, ix] with
// iy = oy*sh - ph + ky*dh, ix = ox*sw - pw + kx*dw inside the input (g = oc / og). One block per
// weight element (blockIdx.x, grid-stride over the weight), its threads striding over the
// n * oh * ow terms and then summing with block_sum: a fixed order, so deterministic.
template <typename T>
__device__ void conv2d_dw(T* dwt, const T* dy, const T* x, ConvGeom d) {
    typedef typename Acc<T>::type A;
    __shared__ A scratch[32];
    const i64 cg = d.c / d.groups, og = d.o / d.groups;
    const i64 wtotal = d.o * cg * d.kh * d.kw;
    const i64 sp = d.oh * d.ow;
    const i64 terms = d.n * sp;
    for (i64 e = blockIdx.x; e < wtotal; e += gridDim.x) {
        i64 r = e;
        const i64 kx = r % d.kw; r /= d.kw;
        const i64 ky = r % d.kh; r /= d.kh;
        const i64 ci = r % cg;
        const i64 oc = r / cg;
        const i64 c = (oc / og) * cg + ci;
        A acc = (A)0;
        for (i64 t = threadIdx.x; t < terms; t += blockDim.x) {
            const i64 n = t / sp, s = t % sp;
            const i64 oy = s / d.ow, ox = s % d.ow;
            const i64 iy = oy * d.sh - d.ph + ky * d.dh;
            const i64 ix = ox * d.sw - d.pw + kx * d.dw;
            if (iy < 0 || iy >= d.h || ix < 0 || ix >= d.w) continue;
            acc += ld(dy, (u64)((n * d.o + oc) * sp + s)) * ld(x, (u64)(((n * d.c + c) * d.h + iy) * d.w + ix));
        }
        acc = block_sum(acc, scratch);
        if (threadIdx.x == 0) st(dwt, (u64)e, acc);
        __syncthreads();  // scratch is reused by the next element's block_sum
    }
}

// Max pooling as crate::cpu::conv::max_pool2d: windows scanned row by row; an element replaces
// the best so far when it is greater, when it is NaN, or when it is the window's first element
// inside the input (so the first maximum wins ties, the last NaN wins, and padding is never
// chosen). idx gets the flat position iy * w + ix within the plane (-1 and -inf for a window with
// no element inside, which the ops layer's padding limit rules out). One thread per output.
template <typename T>
__device__ void max_pool2d(T* y, i64* idx, const T* x, PoolGeom d) {
    typedef typename Acc<T>::type A;
    const i64 total = d.planes * d.oh * d.ow;
    FOR_EACH(i, total) {
        i64 r = (i64)i;
        const i64 ox = r % d.ow; r /= d.ow;
        const i64 oy = r % d.oh;
        const i64 pl = r / d.oh;
        const T* xp = x + pl * d.h * d.w;
        A best = neg_inf<A>();
        i64 at = -1;
        for (i64 ky = 0; ky < d.kh; ++ky) {
            const i64 iy = oy * d.sh - d.ph + ky;
            if (iy < 0 || iy >= d.h) continue;
            for (i64 kx = 0; kx < d.kw; ++kx) {
                const i64 ix = ox * d.sw - d.pw + kx;
                if (ix < 0 || ix >= d.w) continue;
                const A v = ld(xp, (u64)(iy * d.w + ix));
                if (v > best || at < 0 || v != v) {
                    best = v;
                    at = iy * d.w + ix;
                }
            }
        }
        st(y, i, best);
        idx[i] = at;
    }
}

// The outputs (oy range [lo, hi)) whose window along one axis covers input position p:
// oy*s - pad <= p <= oy*s - pad + k - 1.
__device__ __forceinline__ void covering(i64 p, i64 k, i64 s, i64 pad, i64 out, i64* lo, i64* hi) {
    const i64 a = p + pad - k + 1;  // oy*s >= a
    *lo = a <= 0 ? 0 : (a + s - 1) / s;
    const i64 b = p + pad;  // oy*s <= b (b >= 0)
    const i64 h = b / s + 1;
    *hi = h < out ? h : out;
}

// dx[pl, iy, ix] = sum of dy[pl, oy, ox] over the windows covering (iy, ix) whose saved argmax is
// this position, added in row-major output order as the CPU adds them. One thread per input
// element, gathering (windows overlap, so no scatter without atomics).
template <typename T>
__device__ void max_pool2d_backward(T* dx, const i64* idx, const T* dy, PoolGeom d) {
    typedef typename Acc<T>::type A;
    const i64 total = d.planes * d.h * d.w;
    FOR_EACH(i, total) {
        i64 r = (i64)i;
        const i64 ix = r % d.w; r /= d.w;
        const i64 iy = r % d.h;
        const i64 pl = r / d.h;
        const i64 here = iy * d.w + ix;
        i64 y0, y1, x0, x1;
        covering(iy, d.kh, d.sh, d.ph, d.oh, &y0, &y1);
        covering(ix, d.kw, d.sw, d.pw, d.ow, &x0, &x1);
        const i64 base = pl * d.oh * d.ow;
        A acc = (A)0;
        for (i64 oy = y0; oy < y1; ++oy)
            for (i64 ox = x0; ox < x1; ++ox) {
                const u64 o = (u64)(base + oy * d.ow + ox);
                if (idx[o] == here) acc += ld(dy, o);
            }
        st(dx, i, acc);
    }
}

// Average pooling with count_include_pad: the in-input elements of each window summed row by row,
// times inv = 1 / (kh * kw) (converted to the compute type, as the CPU does). One thread per output.
template <typename T>
__device__ void avg_pool2d(T* y, const T* x, PoolGeom d, double inv64) {
    typedef typename Acc<T>::type A;
    const A inv = (A)inv64;
    const i64 total = d.planes * d.oh * d.ow;
    FOR_EACH(i, total) {
        i64 r = (i64)i;
        const i64 ox = r % d.ow; r /= d.ow;
        const i64 oy = r % d.oh;
        const i64 pl = r / d.oh;
        const T* xp = x + pl * d.h * d.w;
        A sum = (A)0;
        for (i64 ky = 0; ky < d.kh; ++ky) {
            const i64 iy = oy * d.sh - d.ph + ky;
            if (iy < 0 || iy >= d.h) continue;
            for (i64 kx = 0; kx < d.kw; ++kx) {
                const i64 ix = ox * d.sw - d.pw + kx;
                if (ix < 0 || ix >= d.w) continue;
                sum += ld(xp, (u64)(iy * d.w + ix));
            }
        }
        st(y, i, mul_rn(sum, inv));
    }
}

// dx[pl, iy, ix] = sum over the windows covering (iy, ix) of dy[pl, oy, ox] * inv, in row-major
// output order (each product rounded first, as the CPU's). One thread per input element.
template <typename T>
__device__ void avg_pool2d_backward(T* dx, const T* dy, PoolGeom d, double inv64) {
    typedef typename Acc<T>::type A;
    const A inv = (A)inv64;
    const i64 total = d.planes * d.h * d.w;
    FOR_EACH(i, total) {
        i64 r = (i64)i;
        const i64 ix = r % d.w; r /= d.w;
        const i64 iy = r % d.h;
        const i64 pl = r / d.h;
        i64 y0, y1, x0, x1;
        covering(iy, d.kh, d.sh, d.ph, d.oh, &y0, &y1);
        covering(ix, d.kw, d.sw, d.pw, d.ow, &x0, &x1);
        const T* dyp = dy + pl * d.oh * d.ow;
        A acc = (A)0;
        for (i64 oy = y0; oy < y1; ++oy)
            for (i64 ox = x0; ox < x1; ++ox) acc += mul_rn(ld(dyp, (u64)(oy * d.ow + ox)), inv);
        st(dx, i, acc);
    }
}

#define CONV_KERNELS(T, S) \
extern "C" __global__ void conv2d_##S(T* y, const T* x, const T* w, ConvGeom d) { conv2d<T>(y, x, w, d); } \
extern "C" __global__ void conv2d_dx_##S(T* dx, const T* dy, const T* w, ConvGeom d) { conv2d_dx<T>(dx, dy, w, d); } \
extern "C" __global__ void conv2d_dw_##S(T* dw, const T* dy, const T* x, ConvGeom d) { conv2d_dw<T>(dw, dy, x, d); } \
extern "C" __global__ void max_pool2d_##S(T* y, i64* idx, const T* x, PoolGeom d) { max_pool2d<T>(y, idx, x, d); } \
extern "C" __global__ void max_pool2d_backward_##S(T* dx, const i64* idx, const T* dy, PoolGeom d) { \
    max_pool2d_backward<T>(dx, idx, dy, d); \
} \
extern "C" __global__ void avg_pool2d_##S(T* y, const T* x, PoolGeom d, double inv) { avg_pool2d<T>(y, x, d, inv); } \
extern "C" __global__ void avg_pool2d_backward_##S(T* dx, const T* dy, PoolGeom d, double inv) { \
    avg_pool2d_backward<T>(dx, dy, d, inv); \
}

CONV_KERNELS(float, f32)
CONV_KERNELS(double, f64)
CONV_KERNELS(bf16, bf16)
CONV_KERNELS(f16, f16)
