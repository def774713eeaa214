// reduce.cu: row sums and means, max/min (NaN propagating), argmax (first maximum, first NaN),
// two-pass variance, for floats of every width and the integer types (u8 saturating sums, i64 /
// i32 extremes, bool argmax), against plain C++ scans of the CPU's rules.
#include "check.h"
#include "../../../crates/weft-core/src/cuda/kernels/reduce.cu"

using namespace chk;
static Rng rng(2);
static Report rep("reduce");

// As crate::cuda::families::reduce::row_config, but at most 64 threads (the Rust side goes to
// 256) and at most 3 blocks (the kernels grid-stride over the other rows).
static unsigned threads_for(u64 len) { return (unsigned)std::clamp<u64>((len + 31) / 32, 1, 2) * 32; }
static const u64 ROWS = 5, GRID = 3;

template <typename T> struct K;
#define KF(T, S)                                                                                          \
    template <> struct K<T> {                                                                             \
        static constexpr auto sum = sum_##S, max = max_##S, min = min_##S;                                \
        static constexpr auto argmax = argmax_##S;                                                        \
    };
KF(float, f32)
KF(double, f64)
KF(bf16, bf16)
KF(f16, f16)
KF(i64, i64)
KF(int, i32)
KF(unsigned char, u8)
template <typename T> constexpr auto var_of() {
    if constexpr (std::is_same_v<T, float>) return var_f32;
    else if constexpr (std::is_same_v<T, double>) return var_f64;
    else if constexpr (std::is_same_v<T, bf16>) return var_bf16;
    else return var_f16;
}

// The CPU's scans, on values already widened to double.
static double pick_ref(const double* v, u64 n, bool mn) {
    double a = v[0];
    for (u64 j = 1; j < n; ++j) {
        double b = v[j];
        if ((mn ? b < a : b > a) || b != b) a = b;
    }
    return a;
}
static u64 argmax_ref(const double* v, u64 n) {
    u64 best = 0;
    for (u64 j = 1; j < n; ++j)
        if (v[j] > v[best] || (v[j] != v[j] && v[best] == v[best])) best = j;
    return best;
}

template <typename T> void float_case(u64 len, bool ties) {
    rep.begin();
    const u64 n = ROWS * len;
    std::vector<double> x(n);
    for (auto& v : x) v = ties ? (double)(rng.next() % 5) : rng.normal() * 3;
    if (len > 2) {
        x[1 * len + len / 2] = NAN;  // row 1: two NaNs
        x[1 * len + len - 1] = NAN;
        x[3 * len] = -INFINITY;
        for (u64 j = 0; j < len; ++j) x[4 * len + j] = -INFINITY;  // row 4: all -inf
    }
    x = roundtrip<T>(x);
    auto xt = to_t<T>(x);
    const T* xp = xt.data();
    std::vector<T> out(ROWS);
    T* op = out.data();
    std::vector<i64> aout(ROWS);
    i64* ap = aout.data();
    const unsigned th = threads_for(len);
    std::string w = fmt("%s len %llu%s", dtype_name<T>(), len, ties ? " ties" : "");
    std::vector<double> want(ROWS);
    for (u32 mean : {0u, 1u}) {
        LAUNCH(K<T>::sum, GRID, th, op, xp, ROWS, len, mean);
        for (u64 r = 0; r < ROWS; ++r) {
            double s = 0;
            for (u64 j = 0; j < len; ++j) s += x[r * len + j];
            want[r] = mean ? s / (double)len : s;
        }
        // stored as the CPU does: f64 as is, the others through f32
        if (!std::is_same_v<T, double>)
            for (auto& v : want) v = (double)(float)v;
        rep.close(w + (mean ? " mean" : " sum"), from_t(out), roundtrip<T>(want),
                  std::is_same_v<T, double> ? 1e-13 : tolerance<T>() / 10);
    }
    if (len) {
        for (bool mn : {false, true}) {
            if (mn) LAUNCH(K<T>::min, GRID, th, op, xp, ROWS, len);
            else LAUNCH(K<T>::max, GRID, th, op, xp, ROWS, len);
            for (u64 r = 0; r < ROWS; ++r) want[r] = pick_ref(&x[r * len], len, mn);
            rep.exact(w + (mn ? " min" : " max"), from_t(out), want);
        }
        LAUNCH(K<T>::argmax, GRID, th, ap, xp, ROWS, len);
        for (u64 r = 0; r < ROWS; ++r) want[r] = (double)argmax_ref(&x[r * len], len);
        rep.exact(w + " argmax", widen(aout), want);
        double denom = (double)len - 1.0;
        LAUNCH(var_of<T>(), GRID, th, op, xp, ROWS, len, denom);
        for (u64 r = 0; r < ROWS; ++r) {
            double s = 0, q = 0;
            for (u64 j = 0; j < len; ++j) s += x[r * len + j];
            for (u64 j = 0; j < len; ++j) q += (x[r * len + j] - s / len) * (x[r * len + j] - s / len);
            want[r] = q / denom;
        }
        rep.close(w + " var", from_t(out), roundtrip<T>(want), std::is_same_v<T, double> ? 1e-12 : tolerance<T>());
    }
    rep.end();
}

template <typename T> std::vector<double> ints_of(const std::vector<T>& v) {
    std::vector<double> o(v.size());
    for (size_t i = 0; i < v.size(); ++i) o[i] = (double)v[i];
    return o;
}

template <typename T> void int_case(u64 len) {
    rep.begin();
    const u64 n = ROWS * len;
    std::vector<T> x(n);
    for (auto& v : x) {
        if constexpr (std::is_same_v<T, unsigned char>) v = (T)(rng.next() % 256);
        else if constexpr (std::is_same_v<T, int>) v = (int)(rng.next() % 7) - 3;  // ties
        else v = (T)rng.next();
    }
    const T* xp = x.data();
    std::vector<T> out(ROWS);
    T* op = out.data();
    std::vector<i64> aout(ROWS);
    i64* ap = aout.data();
    const unsigned th = threads_for(len);
    std::string w = fmt("%s len %llu", std::is_same_v<T, unsigned char> ? "u8" : std::is_same_v<T, int> ? "i32" : "i64", len);
    std::vector<double> want(ROWS), xd = ints_of(x);
    u32 mean = 0;
    LAUNCH(K<T>::sum, GRID, th, op, xp, ROWS, len, mean);
    std::vector<double> got = ints_of(out);
    for (u64 r = 0; r < ROWS; ++r) {
        long double s = 0;
        for (u64 j = 0; j < len; ++j) s += (long double)x[r * len + j];
        double sd = (double)s;
        if constexpr (std::is_same_v<T, unsigned char>) want[r] = sd >= 255 ? 255 : sd;
        else if constexpr (std::is_same_v<T, int>) want[r] = sd;
        else want[r] = (double)(i64)std::clamp<long double>(s, -9223372036854775808.0L, 9223372036854775807.0L);
    }
    // i64 sums go through double on the CPU too: compare to the precision of a double
    rep.close(w + " sum", got, want, std::is_same_v<T, i64> ? 1e-15 : 0);
    if (len) {
        for (bool mn : {false, true}) {
            if (mn) LAUNCH(K<T>::min, GRID, th, op, xp, ROWS, len);
            else LAUNCH(K<T>::max, GRID, th, op, xp, ROWS, len);
            for (u64 r = 0; r < ROWS; ++r) {
                T a = x[r * len];
                for (u64 j = 0; j < len; ++j) a = mn ? std::min(a, x[r * len + j]) : std::max(a, x[r * len + j]);
                want[r] = (double)a;
            }
            rep.exact(w + (mn ? " min" : " max"), ints_of(out), want);
        }
        // argmax compares as f64, as the CPU (Element::to_f64)
        LAUNCH(K<T>::argmax, GRID, th, ap, xp, ROWS, len);
        for (u64 r = 0; r < ROWS; ++r) want[r] = (double)argmax_ref(&xd[r * len], len);
        rep.exact(w + " argmax", widen(aout), want);
    }
    rep.end();
}

void bool_case(u64 len) {
    rep.begin();
    std::vector<unsigned char> x(ROWS * len, 0);
    for (u64 r = 1; r < ROWS; ++r) x[r * len + (r * 7) % len] = 1, x[r * len + len - 1] = 1;
    const unsigned char* xp = x.data();
    std::vector<i64> aout(ROWS);
    i64* ap = aout.data();
    LAUNCH(argmax_bool, GRID, threads_for(len), ap, xp, ROWS, len);
    std::vector<double> want(ROWS), xd = ints_of(x);
    for (u64 r = 0; r < ROWS; ++r) want[r] = (double)argmax_ref(&xd[r * len], len);
    rep.exact(fmt("bool len %llu argmax", len), widen(aout), want);
    rep.end();
}

int main() {
    for (u64 len : {0ull, 1ull, 33ull, 100ull}) {
        float_case<float>(len, false);
        float_case<float>(len, true);
        float_case<double>(len, false);
        float_case<bf16>(len, true);
        float_case<f16>(len, false);
        int_case<unsigned char>(len);
        int_case<int>(len);
        int_case<i64>(len);
        if (len) bool_case(len);
    }
    return rep.finish();
}
