// optim.cu: the fused Adam/AdamW and SGD (momentum, dampening, Nesterov, weight decay) steps,
// bit for bit against the same formulas written as plain C++ (fma where the CPU fuses, separate
// roundings elsewhere), sum_sq + sum_partials (gradient norm, in double) and scale.
#include "check.h"
#include "../../../crates/weft-core/src/cuda/kernels/optim.cu"

using namespace chk;
static Rng rng(4);
static Report rep("optim");

template <typename T> std::vector<T> randt(size_t n, double s = 1) {
    std::vector<T> v(n);
    for (auto& x : v) x = (T)(rng.normal() * s);
    return v;
}

template <typename T> void adam_case(u64 n, bool l2, bool decay, bool small, int steps) {
    rep.begin();
    auto p = randt<T>(n), m = randt<T>(n, 0.1), v = randt<T>(n, 0.01);
    for (auto& x : v) x = std::fabs(x);
    auto rp = p, rm = m, rv = v;
    for (int step = 1; step <= steps; ++step) {
        auto g = randt<T>(n);
        if (n > 3) g[0] = 0, g[1] = (T)1e-30, g[2] = (T)1e6;
        double lr = 1e-3, b1 = 0.9, b2 = 0.999, wd = 0.01;
        AdamScalars<T> c{};
        c.l2 = (T)wd, c.decay = (T)(1 - lr * wd), c.lerp_w = (T)(1 - b1), c.lerp_w_minus_one = (T)(-b1);
        c.beta2 = (T)b2, c.one_minus_beta2 = (T)(1 - b2);
        c.bias_correction2_sqrt = (T)std::sqrt(1 - std::pow(b2, step)), c.eps = (T)1e-8;
        c.neg_step_size = (T)(-lr / (1 - std::pow(b1, step)));
        c.has_l2 = l2, c.has_decay = decay, c.lerp_small = small;
        T *pp = p.data(), *mp = m.data(), *vp = v.data();
        const T* gp = g.data();
        if constexpr (std::is_same_v<T, float>) LAUNCH(adam_f32, 2, 64, pp, mp, vp, gp, c, n);
        else LAUNCH(adam_f64, 2, 64, pp, mp, vp, gp, c, n);
        for (u64 i = 0; i < n; ++i) {
            T pv = rp[i], gv = g[i], mi = rm[i], vi = rv[i];
            if (l2) gv = std::fma(pv, c.l2, gv);
            if (decay) pv = pv * c.decay;
            T d = gv - mi;
            T mv = small ? std::fma(c.lerp_w, d, mi) : std::fma(c.lerp_w_minus_one, d, gv);
            T og = c.one_minus_beta2 * gv, vb = vi * c.beta2;
            T vv = std::fma(og, gv, vb);
            T sq = std::sqrt(vv), q = sq / c.bias_correction2_sqrt, denom = q + c.eps;
            T st = c.neg_step_size * mv, upd = st / denom;
            rp[i] = pv + upd, rm[i] = mv, rv[i] = vv;
        }
    }
    std::string w = fmt("adam %s n %llu l2 %d decay %d lerp_small %d", dtype_name<T>(), n, l2, decay, small);
    rep.exact(w + " p", widen(p), widen(rp));
    rep.exact(w + " m", widen(m), widen(rm));
    rep.exact(w + " v", widen(v), widen(rv));
    rep.end();
}

template <typename T> void sgd_case(u64 n, bool wd, bool momentum, bool nesterov, int steps) {
    rep.begin();
    auto p = randt<T>(n), buf = std::vector<T>(n, (T)0);
    auto rp = p, rbuf = buf;
    for (int step = 1; step <= steps; ++step) {
        auto g = randt<T>(n);
        SgdScalars<T> c{};
        c.weight_decay = (T)1e-2, c.momentum = (T)0.9, c.one_minus_dampening = (T)(1 - 0.1), c.neg_lr = (T)-0.05;
        c.has_weight_decay = wd, c.nesterov = nesterov, c.first = step == 1;
        T *pp = p.data(), *bp = momentum ? buf.data() : nullptr;
        const T* gp = g.data();
        if constexpr (std::is_same_v<T, float>) LAUNCH(sgd_f32, 2, 64, pp, bp, gp, c, n);
        else LAUNCH(sgd_f64, 2, 64, pp, bp, gp, c, n);
        for (u64 i = 0; i < n; ++i) {
            T pv = rp[i], gv = g[i];
            if (wd) gv = std::fma(pv, c.weight_decay, gv);
            T d = gv;
            if (momentum) {
                T prev = rbuf[i] * c.momentum;
                T b = step == 1 ? gv : std::fma(gv, c.one_minus_dampening, prev);
                rbuf[i] = b;
                d = nesterov ? std::fma(b, c.momentum, gv) : b;
            }
            rp[i] = std::fma(d, c.neg_lr, pv);
        }
    }
    std::string w = fmt("sgd %s n %llu wd %d momentum %d nesterov %d", dtype_name<T>(), n, wd, momentum, nesterov);
    rep.exact(w + " p", widen(p), widen(rp));
    if (momentum) rep.exact(w + " buf", widen(buf), widen(rbuf));
    rep.end();
}

template <typename T> void norm_and_scale_case(u64 n, unsigned blocks) {
    rep.begin();
    auto x = roundtrip<T>([&] { std::vector<double> v(n); for (auto& e : v) e = rng.normal() * 3; return v; }());
    auto xt = to_t<T>(x);
    std::vector<double> partial(blocks), total(1);
    double *pp = partial.data(), *tp = total.data();
    const T* xp = xt.data();
    u64 nb = blocks;
    if constexpr (std::is_same_v<T, float>) LAUNCH(sum_sq_f32, blocks, 64, pp, xp, n);
    else if constexpr (std::is_same_v<T, double>) LAUNCH(sum_sq_f64, blocks, 64, pp, xp, n);
    else if constexpr (std::is_same_v<T, bf16>) LAUNCH(sum_sq_bf16, blocks, 64, pp, xp, n);
    else LAUNCH(sum_sq_f16, blocks, 64, pp, xp, n);
    LAUNCH(sum_partials, 1, 64, tp, pp, nb);
    double want = 0;
    for (double v : x) want += v * v;
    std::string w = fmt("sum_sq %s n %llu blocks %u", dtype_name<T>(), n, blocks);
    rep.close(w, total, {want}, 1e-14);
    // scale: f32 by an f32 factor, f64 by f64, bf16/f16 in double then rounded through f32
    const double c = 0.37;
    T* xm = xt.data();
    std::vector<double> ws(n);
    if constexpr (std::is_same_v<T, float>) {
        float cf = (float)c;
        LAUNCH(scale_f32, 2, 32, xm, cf, n);
        for (u64 i = 0; i < n; ++i) ws[i] = (double)((float)x[i] * cf);
    } else {
        if constexpr (std::is_same_v<T, double>) LAUNCH(scale_f64, 2, 32, xm, c, n);
        else if constexpr (std::is_same_v<T, bf16>) LAUNCH(scale_bf16, 2, 32, xm, c, n);
        else LAUNCH(scale_f16, 2, 32, xm, c, n);
        for (u64 i = 0; i < n; ++i) ws[i] = std::is_same_v<T, double> ? x[i] * c : (double)(float)(x[i] * c);
    }
    rep.exact(fmt("scale %s n %llu", dtype_name<T>(), n), from_t(xt), roundtrip<T>(ws));
    rep.end();
}

int main() {
    for (int k = 0; k < 8; ++k) {
        adam_case<float>(300, k & 1, k & 2, k & 4, 3);
        adam_case<double>(300, k & 1, k & 2, k & 4, 3);
    }
    for (int k = 0; k < 6; ++k) {
        bool wd = k & 1, mom = k >= 2, nest = k >= 4;
        sgd_case<float>(300, wd, mom, nest, 3);
        sgd_case<double>(300, wd, mom, nest, 3);
    }
    for (u64 n : {0ull, 1ull, 1000ull}) {
        norm_and_scale_case<float>(n, 3);
        norm_and_scale_case<double>(n, 3);
        norm_and_scale_case<bf16>(n, 2);
        norm_and_scale_case<f16>(n, 2);
    }
    return rep.finish();
}
