// attention.cu: the fused attention forward (o, lse) and both backward kernels (dq with delta,
// then dk/dv), through strided views as the Rust side passes them (a permuted q, a broadcast v,
// the q/k/v thirds of a fused [B, T, 3C] projection), with and without the causal mask, against a
// double reference; edge cases with no keys, no queries and an empty value head.
#include "check.h"
#include "../../../crates/weft-core/src/cuda/kernels/attention.cu"

static chk::Report rep("attention");

template <typename T> double tod(T x) { return (double)x; }
template <> double tod<bf16>(bf16 x) { return bf16_to_f32(x); }
template <> double tod<f16>(f16 x) { return f16_to_f32(x); }
template <typename T> T fromd(double x) { return (T)x; }
template <> bf16 fromd<bf16>(double x) { return f32_to_bf16((float)x); }
template <> f16 fromd<f16>(double x) { return f32_to_f16((float)x); }

Mat mat(std::vector<u64> lshape, std::vector<u64> lstrides, u64 off, u64 row, u64 col) {
    Mat m; memset(&m, 0, sizeof m);
    for (int d = 0; d < MAX_RANK; ++d) m.lead.shape[d] = 1;
    m.lead.rank = lshape.size(); m.lead.offset = off;
    for (size_t d = 0; d < lshape.size(); ++d) { m.lead.shape[d] = lshape[d]; m.lead.strides[d] = lstrides[d]; }
    m.row = row; m.col = col;
    return m;
}
static std::mt19937_64 rng(5);
template <typename T> std::vector<T> rand_buf(size_t n) {
    std::normal_distribution<double> nd; std::vector<T> v(n);
    for (auto& x : v) x = fromd<T>(nd(rng));
    return v;
}
template <typename T> std::vector<T> poison(size_t n) { return std::vector<T>(n, fromd<T>(NAN)); }

struct Acc4 { std::function<double(u64, u64, u64)> at; };  // (problem, row, col)
double maxdiff = 0;
bool check(const char* what, const std::string& cfg, std::function<double(u64,u64,u64)> got, std::function<double(u64,u64,u64)> want, u64 bh, u64 rows, u64 cols, double tol) {
    double scale = 1, worst = 0;
    for (u64 b = 0; b < bh; ++b) for (u64 r = 0; r < rows; ++r) for (u64 c = 0; c < cols; ++c) scale = std::max(scale, fabs(want(b, r, c)));
    for (u64 b = 0; b < bh; ++b) for (u64 r = 0; r < rows; ++r) for (u64 c = 0; c < cols; ++c) {
        double d = fabs(got(b, r, c) - want(b, r, c));
        if (!(d <= tol * scale)) { rep.fail(std::string(what) + " " + cfg, chk::fmt("at (%llu,%llu,%llu): got %.9g want %.9g", b, r, c, got(b, r, c), want(b, r, c))); return false; }
        ++rep.values;
        worst = std::max(worst, d / scale);
    }
    maxdiff = std::max(maxdiff, worst);
    return true;
}

// Reference, in double: o, lse, and the gradients given dO (using the reference o and lse).
struct Ref { std::vector<double> o, lse, dq, dk, dv; };
Ref reference(u64 bh, u64 t, u64 s, u64 d, u64 dv, bool causal, double scale,
              std::function<double(u64,u64,u64)> q, std::function<double(u64,u64,u64)> k,
              std::function<double(u64,u64,u64)> v, std::function<double(u64,u64,u64)> g) {
    Ref R; R.o.assign(bh*t*dv, 0); R.lse.assign(bh*t, 0); R.dq.assign(bh*t*d, 0); R.dk.assign(bh*s*d, 0); R.dv.assign(bh*s*dv, 0);
    for (u64 b = 0; b < bh; ++b) for (u64 i = 0; i < t; ++i) {
        u64 nk = causal ? std::min(i + 1, s) : s;
        if (nk == 0) continue;
        std::vector<double> sc(nk), p(nk);
        double m = -INFINITY;
        for (u64 j = 0; j < nk; ++j) { double a = 0; for (u64 c = 0; c < d; ++c) a += q(b,i,c)*k(b,j,c); sc[j] = a*scale; m = std::max(m, sc[j]); }
        double l = 0; for (u64 j = 0; j < nk; ++j) l += exp(sc[j]-m);
        for (u64 j = 0; j < nk; ++j) p[j] = exp(sc[j]-m)/l;
        R.lse[b*t+i] = m + log(l);
        for (u64 c = 0; c < dv; ++c) { double a = 0; for (u64 j = 0; j < nk; ++j) a += p[j]*v(b,j,c); R.o[(b*t+i)*dv+c] = a; }
        double delta = 0; for (u64 c = 0; c < dv; ++c) delta += g(b,i,c)*R.o[(b*t+i)*dv+c];
        for (u64 j = 0; j < nk; ++j) {
            double dp = 0; for (u64 c = 0; c < dv; ++c) dp += g(b,i,c)*v(b,j,c);
            double ds = p[j]*(dp - delta);
            for (u64 c = 0; c < d; ++c) { R.dq[(b*t+i)*d+c] += scale*ds*k(b,j,c); R.dk[(b*s+j)*d+c] += scale*ds*q(b,i,c); }
            for (u64 c = 0; c < dv; ++c) R.dv[(b*s+j)*dv+c] += p[j]*g(b,i,c);
        }
    }
    return R;
}


// sdpa: q stored [B,T,H,D] viewed [B,H,T,D]; k contiguous [B,H,S,D]; v [B,1,S,Dv] broadcast over H;
// out stored [B,T,H,Dv]; grad contiguous [B,H,T,Dv]; dq, dk, dv contiguous.
template <typename T, typename A, typename F1, typename F2, typename F3>
bool sdpa(F1 fwd, F2 bdq, F3 bdkdv, u64 B, u64 H, u64 t, u64 s, u64 d, u64 dv, bool causal, double tol, unsigned maxgrid) {
    char buf[200]; snprintf(buf, sizeof buf, "sdpa B=%llu H=%llu t=%llu s=%llu d=%llu dv=%llu causal=%d", B, H, t, s, d, dv, causal);
    std::string cfg = buf;
    rep.begin();
    struct End { ~End() { rep.end(); } } end_case;
    u64 bh = B*H; double scale = 1.0/sqrt((double)(d ? d : 1)) * 1.3;
    auto qb = rand_buf<T>(B*t*H*d + 3), kb = rand_buf<T>(B*H*s*d), vb = rand_buf<T>(B*s*dv), gb = rand_buf<T>(bh*t*dv);
    auto ob = poison<T>(B*t*H*dv); auto lse = poison<A>(bh*t);
    const u64 qoff = 3;
    auto Q = [&](u64 b, u64 i, u64 c) { return tod(qb[qoff + ((b/H*t+i)*H+b%H)*d+c]); };
    auto K = [&](u64 b, u64 j, u64 c) { return tod(kb[(b*s+j)*d+c]); };
    auto V = [&](u64 b, u64 j, u64 c) { return tod(vb[(b/H*s+j)*dv+c]); };
    auto G = [&](u64 b, u64 i, u64 c) { return tod(gb[(b*t+i)*dv+c]); };
    auto O = [&](u64 b, u64 i, u64 c) { return tod(ob[((b/H*t+i)*H+b%H)*dv+c]); };
    Mat mq = mat({B,H}, {t*H*d, d}, qoff, H*d, 1), mk = mat({B,H}, {H*s*d, s*d}, 0, d, 1),
        mv = mat({B,H}, {s*dv, 0}, 0, dv, 1), mo = mat({B,H}, {t*H*dv, dv}, 0, H*dv, 1), mg = mat({B,H}, {t*dv*H, t*dv}, 0, dv, 1);
    AttnDims n{bh, t, s, d, dv, scale, causal, 0};
    auto rows = bh*t; unsigned blocks = std::min<u64>(std::max<u64>((rows+3)/4, 1), maxgrid);
    if (rows) cuda_host::launch(cuda_host::grid1(blocks), 128, [&] { fwd(qb.data(), kb.data(), vb.data(), ob.data(), lse.data(), mq, mk, mv, mo, n); });
    Ref R = reference(bh, t, s, d, dv, causal, scale, Q, K, V, G);
    bool ok = check("o", cfg, O, [&](u64 b, u64 i, u64 c) { return R.o[(b*t+i)*dv+c]; }, bh, t, dv, tol);
    ok &= check("lse", cfg, [&](u64 b, u64 i, u64) { return (double)lse[b*t+i]; }, [&](u64 b, u64 i, u64) { return R.lse[b*t+i]; }, bh, t, 1, tol);
    // backward from the reference's o and lse (in T / A)
    std::vector<T> o2(bh*t*dv); for (u64 x = 0; x < bh*t*dv; ++x) o2[x] = fromd<T>(R.o[x]);
    std::vector<A> l2(bh*t); for (u64 x = 0; x < bh*t; ++x) l2[x] = (A)R.lse[x];
    Ref R2 = reference(bh, t, s, d, dv, causal, scale, Q, K, V, G);  // same
    Mat mo2 = mat({B,H}, {t*H*dv, t*dv}, 0, dv, 1);
    auto dqb = poison<T>(bh*t*d), dkb = poison<T>(bh*s*d), dvb = poison<T>(bh*s*dv); auto delta = poison<A>(bh*t);
    Mat mdq = mat({B,H}, {H*t*d, t*d}, 0, d, 1), mdk = mat({B,H}, {H*s*d, s*d}, 0, d, 1), mdv = mat({B,H}, {H*s*dv, s*dv}, 0, dv, 1);
    if (rows) cuda_host::launch(cuda_host::grid1(blocks), 128, [&] { bdq(qb.data(), kb.data(), vb.data(), o2.data(), gb.data(), l2.data(), delta.data(), dqb.data(), mq, mk, mv, mo2, mg, mdq, n); });
    u64 krows = bh*s; unsigned kblocks = std::min<u64>(std::max<u64>((krows+3)/4, 1), maxgrid);
    if (krows) cuda_host::launch(cuda_host::grid1(kblocks), 128, [&] { bdkdv(qb.data(), kb.data(), vb.data(), gb.data(), l2.data(), delta.data(), dkb.data(), dvb.data(), mq, mk, mv, mg, mdk, mdv, n); });
    ok &= check("dq", cfg, [&](u64 b, u64 i, u64 c) { return tod(dqb[(b*t+i)*d+c]); }, [&](u64 b, u64 i, u64 c) { return R2.dq[(b*t+i)*d+c]; }, bh, t, d, tol);
    ok &= check("dk", cfg, [&](u64 b, u64 j, u64 c) { return tod(dkb[(b*s+j)*d+c]); }, [&](u64 b, u64 j, u64 c) { return R2.dk[(b*s+j)*d+c]; }, bh, s, d, tol);
    ok &= check("dv", cfg, [&](u64 b, u64 j, u64 c) { return tod(dvb[(b*s+j)*dv+c]); }, [&](u64 b, u64 j, u64 c) { return R2.dv[(b*s+j)*dv+c]; }, bh, s, dv, tol);
    return ok;
}

// qkv: x [B,T,3C] contiguous (plus an offset), heads of hd; out [B,T,C]; dx [B,T,3C].
template <typename T, typename A, typename F1, typename F2, typename F3>
bool qkv(F1 fwd, F2 bdq, F3 bdkdv, u64 B, u64 heads, u64 t, u64 hd, bool causal, double tol, unsigned maxgrid) {
    char buf[200]; snprintf(buf, sizeof buf, "qkv B=%llu heads=%llu t=%llu hd=%llu causal=%d", B, heads, t, hd, causal);
    std::string cfg = buf;
    rep.begin();
    struct End { ~End() { rep.end(); } } end_case;
    u64 C = heads*hd, W = 3*C, bh = B*heads; double scale = 1.0/sqrt((double)hd);
    const u64 off = 5;
    auto xb = rand_buf<T>(off + B*t*W), gb = rand_buf<T>(B*t*C); auto ob = poison<T>(B*t*C); auto lse = poison<A>(bh*t);
    auto X = [&](u64 third) { return [&, third](u64 b, u64 i, u64 c) { return tod(xb[off + (b/heads*t+i)*W + third*C + b%heads*hd + c]); }; };
    auto G = [&](u64 b, u64 i, u64 c) { return tod(gb[(b/heads*t+i)*C + b%heads*hd + c]); };
    auto O = [&](u64 b, u64 i, u64 c) { return tod(ob[(b/heads*t+i)*C + b%heads*hd + c]); };
    // as Mat::heads(l, heads, hd, first) with l = [B,T,W] strides [t*W, W, 1] offset off
    auto heads_of = [&](u64 st0, u64 st1, u64 st2, u64 o, u64 first) { return mat({B, heads}, {st0, hd*st2}, o + first*st2, st1, st2); };
    Mat mq = heads_of(t*W, W, 1, off, 0), mk = heads_of(t*W, W, 1, off, C), mv = heads_of(t*W, W, 1, off, 2*C), mo = heads_of(t*C, C, 1, 0, 0);
    AttnDims n{bh, t, t, hd, hd, scale, causal, 0};
    auto rows = bh*t; unsigned blocks = std::min<u64>(std::max<u64>((rows+3)/4, 1), maxgrid);
    if (rows) cuda_host::launch(cuda_host::grid1(blocks), 128, [&] { fwd(xb.data(), xb.data(), xb.data(), ob.data(), lse.data(), mq, mk, mv, mo, n); });
    Ref R = reference(bh, t, t, hd, hd, causal, scale, X(0), X(1), X(2), G);
    bool ok = check("o", cfg, O, [&](u64 b, u64 i, u64 c) { return R.o[(b*t+i)*hd+c]; }, bh, t, hd, tol);
    ok &= check("lse", cfg, [&](u64 b, u64 i, u64) { return (double)lse[b*t+i]; }, [&](u64 b, u64 i, u64) { return R.lse[b*t+i]; }, bh, t, 1, tol);
    std::vector<T> o2(B*t*C); for (u64 b = 0; b < bh; ++b) for (u64 i = 0; i < t; ++i) for (u64 c = 0; c < hd; ++c) o2[(b/heads*t+i)*C + b%heads*hd + c] = fromd<T>(R.o[(b*t+i)*hd+c]);
    std::vector<A> l2(bh*t); for (u64 x = 0; x < bh*t; ++x) l2[x] = (A)R.lse[x];
    auto dx = poison<T>(B*t*W); auto delta = poison<A>(bh*t);
    Mat mg = heads_of(t*C, C, 1, 0, 0), md0 = heads_of(t*W, W, 1, 0, 0), md1 = heads_of(t*W, W, 1, 0, C), md2 = heads_of(t*W, W, 1, 0, 2*C);
    if (rows) cuda_host::launch(cuda_host::grid1(blocks), 128, [&] { bdq(xb.data(), xb.data(), xb.data(), o2.data(), gb.data(), l2.data(), delta.data(), dx.data(), mq, mk, mv, mo, mg, md0, n); });
    if (rows) cuda_host::launch(cuda_host::grid1(blocks), 128, [&] { bdkdv(xb.data(), xb.data(), xb.data(), gb.data(), l2.data(), delta.data(), dx.data(), dx.data(), mq, mk, mv, mg, md1, md2, n); });
    for (u64 third = 0; third < 3; ++third) {
        auto& ref = third == 0 ? R.dq : third == 1 ? R.dk : R.dv;
        ok &= check(third == 0 ? "dq" : third == 1 ? "dk" : "dv", cfg,
            [&](u64 b, u64 i, u64 c) { return tod(dx[(b/heads*t+i)*W + third*C + b%heads*hd + c]); },
            [&](u64 b, u64 i, u64 c) { return ref[(b*t+i)*hd+c]; }, bh, t, hd, tol);
    }
    return ok;
}

#define ARGS(SUF) attention_forward_##SUF, attention_backward_dq_##SUF, attention_backward_dkdv_##SUF
// Small problems (the emulation runs a thread per lane): two key tiles, a second pass over wide
// heads (d, dv > 128), and the empty edges.
#define RUN(T, A, SUF, TOL, GRID) \
    for (int causal = 0; causal < 2; ++causal) { \
        ok &= sdpa<T, A>(ARGS(SUF), 1, 2, 5, 37, 8, 12, causal, TOL, GRID); \
        ok &= sdpa<T, A>(ARGS(SUF), 1, 1, 3, 3, 130, 136, causal, TOL, GRID); \
        ok &= sdpa<T, A>(ARGS(SUF), 2, 1, 3, 0, 4, 4, causal, TOL, GRID); \
        ok &= sdpa<T, A>(ARGS(SUF), 2, 1, 0, 3, 4, 4, causal, TOL, GRID); \
        ok &= sdpa<T, A>(ARGS(SUF), 1, 1, 4, 4, 8, 0, causal, TOL, GRID); \
        ok &= qkv<T, A>(ARGS(SUF), 1, 2, 6, 8, causal, TOL, GRID); \
    }

int main() {
    bool ok = true;
    RUN(float, float, f32, 2e-6, 2)
    RUN(double, double, f64, 1e-12, 1000000)
    RUN(bf16, float, bf16, 1e-2, 2)
    RUN(f16, float, f16, 2e-3, 2)
    (void)ok;
    return rep.finish();
}
