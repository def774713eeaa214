// elementwise.cu: the casts (cast_from_<src> to every dtype code), element for element against
// a plain C++ statement of crate::storage::CpuStorage::cast: through f64, Rust `as` for ints
// (truncate, saturate, NaN -> 0), `v != 0` for bool, i64 -> i32 wrapping, f32 -> bf16/f16
// rounded from f32, other -> bf16 as the `half` crate's from_f64 (round to nearest even on the
// top 32 bits of the double), -> f16 through f32. bf16, f16 and u8 sources are exhaustive.
#include "check.h"
#include "../../../crates/weft-core/src/cuda/kernels/elementwise.cu"

using namespace chk;
static Rng rng(3);
static Report rep("elementwise");

enum Dt { F32, F64, BF16, F16, I64, I32, U8, BOOL };  // elementwise.rs dtype_code order
static const char* NAMES[8] = {"f32", "f64", "bf16", "f16", "i64", "i32", "u8", "bool"};
static const int SIZES[8] = {4, 8, 2, 2, 8, 4, 1, 1};

// v rounded to nearest, ties to even, in a binary format with p fraction bits and normal
// exponents emin..emax (overflow to infinity).
static double round_fmt(double v, int p, int emin, int emax) {
    if (std::isnan(v) || std::isinf(v) || v == 0) return v;
    double a = std::fabs(v);
    int e = std::max(std::ilogb(a), emin);
    double ulp = std::ldexp(1.0, e - p);
    double r = std::nearbyint(a / ulp) * ulp;
    if (r > std::ldexp(2.0 - std::ldexp(1.0, -p), emax)) r = INFINITY;
    return std::copysign(r, v);
}
static double trunc32(double v) {  // the low 32 bits of the double cleared
    if (std::isnan(v)) return v;
    return cuda_host::bits<double>(cuda_host::bits<u64>(v) & 0xFFFFFFFF00000000ull);
}
static unsigned short bf16_bits(double exact) {
    return std::isnan(exact) ? 0x7FC0 : (unsigned short)(cuda_host::bits<u32>((float)exact) >> 16);
}
static unsigned short f16_bits(double exact) {
    return std::isnan(exact) ? 0x7E00 : cuda_host::bits<unsigned short>((_Float16)(float)exact);
}

// Element::to_f64 of a source element.
static double to_f64(int s, const unsigned char* p) {
    switch (s) {
        case F32: return cuda_host::bits<float>(*(const u32*)p);
        case F64: return *(const double*)p;
        case BF16: return cuda_host::bits<float>((u32)(*(const unsigned short*)p) << 16);
        case F16: return (double)cuda_host::bits<_Float16>(*(const unsigned short*)p);
        case I64: return (double)*(const i64*)p;
        case I32: return (double)*(const int*)p;
        default: return (double)*p;
    }
}
static i64 as_i64(double v) {
    if (std::isnan(v)) return 0;
    if (v >= 9223372036854775808.0) return INT64_MAX;
    if (v < -9223372036854775808.0) return INT64_MIN;
    return (i64)std::trunc(v);
}
static long long as_int_range(double v, long long lo, long long hi) {
    if (std::isnan(v)) return 0;
    double t = std::trunc(v);
    return t < (double)lo ? lo : t > (double)hi ? hi : (long long)t;
}
// The CPU's cast of one element, as bytes of the destination.
static void cast_ref(int s, int d, const unsigned char* src, unsigned char* out) {
    double v = to_f64(s, src);
    switch (d) {
        case F32: { float f = (float)v; std::memcpy(out, &f, 4); break; }
        case F64: std::memcpy(out, &v, 8); break;
        case BF16: {
            unsigned short b = bf16_bits(round_fmt(s == F32 ? v : trunc32(v), 7, -126, 127));
            std::memcpy(out, &b, 2);
            break;
        }
        case F16: { unsigned short h = f16_bits(round_fmt((float)v, 10, -14, 15)); std::memcpy(out, &h, 2); break; }
        case I64: { i64 i = as_i64(v); std::memcpy(out, &i, 8); break; }
        case I32: {
            int i = s == I64 ? (int)(u32)(u64)*(const i64*)src : (int)as_int_range(v, INT32_MIN, INT32_MAX);
            std::memcpy(out, &i, 4);
            break;
        }
        case U8: *out = (unsigned char)as_int_range(v, 0, 255); break;
        default: *out = v != 0.0 ? 1 : 0; break;
    }
}
static bool is_nan_bytes(int d, const unsigned char* p) {
    switch (d) {
        case F32: return std::isnan(cuda_host::bits<float>(*(const u32*)p));
        case F64: return std::isnan(*(const double*)p);
        case BF16: { unsigned short b = *(const unsigned short*)p; return (b & 0x7F80) == 0x7F80 && (b & 0x7F); }
        case F16: { unsigned short b = *(const unsigned short*)p; return (b & 0x7C00) == 0x7C00 && (b & 0x3FF); }
        default: return false;
    }
}

typedef void (*CastFn)(void*, const void*, Strided, u64, u32);
static const CastFn FNS[8] = {(CastFn)cast_from_f32, (CastFn)cast_from_f64, (CastFn)cast_from_bf16,
                              (CastFn)cast_from_f16, (CastFn)cast_from_i64, (CastFn)cast_from_i32,
                              (CastFn)cast_from_u8,  (CastFn)cast_from_bool};

static void check_source(int s, const std::vector<unsigned char>& src) {
    const u64 n = src.size() / SIZES[s];
    Strided sx{};
    sx.rank = 1;
    sx.shape[0] = n;
    sx.strides[0] = 1;
    for (int d = 0; d < 8; ++d) {
        if (d == s) continue;
        rep.begin();
        std::vector<unsigned char> got(n * SIZES[d]), want(n * SIZES[d]);
        CastFn f = FNS[s];
        const void* xp = src.data();
        void* op = got.data();
        u32 dst = d;
        LAUNCH(f, 4, 64, op, xp, sx, n, dst);
        for (u64 i = 0; i < n; ++i) cast_ref(s, d, &src[i * SIZES[s]], &want[i * SIZES[d]]);
        for (u64 i = 0; i < n; ++i) {
            const unsigned char *g = &got[i * SIZES[d]], *w = &want[i * SIZES[d]];
            ++rep.values;
            if (std::memcmp(g, w, SIZES[d]) == 0 || (is_nan_bytes(d, g) && is_nan_bytes(d, w))) continue;
            std::string hex = "got ", wh = " want ", sh = " source ";
            for (int k = SIZES[d] - 1; k >= 0; --k) hex += fmt("%02x", g[k]), wh += fmt("%02x", w[k]);
            for (int k = SIZES[s] - 1; k >= 0; --k) sh += fmt("%02x", src[i * SIZES[s] + k]);
            rep.fail(fmt("cast %s -> %s", NAMES[s], NAMES[d]), fmt("element %llu: ", i) + hex + wh + sh);
            break;
        }
        rep.end();
    }
}

template <typename V> static std::vector<unsigned char> bytes_of(const std::vector<V>& v) {
    std::vector<unsigned char> b(v.size() * sizeof(V));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
}

int main() {
    // Doubles that probe every rounding and saturation edge of the targets.
    std::vector<double> edges = {0.0, -0.0, 1.0, -1.0, 0.5, 1.5, 2.5, -2.5, -0.9, 0.9, 127.9, 254.5, 255.0, 255.5,
                                 256.0, -1e-45, 1e-40, 1.1754943508222875e-38, 3.3895313892515355e38,
                                 3.4028234663852886e38, 3.4e38, 1e39, INFINITY, -INFINITY, NAN, -NAN, 65504.0,
                                 65519.99, 65520.0, 6.103515625e-05, 5.960464477539063e-08, 2.9802322387695312e-08,
                                 2.98023224e-08, 1.0 + 1.0 / 256, 1.0 + 3.0 / 256, 1.0 + 1.0 / 256 + 1e-12,
                                 1.0 + 1.0 / 256 + 1e-9, 1.0 + 1.0 / 2048, 1.0 + 3.0 / 2048, 2147483647.0,
                                 2147483647.9, 2147483648.0, -2147483648.0, -2147483648.9, -2147483649.0,
                                 9007199254740993.0, 9.2233720368547748e18, 9.223372036854775807e18,
                                 -9.223372036854775808e18, -9.3e18, 1e20, 1e-310, -1e-320, 1e300, 9.18e-41};
    for (int i = 0; i < 200; ++i) edges.push_back(rng.normal() * std::ldexp(1.0, (int)rng.range(-30, 40)));
    std::vector<float> f32;
    for (double v : edges) f32.push_back((float)v);
    check_source(F32, bytes_of(f32));
    check_source(F64, bytes_of(edges));
    std::vector<unsigned short> all16(65536);
    for (u32 i = 0; i < 65536; ++i) all16[i] = (unsigned short)i;
    check_source(BF16, bytes_of(all16));
    check_source(F16, bytes_of(all16));
    std::vector<i64> i64s = {0, 1, -1, 255, 256, -256, INT32_MAX, (i64)INT32_MAX + 1, (i64)INT32_MIN - 1,
                             (1ll << 53) + 1, INT64_MAX, INT64_MIN, INT64_MAX - 511, 0x123456789abcdefll};
    for (int i = 0; i < 100; ++i) i64s.push_back((i64)rng.next() >> rng.range(0, 60));
    check_source(I64, bytes_of(i64s));
    std::vector<int> i32s = {0, 1, -1, 255, 256, -256, INT32_MAX, INT32_MIN, 16777217, -16777217};
    for (int i = 0; i < 100; ++i) i32s.push_back((int)(rng.next() >> rng.range(32, 62)));
    check_source(I32, bytes_of(i32s));
    std::vector<unsigned char> u8s(256);
    for (int i = 0; i < 256; ++i) u8s[i] = (unsigned char)i;
    check_source(U8, u8s);
    check_source(BOOL, {0, 1, 1, 0, 1});
    return rep.finish();
}
