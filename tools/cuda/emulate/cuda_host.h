// cuda_host.h: compiles the REAL CUDA C kernel sources (crates/weft-core/src/cuda/kernels/) as
// host C++20 with g++, so that their arithmetic can be checked without a GPU.
//
// Model: one OS thread per CUDA thread; the blocks of a launch run one after another (so
// `__shared__` variables become function-local statics); `__syncthreads` is a barrier over the
// block; warp shuffles go through per-thread slots and a barrier over the warp. A thread
// that returns drops out of both barriers (as exited threads do on sm_70+). bf16 is the prelude's
// own code; the f16 conversions (inline PTX `cvt`) are done with _Float16 (round to nearest even;
// NaN payloads are not modelled). atomicAdd (float, double, int, unsigned, unsigned long long)
// is a real atomic read-modify-write on the OS threads.
//
// Include this first (it includes the prelude), then the family .cu file, then the checker code.
// Never change a kernel to make it compile here: extend this file.
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <latch>
#include <semaphore>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <math.h>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

// ---- CUDA C keywords ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __shared__ static  // one block at a time: a static is the block's shared memory
#define __launch_bounds__(...)
#define __restrict__ __restrict

namespace cuda_host {
struct Idx {
    unsigned x = 0, y = 0, z = 0;
};
}  // namespace cuda_host

inline thread_local cuda_host::Idx threadIdx, blockIdx;
inline cuda_host::Idx blockDim{1, 1, 1}, gridDim{1, 1, 1};

namespace cuda_host {

[[noreturn]] inline void die(const char* what) {
    std::fprintf(stderr, "cuda_host: %s\n", what);
    std::fflush(stderr);
    std::abort();
}

// A barrier whose waiters spin with sched_yield: with more threads than cores, far quicker than
// std::barrier's sleep/wake for the short phases between shuffles. arrive_and_drop: a thread
// that has returned no longer takes part.
class Barrier {
   public:
    explicit Barrier(unsigned n) : expected_(n) {}
    void arrive_and_wait() {
        unsigned p;
        {
            std::lock_guard<std::mutex> g(m_);
            p = phase_.load();
            if (++arrived_ == expected_) {
                arrived_ = 0;
                phase_.fetch_add(1);
                return;
            }
        }
        while (phase_.load() == p) std::this_thread::yield();
    }
    void arrive_and_drop() {
        std::lock_guard<std::mutex> g(m_);
        --expected_;
        if (arrived_ > 0 && arrived_ == expected_) {
            arrived_ = 0;
            phase_.fetch_add(1);
        }
    }

   private:
    std::mutex m_;
    unsigned expected_, arrived_ = 0;
    std::atomic<unsigned> phase_{0};
};

// The state of the block that is running.
struct Block {
    Barrier all;
    std::vector<std::unique_ptr<Barrier>> warps;
    std::vector<std::uint64_t> slots;
    explicit Block(unsigned threads) : all(threads), slots(threads) {
        for (unsigned w = 0; w * 32 < threads; ++w)
            warps.emplace_back(std::make_unique<Barrier>(std::min(32u, threads - w * 32)));
    }
};
inline Block* g_block = nullptr;

// A pool of OS threads, one per CUDA thread of the largest block so far, reused by every block
// (creating threads per block costs more than the kernels).
class Pool {
   public:
    // Runs job(t) on worker t for t < n, and waits for all of them.
    void run(unsigned n, const std::function<void(unsigned)>& job) {
        while (workers_.size() < n) workers_.emplace_back(std::make_unique<Worker>(this, (unsigned)workers_.size()));
        job_ = &job;
        std::latch done((std::ptrdiff_t)n);
        done_ = &done;
        for (unsigned t = 0; t < n; ++t) workers_[t]->go.release();
        done.wait();
    }
    ~Pool() {
        stopping_ = true;
        for (auto& w : workers_) w->go.release();
        for (auto& w : workers_) w->thread.join();
    }

   private:
    struct Worker {
        std::binary_semaphore go{0};
        std::thread thread;
        Worker(Pool* pool, unsigned t) : thread([this, pool, t] {
            for (;;) {
                go.acquire();
                if (pool->stopping_) return;
                (*pool->job_)(t);
                pool->done_->count_down();
            }
        }) {}
    };
    std::vector<std::unique_ptr<Worker>> workers_;
    const std::function<void(unsigned)>* job_ = nullptr;
    std::latch* done_ = nullptr;
    std::atomic<bool> stopping_{false};
};
inline Pool g_pool;

// Runs body() once per CUDA thread of a grid of `grid` blocks of `block` threads (1-D blocks,
// 1-D or 2-D grids), one block after another. body calls the kernel: LAUNCH below makes one.
template <typename F> void launch(Idx grid, unsigned block, const F& body) {
    if (block == 0 || block > 1024) die("block size must be 1..1024");
    if (grid.x == 0 || grid.y == 0 || grid.z == 0) die("empty grid");
    gridDim = grid;
    blockDim = Idx{block, 1, 1};
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                Block b(block);
                g_block = &b;
                g_pool.run(block, [&](unsigned t) {
                    threadIdx = Idx{t, 0, 0};
                    blockIdx = Idx{bx, by, bz};
                    body();
                    b.warps[t >> 5]->arrive_and_drop();
                    b.all.arrive_and_drop();
                });
                g_block = nullptr;
            }
}
inline Idx grid1(unsigned long long n) {
    if (n == 0 || n > 0x7fffffffull) die("bad grid size");
    return Idx{(unsigned)n, 1, 1};
}

// ---- bit casts and correctly rounded arithmetic (-std=c++20 does not contract a*b+c) ----
template <typename To, typename From> inline To bits(From v) {
    static_assert(sizeof(To) == sizeof(From));
    To r;
    std::memcpy(&r, &v, sizeof r);
    return r;
}

inline float half_bits_to_float(unsigned short h) { return (float)bits<_Float16>(h); }
inline unsigned short float_to_half_bits(float f) { return bits<unsigned short>((_Float16)f); }

// ---- inline PTX: the prelude's two `cvt`s, recognised by their exact text ----
// The asm macro below names the operands f, x and r, which are the locals at the two sites; at
// each site one of x / r is not a local, and names these dummies instead.
struct NoOperand {};
constexpr int ptx_kind(std::string_view s) {
    if (s == R"("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits))") return 1;
    if (s == R"("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(f))") return 2;
    return 0;
}
template <int K, typename F, typename X, typename R> inline void ptx_asm(F& f, X& x, R& r) {
    static_assert(K != 0, "cuda_host.h: a kernel uses inline PTX this shim does not know (see ptx_kind)");
    if constexpr (K == 1) {
        f = half_bits_to_float(x.bits);
    } else if constexpr (K == 2) {
        r.bits = float_to_half_bits(f);
    }
    (void)f, (void)x, (void)r;
}
}  // namespace cuda_host

inline cuda_host::NoOperand x, r;  // see ptx_asm
#define asm(...)                                                                                  \
    do {                                                                                          \
        constexpr std::string_view cuda_host_asm_text = #__VA_ARGS__;                             \
        cuda_host::ptx_asm<cuda_host::ptx_kind(cuda_host_asm_text)>(f, x, r);                     \
    } while (0)

// ---- intrinsics ----
inline float __int_as_float(int v) { return cuda_host::bits<float>(v); }
inline float __uint_as_float(unsigned v) { return cuda_host::bits<float>(v); }
inline int __float_as_int(float v) { return cuda_host::bits<int>(v); }
inline unsigned __float_as_uint(float v) { return cuda_host::bits<unsigned>(v); }
inline double __longlong_as_double(long long v) { return cuda_host::bits<double>(v); }
inline long long __double_as_longlong(double v) { return cuda_host::bits<long long>(v); }

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dsqrt_rn(double a) { return sqrt(a); }

// CUDA's max/min overloads (floating point: fmaxf/fminf, so a NaN operand loses).
inline float max(float a, float b) { return fmaxf(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }

inline void __syncthreads() { cuda_host::g_block->all.arrive_and_wait(); }

// Atomics: the CUDA threads of a block are OS threads here, so these are real read-modify-writes
// (std::atomic_ref; floats by compare-and-swap, round to nearest). They return the old value.
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline double atomicAdd(double* p, double v) { return std::atomic_ref<double>(*p).fetch_add(v); }
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    return std::atomic_ref<unsigned long long>(*p).fetch_add(v);
}

namespace cuda_host {
// Lane `src` of this warp's value v (every lane of the warp must call it: converged code).
template <typename T> T shuffle(unsigned mask, T v, unsigned src, int width) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8);
    if (mask != 0xffffffffu || width != 32) die("shuffle: only full-warp masks and width 32 are modelled");
    const unsigned t = threadIdx.x, base = t & ~31u;
    if (base + 32 > blockDim.x) die("shuffle in a partial warp (blockDim.x not a multiple of 32)");
    Block& b = *g_block;
    std::memcpy(&b.slots[t], &v, sizeof(T));
    b.warps[t >> 5]->arrive_and_wait();
    T out;
    std::memcpy(&out, &b.slots[base + (src & 31u)], sizeof(T));
    b.warps[t >> 5]->arrive_and_wait();
    return out;
}
}  // namespace cuda_host
template <typename T> T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return cuda_host::shuffle(mask, v, (unsigned)src, width);
}
template <typename T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    return cuda_host::shuffle(mask, v, (threadIdx.x & 31u) ^ (unsigned)lane_mask, width);
}
template <typename T> T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    const unsigned lane = threadIdx.x & 31u;
    return cuda_host::shuffle(mask, v, lane + delta < 32 ? lane + delta : lane, width);
}
template <typename T> T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    const unsigned lane = threadIdx.x & 31u;
    return cuda_host::shuffle(mask, v, lane >= delta ? lane - delta : lane, width);
}

// kernel<<<grid, block>>>(args...) as LAUNCH(kernel, grid, block, args...); grid is a
// cuda_host::Idx or a block count. Each CUDA thread gets its own copy of the arguments.
#define LAUNCH(kernel, grid, block, ...) \
    cuda_host::launch(cuda_host::to_grid(grid), (block), [&] { kernel(__VA_ARGS__); })
namespace cuda_host {
inline Idx to_grid(Idx g) { return g; }
inline Idx to_grid(unsigned long long n) { return grid1(n); }
inline Idx grid2(unsigned x, unsigned y) { return Idx{x, y, 1}; }
}  // namespace cuda_host

// ---- the prelude, as NVRTC sees it ----
#include "../../../crates/weft-core/src/cuda/kernels/prelude.cuh"
