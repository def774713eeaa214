// linear.cu: the epilogue after cuBLAS's product, launched as crate::cuda::families::matmul::linear
// does (f32/f64 in place in the product: `pre` is the product with an act, `out` without one;
// bf16/f16 from an f32 product into separate buffers; null residual / pre when absent), for every
// activation code 0..12, with and without a residual, one row, one column and n = 0.
// The pre-activation (product + bias in the compute type, rounded once to the dtype) and the
// exact activations (none, Neg, Abs, Relu) are compared bit for bit; the others against the
// CPU's f64 formulas (crate::cpu::elementwise::unary_scalar) evaluated in double for the f32 /
// half kernels and in long double for f64: f32 within 1e-5 (the GPU test's tolerance, here per
// element, relative to max(1, |want|)), f64 within 1e-12, bf16 / f16 within rounding. Inputs
// sweep [-12.5, 12.5] and, in column 0 (zero bias), 0, -0, tiny, subnormal, large, inf and NaN.
// Prints the largest relative error per activation for f32 and f64.
#include "check.h"
#include "../../../crates/weft-core/src/cuda/kernels/linear.cu"

using namespace chk;
static Rng rng(6);
static Report rep("linear");

static const char* ACT_NAMES[13] = {"none", "neg",     "exp",  "log",  "sqrt",      "rsqrt", "abs",
                                    "tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "silu"};
static bool exact_act(u32 a) { return a == 0 || a == 1 || a == 6 || a == 9; }

// unary_scalar's value, in R.
template <typename R> R act_ref(u32 act, R x) {
    const R one = 1, half = (R)0.5;
    switch (act) {
        case 1: return -x;
        case 2: return std::exp(x);
        case 3: return std::log(x);
        case 4: return std::sqrt(x);
        case 5: return one / std::sqrt(x);
        case 6: return std::fabs(x);
        case 7: return std::tanh(x);
        case 8: return one / (one + std::exp(-x));
        case 9: return x > 0 ? x : (R)0;
        case 10: return x * (half * (one + std::erf(x * (R)0.707106781186547524400844362104849039L)));
        case 11: {
            const R c = (R)0.7978845608028654L, k = (R)0.044715L;  // SQRT_2_OVER_PI, GELU_TANH_C
            return half * x * (one + std::tanh(c * (x + k * x * x * x)));
        }
        case 12: return x * (one / (one + std::exp(-x)));
        default: return x;
    }
}

template <typename T> constexpr auto epilogue_of() {
    if constexpr (std::is_same_v<T, float>) return linear_epilogue_f32;
    else if constexpr (std::is_same_v<T, double>) return linear_epilogue_f64;
    else if constexpr (std::is_same_v<T, bf16>) return linear_epilogue_bf16;
    else return linear_epilogue_f16;
}

static double max_err[2][13];  // [f32, f64][act]


template <typename T> void epilogue_case(u64 m, u64 cols, u32 act, bool with_res) {
    typedef typename Acc<T>::type A;
    constexpr bool half = !std::is_same_v<T, A>;
    rep.begin();
    const u64 n = m * cols;
    std::string w = fmt("%s [%llu, %llu] act %s%s", dtype_name<T>(), m, cols, ACT_NAMES[act], with_res ? " + residual" : "");
    // the product: a sweep over [-12, 12]; column 0 the special values (its bias is 0)
    static const double specials[] = {0.0, -0.0, 1e-30, -1e-30, 1e-40, 0.2, -0.2, 3.0, -3.0, 20.0, -20.0,
                                      88.0, 89.0, -104.0, INFINITY, -INFINITY, NAN};
    std::vector<A> prod(std::max<u64>(n, 1));
    for (u64 i = 0; i < n; ++i) prod[i] = (A)(n > 1 ? -12.0 + 24.0 * (double)i / (double)(n - 1) : 0.7);
    for (u64 r = 0; r < m && r < std::size(specials) && cols > 1; ++r) prod[r * cols] = (A)specials[r];
    std::vector<double> bd(cols), rd(n);
    for (auto& v : bd) v = rng.normal() * 0.5;
    if (cols > 1) bd[0] = 0;
    for (auto& v : rd) v = rng.normal();
    auto bias = to_t<T>(bd), res = to_t<T>(rd);
    const std::vector<A> prod0 = prod;

    // buffers as linear.rs: f32/f64 in place in the product, half types apart
    std::vector<T> out_buf(std::max<u64>(n, 1)), pre_buf(std::max<u64>(n, 1));
    const A* pp = prod.data();
    const T* bp = bias.data();
    const T* rp = with_res ? res.data() : nullptr;
    T *op, *prep;
    if constexpr (half) {
        op = out_buf.data();
        prep = act ? pre_buf.data() : nullptr;
    } else {
        op = act ? out_buf.data() : prod.data();
        prep = act ? prod.data() : nullptr;
    }
    u32 code = act;
    if (n == 0) {  // not launched by linear.rs; the kernel must write nothing
        u64 zero = 0;
        A sentinel_prod = (A)1.5;
        T sentinel_out{}, sentinel_pre{};
        const T one_bias = bias.empty() ? T{} : bias[0];
        T* so = &sentinel_out;
        T* sp = act ? &sentinel_pre : nullptr;
        const A* ps = &sentinel_prod;
        const T* bs = &one_bias;
        u64 one = 1;
        LAUNCH(epilogue_of<T>(), 1, TH, ps, bs, (const T*)nullptr, so, sp, code, one, zero);
        const T untouched{};
        if (std::memcmp(&sentinel_out, &untouched, sizeof(T)) || std::memcmp(&sentinel_pre, &untouched, sizeof(T)) ||
            sentinel_prod != (A)1.5)
            rep.fail(w, "n = 0 wrote an element");
        rep.end();
        return;
    }
    LAUNCH(epilogue_of<T>(), blocks_for(n), TH, pp, bp, rp, op, prep, code, cols, n);

    // pre-activation: product + bias in A, rounded once to T (bit for bit)
    std::vector<A> h(n);
    for (u64 i = 0; i < n; ++i) h[i] = prod0[i] + (A)ld(bias.data(), i % cols);
    std::vector<double> hd = widen(h);
    if (act) rep.exact(w + " pre", from_t(std::vector<T>(prep, prep + n)), roundtrip<T>(hd));

    std::vector<double> got = from_t(std::vector<T>(op, op + n));
    if (exact_act(act)) {  // y = act(h) (+ res) in A, rounded once
        std::vector<double> want(n);
        for (u64 i = 0; i < n; ++i) {
            A y = (A)act_ref<double>(act, (double)h[i]);
            if (with_res) y += (A)ld(res.data(), i);
            want[i] = (double)y;
        }
        rep.exact(w, got, roundtrip<T>(want));
        rep.end();
        return;
    }
    // y against the exact value: long double for f64, double otherwise
    const double tol = std::is_same_v<T, float> ? 1e-5 : std::is_same_v<T, double> ? 1e-12
                       : std::is_same_v<T, bf16> ? 0x1p-8 + 1e-5 : 0x1p-11 + 1e-5;
    for (u64 i = 0; i < n; ++i) {
        long double want;
        if constexpr (std::is_same_v<T, double>) want = act_ref<long double>(act, (long double)h[i]);
        else want = act_ref<double>(act, (double)h[i]);
        if (with_res) want += (long double)ld(res.data(), i);
        // the value want becomes in T: NaN and infinities (overflow) must come out as they are
        double in_t = std::is_same_v<T, double> ? (double)want : roundtrip<T>({(double)(float)want})[0];
        double g = got[i];
        ++rep.values;
        if (std::isnan(in_t) || std::isinf(in_t)) {
            if (!(std::isnan(in_t) ? std::isnan(g) : g == in_t)) {
                rep.fail(w, fmt("element %llu (h = %.9g): got %.17g want %.17g", i, (double)hd[i], g, in_t));
                break;
            }
            continue;
        }
        double err = (double)(std::fabs((long double)g - want) / std::max<long double>(1, std::fabs(want)));
        if (!half) max_err[std::is_same_v<T, double>][act] = std::max(max_err[std::is_same_v<T, double>][act], err);
        if (!(err <= tol)) {
            rep.fail(w, fmt("element %llu (h = %.9g): got %.17g want %.17Lg (relative error %.3g > %.3g)", i,
                            (double)hd[i], g, want, err, tol));
            break;
        }
    }
    rep.end();
}

template <typename T> void dtype_cases() {
    for (u32 act = 0; act <= 12; ++act)
        for (bool res : {false, true}) epilogue_case<T>(17, 33, act, res);
    for (u32 act : {0u, 2u, 10u, 11u, 12u}) {
        epilogue_case<T>(1, 45, act, true);  // one row
        epilogue_case<T>(9, 1, act, false);  // one column (the bias broadcast down it)
        epilogue_case<T>(0, 5, act, true);   // n = 0
    }
}

int main() {
    dtype_cases<float>();
    dtype_cases<double>();
    dtype_cases<bf16>();
    dtype_cases<f16>();
    for (int f = 0; f < 2; ++f) {
        std::string line = fmt("linear: largest relative error vs exact, %s:", f ? "f64" : "f32");
        for (u32 a = 0; a <= 12; ++a) line += fmt(" %s %.2g", ACT_NAMES[a], max_err[f][a]);
        std::printf("%s\n", line.c_str());
    }
    return rep.finish();
}
