// Indexing kernels (families/index.rs): index_select and gather move raw elements by size (1, 2,
// 4 or 8 bytes, so every dtype shares them); index_add and scatter_add accumulate with atomicAdd
// into a buffer of the compute type (f32 for f32/bf16/f16, f64 for f64), which index_load fills
// from x and index_store rounds back to bf16/f16; one_hot writes I64 zeros and ones.
//
// Every index value was range-checked on the host before a launch, so the kernels read indices
// as they are. The geometry of each view comes in a Strided: only its shape and strides are read.

// out[i] (i over the output, whose shape is sel.shape: x's shape with dim `dim` of index's
// length) = x at the coordinates of i with coordinate `dim` replaced by index[that coordinate];
// sel.strides and sel.offset are x's. `index` is contiguous.
#define INDEX_SELECT(T, NAME) \
extern "C" __global__ void NAME(T* out, const T* x, const i64* index, Strided sel, u32 dim, u64 n) { \
    FOR_EACH(i, n) { \
        u64 r = i, off = sel.offset; \
        for (int d = (int)sel.rank - 1; d >= 0; --d) { \
            u64 c = r % sel.shape[d]; \
            r /= sel.shape[d]; \
            if ((u32)d == dim) c = (u64)index[c]; \
            off += c * sel.strides[d]; \
        } \
        out[i] = x[off]; \
    } \
}
INDEX_SELECT(unsigned char, index_select_1)
INDEX_SELECT(unsigned short, index_select_2)
INDEX_SELECT(u32, index_select_4)
INDEX_SELECT(u64, index_select_8)

// out[i] (i over index's shape, iv) = x at the coordinates of i with coordinate `dim` replaced by
// the index element at i; xv holds x's strides and offset.
#define GATHER(T, NAME) \
extern "C" __global__ void NAME(T* out, const T* x, const i64* index, Strided iv, Strided xv, u32 dim, u64 n) { \
    FOR_EACH(i, n) { \
        u64 r = i, io = iv.offset, xo = xv.offset; \
        for (int d = (int)iv.rank - 1; d >= 0; --d) { \
            u64 c = r % iv.shape[d]; \
            r /= iv.shape[d]; \
            io += c * iv.strides[d]; \
            if ((u32)d != dim) xo += c * xv.strides[d]; \
        } \
        out[i] = x[xo + (u64)index[io] * xv.strides[dim]]; \
    } \
}
GATHER(unsigned char, index_gather_1)
GATHER(unsigned short, index_gather_2)
GATHER(u32, index_gather_4)
GATHER(u64, index_gather_8)

// acc[i] = x[view element i] in the compute type: the accumulating ops' starting values.
template <typename T>
__device__ void index_load(typename Acc<T>::type* acc, const T* x, const Strided& xv, u64 n) {
    FOR_EACH(i, n) acc[i] = ld(x, strided_offset(xv, i));
}
#define INDEX_LOAD(T, NAME) \
extern "C" __global__ void NAME(typename Acc<T>::type* acc, const T* x, Strided xv, u64 n) { index_load<T>(acc, x, xv, n); }
INDEX_LOAD(float, index_load_f32)
INDEX_LOAD(double, index_load_f64)
INDEX_LOAD(bf16, index_load_bf16)
INDEX_LOAD(f16, index_load_f16)

// out[i] = acc[i] rounded to the half type (nearest even).
#define INDEX_STORE(T, NAME) \
extern "C" __global__ void NAME(T* out, const float* acc, u64 n) { FOR_EACH(i, n) st(out, i, acc[i]); }
INDEX_STORE(bf16, index_store_bf16)
INDEX_STORE(f16, index_store_f16)

// A source element as f64, as the CPU's cast does (every dtype through f64, then to the compute
// type); bool is stored as one byte 0 or 1 and read as u8.
__device__ __forceinline__ double as_f64(float v) { return (double)v; }
__device__ __forceinline__ double as_f64(double v) { return v; }
__device__ __forceinline__ double as_f64(bf16 v) { return (double)bf16_to_f32(v); }
__device__ __forceinline__ double as_f64(f16 v) { return (double)f16_to_f32(v); }
__device__ __forceinline__ double as_f64(i64 v) { return (double)v; }
__device__ __forceinline__ double as_f64(int v) { return (double)v; }
__device__ __forceinline__ double as_f64(unsigned char v) { return (double)v; }

// acc (contiguous, x's shape, contiguous strides in ov.strides) += src at index: element i of
// src (shape and strides sv) goes to src's coordinates with coordinate `dim` c replaced by
// index[c]. `index` is contiguous 1-D.
template <typename S, typename A>
__device__ void index_add(A* acc, const S* src, const i64* index, const Strided& sv, const Strided& ov, u32 dim, u64 n) {
    FOR_EACH(i, n) {
        u64 r = i, so = sv.offset, oo = 0;
        for (int d = (int)sv.rank - 1; d >= 0; --d) {
            u64 c = r % sv.shape[d];
            r /= sv.shape[d];
            so += c * sv.strides[d];
            oo += ((u32)d == dim ? (u64)index[c] : c) * ov.strides[d];
        }
        atomicAdd(acc + oo, (A)as_f64(src[so]));
    }
}

// acc (as above) += src at index, scatter form: element i of index (shape and strides iv; src's
// view sv has the same shape) sends src's element to its own coordinates with coordinate `dim`
// replaced by the index element.
template <typename S, typename A>
__device__ void scatter_add(A* acc, const S* src, const i64* index, const Strided& iv, const Strided& sv, const Strided& ov, u32 dim, u64 n) {
    FOR_EACH(i, n) {
        u64 r = i, io = iv.offset, so = sv.offset, oo = 0;
        for (int d = (int)iv.rank - 1; d >= 0; --d) {
            u64 c = r % iv.shape[d];
            r /= iv.shape[d];
            io += c * iv.strides[d];
            so += c * sv.strides[d];
            if ((u32)d != dim) oo += c * ov.strides[d];
        }
        oo += (u64)index[io] * ov.strides[dim];
        atomicAdd(acc + oo, (A)as_f64(src[so]));
    }
}

#define ACCUMULATE(S, A, SN, AN) \
extern "C" __global__ void index_add_##SN##_##AN(A* acc, const S* src, const i64* index, Strided sv, Strided ov, u32 dim, u64 n) { \
    index_add<S, A>(acc, src, index, sv, ov, dim, n); \
} \
extern "C" __global__ void scatter_add_##SN##_##AN(A* acc, const S* src, const i64* index, Strided iv, Strided sv, Strided ov, u32 dim, u64 n) { \
    scatter_add<S, A>(acc, src, index, iv, sv, ov, dim, n); \
}
#define ACCUMULATE_INTO(A, AN) \
ACCUMULATE(float, A, f32, AN) \
ACCUMULATE(double, A, f64, AN) \
ACCUMULATE(bf16, A, bf16, AN) \
ACCUMULATE(f16, A, f16, AN) \
ACCUMULATE(i64, A, i64, AN) \
ACCUMULATE(int, A, i32, AN) \
ACCUMULATE(unsigned char, A, u8, AN)
ACCUMULATE_INTO(float, f32)
ACCUMULATE_INTO(double, f64)

// out[i] (contiguous [..., classes]) = 1 when the id of row i / classes is i % classes, else 0;
// ids read through their view iv.
extern "C" __global__ void one_hot(i64* out, const i64* ids, Strided iv, u64 classes, u64 n) {
    FOR_EACH(i, n) {
        u64 row = i / classes, c = i % classes;
        out[i] = ids[strided_offset(iv, row)] == (i64)c ? 1 : 0;
    }
}
