// index.cu, launched as crate::cuda::families::index does (same arguments, Strided views, the
// index_load -> accumulate -> index_store sequence), against plain C++ statements of
// crate::ops::index (the CPU):
// - index_select and gather, all four element sizes (random bit patterns: every dtype moves
//   through one of them), x and index read through contiguous, padded + offset, transposed and
//   broadcast (stride 0) views, repeated indices, one row, empty outputs;
// - index_add and scatter_add, x of every float dtype, src of every dtype (bool is read as u8,
//   as the Rust side does), repeated indices: with dyadic values (exact sums in any order, so
//   compared bit for bit with the CPU's order), with normals (f32 sums in atomic order: within
//   tolerance), and integer sources beyond f32's 24 bits (the CPU converts them through f32, its
//   compute dtype for integers, before x's compute dtype);
// - one_hot, ids through contiguous and strided views.
#include "check.h"
#include "../../../crates/weft-core/src/cuda/kernels/index.cu"

using namespace chk;
static Rng rng(5);
static Report rep("index");



// A view of a storage buffer: element i (row-major over shape) is at offset + sum c_d * strides[d].
struct View {
    Shape shape, strides;
    u64 offset = 0;
};
enum Kind { CONTIG, PADDED, TRANSPOSED, BROADCAST };
static const char* KIND_NAMES[4] = {"contiguous", "padded", "transposed", "broadcast"};
static View make_view(const Shape& s, int kind) {
    View v{s, contiguous(s), 0};
    const int rank = (int)s.size();
    if (kind == PADDED) {  // last stride 2, each row one longer than needed, offset 3
        u64 a = 2;
        for (int d = rank - 1; d >= 0; --d) v.strides[d] = a, a = a * s[d] + 1;
        v.offset = 3;
    } else if (kind == TRANSPOSED) {  // column-major storage
        u64 a = 1;
        for (int d = 0; d < rank; ++d) v.strides[d] = a, a *= s[d];
    } else if (kind == BROADCAST && rank > 0) {
        v.strides[0] = 0;
        v.offset = 1;
    }
    return v;
}
static u64 storage_len(const View& v) {
    u64 m = v.offset;
    if (numel(v.shape) == 0) return m + 1;
    for (size_t d = 0; d < v.shape.size(); ++d) m += (v.shape[d] - 1) * v.strides[d];
    return m + 1;
}
static u64 offset_of(const View& v, u64 i) {
    u64 off = v.offset;
    for (int d = (int)v.shape.size() - 1; d >= 0; --d) off += (i % v.shape[d]) * v.strides[d], i /= v.shape[d];
    return off;
}
// As crate::cuda::launch::Strided::new: unused dims have shape 1 and stride 0.
static Strided strided(const View& v) {
    Strided s{};
    for (int d = 0; d < MAX_RANK; ++d) s.shape[d] = 1, s.strides[d] = 0;
    for (size_t d = 0; d < v.shape.size(); ++d) s.shape[d] = v.shape[d], s.strides[d] = v.strides[d];
    s.offset = v.offset;
    s.rank = (u32)v.shape.size();
    s.pad = 0;
    return s;
}
// The elements a view selects, row-major.
template <typename T> std::vector<T> logical(const std::vector<T>& storage, const View& v) {
    std::vector<T> o(numel(v.shape));
    for (u64 i = 0; i < o.size(); ++i) o[i] = storage[offset_of(v, i)];
    return o;
}

// Bit-exact comparison of raw elements.
template <typename T> void same_bits(const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
    if (got.size() != want.size()) return rep.fail(what, fmt("size %zu != %zu", got.size(), want.size()));
    for (size_t i = 0; i < got.size(); ++i) {
        ++rep.values;
        if (got[i] != want[i])
            return rep.fail(what, fmt("element %zu: got %llx want %llx", i, (unsigned long long)got[i], (unsigned long long)want[i]));
    }
}

template <typename T> std::vector<T> random_bits(u64 n) {
    std::vector<T> v(n);
    for (auto& e : v) e = (T)rng.next();
    return v;
}
static std::vector<i64> random_indices(u64 n, u64 size) {
    std::vector<i64> v(n);
    for (auto& e : v) e = size ? rng.range(0, (long long)size - 1) : 0;
    return v;
}

// ---- index_select / gather: raw moves by element size ----
template <typename T> struct Move;
template <> struct Move<unsigned char> { static constexpr auto select = index_select_1, gather = index_gather_1; };
template <> struct Move<unsigned short> { static constexpr auto select = index_select_2, gather = index_gather_2; };
template <> struct Move<u32> { static constexpr auto select = index_select_4, gather = index_gather_4; };
template <> struct Move<u64> { static constexpr auto select = index_select_8, gather = index_gather_8; };

// With n = 0 (the Rust side does not launch then) a kernel is launched on a one-element sentinel
// and must write nothing.
static const u64 SENTINEL = 0x5a5a5a5a5a5a5a5aull;

template <typename T> void index_select_case(const Shape& xs, u32 dim, const std::vector<i64>& idx, int kind) {
    rep.begin();
    View xv = make_view(xs, kind);
    auto xst = random_bits<T>(storage_len(xv));
    Shape os = xs;
    os[dim] = idx.size();
    const u64 n = numel(os);
    std::string w = fmt("index_select %zu-byte x %s %s dim %u, %zu indices", sizeof(T), shape_str(xs).c_str(),
                        KIND_NAMES[kind], dim, idx.size());
    Strided sel = strided(View{os, xv.strides, xv.offset});  // the output's shape, x's strides
    const T* xp = xst.data();
    const i64* ip = idx.data();
    if (n == 0) {
        u64 zero = 0, sentinel = SENTINEL;
        T* op = (T*)&sentinel;
        LAUNCH(Move<T>::select, 1, TH, op, xp, ip, sel, dim, zero);
        if (sentinel != SENTINEL) rep.fail(w, "n = 0 wrote an element");
        rep.end();
        return;
    }
    std::vector<T> out(n);
    T* op = out.data();
    LAUNCH(Move<T>::select, blocks_for(n), TH, op, xp, ip, sel, dim, n);
    // crate::ops::index::index_select_typed on the contiguous x
    auto xl = logical(xst, xv);
    u64 outer = numel(Shape(xs.begin(), xs.begin() + dim)), size = xs[dim], inner = numel(Shape(xs.begin() + dim + 1, xs.end()));
    std::vector<T> want;
    for (u64 o = 0; o < outer; ++o)
        for (i64 i : idx)
            for (u64 k = 0; k < inner; ++k) want.push_back(xl[(o * size + (u64)i) * inner + k]);
    same_bits(w, out, want);
    rep.end();
}

// crate::ops::index::scatter_offsets: for each element of a row-major `is` tensor, the flat
// offset in a contiguous `xs` tensor with coordinate `dim` replaced by its index.
static std::vector<u64> scatter_offsets(const Shape& xs, const Shape& is, u32 dim, const std::vector<i64>& idx) {
    Shape xst = contiguous(xs), ist = contiguous(is);
    std::vector<u64> offs(idx.size());
    for (u64 flat = 0; flat < idx.size(); ++flat) {
        u64 off = 0, rem = flat;
        for (size_t d = 0; d < is.size(); ++d) {
            u64 c = rem / ist[d];
            rem %= ist[d];
            off += (d == dim ? (u64)idx[flat] : c) * xst[d];
        }
        offs[flat] = off;
    }
    return offs;
}

template <typename T> void gather_case(const Shape& xs, const Shape& is, u32 dim, int xkind, int ikind) {
    rep.begin();
    View xv = make_view(xs, xkind), iv = make_view(is, ikind);
    auto xst = random_bits<T>(storage_len(xv));
    auto ist = random_indices(storage_len(iv), xs[dim]);
    const u64 n = numel(is);
    std::string w = fmt("gather %zu-byte x %s %s, index %s %s, dim %u", sizeof(T), shape_str(xs).c_str(),
                        KIND_NAMES[xkind], shape_str(is).c_str(), KIND_NAMES[ikind], dim);
    Strided ivs = strided(iv), xvs = strided(xv);
    const T* xp = xst.data();
    const i64* ip = ist.data();
    if (n == 0) {
        u64 zero = 0, sentinel = SENTINEL;
        T* op = (T*)&sentinel;
        LAUNCH(Move<T>::gather, 1, TH, op, xp, ip, ivs, xvs, dim, zero);
        if (sentinel != SENTINEL) rep.fail(w, "n = 0 wrote an element");
        rep.end();
        return;
    }
    std::vector<T> out(n);
    T* op = out.data();
    LAUNCH(Move<T>::gather, blocks_for(n), TH, op, xp, ip, ivs, xvs, dim, n);
    auto xl = logical(xst, xv);
    auto offs = scatter_offsets(xs, is, dim, logical(ist, iv));
    std::vector<T> want(n);
    for (u64 i = 0; i < n; ++i) want[i] = xl[offs[i]];
    same_bits(w, out, want);
    rep.end();
}

// ---- index_add / scatter_add ----
template <typename S> constexpr const char* src_name() {
    if constexpr (std::is_same_v<S, i64>) return "i64";
    else if constexpr (std::is_same_v<S, int>) return "i32";
    else if constexpr (std::is_same_v<S, unsigned char>) return "u8";
    else return dtype_name<S>();
}
template <typename S> constexpr bool is_int() { return std::is_integral_v<S>; }

template <typename S, typename A> struct Accum;
#define ACC_K(S, SN, A, AN)                                                    \
    template <> struct Accum<S, A> {                                           \
        static constexpr auto add = index_add_##SN##_##AN;                     \
        static constexpr auto scatter = scatter_add_##SN##_##AN;               \
    };
#define ACC_K_ALL(A, AN)                                                                                   \
    ACC_K(float, f32, A, AN) ACC_K(double, f64, A, AN) ACC_K(bf16, bf16, A, AN) ACC_K(f16, f16, A, AN) \
    ACC_K(i64, i64, A, AN) ACC_K(int, i32, A, AN) ACC_K(unsigned char, u8, A, AN)
ACC_K_ALL(float, f32)
ACC_K_ALL(double, f64)
template <typename X> constexpr auto load_of() {
    if constexpr (std::is_same_v<X, float>) return index_load_f32;
    else if constexpr (std::is_same_v<X, double>) return index_load_f64;
    else if constexpr (std::is_same_v<X, bf16>) return index_load_bf16;
    else return index_load_f16;
}
template <typename X> constexpr auto store_of() {
    if constexpr (std::is_same_v<X, bf16>) return index_store_bf16;
    else return index_store_f16;
}

// Source values: DYADIC (multiples of 1/8 in [-8, 8], integers for the integer types: every sum
// exact in f32, so the order of the atomics cannot show), NORMAL (f32 sums differ in the order),
// BIG (integers that f32 cannot hold).
enum Data { DYADIC, NORMAL, BIG };
static const char* DATA_NAMES[3] = {"dyadic", "normal", "ints beyond 2^24"};
template <typename S> std::vector<S> src_values(u64 n, int data) {
    std::vector<S> v(n);
    for (auto& e : v) {
        if constexpr (is_int<S>()) {
            if (data == BIG) {
                if constexpr (std::is_same_v<S, i64>) e = (i64)((1ll << 40) + (long long)(rng.next() % (1ull << 30)) * 2 + 1) * (rng.next() & 1 ? 1 : -1);
                else if constexpr (std::is_same_v<S, int>) e = (int)((1 << 30) + (int)(rng.next() % (1u << 20)) * 2 + 1) * (rng.next() & 1 ? 1 : -1);
                else e = (S)(rng.next() % 256);
            } else if constexpr (std::is_same_v<S, unsigned char>) {
                e = (S)(rng.next() % 256);
            } else {
                e = (S)rng.range(-20, 20);
            }
        } else {
            double d = data == NORMAL ? rng.normal() * 2 : (double)rng.range(-64, 64) / 8;
            st(&e, 0, (typename Acc<S>::type)d);
        }
    }
    return v;
}
// The value of a source element, as Element::to_f64.
template <typename S> double to_f64(S v) {
    if constexpr (is_int<S>()) return (double)v;
    else return (double)ld(&v, 0);
}
// crate::ops::index::forward's conversion of a source element to x's compute dtype A: one
// CpuStorage::cast, through f64 (an integer into f64 x stays exact).
template <typename S, typename A> A cpu_convert(S v) {
    return (A)to_f64(v);
}

// op = index_add (index 1-D, src shape = x's with dim of the index's length) or scatter_add
// (index of shape `is`, src the same shape).
template <typename X, typename S>
void accumulate_case(bool scatter, const Shape& xs, u32 dim, const Shape& is, const std::vector<i64>& fixed_idx,
                     int xkind, int skind, int ikind, int data) {
    typedef typename Acc<X>::type A;
    rep.begin();
    const u64 n = numel(xs);
    // x: values on X's grid, read through its view by index_load
    View xv = make_view(xs, xkind);
    std::vector<X> xst(storage_len(xv));
    for (auto& e : xst) st(&e, 0, (A)(data == NORMAL ? rng.normal() : (double)rng.range(-64, 64) / 8));
    // index and src
    std::vector<i64> ist;
    View iv;
    Shape ss;
    if (scatter) {
        iv = make_view(is, ikind);
        ist = random_indices(storage_len(iv), xs[dim]);
        ss = is;
    } else {
        iv = make_view(Shape{fixed_idx.size()}, CONTIG);  // the Rust side makes it dense
        ist = fixed_idx;
        ss = xs;
        ss[dim] = fixed_idx.size();
    }
    View sv = make_view(ss, skind);
    auto sst = src_values<S>(storage_len(sv), data);
    const u64 count = numel(ss);
    std::string w = fmt("%s x %s %s %s dim %u, src %s %s %s, %s", scatter ? "scatter_add" : "index_add", dtype_name<X>(),
                        shape_str(xs).c_str(), KIND_NAMES[xkind], dim, src_name<S>(), shape_str(ss).c_str(),
                        KIND_NAMES[skind], DATA_NAMES[data]);
    if (scatter) w += fmt(", index %s", KIND_NAMES[ikind]);

    // the launches of families::index::accumulate
    std::vector<A> acc(std::max<u64>(n, 1));
    A* ap = acc.data();
    const X* xp = xst.data();
    Strided xvs = strided(xv);
    if (n > 0) LAUNCH(load_of<X>(), blocks_for(n), TH, ap, xp, xvs, n);
    if (count > 0) {
        Strided ov = strided(View{xs, contiguous(xs), 0}), svs = strided(sv);
        const S* sp = sst.data();
        const i64* ip = ist.data();
        if (scatter) {
            Strided ivs = strided(iv);
            LAUNCH((Accum<S, A>::scatter), blocks_for(count), TH, ap, sp, ip, ivs, svs, ov, dim, count);
        } else {
            LAUNCH((Accum<S, A>::add), blocks_for(count), TH, ap, sp, ip, svs, ov, dim, count);
        }
    }
    std::vector<double> got;
    if constexpr (std::is_same_v<X, A>) {
        got = widen(std::vector<A>(acc.begin(), acc.begin() + n));
    } else {
        std::vector<X> out(std::max<u64>(n, 1));
        X* op = out.data();
        if (n > 0) LAUNCH(store_of<X>(), blocks_for(n), TH, op, ap, n);
        out.resize(n);
        got = from_t(out);
    }

    // the CPU: x in its compute dtype, src converted, added in row-major order of src / index
    std::vector<A> ref(n);
    {
        auto xl = logical(xst, xv);
        for (u64 i = 0; i < n; ++i) ref[i] = (A)ld(xl.data(), i);
    }
    auto sl = logical(sst, sv);
    if (scatter) {
        auto offs = scatter_offsets(xs, is, dim, logical(ist, iv));
        for (u64 i = 0; i < offs.size(); ++i) ref[offs[i]] += cpu_convert<S, A>(sl[i]);
    } else {
        u64 outer = numel(Shape(xs.begin(), xs.begin() + dim)), size = xs[dim], inner = numel(Shape(xs.begin() + dim + 1, xs.end()));
        const u64 len = fixed_idx.size();
        for (u64 o = 0; o < outer; ++o)
            for (u64 j = 0; j < len; ++j)
                for (u64 k = 0; k < inner; ++k)
                    ref[(o * size + (u64)fixed_idx[j]) * inner + k] += cpu_convert<S, A>(sl[(o * len + j) * inner + k]);
    }
    std::vector<double> want = roundtrip<X>(widen(ref));  // back_to: rounded once to X
    if (data == NORMAL) rep.close(w, got, want, tolerance<X>());
    else rep.exact(w, got, want);
    rep.end();
}

// Every source dtype into one x dtype.
template <typename X> void accumulate_all_sources(bool scatter, const Shape& xs, u32 dim, const Shape& is,
                                                  const std::vector<i64>& idx, int xkind, int skind, int ikind, int data) {
    accumulate_case<X, float>(scatter, xs, dim, is, idx, xkind, skind, ikind, data);
    accumulate_case<X, double>(scatter, xs, dim, is, idx, xkind, skind, ikind, data);
    accumulate_case<X, bf16>(scatter, xs, dim, is, idx, xkind, skind, ikind, data);
    accumulate_case<X, f16>(scatter, xs, dim, is, idx, xkind, skind, ikind, data);
    accumulate_case<X, i64>(scatter, xs, dim, is, idx, xkind, skind, ikind, data);
    accumulate_case<X, int>(scatter, xs, dim, is, idx, xkind, skind, ikind, data);
    accumulate_case<X, unsigned char>(scatter, xs, dim, is, idx, xkind, skind, ikind, data);
}
template <typename... Args> void accumulate_all(Args... a) {
    accumulate_all_sources<float>(a...);
    accumulate_all_sources<double>(a...);
    accumulate_all_sources<bf16>(a...);
    accumulate_all_sources<f16>(a...);
}

// ---- one_hot ----
void one_hot_case(const Shape& ids_shape, int kind, u64 classes) {
    rep.begin();
    View iv = make_view(ids_shape, kind);
    auto ist = random_indices(storage_len(iv), classes);
    const u64 rows = numel(ids_shape), n = rows * classes;
    std::string w = fmt("one_hot ids %s %s, %llu classes", shape_str(ids_shape).c_str(), KIND_NAMES[kind], classes);
    Strided ivs = strided(iv);
    const i64* ip = ist.data();
    if (n == 0) {
        u64 zero = 0;
        i64 sentinel = (i64)SENTINEL;
        i64* op = &sentinel;
        LAUNCH(one_hot, 1, TH, op, ip, ivs, classes, zero);
        if (sentinel != (i64)SENTINEL) rep.fail(w, "n = 0 wrote an element");
        rep.end();
        return;
    }
    std::vector<i64> out(n, 7);
    i64* op = out.data();
    LAUNCH(one_hot, blocks_for(n), TH, op, ip, ivs, classes, n);
    std::vector<i64> want(n, 0);
    auto ids = logical(ist, iv);
    for (u64 r = 0; r < rows; ++r) want[r * classes + (u64)ids[r]] = 1;
    same_bits(w, out, want);
    rep.end();
}

template <typename T> void moves() {
    // index_select: every dim of a rank-3 x in every view kind, repeated indices
    for (int kind = 0; kind < 4; ++kind)
        for (u32 dim = 0; dim < 3; ++dim) index_select_case<T>({3, 4, 5}, dim, random_indices(7, Shape{3, 4, 5}[dim]), kind);
    index_select_case<T>({1, 6}, 0, {0, 0, 0}, CONTIG);                    // one row, repeated
    index_select_case<T>({9}, 0, {8}, PADDED);                             // one index
    index_select_case<T>({5, 300}, 0, {4, 0, 4}, CONTIG);                  // rows longer than the grid
    index_select_case<T>({4, 3}, 1, {}, CONTIG);                           // empty output
    // gather: index smaller than x off dim, larger along dim, every view kind
    for (int xk = 0; xk < 4; ++xk)
        for (u32 dim = 0; dim < 3; ++dim) {
            Shape is = {2, 3, 4};
            is[dim] = 6;
            gather_case<T>({3, 4, 5}, is, dim, xk, (xk + dim) % 4);
        }
    gather_case<T>({1, 5}, {1, 1}, 1, CONTIG, CONTIG);  // one element
    gather_case<T>({6, 70}, {6, 70}, 1, TRANSPOSED, PADDED);
    gather_case<T>({3, 4}, {0, 4}, 0, CONTIG, CONTIG);  // empty index
}

int main() {
    moves<unsigned char>();
    moves<unsigned short>();
    moves<u32>();
    moves<u64>();

    // index_add: repeated indices, every view kind of x and src, every x / src dtype pair
    accumulate_all(false, Shape{4, 5, 3}, 1u, Shape{}, std::vector<i64>{4, 0, 4, 2, 4, 0, 1}, (int)PADDED, (int)TRANSPOSED, 0, (int)DYADIC);
    accumulate_all(false, Shape{6, 4}, 0u, Shape{}, std::vector<i64>{5, 5, 5}, (int)TRANSPOSED, (int)BROADCAST, 0, (int)DYADIC);
    accumulate_all(false, Shape{1, 7}, 1u, Shape{}, std::vector<i64>{6}, (int)CONTIG, (int)CONTIG, 0, (int)DYADIC);  // one row
    accumulate_all(false, Shape{3, 4}, 0u, Shape{}, std::vector<i64>{}, (int)BROADCAST, (int)CONTIG, 0, (int)DYADIC);  // nothing added
    // scatter_add: repeated targets, index and src through views
    accumulate_all(true, Shape{4, 5, 3}, 1u, Shape{3, 9, 2}, std::vector<i64>{}, (int)CONTIG, (int)PADDED, (int)TRANSPOSED, (int)DYADIC);
    accumulate_all(true, Shape{5, 6}, 0u, Shape{12, 4}, std::vector<i64>{}, (int)PADDED, (int)TRANSPOSED, (int)BROADCAST, (int)DYADIC);
    accumulate_all(true, Shape{1, 4}, 1u, Shape{1, 1}, std::vector<i64>{}, (int)CONTIG, (int)CONTIG, (int)CONTIG, (int)DYADIC);  // one element
    accumulate_all(true, Shape{3, 4}, 1u, Shape{3, 0}, std::vector<i64>{}, (int)CONTIG, (int)CONTIG, (int)CONTIG, (int)DYADIC);  // empty index
    accumulate_all(true, Shape{0, 4}, 1u, Shape{0, 2}, std::vector<i64>{}, (int)CONTIG, (int)CONTIG, (int)CONTIG, (int)DYADIC);  // empty x
    // normals, many repeats: f32 sums in atomic order, within tolerance
    for (bool scatter : {false, true}) {
        Shape xs{8, 16};
        accumulate_case<float, float>(scatter, xs, 0, Shape{40, 16}, random_indices(40, 8), CONTIG, CONTIG, CONTIG, NORMAL);
        accumulate_case<double, double>(scatter, xs, 0, Shape{40, 16}, random_indices(40, 8), CONTIG, CONTIG, CONTIG, NORMAL);
        accumulate_case<bf16, float>(scatter, xs, 0, Shape{40, 16}, random_indices(40, 8), CONTIG, CONTIG, CONTIG, NORMAL);
        accumulate_case<f16, bf16>(scatter, xs, 0, Shape{40, 16}, random_indices(40, 8), CONTIG, CONTIG, CONTIG, NORMAL);
    }
    // integer sources beyond 2^24, one addition per element (distinct indices): exact into f64
    // x, rounded once into f32 x
    for (bool scatter : {false, true}) {
        std::vector<i64> perm = {3, 1, 4, 0, 2};
        Shape xs{5, 3};
        accumulate_case<float, i64>(scatter, xs, 0, Shape{1, 3}, perm, CONTIG, CONTIG, CONTIG, BIG);
        accumulate_case<float, int>(scatter, xs, 0, Shape{1, 3}, perm, CONTIG, CONTIG, CONTIG, BIG);
        accumulate_case<double, i64>(scatter, xs, 0, Shape{1, 3}, perm, CONTIG, CONTIG, CONTIG, BIG);
        accumulate_case<double, int>(scatter, xs, 0, Shape{1, 3}, perm, CONTIG, CONTIG, CONTIG, BIG);
    }

    for (int kind = 0; kind < 4; ++kind) one_hot_case({3, 5}, kind, 7);
    one_hot_case({1}, CONTIG, 1);       // one id, one class
    one_hot_case({200}, PADDED, 3);     // more than the grid
    one_hot_case({0, 4}, CONTIG, 5);    // no ids
    return rep.finish();
}
