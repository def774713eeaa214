// copy.cu, launched as crate::cuda::copy does, against plain C++ statements of what the CPU does:
// - gather_N (contiguous(): a view made dense) and scatter_N (write_into(): a dense block written
//   into a view), all four element sizes, random bit patterns, through permuted, narrowed (offset),
//   expanded (stride 0, gather only: a destination never overlaps itself) and rank-8 views; the
//   output buffers carry guard elements that must stay untouched (scatter: every element the view
//   does not select keeps its old value);
// - fill_N, all four sizes, one element to several grid strides, guard after the end;
// - random_f32/f64/bf16/f16 as Op::Random (crate::ops::creation): element i is
//   rng::uniform/normal(seed, offset + i), a uniform capped at the dtype's largest value below 1
//   (uniform_cap: 1 - 2^-24, 1 - 2^-8, 1 - 2^-11; none for f64), rounded once as the CPU's from_f64 (`as f32`; bf16 by the half crate's rule on the top
//   32 bits of the double; f16 through f32). The reference is this file's own port of
//   crate::rng (philox4x32-10, checked against the Random123 known answers that rng.rs's test
//   uses), not the prelude's. Offsets 0, across 2^32 and far beyond it, two counters whose
//   uniform lies above the cap (one beyond 2^32), and two whose bf16 by the half crate's rule
//   differs from rounding through f32. Compared bit for bit (NaN never occurs).
#include "check.h"
#include "../../../crates/weft-core/src/cuda/kernels/copy.cu"

using namespace chk;
static Rng rng(17);
static Report rep("copy");



// A view of a storage buffer (crate::layout::Layout): element (c_0 .. c_r-1) at
// offset + sum c_d * strides[d].
struct View {
    Shape shape, strides;
    u64 offset = 0;
    std::string name;
};
static View contig(const Shape& s) { return View{s, contiguous(s), 0, "contiguous"}; }
static View permute(const View& v, const std::vector<int>& perm) {
    View o = v;
    for (size_t d = 0; d < perm.size(); ++d) o.shape[d] = v.shape[perm[d]], o.strides[d] = v.strides[perm[d]];
    o.name += "+permuted";
    return o;
}
static View narrow(const View& v, int dim, u64 start, u64 len) {
    View o = v;
    o.offset += start * v.strides[dim];
    o.shape[dim] = len;
    o.name += "+narrowed";
    return o;
}
// Size-1 dims of v (and new leading dims) stretched to `to` with stride 0.
static View expand(const View& v, const Shape& to) {
    View o{to, Shape(to.size(), 0), v.offset, v.name + "+expanded"};
    const size_t lead = to.size() - v.shape.size();
    for (size_t d = 0; d < v.shape.size(); ++d) o.strides[lead + d] = v.shape[d] == 1 ? 0 : v.strides[d];
    return o;
}
static u64 storage_len(const View& v) {
    u64 m = v.offset;
    for (size_t d = 0; d < v.shape.size(); ++d) m += (v.shape[d] - 1) * v.strides[d];
    return m + 1;
}
// The storage offsets of the view's elements in row-major order (a multi-index counter, not the
// prelude's div/mod walk).
static std::vector<u64> offsets(const View& v) {
    std::vector<u64> o;
    const u64 n = numel(v.shape);
    std::vector<u64> c(v.shape.size(), 0);
    for (u64 i = 0; i < n; ++i) {
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
// As crate::cuda::launch::Strided::new: unused dims have shape 1 and stride 0.
static Strided strided(const View& v) {
    Strided s{};
    for (int d = 0; d < MAX_RANK; ++d) s.shape[d] = 1, s.strides[d] = 0;
    for (size_t d = 0; d < v.shape.size(); ++d) s.shape[d] = v.shape[d], s.strides[d] = v.strides[d];
    s.offset = v.offset;
    s.rank = (u32)v.shape.size();
    return s;
}

template <typename T> std::vector<T> random_bits(u64 n) {
    std::vector<T> v(n);
    for (auto& e : v) e = (T)rng.next();
    return v;
}
template <typename T> void same_bits(const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
    if (got.size() != want.size()) return rep.fail(what, fmt("size %zu != %zu", got.size(), want.size()));
    for (size_t i = 0; i < got.size(); ++i) {
        ++rep.values;
        if (got[i] != want[i])
            return rep.fail(what, fmt("element %zu: got %llx want %llx", i, (unsigned long long)got[i], (unsigned long long)want[i]));
    }
}

template <typename T> struct Move;
template <> struct Move<unsigned char> { static constexpr auto gather = gather_1, scatter = scatter_1; static constexpr auto fill = fill_1; };
template <> struct Move<unsigned short> { static constexpr auto gather = gather_2, scatter = scatter_2; static constexpr auto fill = fill_2; };
template <> struct Move<u32> { static constexpr auto gather = gather_4, scatter = scatter_4; static constexpr auto fill = fill_4; };
template <> struct Move<u64> { static constexpr auto gather = gather_8, scatter = scatter_8; static constexpr auto fill = fill_8; };

static const u64 GUARD = 5;

// gather: out[i] = storage[offset of element i of the view], out followed by guard elements.
template <typename T> void check_gather(const View& v) {
    rep.begin();
    const auto offs = offsets(v);
    const u64 n = offs.size();
    auto in = random_bits<T>(storage_len(v));
    auto sentinel = random_bits<T>(GUARD);
    std::vector<T> got(n + GUARD), want(n + GUARD);
    for (u64 i = 0; i < n; ++i) want[i] = in[offs[i]];
    for (u64 g = 0; g < GUARD; ++g) got[n + g] = want[n + g] = sentinel[g];
    T* o = got.data();
    const T* ip = in.data();
    Strided sv = strided(v);
    LAUNCH(Move<T>::gather, blocks_for(n), TH, o, ip, sv, n);
    same_bits(fmt("gather_%zu %s", sizeof(T), v.name.c_str()), got, want);
    rep.end();
}

// scatter: storage[offset of element i of the view] = in[i]; the rest of the storage unchanged.
template <typename T> void check_scatter(const View& v) {
    rep.begin();
    const auto offs = offsets(v);
    const u64 n = offs.size();
    auto in = random_bits<T>(n);
    auto got = random_bits<T>(storage_len(v) + GUARD);
    auto want = got;
    for (u64 i = 0; i < n; ++i) want[offs[i]] = in[i];
    T* o = got.data();
    const T* ip = in.data();
    Strided sv = strided(v);
    LAUNCH(Move<T>::scatter, blocks_for(n), TH, o, ip, sv, n);
    same_bits(fmt("scatter_%zu %s", sizeof(T), v.name.c_str()), got, want);
    rep.end();
}

template <typename T> void check_fill(u64 n) {
    rep.begin();
    const T pattern = (T)rng.next();
    auto got = random_bits<T>(n + GUARD);
    auto want = got;
    for (u64 i = 0; i < n; ++i) want[i] = pattern;
    T* o = got.data();
    T p = pattern;
    LAUNCH(Move<T>::fill, blocks_for(n), TH, o, p, n);
    same_bits(fmt("fill_%zu n=%llu", sizeof(T), (unsigned long long)n), got, want);
    rep.end();
}

template <typename T> void check_moves() {
    const View a = contig({4, 5, 6});
    check_gather<T>(a);
    check_gather<T>(permute(a, {2, 0, 1}));
    check_gather<T>(narrow(contig({4, 9}), 1, 2, 5));
    check_gather<T>(permute(narrow(a, 2, 1, 4), {1, 2, 0}));
    check_gather<T>(expand(narrow(contig({3, 1, 7}), 2, 3, 4), {2, 3, 5, 4}));
    check_gather<T>(expand(permute(contig({1, 5}), {1, 0}), {5, 6}));
    check_gather<T>(permute(contig({2, 1, 2, 3, 1, 2, 2, 3}), {7, 6, 5, 4, 3, 2, 1, 0}));  // rank 8
    View one = contig({});
    one.offset = 2, one.name = "scalar at offset 2";  // rank 0
    check_gather<T>(one);
    check_scatter<T>(a);
    check_scatter<T>(permute(a, {2, 0, 1}));
    check_scatter<T>(narrow(contig({4, 9}), 1, 2, 5));  // cat along dim 1
    check_scatter<T>(narrow(contig({7, 6}), 0, 3, 4));  // cat along dim 0
    check_scatter<T>(permute(narrow(a, 2, 1, 4), {1, 2, 0}));
    check_scatter<T>(permute(contig({2, 1, 2, 3, 1, 2, 2, 3}), {7, 6, 5, 4, 3, 2, 1, 0}));
    for (u64 n : {1, 63, 300}) check_fill<T>(n);
}

// ---- random: an independent port of crate::rng ----
namespace ref {
void philox4x32(u32 c[4], const u32 key[2]) {
    u32 k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; ++round) {
        const u64 p0 = (u64)0xD2511F53u * c[0], p1 = (u64)0xCD9E8D57u * c[2];
        const u32 next[4] = {(u32)(p1 >> 32) ^ c[1] ^ k0, (u32)p1, (u32)(p0 >> 32) ^ c[3] ^ k1, (u32)p0};
        std::memcpy(c, next, sizeof next);
        k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
    }
}
void words(u64 seed, u64 index, u32 w[4]) {
    w[0] = (u32)index, w[1] = (u32)(index >> 32), w[2] = w[3] = 0;
    const u32 key[2] = {(u32)seed, (u32)(seed >> 32)};
    philox4x32(w, key);
}
double uniform(u64 seed, u64 index) {
    u32 w[4];
    words(seed, index, w);
    const u64 b = ((u64)w[0] << 21) ^ (u64)w[1];
    return (double)(b & ((1ull << 53) - 1)) * (1.0 / (double)(1ull << 53));
}
double normal(u64 seed, u64 index) {
    u32 w[4];
    words(seed, index, w);
    const double u1 = ((double)w[2] + 1.0) / 4294967296.0, u2 = (double)w[3] / 4294967296.0;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * 3.141592653589793 * u2);
}
// v rounded to nearest even with p fraction bits, normal exponents from emin (no overflow here).
double round_fmt(double v, int p, int emin) {
    if (v == 0) return v;
    const int e = std::max(std::ilogb(std::fabs(v)), emin);
    const double ulp = std::ldexp(1.0, e - p);
    return std::nearbyint(v / ulp) * ulp;
}
// The CPU's from_f64, as bits of each storage type.
u32 f32_bits(double v) { return cuda_host::bits<u32>((float)v); }
u64 f64_bits(double v) { return cuda_host::bits<u64>(v); }
unsigned short bf16_bits(double v) {  // half::bf16::from_f64: nearest even on the top 32 bits
    const double top = cuda_host::bits<double>(cuda_host::bits<u64>(v) & 0xFFFFFFFF00000000ull);
    return (unsigned short)(cuda_host::bits<u32>((float)round_fmt(top, 7, -126)) >> 16);
}
unsigned short f16_bits(double v) {  // through f32, then nearest even to f16
    return cuda_host::bits<unsigned short>((_Float16)round_fmt((float)v, 10, -14));
}
}  // namespace ref

static void check_philox_known_answers() {
    rep.begin();
    u32 c[4] = {0, 0, 0, 0};
    const u32 k0[2] = {0, 0};
    ref::philox4x32(c, k0);
    std::vector<u64> got(c, c + 4), want = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};
    u32 d[4] = {~0u, ~0u, ~0u, ~0u};
    const u32 k1[2] = {~0u, ~0u};
    ref::philox4x32(d, k1);
    got.insert(got.end(), d, d + 4);
    for (u64 w : {0x408f276dull, 0x41c83b0eull, 0xa20bc7c6ull, 0x6d5451fdull}) want.push_back(w);
    same_bits("the reference's philox4x32 (Random123 known answers)", got, want);
    rep.end();
}

enum RDt { R_F32, R_F64, R_BF16, R_F16 };
static const char* RNAMES[4] = {"f32", "f64", "bf16", "f16"};

// crate::ops::creation::uniform_cap: the largest value of the dtype below 1 for a uniform (24, 8
// and 11 significant bits), no cap for f64 or a normal.
static double cap(int dt, int normal) {
    if (normal || dt == R_F64) return INFINITY;
    return 1.0 - std::ldexp(1.0, dt == R_BF16 ? -8 : dt == R_F16 ? -11 : -24);
}

template <typename S> void run_random(int dt, S* out, u64 seed, u64 offset, u64 n, int normal) {
    const unsigned grid = (unsigned)blocks_for(n);
    switch (dt) {
        case R_F32: LAUNCH(random_f32, grid, TH, (float*)out, seed, offset, n, normal, cap(dt, normal)); break;
        case R_F64: LAUNCH(random_f64, grid, TH, (double*)out, seed, offset, n, normal, cap(dt, normal)); break;
        case R_BF16: LAUNCH(random_bf16, grid, TH, (bf16*)out, seed, offset, n, normal, cap(dt, normal)); break;
        default: LAUNCH(random_f16, grid, TH, (f16*)out, seed, offset, n, normal, cap(dt, normal)); break;
    }
}

// Returns how many of the draws the cap changed (uniforms above 1 - 2^-24, not f64).
static int check_random(int dt, u64 seed, u64 offset, u64 n, int normal) {
    rep.begin();
    const double below_one = cap(dt, normal);
    std::vector<u64> want(n), got(n);
    int capped = 0;
    for (u64 i = 0; i < n; ++i) {
        double u = normal ? ref::normal(seed, offset + i) : ref::uniform(seed, offset + i);
        if (u > below_one) u = below_one, ++capped;
        want[i] = dt == R_F32 ? ref::f32_bits(u) : dt == R_F64 ? ref::f64_bits(u) : dt == R_BF16 ? ref::bf16_bits(u) : ref::f16_bits(u);
    }
    const int size = dt == R_F64 ? 8 : dt == R_F32 ? 4 : 2;
    std::vector<unsigned char> buf((n + GUARD) * size, 0xA5);
    run_random(dt, buf.data(), seed, offset, n, normal);
    for (u64 i = 0; i < n; ++i) {
        u64 w = 0;
        std::memcpy(&w, &buf[i * size], size);
        got[i] = w;
    }
    same_bits(fmt("random_%s %s seed %llx offset %llu", RNAMES[dt], normal ? "normal" : "uniform", (unsigned long long)seed,
                  (unsigned long long)offset),
              got, want);
    for (u64 b = n * size; b < buf.size(); ++b)
        if (buf[b] != 0xA5) {
            rep.fail(fmt("random_%s", RNAMES[dt]), "wrote past the end");
            break;
        }
    rep.end();
    return capped;
}

int main() {
    check_moves<unsigned char>();
    check_moves<unsigned short>();
    check_moves<u32>();
    check_moves<u64>();

    check_philox_known_answers();
    const u64 seeds[2] = {0x0123456789ABCDEFull, 42};
    const u64 offsets_[3] = {0, (1ull << 32) - 150, 0x123456789ABull};
    for (int dt = 0; dt < 4; ++dt)
        for (int normal = 0; normal < 2; ++normal)
            for (int k = 0; k < 3; ++k) check_random(dt, seeds[k & 1], offsets_[k], 300, normal);
    // Counters of seed 0x0123456789ABCDEF whose uniform lies above 1 - 2^-24 (found by search):
    // the cap must act (and not for f64).
    for (u64 at : {17473302ull, 4313057066ull}) {
        if (!(ref::uniform(seeds[0], at) > 1.0 - std::ldexp(1.0, -24)))
            rep.begin(), rep.fail("random cap", fmt("counter %llu is not above the cap", (unsigned long long)at)), rep.end();
        for (int dt = 0; dt < 4; ++dt) {
            const int capped = check_random(dt, seeds[0], at - 3, 8, 0);
            // f32's cap is the one the counters were found for; bf16's and f16's are lower, so
            // they cap that draw and perhaps a neighbour too
            if (dt == R_F64 ? capped != 0 : dt == R_F32 ? capped != 1 : capped < 1)
                rep.begin(), rep.fail("random cap", fmt("%s: %d draws capped", RNAMES[dt], capped)), rep.end();
        }
    }
    // Counters (beyond 2^32) whose draw rounds differently to bf16 by the half crate's rule than
    // through f32 (found by search): the kernel must follow the half crate.
    for (auto [at, normal] : {std::pair<u64, int>{4294974832ull, 0}, {4295044606ull, 1}}) {
        const double u = normal ? ref::normal(seeds[0], at) : ref::uniform(seeds[0], at);
        const float f = (float)u;
        const unsigned short via_f32 = (unsigned short)(cuda_host::bits<u32>((float)ref::round_fmt(f, 7, -126)) >> 16);
        if (ref::bf16_bits(u) == via_f32)
            rep.begin(), rep.fail("random bf16 rounding", fmt("counter %llu rounds alike both ways", (unsigned long long)at)), rep.end();
        check_random(R_BF16, seeds[0], at - 2, 5, normal);
    }
    return rep.finish();
}
