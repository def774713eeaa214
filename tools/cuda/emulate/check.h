// Shared by the checkers: a deterministic RNG, comparisons, and the one-line summary.
#pragma once
#include "cuda_host.h"

namespace chk {

// xorshift64: the same inputs on every run.
struct Rng {
    unsigned long long s;
    explicit Rng(unsigned long long seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
    unsigned long long next() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        return s;
    }
    double uniform() { return (double)(next() >> 11) * (1.0 / 9007199254740992.0); }
    double normal() {
        double u1 = uniform() + 1e-12, u2 = uniform();
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    }
    long long range(long long lo, long long hi) { return lo + (long long)(next() % (unsigned long long)(hi - lo + 1)); }
};

// Storage <-> double through the prelude's own ld/st (bf16/f16 round once, from f32).
template <typename T> std::vector<T> to_t(const std::vector<double>& v) {
    std::vector<T> o(v.size());
    for (size_t i = 0; i < v.size(); ++i) st(o.data(), i, (typename Acc<T>::type)v[i]);
    return o;
}
template <typename T> std::vector<double> from_t(const std::vector<T>& v) {
    std::vector<double> o(v.size());
    for (size_t i = 0; i < v.size(); ++i) o[i] = (double)ld(v.data(), i);
    return o;
}
template <typename T> std::vector<double> roundtrip(const std::vector<double>& v) { return from_t(to_t<T>(v)); }
template <typename A> std::vector<double> widen(const std::vector<A>& v) { return std::vector<double>(v.begin(), v.end()); }

template <typename T> constexpr const char* dtype_name() {
    if constexpr (std::is_same_v<T, float>) return "f32";
    else if constexpr (std::is_same_v<T, double>) return "f64";
    else if constexpr (std::is_same_v<T, bf16>) return "bf16";
    else return "f16";
}
// Tolerance relative to the largest reference magnitude (at least 1).
template <typename T> constexpr double tolerance() {
    if constexpr (std::is_same_v<T, float>) return 2e-5;
    else if constexpr (std::is_same_v<T, double>) return 1e-12;
    else if constexpr (std::is_same_v<T, bf16>) return 1.6e-2;
    else return 4e-3;
}

struct Report {
    std::string family;
    int cases = 0, failed_cases = 0;
    long values = 0;
    bool case_ok = true;
    explicit Report(std::string f) : family(std::move(f)) {}

    void begin() {
        ++cases;
        case_ok = true;
    }
    void end() {
        if (!case_ok) ++failed_cases;
    }
    void fail(const std::string& what, const std::string& detail) {
        if (failed_cases < 20) std::printf("FAIL %s: %s: %s\n", family.c_str(), what.c_str(), detail.c_str());
        case_ok = false;
    }
    // got == want within tol * max(1, max |want|); NaN matches NaN, infinities match exactly.
    void close(const std::string& what, const std::vector<double>& got, const std::vector<double>& want, double tol) {
        if (got.size() != want.size()) {
            fail(what, "size " + std::to_string(got.size()) + " != " + std::to_string(want.size()));
            return;
        }
        double scale = 1;
        for (double w : want)
            if (std::isfinite(w)) scale = std::max(scale, std::fabs(w));
        for (size_t i = 0; i < want.size(); ++i) {
            ++values;
            double a = got[i], b = want[i];
            bool same = (std::isnan(a) && std::isnan(b)) || (std::isinf(b) && a == b) || std::fabs(a - b) <= tol * scale;
            if (!same) {
                char buf[160];
                std::snprintf(buf, sizeof buf, "element %zu: got %.17g want %.17g", i, a, b);
                fail(what, buf);
                return;
            }
        }
    }
    void exact(const std::string& what, const std::vector<double>& got, const std::vector<double>& want) {
        close(what, got, want, 0);
    }
    int finish() const {
        if (failed_cases)
            std::printf("%s: FAILED %d of %d cases\n", family.c_str(), failed_cases, cases);
        else
            std::printf("%s: ok, %d cases, %ld values\n", family.c_str(), cases, values);
        return failed_cases ? 1 : 0;
    }
};

inline std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
inline std::string fmt(const char* f, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, f);
    std::vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    return buf;
}

// Shapes and launch sizes shared by the checkers that walk views.
typedef std::vector<u64> Shape;
// The Rust side's blocks have 256 threads; the kernels grid-stride, so fewer, smaller blocks run
// the same code faster here.
static const unsigned TH = 64;
static inline u64 blocks_for(u64 n) { return std::clamp<u64>((n + TH - 1) / TH, 1, 3); }
static inline u64 numel(const Shape& s) {
    u64 n = 1;
    for (u64 d : s) n *= d;
    return n;
}
// Row-major strides of `s`.
static inline Shape contiguous(const Shape& s) {
    Shape st(s.size());
    u64 a = 1;
    for (int d = (int)s.size() - 1; d >= 0; --d) st[d] = a, a *= s[d];
    return st;
}
static inline std::string shape_str(const Shape& s) {
    std::string o = "[";
    for (size_t d = 0; d < s.size(); ++d) o += (d ? "," : "") + std::to_string(s[d]);
    return o + "]";
}

}  // namespace chk
