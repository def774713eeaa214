// conv.cu: conv2d forward, dx and dw (groups, stride, padding, dilation, empty batches and
// channels) and max / avg pooling with their backward kernels (NaN, -inf and tied windows,
// padding), over random geometries, against direct double loops.
#include "check.h"
#include "../../../crates/weft-core/src/cuda/kernels/conv.cu"

using namespace chk;
static Rng rng(6);
static Report rep("conv");

static bool src(i64 o, i64 k, i64 s, i64 p, i64 d, i64 size, i64* out) {
    i64 i = o * s + k * d - p;
    *out = i;
    return i >= 0 && i < size;
}
static i64 outsz(i64 size, i64 k, i64 s, i64 p, i64 d) {
    i64 span = d * (k - 1) + 1;
    if (size + 2 * p < span) return -1;
    return (size + 2 * p - span) / s + 1;
}
// Element kernels: grid-stride, so 2 blocks of 32 threads cover any size.
static const unsigned EB = 32, EG = 2;

template <typename T> struct K;
#define KC(T, S)                                                                                              \
    template <> struct K<T> {                                                                                 \
        static constexpr auto conv = conv2d_##S, dx = conv2d_dx_##S, dw = conv2d_dw_##S;                      \
        static constexpr auto maxp = max_pool2d_##S, maxb = max_pool2d_backward_##S;                          \
        static constexpr auto avgp = avg_pool2d_##S, avgb = avg_pool2d_backward_##S;                          \
    };
KC(float, f32)
KC(double, f64)
KC(bf16, bf16)
KC(f16, f16)

template <typename T> void conv_trial(int trial) {
    ConvGeom d;
    d.groups = rng.range(1, 3);
    i64 cg = rng.range(1, 3), og = rng.range(1, 3);
    if (trial % 7 == 0) cg = rng.range(0, 2), og = rng.range(0, 2);
    d.n = rng.range(0, 2), d.c = cg * d.groups, d.o = og * d.groups, d.h = rng.range(1, 7), d.w = rng.range(1, 7);
    d.kh = rng.range(1, 3), d.kw = rng.range(1, 3), d.sh = rng.range(1, 3), d.sw = rng.range(1, 3);
    d.ph = rng.range(0, 2), d.pw = rng.range(0, 2), d.dh = rng.range(1, 2), d.dw = rng.range(1, 2);
    d.oh = outsz(d.h, d.kh, d.sh, d.ph, d.dh), d.ow = outsz(d.w, d.kw, d.sw, d.pw, d.dw);
    if (d.oh < 0 || d.ow < 0) return;
    rep.begin();
    auto randv = [](size_t n) { std::vector<double> v(n); for (auto& e : v) e = rng.normal(); return v; };
    auto x = roundtrip<T>(randv(d.n * d.c * d.h * d.w)), w = roundtrip<T>(randv(d.o * cg * d.kh * d.kw)),
         dy = roundtrip<T>(randv(d.n * d.o * d.oh * d.ow));
    auto xt = to_t<T>(x), wt = to_t<T>(w), dyt = to_t<T>(dy);
    std::vector<T> y(dy.size()), dx(x.size()), dw(w.size());
    const T *xp = xt.data(), *wp = wt.data(), *dyp = dyt.data();
    T *yp = y.data(), *dxp = dx.data(), *dwp = dw.data();
    LAUNCH(K<T>::conv, EG, EB, yp, xp, wp, d);
    LAUNCH(K<T>::dx, EG, EB, dxp, dyp, wp, d);
    // one block per weight element in Rust (DW_THREADS threads); here at most 3 blocks of 32 or 64
    if (!w.empty()) LAUNCH(K<T>::dw, std::min<size_t>(w.size(), 3), trial % 4 ? 32 : 64, dwp, dyp, xp, d);
    std::vector<double> yr(dy.size(), 0), dxr(x.size(), 0), dwr(w.size(), 0);
    for (i64 n = 0; n < d.n; n++)
        for (i64 oc = 0; oc < d.o; oc++) {
            i64 g = oc / og;
            for (i64 oy = 0; oy < d.oh; oy++)
                for (i64 ox = 0; ox < d.ow; ox++) {
                    i64 yo = ((n * d.o + oc) * d.oh + oy) * d.ow + ox;
                    for (i64 ci = 0; ci < cg; ci++)
                        for (i64 ky = 0; ky < d.kh; ky++)
                            for (i64 kx = 0; kx < d.kw; kx++) {
                                i64 iy, ix;
                                if (!src(oy, ky, d.sh, d.ph, d.dh, d.h, &iy) || !src(ox, kx, d.sw, d.pw, d.dw, d.w, &ix)) continue;
                                i64 xi = ((n * d.c + g * cg + ci) * d.h + iy) * d.w + ix, wi = ((oc * cg + ci) * d.kh + ky) * d.kw + kx;
                                yr[yo] += x[xi] * w[wi];
                                dxr[xi] += dy[yo] * w[wi];
                                dwr[wi] += dy[yo] * x[xi];
                            }
                }
        }
    std::string s = fmt("conv2d %s n%lld c%lld h%lld w%lld o%lld k%lldx%lld s%lld,%lld p%lld,%lld d%lld,%lld g%lld", dtype_name<T>(),
                        d.n, d.c, d.h, d.w, d.o, d.kh, d.kw, d.sh, d.sw, d.ph, d.pw, d.dh, d.dw, d.groups);
    rep.close(s + " y", from_t(y), yr, tolerance<T>());
    rep.close(s + " dx", from_t(dx), dxr, tolerance<T>());
    rep.close(s + " dw", from_t(dw), dwr, tolerance<T>());
    rep.end();
}

template <typename T> void pool_trial() {
    PoolGeom d;
    d.planes = rng.range(0, 3), d.h = rng.range(1, 8), d.w = rng.range(1, 8), d.kh = rng.range(1, 3), d.kw = rng.range(1, 3);
    d.sh = rng.range(1, 3), d.sw = rng.range(1, 3), d.ph = rng.range(0, d.kh / 2), d.pw = rng.range(0, d.kw / 2);
    d.oh = outsz(d.h, d.kh, d.sh, d.ph, 1), d.ow = outsz(d.w, d.kw, d.sw, d.pw, 1);
    if (d.oh < 0 || d.ow < 0) return;
    rep.begin();
    std::vector<double> x(d.planes * d.h * d.w), dy(d.planes * d.oh * d.ow);
    for (auto& v : x) {
        v = (double)rng.range(0, 3);  // ties
        if (rng.range(0, 30) == 0) v = NAN;
        if (rng.range(0, 30) == 0) v = -INFINITY;
    }
    for (auto& v : dy) v = rng.normal();
    x = roundtrip<T>(x), dy = roundtrip<T>(dy);
    auto xt = to_t<T>(x), dyt = to_t<T>(dy);
    std::vector<T> y(dy.size()), ya(dy.size()), dx(x.size()), dxa(x.size());
    std::vector<i64> idx(dy.size());
    const T *xp = xt.data(), *dyp = dyt.data();
    T *yp = y.data(), *yap = ya.data(), *dxp = dx.data(), *dxap = dxa.data();
    i64* ip = idx.data();
    double inv = 1.0 / (double)(d.kh * d.kw);
    LAUNCH(K<T>::maxp, EG, EB, yp, ip, xp, d);
    LAUNCH(K<T>::maxb, EG, EB, dxp, ip, dyp, d);
    LAUNCH(K<T>::avgp, EG, EB, yap, xp, d, inv);
    LAUNCH(K<T>::avgb, EG, EB, dxap, dyp, d, inv);
    std::vector<double> yr(dy.size()), yar(dy.size()), dxr(x.size(), 0), dxar(x.size(), 0), idxr(dy.size());
    for (i64 pl = 0; pl < d.planes; pl++)
        for (i64 oy = 0; oy < d.oh; oy++)
            for (i64 ox = 0; ox < d.ow; ox++) {
                double best = -INFINITY, sum = 0;
                i64 at = -1, o = (pl * d.oh + oy) * d.ow + ox;
                for (i64 ky = 0; ky < d.kh; ky++) {
                    i64 iy;
                    if (!src(oy, ky, d.sh, d.ph, 1, d.h, &iy)) continue;
                    for (i64 kx = 0; kx < d.kw; kx++) {
                        i64 ix;
                        if (!src(ox, kx, d.sw, d.pw, 1, d.w, &ix)) continue;
                        double v = x[pl * d.h * d.w + iy * d.w + ix];
                        sum += v;
                        if (v > best || at < 0 || std::isnan(v)) best = v, at = iy * d.w + ix;
                    }
                }
                yr[o] = best, idxr[o] = (double)at, yar[o] = sum * inv;
                if (at >= 0) dxr[pl * d.h * d.w + at] += dy[o];
                for (i64 ky = 0; ky < d.kh; ky++) {
                    i64 iy;
                    if (!src(oy, ky, d.sh, d.ph, 1, d.h, &iy)) continue;
                    for (i64 kx = 0; kx < d.kw; kx++) {
                        i64 ix;
                        if (src(ox, kx, d.sw, d.pw, 1, d.w, &ix)) dxar[pl * d.h * d.w + iy * d.w + ix] += dy[o] * inv;
                    }
                }
            }
    std::string s = fmt("pool %s planes%lld h%lld w%lld k%lldx%lld s%lld,%lld p%lld,%lld", dtype_name<T>(), d.planes, d.h, d.w,
                        d.kh, d.kw, d.sh, d.sw, d.ph, d.pw);
    rep.exact(s + " max y", from_t(y), yr);
    rep.exact(s + " max idx", widen(idx), idxr);
    rep.close(s + " max dx", from_t(dx), dxr, tolerance<T>());
    rep.close(s + " avg y", from_t(ya), yar, tolerance<T>());
    rep.close(s + " avg dx", from_t(dxa), dxar, tolerance<T>());
    rep.end();
}

int main() {
    // conv2d_dw does a block reduction per weight element: the costly part of the emulation
    for (int t = 0; t < 40; ++t) conv_trial<double>(t);
    for (int t = 0; t < 12; ++t) conv_trial<float>(t);
    for (int t = 0; t < 6; ++t) conv_trial<bf16>(t);
    for (int t = 0; t < 6; ++t) conv_trial<f16>(t);
    for (int t = 0; t < 150; ++t) pool_trial<double>();
    for (int t = 0; t < 30; ++t) pool_trial<float>();
    for (int t = 0; t < 20; ++t) pool_trial<bf16>();
    for (int t = 0; t < 20; ++t) pool_trial<f16>();
    return rep.finish();
}
