// nn.cu: softmax / log-softmax (+ backward), layer and RMS norm (+ dx, dw, db through
// norm_partials / norm_colsum), cross-entropy (loss, mean, scale, backward, label smoothing,
// ignore_index) and dropout (a permuted view, Philox), per dtype, against double references.
#include "check.h"
#include "../../../crates/weft-core/src/cuda/kernels/nn.cu"

using namespace chk;
static Rng rng(1);
static Report rep("nn");

static std::vector<double> randv(size_t n) {
    std::vector<double> v(n);
    for (auto& x : v) x = rng.normal();
    return v;
}
// As crate::cuda::families::nn::row_threads, but at most 64 threads (the Rust side goes up to
// 256): two warps already exercise the block reduction and rows longer than the block.
static unsigned row_threads(size_t len) { return (unsigned)std::clamp<size_t>((len + 31) / 32 * 32, 32, 64); }
// One block per row as the Rust side, but at most 4 (the kernels grid-stride over the rest).
static unsigned long long rows_grid(size_t rows) { return std::clamp<size_t>(rows, 1, 4); }
// Element kernels: any block size works (grid-stride); small blocks keep the emulation quick.
static unsigned long long elem_grid(size_t n) { return std::clamp<size_t>((n + 63) / 64, 1, 4); }


template <typename T> struct Fns;
#define FNS(T, S)                                                                                          \
    template <> struct Fns<T> {                                                                            \
        static constexpr auto softmax = softmax_##S, softmax_bwd = softmax_backward_##S;                  \
        static constexpr auto norm = norm_##S;                                                            \
        static constexpr auto norm_bwd = norm_backward_##S;                                               \
        static constexpr auto partials = norm_partials_##S;                                               \
        static constexpr auto colsum = norm_colsum_##S;                                                   \
        static constexpr auto ce = cross_entropy_##S;                                                     \
        static constexpr auto ce_mean = cross_entropy_mean_##S;                                           \
        static constexpr auto ce_scale = cross_entropy_scale_##S;                                         \
        static constexpr auto ce_bwd = cross_entropy_backward_##S;                                        \
        static constexpr auto dropout = dropout_##S;                                                      \
    };
FNS(float, f32)
FNS(double, f64)
FNS(bf16, bf16)
FNS(f16, f16)

template <typename T> void test_softmax(size_t rows, size_t len, bool lg) {
    rep.begin();
    const double tol = tolerance<T>();
    auto x = roundtrip<T>(randv(rows * len)), g = roundtrip<T>(randv(rows * len));
    auto xt = to_t<T>(x), gt = to_t<T>(g);
    std::vector<T> yt(rows * len), dt(rows * len);
    T *xp = xt.data(), *yp = yt.data(), *gp = gt.data(), *dp = dt.data();
    u32 is_log = lg;
    LAUNCH(Fns<T>::softmax, rows_grid(rows), row_threads(len), xp, yp, rows, len, is_log);
    auto y = from_t(yt);
    LAUNCH(Fns<T>::softmax_bwd, rows_grid(rows), row_threads(len), yp, gp, dp, rows, len, is_log);
    std::vector<double> wy(rows * len), wd(rows * len);
    for (size_t r = 0; r < rows; ++r) {
        const double* xr = &x[r * len];
        double m = -INFINITY, s = 0, a = 0;
        for (size_t j = 0; j < len; ++j) m = std::max(m, xr[j]);
        for (size_t j = 0; j < len; ++j) s += std::exp(xr[j] - m);
        for (size_t j = 0; j < len; ++j) wy[r * len + j] = lg ? xr[j] - m - std::log(s) : std::exp(xr[j] - m) / s;
        for (size_t j = 0; j < len; ++j) a += lg ? g[r * len + j] : y[r * len + j] * g[r * len + j];
        for (size_t j = 0; j < len; ++j) {
            double yy = y[r * len + j], gg = g[r * len + j];
            wd[r * len + j] = lg ? gg - std::exp(yy) * a : yy * (gg - a);
        }
    }
    std::string w = fmt("%s %s [%zu,%zu]", lg ? "log_softmax" : "softmax", dtype_name<T>(), rows, len);
    rep.close(w + " y", y, wy, tol);
    rep.close(w + " dx", from_t(dt), wd, tol);
    rep.end();
}

template <typename T> void test_norm(size_t rows, size_t len, bool hw, bool hb, bool rms) {
    typedef typename Acc<T>::type A;
    rep.begin();
    const double tol = tolerance<T>(), eps = 1e-5;
    auto x = roundtrip<T>(randv(rows * len)), g = roundtrip<T>(randv(rows * len));
    auto w = roundtrip<T>(randv(len)), b = roundtrip<T>(randv(len));
    auto xt = to_t<T>(x), gt = to_t<T>(g), wt = to_t<T>(w), bt = to_t<T>(b);
    std::vector<T> yt(rows * len), dxt(rows * len), dwt(len), dbt(len);
    std::vector<A> mean(rows), rstd(rows);
    T *xp = xt.data(), *gp = gt.data(), *wp = hw ? wt.data() : nullptr, *bp = hb ? bt.data() : nullptr;
    T *yp = yt.data(), *dxp = dxt.data();
    A *mp = mean.data(), *rp = rstd.data();
    u32 r32 = rms;
    LAUNCH(Fns<T>::norm, rows_grid(rows), row_threads(len), xp, wp, bp, yp, mp, rp, rows, len, eps, r32);
    if (rows) LAUNCH(Fns<T>::norm_bwd, rows_grid(rows), row_threads(len), xp, wp, gp, mp, rp, dxp, rows, len, r32);
    // As norm.rs (rows_per_block: at most 512 blocks, at least 64 rows each), with 32 columns a
    // block instead of 256 (any count works: threads past len return).
    size_t per = std::max<size_t>((rows + 511) / 512, 64), blocks = (rows + per - 1) / per;
    std::vector<A> pw(blocks * len + 1), pb(blocks * len + 1);
    A *pwp = pw.data(), *pbp = pb.data();
    if (blocks)
        LAUNCH(Fns<T>::partials, cuda_host::grid2((unsigned)((len + 31) / 32), (unsigned)blocks), 32, xp, gp, mp, rp,
               pwp, pbp, rows, len, per);
    T *dwp = hw ? dwt.data() : nullptr, *dbp = hb ? dbt.data() : nullptr;
    LAUNCH(Fns<T>::colsum, elem_grid(len), 64, pwp, pbp, dwp, dbp, blocks, len);
    std::vector<double> wy(rows * len), wm(rows), wr(rows), wdx(rows * len), wdw(len, 0), wdb(len, 0);
    for (size_t r = 0; r < rows; ++r) {
        const double *xr = &x[r * len], *gr = &g[r * len];
        double mu = 0, q = 0, a = 0, c = 0;
        if (!rms) {
            for (size_t j = 0; j < len; ++j) mu += xr[j];
            mu /= len;
        }
        for (size_t j = 0; j < len; ++j) q += (xr[j] - mu) * (xr[j] - mu);
        double rs = 1 / std::sqrt(q / len + eps);
        wm[r] = mu;
        wr[r] = rs;
        for (size_t j = 0; j < len; ++j) {
            double xh = (xr[j] - mu) * rs, gw = gr[j] * (hw ? w[j] : 1);
            wy[r * len + j] = xh * (hw ? w[j] : 1) + (hb ? b[j] : 0);
            a += gw;
            c += gw * xh;
            wdw[j] += gr[j] * xh;
            wdb[j] += gr[j];
        }
        double mgw = rms ? 0 : a / len, mgx = c / len;
        for (size_t j = 0; j < len; ++j) {
            double xh = (xr[j] - mu) * rs;
            wdx[r * len + j] = rs * (gr[j] * (hw ? w[j] : 1) - mgw - xh * mgx);
        }
    }
    std::string s = fmt("%s %s [%zu,%zu] w%d b%d", rms ? "rms_norm" : "layer_norm", dtype_name<T>(), rows, len, hw, hb);
    rep.close(s + " y", from_t(yt), wy, tol);
    rep.close(s + " mean", widen(mean), wm, tol);
    rep.close(s + " rstd", widen(rstd), wr, tol);
    rep.close(s + " dx", from_t(dxt), wdx, tol);
    if (hw) rep.close(s + " dw", from_t(dwt), wdw, tol);
    if (hb) rep.close(s + " db", from_t(dbt), wdb, tol);
    rep.end();
}

template <typename T> void test_ce(size_t n, size_t c, int ignore_every, double sm) {
    typedef typename Acc<T>::type A;
    rep.begin();
    const double tol = tolerance<T>();
    const i64 ignore = -100;
    auto x = roundtrip<T>(randv(n * c));
    std::vector<i64> t(n);
    size_t valid = 0;
    for (size_t i = 0; i < n; ++i) {
        t[i] = (ignore_every && i % ignore_every == 0) ? ignore : (i64)(rng.uniform() * c);
        valid += t[i] != ignore;
    }
    auto xt = to_t<T>(x);
    std::vector<A> loss(n + 1), lse(n + 1);
    std::vector<T> out(1), dxt(n * c), gt = to_t<T>({0.75});
    std::vector<double> scale(1);
    T *xp = xt.data(), *op = out.data(), *gp = gt.data(), *dxp = dxt.data();
    i64* tp = t.data();
    A *lp = loss.data(), *ep = lse.data();
    double* sp = scale.data();
    u64 nc = n * c;
    if (n) LAUNCH(Fns<T>::ce, rows_grid(n), row_threads(c), xp, tp, lp, ep, n, c, ignore, sm);
    LAUNCH(Fns<T>::ce_mean, 1, 64, lp, op, n, valid);
    LAUNCH(Fns<T>::ce_scale, 1, 64, tp, n, ignore, gp, sp);
    if (nc) LAUNCH(Fns<T>::ce_bwd, elem_grid(nc), 64, xp, tp, ep, sp, dxp, nc, c, ignore, sm);
    std::vector<double> wl(n), wdx(n * c);
    double total = 0, gsc = 0.75 / (double)valid;
    for (size_t r = 0; r < n; ++r) {
        const double* xr = &x[r * c];
        double m = -INFINITY, s = 0, sx = 0;
        for (size_t j = 0; j < c; ++j) m = std::max(m, xr[j]);
        for (size_t j = 0; j < c; ++j) s += std::exp(xr[j] - m), sx += xr[j];
        double l = m + std::log(s);
        wl[r] = l;
        if (t[r] == ignore) continue;
        total += (1 - sm) * (l - xr[t[r]]) + sm * (l - sx / c);
        for (size_t j = 0; j < c; ++j)
            wdx[r * c + j] = gsc * (std::exp(xr[j] - l) - sm / c - (j == (size_t)t[r] ? 1 - sm : 0));
    }
    std::string s = fmt("cross_entropy %s [%zu,%zu] ignore_every %d smoothing %g", dtype_name<T>(), n, c, ignore_every, sm);
    rep.close(s + " loss", from_t(out), {total / (double)valid}, tol);
    rep.close(s + " scale", scale, {gsc}, 1e-15);
    rep.close(s + " lse", std::vector<double>(lse.begin(), lse.begin() + n), wl, tol);
    rep.close(s + " dx", from_t(dxt), wdx, tol);
    rep.end();
}

// Philox4x32-10 written from the Random123 definition (not the prelude's), as crate::rng:
// counter (index lo, index hi, 0, 0), key (seed lo, seed hi).
static void philox_ref(u64 seed, u64 index, u32 out[4]) {
    u32 c[4] = {(u32)index, (u32)(index >> 32), 0, 0}, k[2] = {(u32)seed, (u32)(seed >> 32)};
    for (int round = 0; round < 10; ++round) {
        if (round) k[0] += 0x9E3779B9u, k[1] += 0xBB67AE85u;
        u64 a = (u64)0xD2511F53u * c[0], b = (u64)0xCD9E8D57u * c[2];
        u32 n[4] = {(u32)(b >> 32) ^ c[1] ^ k[0], (u32)b, (u32)(a >> 32) ^ c[3] ^ k[1], (u32)a};
        std::memcpy(c, n, sizeof c);
    }
    std::memcpy(out, c, sizeof c);
}
static double uniform_ref(u64 seed, u64 index) {
    u32 w[4];
    philox_ref(seed, index, w);
    return (double)(((((u64)w[0]) << 21) ^ (u64)w[1]) & ((1ull << 53) - 1)) / 9007199254740992.0;
}

template <typename T> void test_dropout() {
    rep.begin();
    // x stored [2, 3, 4], read as permute(2, 0, 1): shape [4, 2, 3], strides [1, 12, 4], offset 1.
    auto x = roundtrip<T>(randv(25));
    auto xt = to_t<T>(x);
    std::vector<T> yt(24);
    Strided s{};
    s.rank = 3;
    s.shape[0] = 4, s.shape[1] = 2, s.shape[2] = 3;
    s.strides[0] = 1, s.strides[1] = 12, s.strides[2] = 4;
    s.offset = 1;
    T *xp = xt.data(), *yp = yt.data();
    double p = 0.3, sc = 1.0 / 0.7;
    u64 seed = 42, off = (1ull << 33) + 5, n = 24;
    LAUNCH(Fns<T>::dropout, 2, 32, xp, s, yp, n, p, sc, seed, off);
    std::vector<double> want(24);
    for (size_t i = 0; i < 24; ++i) {
        size_t a = i / 6, b = (i / 3) % 2, c = i % 3;
        typedef typename Acc<T>::type A;
        A v = (A)x[1 + b * 12 + c * 4 + a];
        want[i] = uniform_ref(seed, off + i) < p ? 0.0 : (double)(A)(v * (A)sc);
    }
    // rounded to T as the kernel stores it
    rep.exact(fmt("dropout %s permuted view", dtype_name<T>()), from_t(yt), roundtrip<T>(want));
    rep.end();
}

template <typename T> void family() {
    for (size_t len : {1, 37, 64, 150})
        for (bool lg : {false, true}) test_softmax<T>(3, len, lg);
    struct S {
        size_t r, l;
    };
    for (S s : {S{4, 37}, S{2, 100}, S{0, 8}, S{1, 1}})
        for (int k = 0; k < 4; ++k) test_norm<T>(s.r, s.l, k != 2, k == 0 || k == 2, k == 3);
    test_norm<T>(70, 5, true, true, false);  // two blocks of norm_partials (64 rows each)
    struct C {
        size_t n, c;
        int ie;
    };
    for (double sm : {0.0, 0.1})
        for (C k : {C{6, 37, 3}, C{3, 150, 0}, C{20, 10, 7}, C{1, 1, 0}, C{0, 6, 0}}) test_ce<T>(k.n, k.c, k.ie, sm);
    test_dropout<T>();
}

int main() {
    // Random123's known answer for Philox4x32-10 with counter 0 and key 0, through the prelude.
    rep.begin();
    Words w = philox(0, 0);
    u32 r0[4];
    philox_ref(0, 0, r0);
    rep.exact("philox known answer", {(double)w.w[0], (double)w.w[1], (double)w.w[2], (double)w.w[3]},
              {(double)0x6627e8d5u, (double)0xe169c58du, (double)0xbc57ac4cu, (double)0x9b00dbd8u});
    rep.exact("philox reference", {(double)r0[0], (double)r0[1], (double)r0[2], (double)r0[3]},
              {(double)0x6627e8d5u, (double)0xe169c58du, (double)0xbc57ac4cu, (double)0x9b00dbd8u});
    rep.end();
    family<float>();
    family<double>();
    family<bf16>();
    family<f16>();
    return rep.finish();
}
