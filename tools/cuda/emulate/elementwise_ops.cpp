// elementwise.cu, every kernel but the casts (elementwise.cpp has those), launched as
// crate::cuda::families::elementwise does, against plain C++ statements of the CPU's rules
// (crate::ops::elementwise, crate::cpu::elementwise, crate::cpu::math):
// - unary_* and unary_backward_*, all 12 ops, every float dtype: x through a permuted view with
//   an offset, the gradient through a broadcast (stride 0) view. Neg, Abs, Relu (and their
//   derivatives) bit for bit; the rest against unary_scalar's formulas evaluated in double (long
//   double for f64): f32 within 1e-5 relative to max(1, |want|) per element (the GPU test's
//   tolerance), f64 within 1e-12, bf16 / f16 within their rounding (2^-8 / 2^-11) plus 2e-5.
//   NaN and infinities must come out exactly where the CPU's formulas give them: for f32 and the
//   half types that is the CPU's f32 code (cpu::math's exp_f32 is 0 below -87.3 and inf above
//   88.72, erf_f32 is +-1 from 3.8325, x * x * x overflows in gelu_tanh) with exact elementary
//   functions. Inputs: 0, -0, tiny, subnormal, the CPU's branch points, large, +-inf, NaN and
//   normals at three scales. Prints the largest f32 error per op. Left out on purpose: f32 x in
//   (88.72, 88.7228], where the CPU's exp_f32 says inf and expf the finite e^x (a difference of
//   the CPU's approximation, not of the kernel).
// - binary_*: the 7 ops on every float dtype, add/sub/mul/maximum/minimum on i64/i32/u8
//   (wrapping), through broadcast (stride 0), permuted, narrowed and rank-8 views and a cross
//   product of special values; bit for bit (the maximum/minimum NaN rule and signed zeros
//   included) except float pow (tolerance as above, classes exact).
// - compare_*: the 6 ops on all 8 dtypes, Bool out as 0/1 bytes: a cross product of values with
//   ties, +-0, NaNs, ints beyond 2^53, and random values through permuted/broadcast views.
// - affine_*, pow_scalar_* (exponents 2 and -1, and ones that become them in f32: x * x and
//   1 / x bit for bit) and clamp_* (Rust's max/min: NaN becomes lo, NaN bounds, equal bounds),
//   scalars handed over in the compute type as the Rust side does.
// - where_1/2/4/8: cond, a and b broadcast three different ways.
#include "check.h"
#include "../../../crates/weft-core/src/cuda/kernels/elementwise.cu"

using namespace chk;
static Rng rng(23);
static Report rep("elementwise_ops");


// ---- views ----
struct View {
    Shape shape, strides;
    u64 offset = 0;
};
enum Layout { CONTIG, PERMUTED, NARROWED };  // how an input's storage holds it
// An input of shape `s` stored as `layout`, broadcast to `out` (stride 0 on its size-1 and
// missing leading dims), as Layout::expand.
static View input_view(const Shape& s, int layout, const Shape& out) {
    View v{s, contiguous(s), 0};
    const int rank = (int)s.size();
    if (layout == PERMUTED) {  // column-major storage, offset 3
        u64 a = 1;
        for (int d = 0; d < rank; ++d) v.strides[d] = a, a *= s[d];
        v.offset = 3;
    } else if (layout == NARROWED) {  // each dim a slice of one twice its size (+1), starting at 1
        u64 a = 1;
        for (int d = rank - 1; d >= 0; --d) v.offset += a, v.strides[d] = a, a *= 2 * s[d] + 1;
    }
    View o{out, Shape(out.size(), 0), v.offset};
    const size_t lead = out.size() - s.size();
    for (size_t d = 0; d < s.size(); ++d) o.strides[lead + d] = s[d] == 1 ? 0 : v.strides[d];
    return o;
}
static u64 storage_len(const View& v) {
    u64 m = v.offset;
    for (size_t d = 0; d < v.shape.size(); ++d) m += (v.shape[d] - 1) * v.strides[d];
    return m + 1;
}
// Storage offsets of the view's elements, row-major (a multi-index counter).
static std::vector<u64> offsets(const View& v) {
    std::vector<u64> o;
    std::vector<u64> c(v.shape.size(), 0);
    for (u64 i = 0, n = numel(v.shape); i < n; ++i) {
        u64 off = v.offset;
        for (size_t d = 0; d < c.size(); ++d) off += c[d] * v.strides[d];
        o.push_back(off);
        for (int d = (int)c.size() - 1; d >= 0; --d) {
            if (++c[d] < v.shape[d]) break;
            c[d] = 0;
        }
    }
    return o;
}
static Strided strided(const View& v) {  // as crate::cuda::launch::Strided::new
    Strided s{};
    for (int d = 0; d < MAX_RANK; ++d) s.shape[d] = 1, s.strides[d] = 0;
    for (size_t d = 0; d < v.shape.size(); ++d) s.shape[d] = v.shape[d], s.strides[d] = v.strides[d];
    s.offset = v.offset;
    s.rank = (u32)v.shape.size();
    return s;
}

// ---- storage values (decoded exactly; encoded by this file's own rounding) ----
static double round_fmt(double v, int p, int emin, int emax) {  // nearest even, overflow to inf
    if (std::isnan(v) || std::isinf(v) || v == 0) return v;
    double a = std::fabs(v);
    int e = std::max(std::ilogb(a), emin);
    double ulp = std::ldexp(1.0, e - p);
    double r = std::nearbyint(a / ulp) * ulp;
    if (r > std::ldexp(2.0 - std::ldexp(1.0, -p), emax)) r = INFINITY;
    return std::copysign(r, v);
}
static double dec(float v) { return v; }
static double dec(double v) { return v; }
static double dec(bf16 v) { return cuda_host::bits<float>((u32)v.bits << 16); }
static double dec(f16 v) { return (double)cuda_host::bits<_Float16>(v.bits); }
// v in T, from f32 for the half types (the CPU's back_to: f32 -> bf16/f16, nearest even).
template <typename T> T enc(double v) {
    if constexpr (std::is_same_v<T, float>) return (float)v;
    else if constexpr (std::is_same_v<T, double>) return v;
    else if constexpr (std::is_same_v<T, bf16>) {
        if (std::isnan(v)) return bf16{(unsigned short)(std::signbit(v) ? 0xFFC0 : 0x7FC0)};
        return bf16{(unsigned short)(cuda_host::bits<u32>((float)round_fmt((float)v, 7, -126, 127)) >> 16)};
    } else {
        if (std::isnan(v)) return f16{(unsigned short)(std::signbit(v) ? 0xFE00 : 0x7E00)};
        return f16{cuda_host::bits<unsigned short>((_Float16)round_fmt((float)v, 10, -14, 15))};
    }
}
template <typename T> double in_t(double v) { return dec(enc<T>(v)); }
static bool same(double a, double b) {  // bit for bit, any NaN matching any NaN
    return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b));
}

template <typename T> struct K;
#define KERNELS_OF(T, S)                                                                                   \
    template <> struct K<T> {                                                                              \
        static constexpr const char* name = #S;                                                            \
        static constexpr auto unary = unary_##S, unary_backward = unary_backward_##S, binary = binary_##S; \
        static constexpr auto affine = affine_##S, pow_scalar = pow_scalar_##S, clamp = clamp_##S;         \
        static constexpr auto compare = compare_##S;                                                       \
    };
KERNELS_OF(float, f32)
KERNELS_OF(double, f64)
KERNELS_OF(bf16, bf16)
KERNELS_OF(f16, f16)
template <typename T> constexpr double tol() {
    if constexpr (std::is_same_v<T, float>) return 1e-5;
    else if constexpr (std::is_same_v<T, double>) return 1e-12;
    else if constexpr (std::is_same_v<T, bf16>) return 0x1p-8 + 2e-5;
    else return 0x1p-11 + 2e-5;
}

// got against a reference: `cls` is the value the CPU's own code gives (in T), `exact` the exact
// value of its formula. cls NaN or infinite: got must be the same; else got within tol * max(1,
// |exact|) of exact (of cls where the exact value overflows or is NaN). Returns the largest error.
static double close(const std::string& what, const std::vector<double>& got, const std::vector<long double>& exact,
                    const std::vector<double>& cls, const std::vector<double>& inputs, double tolerance) {
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        ++rep.values;
        const double g = got[i], c = cls[i];
        if (!std::isfinite(c)) {
            if (!(std::isnan(c) ? std::isnan(g) : g == c)) {
                rep.fail(what, fmt("element %zu (x = %.9g): got %.17g want %.17g", i, inputs[i], g, c));
                return worst;
            }
            continue;
        }
        const long double w = std::isfinite(exact[i]) ? exact[i] : (long double)c;
        const double err = std::isfinite(g) ? (double)(std::fabs((long double)g - w) / std::max<long double>(1, std::fabs(w))) : INFINITY;
        worst = std::max(worst, err);
        if (!(err <= tolerance)) {
            rep.fail(what, fmt("element %zu (x = %.9g): got %.17g want %.17Lg (relative error %.3g > %.3g)", i, inputs[i], g,
                               w, err, tolerance));
            return worst;
        }
    }
    return worst;
}
static void exact(const std::string& what, const std::vector<double>& got, const std::vector<double>& want,
                  const std::vector<double>& inputs) {
    for (size_t i = 0; i < got.size(); ++i) {
        ++rep.values;
        if (!same(got[i], want[i])) {
            rep.fail(what, fmt("element %zu (x = %.9g): got %.17g want %.17g", i, inputs[i], got[i], want[i]));
            return;
        }
    }
}

// ============================== unary ==============================
static const char* UNARY[12] = {"neg", "exp", "log", "sqrt", "rsqrt", "abs", "tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "silu"};
static bool exact_unary(int op) { return op == 0 || op == 5 || op == 8; }
const double SQRT_2_OVER_PI_ = 0.7978845608028654, GELU_TANH_C_ = 0.044715, FRAC_1_SQRT_2_ = 0.7071067811865476,
             FRAC_1_SQRT_2PI_ = 0.3989422804014327;

// unary_scalar (crate::cpu::elementwise): (value, derivative) in R.
template <typename R> std::pair<R, R> unary_scalar(int op, R x) {
    const R one = 1, half = (R)0.5, z = 0;
    switch (op) {
        case 0: return {-x, -one};
        case 1: return {std::exp(x), std::exp(x)};
        case 2: return {std::log(x), one / x};
        case 3: return {std::sqrt(x), half / std::sqrt(x)};
        case 4: return {one / std::sqrt(x), -half / (x * std::sqrt(x))};
        case 5: return {std::fabs(x), x > z ? one : x < z ? -one : z};
        case 6: { R t = std::tanh(x); return {t, one - t * t}; }
        case 7: { R s = one / (one + std::exp(-x)); return {s, s * (one - s)}; }
        case 8: return x > z ? std::pair<R, R>{x, one} : std::pair<R, R>{z, z};
        case 9: {
            R cdf = half * (one + std::erf(x * (R)FRAC_1_SQRT_2_));
            R pdf = (R)FRAC_1_SQRT_2PI_ * std::exp(-half * x * x);
            return {x * cdf, cdf + x * pdf};
        }
        case 10: {
            const R c = (R)SQRT_2_OVER_PI_, k = (R)GELU_TANH_C_;
            R t = std::tanh(c * (x + k * x * x * x));
            return {half * x * (one + t), half * (one + t) + half * x * (one - t * t) * c * (one + (R)3 * k * x * x)};
        }
        default: { R s = one / (one + std::exp(-x)); return {x * s, s * (one + x * (one - s))}; }
    }
}

// The CPU's f32 code (unary_f32_serial / unary_backward_f32_serial and cpu::math), its
// approximations replaced by the exact function rounded to f32 but their cut-offs kept.
namespace cpu32 {
float exp_f32(float x) { return x < -87.3f ? 0.0f : x > 88.72f ? INFINITY : (float)std::exp((double)x); }
float exp_nonpos_f32(float x) { return x < -87.3f ? 0.0f : (float)std::exp((double)x); }
float tanh_f32(float x) { return (float)std::tanh((double)x); }
float erf_f32(float x) { return std::fabs(x) >= 3.832506856900711f ? std::copysign(1.0f, x) : (float)std::erf((double)x); }
float sigmoid(float x) { return 1.0f / (1.0f + exp_f32(-x)); }
const float C = (float)SQRT_2_OVER_PI_, KK = (float)GELU_TANH_C_, R2 = (float)FRAC_1_SQRT_2_, P = (float)FRAC_1_SQRT_2PI_;
float value(int op, float x) {
    switch (op) {
        case 0: return -x;
        case 1: return exp_f32(x);
        case 2: return std::log(x);
        case 3: return std::sqrt(x);
        case 4: return 1.0f / std::sqrt(x);
        case 5: return std::fabs(x);
        case 6: return tanh_f32(x);
        case 7: return sigmoid(x);
        case 8: return x > 0.0f ? x : 0.0f;
        case 9: return 0.5f * x * (1.0f + erf_f32(x * R2));
        case 10: return 0.5f * x * (1.0f + tanh_f32(C * (x + KK * x * x * x)));
        default: return x * sigmoid(x);
    }
}
float derivative(int op, float x) {
    switch (op) {
        case 0: return -1.0f;
        case 1: return exp_f32(x);
        case 2: return 1.0f / x;
        case 3: return 0.5f / std::sqrt(x);
        case 4: return -0.5f / (x * std::sqrt(x));
        case 5: return x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : 0.0f;
        case 6: { float t = tanh_f32(x); return 1.0f - t * t; }
        case 7: { float s = sigmoid(x); return s * (1.0f - s); }
        case 8: return x > 0.0f ? 1.0f : 0.0f;
        case 9: {
            float u = x * R2;
            float erf = erf_f32(u), gauss = exp_nonpos_f32(-u * u);
            return 0.5f * (1.0f + erf) + x * (P * gauss);
        }
        case 10: {
            float x2 = x * x;
            float t = tanh_f32(C * (x + KK * x2 * x));
            float dinner = C * (1.0f + 3.0f * KK * x2);
            return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dinner;
        }
        default: { float s = sigmoid(x); return s * (1.0f + x * (1.0f - s)); }
    }
}
}  // namespace cpu32

static double max_err32[2][12];  // [forward, backward][op], f32

static std::vector<double> unary_inputs(u64 n) {
    static const double specials[] = {0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -3.0, 1e-3, -1e-3, 1e-30, -1e-30, 5e-39,
                                      0.24, 0.26, -0.26, 3.83, -3.84, 5.4, -5.45, 10.0, -10.0, 20.0, -20.0, 87.0, -87.2,
                                      -87.4, 88.5, -88.5, (double)88.72f, 88.73, -104.0, 1e13, -1e13, 1e30, -1e30,
                                      1e200, -1e200, INFINITY, -INFINITY, NAN};
    std::vector<double> v(specials, specials + std::size(specials));
    while (v.size() < n) {
        const double scale = v.size() % 3 == 0 ? 8.0 : v.size() % 7 == 0 ? 40.0 : 2.0;
        const double x = rng.normal() * scale;
        // exp_f32 is inf above 88.72 where e^x is still below f32's largest (up to 88.7228):
        // the kernels' expf is finite there (see the head comment)
        if (std::fabs(x) > 88.72 && std::fabs(x) < 88.723) continue;
        v.push_back(x);
    }
    v.resize(n);
    return v;
}

template <typename T> void check_unary(int op, bool backward) {
    constexpr bool f64 = std::is_same_v<T, double>;
    rep.begin();
    const Shape out{8, 24};  // x: permuted storage; g: one row broadcast down
    const View vx = input_view(out, PERMUTED, out), vg = input_view({24}, CONTIG, out);
    const u64 n = numel(out);
    auto ox = offsets(vx), og = offsets(vg);
    std::vector<T> xs(storage_len(vx), enc<T>(0.25)), gs(storage_len(vg));
    const std::vector<double> in = unary_inputs(n);
    for (u64 i = 0; i < n; ++i) xs[ox[i]] = enc<T>(in[i]);
    for (auto& g : gs) g = enc<T>(rng.normal() * 2);
    std::vector<T> got_t(n);
    T* o = got_t.data();
    const T *xp = xs.data(), *gp = gs.data();
    Strided sx = strided(vx), sg = strided(vg);
    u32 code = op;
    if (backward) LAUNCH(K<T>::unary_backward, blocks_for(n), TH, o, xp, sx, gp, sg, n, code);
    else LAUNCH(K<T>::unary, blocks_for(n), TH, o, xp, sx, n, code);

    std::vector<double> got(n), x(n), cls(n), want_exact(n);
    std::vector<long double> want(n);
    for (u64 i = 0; i < n; ++i) {
        got[i] = dec(got_t[i]);
        x[i] = dec(xs[ox[i]]);
        const double g = dec(gs[og[i]]);
        if constexpr (f64) {
            auto d = unary_scalar<double>(op, x[i]);
            cls[i] = backward ? g * d.second : d.first;
            auto l = unary_scalar<long double>(op, (long double)x[i]);
            want[i] = backward ? (long double)g * l.second : l.first;
        } else {
            const float xf = (float)x[i];
            cls[i] = in_t<T>(backward ? (float)g * cpu32::derivative(op, xf) : cpu32::value(op, xf));
            auto d = unary_scalar<double>(op, x[i]);
            want[i] = backward ? g * d.second : d.first;
        }
        want_exact[i] = cls[i];
    }
    const std::string what = fmt("unary%s_%s %s", backward ? "_backward" : "", K<T>::name, UNARY[op]);
    if (exact_unary(op)) {
        exact(what, got, want_exact, x);  // in the compute type, rounded once: exact for these
    } else {
        double e = close(what, got, want, cls, x, tol<T>());
        if constexpr (std::is_same_v<T, float>) max_err32[backward][op] = std::max(max_err32[backward][op], e);
    }
    rep.end();
}

// ============================== binary ==============================
static const char* BINARY[7] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum"};

struct Geometry {
    std::string name;
    Shape out, a, b;
    int la, lb;
};
static std::vector<Geometry> geometries() {
    return {
        {"a permuted, b [7,1] broadcast", {5, 7, 9}, {5, 7, 9}, {7, 1}, PERMUTED, CONTIG},
        {"a [1,10] narrowed, b [6,1] permuted", {6, 10}, {1, 10}, {6, 1}, NARROWED, PERMUTED},
        {"rank 8, b a scalar", {2, 1, 2, 3, 1, 2, 2, 3}, {2, 1, 2, 3, 1, 2, 2, 3}, {}, PERMUTED, CONTIG},
    };
}
// A value for float storage: a special one now and then, else a normal.
static const double FLOAT_SPECIALS[] = {0.0, -0.0, 1.0, -1.0, 0.5, -2.0, 3.0, 2.5, 1e-3, 1e-40, -1e30, 7e4,
                                        INFINITY, -INFINITY, NAN};
static double float_value() {
    if (rng.next() % 6 == 0) return FLOAT_SPECIALS[rng.next() % std::size(FLOAT_SPECIALS)];
    return rng.normal() * (rng.next() % 2 ? 3.0 : 0.5);
}

// Runs one binary-shaped kernel (binary or compare) over a geometry; the storages are filled by
// `fill` (called with the storage and the offsets of the view's elements).
template <typename T, typename O, typename Kern>
void run_binary_shaped(Kern kern, u32 op, const Shape& out, const View& va, const View& vb, const std::vector<T>& as,
                       const std::vector<T>& bs, std::vector<O>& got) {
    const u64 n = numel(out);
    got.assign(n, O{});
    O* o = got.data();
    const T *ap = as.data(), *bp = bs.data();
    Strided sa = strided(va), sb = strided(vb);
    LAUNCH(kern, blocks_for(n), TH, o, ap, sa, bp, sb, n, op);
}

// The special values' cross product: out [S, S], a [S, 1], b [S] (both broadcast).
template <typename T> void special_views(const std::vector<double>& s, Shape& out, View& va, View& vb, std::vector<T>& as,
                                         std::vector<T>& bs) {
    const u64 m = s.size();
    out = {m, m};
    va = input_view({m, 1}, CONTIG, out);
    vb = input_view({m}, CONTIG, out);
    as.clear(), bs.clear();
    for (double v : s) as.push_back(enc<T>(v)), bs.push_back(enc<T>(v));
}

template <typename T> double binary_ref(int op, double a, double b) {
    typedef typename Acc<T>::type A;
    const A x = (A)a, y = (A)b;
    A r;
    switch (op) {
        case 0: r = x + y; break;
        case 1: r = x - y; break;
        case 2: r = x * y; break;
        case 3: r = x / y; break;
        case 5: r = y > x ? y : x; break;
        default: r = y < x ? y : x; break;
    }
    return in_t<T>((double)r);
}

template <typename T> void check_binary_float(int op, int geom) {
    rep.begin();
    Shape out;
    View va, vb;
    std::vector<T> as, bs;
    std::string gname;
    if (geom < 3) {
        const Geometry g = geometries()[geom];
        gname = g.name;
        out = g.out;
        va = input_view(g.a, g.la, out);
        vb = input_view(g.b, g.lb, out);
        as.resize(storage_len(va)), bs.resize(storage_len(vb));
        for (auto& v : as) v = enc<T>(op == 4 ? std::fabs(rng.normal()) * 2 + (rng.next() % 5 ? 0.0 : -1.5) : float_value());
        for (auto& v : bs) v = enc<T>(op == 4 ? (rng.next() % 3 ? rng.normal() * 2 : (double)rng.range(-3, 3)) : float_value());
    } else {
        gname = "special values crossed";
        special_views<T>({0.0, -0.0, 1.0, -1.0, 0.5, -2.0, 3.0, -0.5, 1e-40, 65504.0, INFINITY, -INFINITY, NAN}, out, va, vb, as,
                         bs);
    }
    std::vector<T> got_t;
    run_binary_shaped<T, T>(K<T>::binary, op, out, va, vb, as, bs, got_t);
    const auto oa = offsets(va), ob = offsets(vb);
    const u64 n = numel(out);
    std::vector<double> got(n), want(n), cls(n), xa(n);
    std::vector<long double> want_l(n);
    for (u64 i = 0; i < n; ++i) {
        got[i] = dec(got_t[i]);
        const double a = dec(as[oa[i]]), b = dec(bs[ob[i]]);
        xa[i] = a;
        if (op == 4) {
            // CPU: powf in the compute type (f32 for the half types), rounded once
            if constexpr (std::is_same_v<T, double>) cls[i] = std::pow(a, b), want_l[i] = std::pow((long double)a, (long double)b);
            else cls[i] = in_t<T>(std::pow((float)a, (float)b)), want_l[i] = std::pow(a, b);
        } else {
            want[i] = binary_ref<T>(op, a, b);
        }
    }
    const std::string what = fmt("binary_%s %s, %s %s", K<T>::name, BINARY[op], gname.c_str(), shape_str(out).c_str());
    if (op == 4) close(what, got, want_l, cls, xa, tol<T>());
    else exact(what, got, want, xa);
    rep.end();
}

template <typename T> constexpr auto int_binary() {
    if constexpr (std::is_same_v<T, i64>) return binary_i64;
    else if constexpr (std::is_same_v<T, int>) return binary_i32;
    else return binary_u8;
}
template <typename T> const char* int_name() {
    return std::is_same_v<T, i64> ? "i64" : std::is_same_v<T, int> ? "i32" : "u8";
}
template <typename T> T int_value() {
    typedef std::make_unsigned_t<T> U;
    static const T edges[] = {0, 1, (T)-1, std::numeric_limits<T>::max(), std::numeric_limits<T>::min(),
                              (T)(std::numeric_limits<T>::max() - 1), (T)(std::numeric_limits<T>::min() + 1), 127, (T)128};
    switch (rng.next() % 4) {
        case 0: return edges[rng.next() % std::size(edges)];
        case 1: return (T)(U)rng.next();
        default: return (T)rng.range(-20, 20);
    }
}
// Rust's wrapping add/sub/mul and the CPU's maximum/minimum.
template <typename T> T int_ref(int op, T a, T b) {
    typedef std::make_unsigned_t<T> U;
    switch (op) {
        case 0: return (T)(U)((U)a + (U)b);
        case 1: return (T)(U)((U)a - (U)b);
        case 2: return (T)(U)((u64)(U)a * (u64)(U)b);
        case 5: return b > a ? b : a;
        default: return b < a ? b : a;
    }
}
template <typename T> void check_binary_int(int op, int geom) {
    rep.begin();
    const Geometry g = geometries()[geom];
    const Shape out = g.out;
    const View va = input_view(g.a, g.la, out), vb = input_view(g.b, g.lb, out);
    std::vector<T> as(storage_len(va)), bs(storage_len(vb));
    for (auto& v : as) v = int_value<T>();
    for (auto& v : bs) v = int_value<T>();
    std::vector<T> got;
    run_binary_shaped<T, T>(int_binary<T>(), op, out, va, vb, as, bs, got);
    const auto oa = offsets(va), ob = offsets(vb);
    for (u64 i = 0; i < got.size(); ++i) {
        ++rep.values;
        const T want = int_ref<T>(op, as[oa[i]], bs[ob[i]]);
        if (got[i] != want) {
            rep.fail(fmt("binary_%s %s, %s", int_name<T>(), BINARY[op], g.name.c_str()),
                     fmt("element %llu: %lld op %lld: got %lld want %lld", i, (long long)as[oa[i]], (long long)bs[ob[i]],
                         (long long)got[i], (long long)want));
            break;
        }
    }
    rep.end();
}

// ============================== compare ==============================
static const char* COMPARE[6] = {"eq", "ne", "lt", "le", "gt", "ge"};
template <typename V> bool cmp_ref(int op, V x, V y) {
    switch (op) {
        case 0: return x == y;
        case 1: return x != y;
        case 2: return x < y;
        case 3: return x <= y;
        case 4: return x > y;
        default: return x >= y;
    }
}
// S: the storage type, V: how the CPU compares it (doubles for floats, the int itself, 0/1).
template <typename S, typename V, typename Kern>
void check_compare(Kern kern, const char* name, int op, const std::vector<S>& specials, S (*random)(), V (*val)(S)) {
    for (int geom = 0; geom < 2; ++geom) {
        rep.begin();
        Shape out;
        View va, vb;
        std::vector<S> as, bs;
        if (geom == 0) {
            const u64 m = specials.size();
            out = {m, m};
            va = input_view({m, 1}, CONTIG, out), vb = input_view({m}, CONTIG, out);
            as = specials, bs = specials;
        } else {
            out = {4, 6, 5};
            va = input_view({4, 6, 5}, PERMUTED, out), vb = input_view({6, 1}, NARROWED, out);
            as.resize(storage_len(va)), bs.resize(storage_len(vb));
            // draw from the specials half the time, so that ties occur
            for (auto& v : as) v = rng.next() % 2 ? specials[rng.next() % specials.size()] : random();
            for (auto& v : bs) v = rng.next() % 2 ? specials[rng.next() % specials.size()] : random();
        }
        std::vector<unsigned char> got;
        run_binary_shaped<S, unsigned char>(kern, op, out, va, vb, as, bs, got);
        const auto oa = offsets(va), ob = offsets(vb);
        for (u64 i = 0; i < got.size(); ++i) {
            ++rep.values;
            const unsigned char want = cmp_ref(op, val(as[oa[i]]), val(bs[ob[i]])) ? 1 : 0;
            if (got[i] != want) {
                rep.fail(fmt("compare_%s %s (%s)", name, COMPARE[op], geom ? "views" : "specials crossed"),
                         fmt("element %llu: got %d want %d (%.17g vs %.17g)", i, got[i], want, (double)val(as[oa[i]]),
                             (double)val(bs[ob[i]])));
                break;
            }
        }
        rep.end();
    }
}
template <typename T> void compare_float(int op) {
    std::vector<T> s;
    for (double v : std::initializer_list<double>{-INFINITY, -1e30, -2.0, -1.0, -0.0, 0.0, 1e-40, 1.0, 1.0, 1.5, 1.5000001, INFINITY, NAN, -NAN})
        s.push_back(enc<T>(v));
    check_compare<T, double>(K<T>::compare, K<T>::name, op, s, [] { return enc<T>(float_value()); },
                             [](T v) { return dec(v); });
}
template <typename T> constexpr auto int_compare() {
    if constexpr (std::is_same_v<T, i64>) return compare_i64;
    else return compare_i32;
}
template <typename T> void compare_int(int op) {
    std::vector<T> s;
    for (long long v : {-9223372036854775807ll - 1, -9007199254740993ll, -1ll, 0ll, 1ll, 7ll, 9007199254740992ll,
                        9007199254740993ll, 16777216ll, 16777217ll, 2147483647ll, 255ll, 128ll, 127ll,
                        9223372036854775807ll})
        if (v >= (long long)std::numeric_limits<T>::min() && v <= (long long)std::numeric_limits<T>::max()) s.push_back((T)v);
    check_compare<T, T>(int_compare<T>(), int_name<T>(), op, s, [] { return int_value<T>(); }, [](T v) { return v; });
}

// ============================== scalar ops ==============================
template <typename T> std::vector<T> scalar_inputs(const View& v, std::vector<double>& x) {
    std::vector<T> s(storage_len(v), enc<T>(0.125));
    const auto off = offsets(v);
    x.resize(off.size());
    for (size_t i = 0; i < off.size(); ++i) {
        s[off[i]] = enc<T>(i < std::size(FLOAT_SPECIALS) ? FLOAT_SPECIALS[i] : float_value());
        x[i] = dec(s[off[i]]);
    }
    return s;
}
static const Shape SCALAR_OUT{6, 25};

template <typename T> void check_affine(double mul, double add) {
    typedef typename Acc<T>::type A;
    rep.begin();
    const View v = input_view(SCALAR_OUT, PERMUTED, SCALAR_OUT);
    std::vector<double> x;
    auto xs = scalar_inputs<T>(v, x);
    const u64 n = x.size();
    std::vector<T> got_t(n);
    T* o = got_t.data();
    const T* xp = xs.data();
    Strided sv = strided(v);
    A m = (A)mul, a = (A)add;  // the Rust side: `as f32` for every dtype but f64
    LAUNCH(K<T>::affine, blocks_for(n), TH, o, xp, sv, n, m, a);
    std::vector<double> got(n), want(n);
    for (u64 i = 0; i < n; ++i) {
        got[i] = dec(got_t[i]);
        A p = (A)x[i] * m;  // rounded, then added (no fused multiply-add on the CPU)
        want[i] = in_t<T>((double)(A)(p + a));
    }
    exact(fmt("affine_%s mul %g add %g", K<T>::name, mul, add), got, want, x);
    rep.end();
}

template <typename T> void check_pow_scalar(double e) {
    typedef typename Acc<T>::type A;
    constexpr bool f64 = std::is_same_v<T, double>;
    rep.begin();
    const View v = input_view(SCALAR_OUT, NARROWED, SCALAR_OUT);
    std::vector<double> x;
    auto xs = scalar_inputs<T>(v, x);
    const u64 n = x.size();
    std::vector<T> got_t(n);
    T* o = got_t.data();
    const T* xp = xs.data();
    Strided sv = strided(v);
    A ea = (A)e;
    LAUNCH(K<T>::pow_scalar, blocks_for(n), TH, o, xp, sv, n, ea);
    std::vector<double> got(n), want(n), cls(n);
    std::vector<long double> want_l(n);
    for (u64 i = 0; i < n; ++i) {
        got[i] = dec(got_t[i]);
        if constexpr (f64) {  // the CPU: x.powf(e) always
            cls[i] = std::pow(x[i], e);
            want_l[i] = std::pow((long double)x[i], (long double)e);
        } else {  // the CPU's f32 path: x * x for 2, 1 / x for -1 (after `as f32`), else powf
            const float xf = (float)x[i], ef = (float)e;
            const float r = ef == 2.0f ? xf * xf : ef == -1.0f ? 1.0f / xf : std::pow(xf, ef);
            cls[i] = want[i] = in_t<T>(r);
            want_l[i] = std::pow((long double)x[i], (long double)ef);
        }
    }
    const std::string what = fmt("pow_scalar_%s e=%.17g", K<T>::name, e);
    if (!f64 && ((float)e == 2.0f || (float)e == -1.0f)) exact(what, got, want, x);
    else close(what, got, want_l, cls, x, tol<T>());
    rep.end();
}

// Rust's f32::max / f64::max: the other operand when one is NaN.
static double rust_max(double a, double b) { return std::isnan(a) ? b : std::isnan(b) ? a : a < b ? b : a; }
static double rust_min(double a, double b) { return std::isnan(a) ? b : std::isnan(b) ? a : b < a ? b : a; }
template <typename T> void check_clamp(double lo, double hi) {
    typedef typename Acc<T>::type A;
    rep.begin();
    const View v = input_view(SCALAR_OUT, PERMUTED, SCALAR_OUT);
    std::vector<double> x;
    auto xs = scalar_inputs<T>(v, x);
    const u64 n = x.size();
    std::vector<T> got_t(n);
    T* o = got_t.data();
    const T* xp = xs.data();
    Strided sv = strided(v);
    A l = (A)lo, h = (A)hi;
    LAUNCH(K<T>::clamp, blocks_for(n), TH, o, xp, sv, n, l, h);
    const std::string what = fmt("clamp_%s [%g, %g]", K<T>::name, lo, hi);
    for (u64 i = 0; i < n; ++i) {
        ++rep.values;
        const double got = dec(got_t[i]), want = in_t<T>(rust_min(rust_max(x[i], (double)l), (double)h));
        // the sign of a zero result is not pinned down (Rust's max/min of +-0 is either)
        if (!(std::isnan(got) && std::isnan(want)) && !(got == want)) {
            rep.fail(what, fmt("element %llu (x = %.9g): got %.17g want %.17g", i, x[i], got, want));
            break;
        }
    }
    rep.end();
}

// ============================== where ==============================
template <typename T> constexpr auto where_of() {
    if constexpr (sizeof(T) == 1) return where_1;
    else if constexpr (sizeof(T) == 2) return where_2;
    else if constexpr (sizeof(T) == 4) return where_4;
    else return where_8;
}
template <typename T> void check_where(int geom) {
    rep.begin();
    const Shape out{4, 5, 6};
    View vc, va, vb;
    if (geom == 0) {
        vc = input_view({4, 1, 6}, NARROWED, out), va = input_view({5, 1}, PERMUTED, out), vb = input_view(out, PERMUTED, out);
    } else {
        vc = input_view({}, CONTIG, out), va = input_view(out, CONTIG, out), vb = input_view({6}, NARROWED, out);
    }
    std::vector<unsigned char> cs(storage_len(vc));
    std::vector<T> as(storage_len(va)), bs(storage_len(vb));
    for (auto& c : cs) c = rng.next() % 2;
    if (geom == 1) cs[0] = 1;
    for (auto& v : as) v = (T)rng.next();
    for (auto& v : bs) v = (T)rng.next();
    const u64 n = numel(out);
    std::vector<T> got(n);
    T* o = got.data();
    const unsigned char* cp = cs.data();
    const T *ap = as.data(), *bp = bs.data();
    Strided sc = strided(vc), sa = strided(va), sb = strided(vb);
    LAUNCH(where_of<T>(), blocks_for(n), TH, o, cp, sc, ap, sa, bp, sb, n);
    const auto oc = offsets(vc), oa = offsets(va), ob = offsets(vb);
    for (u64 i = 0; i < n; ++i) {
        ++rep.values;
        const T want = cs[oc[i]] ? as[oa[i]] : bs[ob[i]];
        if (got[i] != want) {
            rep.fail(fmt("where_%zu geometry %d", sizeof(T), geom), fmt("element %llu", i));
            break;
        }
    }
    rep.end();
}

template <typename T> void float_dtype() {
    for (int op = 0; op < 12; ++op) check_unary<T>(op, false), check_unary<T>(op, true);
    for (int op = 0; op < 7; ++op)
        for (int geom = 0; geom < 4; ++geom) check_binary_float<T>(op, geom);
    for (int op = 0; op < 6; ++op) compare_float<T>(op);
    for (auto [m, a] : std::vector<std::pair<double, double>>{{2.5, -1.0}, {1.0, 0.1}, {1.0 / 3.0, 0.0}, {0.0, 5.0}, {-1e30, 1e-30}})
        check_affine<T>(m, a);
    for (double e : {2.0, -1.0, 2.0 + 1e-9, -1.0 - 1e-12, 0.5, 3.0, -2.5, 0.0}) check_pow_scalar<T>(e);
    for (auto [lo, hi] : std::vector<std::pair<double, double>>{
             {-1.0, 2.0}, {-INFINITY, 0.5}, {0.0, INFINITY}, {-0.3, -0.3}, {0.1, 0.1 + 1e-12}, {-INFINITY, INFINITY}, {NAN, 1.0}})
        check_clamp<T>(lo, hi);
}
template <typename T> void int_dtype() {
    for (int op : {0, 1, 2, 5, 6})
        for (int geom = 0; geom < 3; ++geom) check_binary_int<T>(op, geom);
}

int main() {
    float_dtype<float>();
    float_dtype<double>();
    float_dtype<bf16>();
    float_dtype<f16>();
    int_dtype<i64>();
    int_dtype<int>();
    int_dtype<unsigned char>();
    for (int op = 0; op < 6; ++op) {
        compare_int<i64>(op);
        compare_int<int>(op);
        check_compare<unsigned char, u32>(compare_u8, "u8", op, {0, 1, 127, 128, 254, 255, 255},
                                          [] { return (unsigned char)rng.next(); }, [](unsigned char v) { return (u32)v; });
        check_compare<unsigned char, u32>(compare_bool, "bool", op, {0, 1, 1, 0}, [] { return (unsigned char)(rng.next() % 2); },
                                          [](unsigned char v) { return (u32)v; });
    }
    check_where<unsigned char>(0), check_where<unsigned char>(1);
    check_where<unsigned short>(0), check_where<unsigned short>(1);
    check_where<u32>(0), check_where<u32>(1);
    check_where<u64>(0), check_where<u64>(1);
    for (int dir = 0; dir < 2; ++dir) {
        std::string line = fmt("elementwise_ops: largest f32 error (relative to max(1, |want|)), unary%s:", dir ? "_backward" : "");
        for (int op = 0; op < 12; ++op)
            if (!exact_unary(op)) line += fmt(" %s %.2g", UNARY[op], max_err32[dir][op]);
        std::printf("%s\n", line.c_str());
    }
    return rep.finish();
}
