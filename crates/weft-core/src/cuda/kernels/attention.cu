// Fused scaled-dot-product attention (crate::ops::attention) and its backward. Per problem (one
// batch element and head): q [T, D], k [S, D], v [S, Dv] -> o [T, Dv] = softmax(scale q k^T) v,
// with the causal mask letting query i see the keys j <= i (aligned at the first query and the
// first key, as the CPU's), and lse [T], each query's log-sum-exp of its visible scaled scores
// (what the backward recomputes the probabilities from, as FlashAttention does).
//
// Every matrix is read and written through a Mat: problem b's matrix starts at
// strided_offset(lead, b) and its element (r, c) lies `r * row + c * col` past that, in elements.
// Permuted, narrowed and broadcast views, and the q/k/v thirds of a fused [B, T, 3C] projection,
// are read where they are, without copies. lse and delta are contiguous [bh, T].
//
// One warp per query row (forward, dq) or key row (dk and dv), ATTN_WARPS warps a block, a
// grid-stride loop over the rows. A warp walks the keys (or queries) in tiles of 32, lane l
// computing the dot products of the tile's row l; the output row is spread over the lanes,
// ATTN_COLS columns each (lane + 32 r), so one pass covers 32 * ATTN_COLS columns and wider heads
// take several passes that recompute the scores. Accumulation in f32 (f64 for f64); no atomics:
// each output element has one writer, so results do not depend on scheduling.

#define ATTN_WARPS 4
#define ATTN_COLS 4
#define ATTN_FULL 0xffffffffu

// A batch of matrices (crate::cuda::families::attention::Mat, same layout).
struct Mat {
    Strided lead;
    u64 row;
    u64 col;
};

// Sizes of one call (crate::cuda::families::attention::Dims, same layout): bh problems of t
// queries, s keys, head dims d (q, k) and dv (v, o).
struct AttnDims {
    u64 bh;
    u64 t;
    u64 s;
    u64 d;
    u64 dv;
    double scale;
    u32 causal;
    u32 pad;
};

__device__ __forceinline__ float attn_exp(float x) { return expf(x); }
__device__ __forceinline__ double attn_exp(double x) { return exp(x); }
__device__ __forceinline__ float attn_log(float x) { return logf(x); }
__device__ __forceinline__ double attn_log(double x) { return log(x); }
__device__ __forceinline__ u64 attn_min(u64 a, u64 b) { return a < b ? a : b; }

// The keys query i sees.
__device__ __forceinline__ u64 attn_keys(const AttnDims& n, u64 i) {
    return n.causal ? attn_min(i + 1, n.s) : n.s;
}

// sum_c x[c * xs] * y[c * ys] over c < len, in the compute type.
template <typename T, typename A>
__device__ __forceinline__ A attn_dot(const T* x, u64 xs, const T* y, u64 ys, u64 len) {
    A acc = 0;
    for (u64 c = 0; c < len; ++c) acc += ld(x, c * xs) * ld(y, c * ys);
    return acc;
}

// Forward: o and lse. Query row `row` = b * t + i. A query that sees no key (only when s = 0)
// gets zeros and a log-sum-exp of 0, as on the CPU.
template <typename T>
__device__ void attn_forward(const T* q, const T* k, const T* v, T* o, typename Acc<T>::type* lse,
                             const Mat& mq, const Mat& mk, const Mat& mv, const Mat& mo, const AttnDims& n) {
    typedef typename Acc<T>::type A;
    const A scale = (A)n.scale;
    const int lane = threadIdx.x & 31;
    const u64 rows = n.bh * n.t;
    for (u64 row = (u64)blockIdx.x * ATTN_WARPS + (threadIdx.x >> 5); row < rows;
         row += (u64)gridDim.x * ATTN_WARPS) {
        const u64 b = row / n.t, i = row % n.t;
        const u64 nk = attn_keys(n, i);
        const T* qi = q + strided_offset(mq.lead, b) + i * mq.row;
        const T* kb = k + strided_offset(mk.lead, b);
        const T* vb = v + strided_offset(mv.lead, b);
        T* oi = o + strided_offset(mo.lead, b) + i * mo.row;
        // Passes over the output's columns (at least one: it writes the log-sum-exp).
        for (u64 c0 = 0; c0 == 0 || c0 < n.dv; c0 += 32 * ATTN_COLS) {
            A m = neg_inf<A>(), l = 0;  // running max and sum of exp(score - m)
            A acc[ATTN_COLS];
#pragma unroll
            for (int r = 0; r < ATTN_COLS; ++r) acc[r] = 0;
            for (u64 j0 = 0; j0 < nk; j0 += 32) {
                const u64 j = j0 + lane;
                A s = neg_inf<A>();
                if (j < nk) s = scale * attn_dot<T, A>(qi, mq.col, kb + j * mk.row, mk.col, n.d);
                const A mn = max(m, warp_max(s));  // finite: the tile's first key is visible
                const A p = j < nk ? attn_exp(s - mn) : (A)0;
                const A corr = attn_exp(m - mn);  // 0 on the first tile (m = -inf)
                l = l * corr + warp_sum(p);
#pragma unroll
                for (int r = 0; r < ATTN_COLS; ++r) acc[r] *= corr;
                const u64 nt = attn_min(32, nk - j0);
                for (u64 jj = 0; jj < nt; ++jj) {
                    const A pj = __shfl_sync(ATTN_FULL, p, (int)jj);
                    const T* vj = vb + (j0 + jj) * mv.row;
#pragma unroll
                    for (int r = 0; r < ATTN_COLS; ++r) {
                        const u64 c = c0 + r * 32 + lane;
                        if (c < n.dv) acc[r] += pj * ld(vj, c * mv.col);
                    }
                }
                m = mn;
            }
            const A inv = nk > 0 ? (A)1 / l : (A)0;
#pragma unroll
            for (int r = 0; r < ATTN_COLS; ++r) {
                const u64 c = c0 + r * 32 + lane;
                if (c < n.dv) st(oi, c * mo.col, acc[r] * inv);
            }
            if (c0 == 0 && lane == 0) lse[row] = nk > 0 ? m + attn_log(l) : (A)0;
        }
    }
}

// Backward, first kernel: delta_i = dot(dO_i, O_i) (written for the second kernel) and
// dq_i = scale * sum_j ds_ij k_j over the visible keys, with p_ij = exp(scale q_i.k_j - lse_i)
// and ds_ij = p_ij (dO_i.v_j - delta_i). One warp per query row.
template <typename T>
__device__ void attn_backward_dq(const T* q, const T* k, const T* v, const T* o, const T* g,
                                 const typename Acc<T>::type* lse, typename Acc<T>::type* delta, T* dq,
                                 const Mat& mq, const Mat& mk, const Mat& mv, const Mat& mo, const Mat& mg,
                                 const Mat& mdq, const AttnDims& n) {
    typedef typename Acc<T>::type A;
    const A scale = (A)n.scale;
    const int lane = threadIdx.x & 31;
    const u64 rows = n.bh * n.t;
    for (u64 row = (u64)blockIdx.x * ATTN_WARPS + (threadIdx.x >> 5); row < rows;
         row += (u64)gridDim.x * ATTN_WARPS) {
        const u64 b = row / n.t, i = row % n.t;
        const u64 nk = attn_keys(n, i);
        const T* qi = q + strided_offset(mq.lead, b) + i * mq.row;
        const T* kb = k + strided_offset(mk.lead, b);
        const T* vb = v + strided_offset(mv.lead, b);
        const T* oi = o + strided_offset(mo.lead, b) + i * mo.row;
        const T* gi = g + strided_offset(mg.lead, b) + i * mg.row;
        T* dqi = dq + strided_offset(mdq.lead, b) + i * mdq.row;
        A dl = 0;
        for (u64 c = lane; c < n.dv; c += 32) dl += ld(gi, c * mg.col) * ld(oi, c * mo.col);
        dl = warp_sum(dl);
        if (lane == 0) delta[row] = dl;
        const A li = lse[row];
        for (u64 c0 = 0; c0 < n.d; c0 += 32 * ATTN_COLS) {
            A acc[ATTN_COLS];
#pragma unroll
            for (int r = 0; r < ATTN_COLS; ++r) acc[r] = 0;
            for (u64 j0 = 0; j0 < nk; j0 += 32) {
                const u64 j = j0 + lane;
                A ds = 0;
                if (j < nk) {
                    const A s = scale * attn_dot<T, A>(qi, mq.col, kb + j * mk.row, mk.col, n.d);
                    const A p = attn_exp(s - li);
                    const A dp = attn_dot<T, A>(gi, mg.col, vb + j * mv.row, mv.col, n.dv);
                    ds = p * (dp - dl);
                }
                const u64 nt = attn_min(32, nk - j0);
                for (u64 jj = 0; jj < nt; ++jj) {
                    const A dsj = __shfl_sync(ATTN_FULL, ds, (int)jj);
                    const T* kj = kb + (j0 + jj) * mk.row;
#pragma unroll
                    for (int r = 0; r < ATTN_COLS; ++r) {
                        const u64 c = c0 + r * 32 + lane;
                        if (c < n.d) acc[r] += dsj * ld(kj, c * mk.col);
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < ATTN_COLS; ++r) {
                const u64 c = c0 + r * 32 + lane;
                if (c < n.d) st(dqi, c * mdq.col, acc[r] * scale);
            }
        }
    }
}

// Backward, second kernel (after the first: it reads delta): for key row j,
// dv_j = sum_i p_ij dO_i and dk_j = scale * sum_i ds_ij q_i over the queries that see key j
// (all of them; with the causal mask, i >= j). One warp per key row `row` = b * s + j.
template <typename T>
__device__ void attn_backward_dkdv(const T* q, const T* k, const T* v, const T* g,
                                   const typename Acc<T>::type* lse, const typename Acc<T>::type* delta,
                                   T* dk, T* dv, const Mat& mq, const Mat& mk, const Mat& mv, const Mat& mg,
                                   const Mat& mdk, const Mat& mdv, const AttnDims& n) {
    typedef typename Acc<T>::type A;
    const A scale = (A)n.scale;
    const int lane = threadIdx.x & 31;
    const u64 rows = n.bh * n.s;
    const u64 width = n.d > n.dv ? n.d : n.dv;
    for (u64 row = (u64)blockIdx.x * ATTN_WARPS + (threadIdx.x >> 5); row < rows;
         row += (u64)gridDim.x * ATTN_WARPS) {
        const u64 b = row / n.s, j = row % n.s;
        const u64 i0 = n.causal ? j : 0;
        const u64 nq = n.t > i0 ? n.t - i0 : 0;
        const T* qb = q + strided_offset(mq.lead, b);
        const T* gb = g + strided_offset(mg.lead, b);
        const T* kj = k + strided_offset(mk.lead, b) + j * mk.row;
        const T* vj = v + strided_offset(mv.lead, b) + j * mv.row;
        T* dkj = dk + strided_offset(mdk.lead, b) + j * mdk.row;
        T* dvj = dv + strided_offset(mdv.lead, b) + j * mdv.row;
        const A* lb = lse + b * n.t;
        const A* db = delta + b * n.t;
        for (u64 c0 = 0; c0 < width; c0 += 32 * ATTN_COLS) {
            A ak[ATTN_COLS], av[ATTN_COLS];
#pragma unroll
            for (int r = 0; r < ATTN_COLS; ++r) {
                ak[r] = 0;
                av[r] = 0;
            }
            for (u64 i1 = 0; i1 < nq; i1 += 32) {
                const u64 i = i0 + i1 + lane;
                A p = 0, ds = 0;
                if (i1 + lane < nq) {
                    const A s = scale * attn_dot<T, A>(qb + i * mq.row, mq.col, kj, mk.col, n.d);
                    p = attn_exp(s - lb[i]);
                    const A dp = attn_dot<T, A>(gb + i * mg.row, mg.col, vj, mv.col, n.dv);
                    ds = p * (dp - db[i]);
                }
                const u64 nt = attn_min(32, nq - i1);
                for (u64 ii = 0; ii < nt; ++ii) {
                    const A pi = __shfl_sync(ATTN_FULL, p, (int)ii);
                    const A dsi = __shfl_sync(ATTN_FULL, ds, (int)ii);
                    const u64 qrow = i0 + i1 + ii;
                    const T* qi = qb + qrow * mq.row;
                    const T* gi = gb + qrow * mg.row;
#pragma unroll
                    for (int r = 0; r < ATTN_COLS; ++r) {
                        const u64 c = c0 + r * 32 + lane;
                        if (c < n.dv) av[r] += pi * ld(gi, c * mg.col);
                        if (c < n.d) ak[r] += dsi * ld(qi, c * mq.col);
                    }
                }
            }
#pragma unroll
            for (int r = 0; r < ATTN_COLS; ++r) {
                const u64 c = c0 + r * 32 + lane;
                if (c < n.d) st(dkj, c * mdk.col, ak[r] * scale);
                if (c < n.dv) st(dvj, c * mdv.col, av[r]);
            }
        }
    }
}

#define ATTN_KERNELS(T, SUF)                                                                              \
    extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32)                                          \
        attention_forward_##SUF(const T* q, const T* k, const T* v, T* o, Acc<T>::type* lse, Mat mq,      \
                                Mat mk, Mat mv, Mat mo, AttnDims n) {                                      \
        attn_forward<T>(q, k, v, o, lse, mq, mk, mv, mo, n);                                              \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32) attention_backward_dq_##SUF(           \
        const T* q, const T* k, const T* v, const T* o, const T* g, const Acc<T>::type* lse,              \
        Acc<T>::type* delta, T* dq, Mat mq, Mat mk, Mat mv, Mat mo, Mat mg, Mat mdq, AttnDims n) {        \
        attn_backward_dq<T>(q, k, v, o, g, lse, delta, dq, mq, mk, mv, mo, mg, mdq, n);                   \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32) attention_backward_dkdv_##SUF(         \
        const T* q, const T* k, const T* v, const T* g, const Acc<T>::type* lse,                          \
        const Acc<T>::type* delta, T* dk, T* dv, Mat mq, Mat mk, Mat mv, Mat mg, Mat mdk, Mat mdv,        \
        AttnDims n) {                                                                                      \
        attn_backward_dkdv<T>(q, k, v, g, lse, delta, dk, dv, mq, mk, mv, mg, mdk, mdv, n);               \
    }

ATTN_KERNELS(float, f32)
ATTN_KERNELS(double, f64)
ATTN_KERNELS(bf16, bf16)
ATTN_KERNELS(f16, f16)
