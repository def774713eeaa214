// Copies and fills by element size (1, 2, 4 or 8 bytes): every dtype moves as raw words.

// out[i] = in[strided_offset(src, i)] for the n elements of a view: makes any view contiguous,
// and broadcasts with zero strides.
#define GATHER(T, NAME) \
extern "C" __global__ void NAME(T* out, const T* in, Strided src, u64 n) { \
    FOR_EACH(i, n) out[i] = in[strided_offset(src, i)]; \
}
GATHER(unsigned char, gather_1)
GATHER(unsigned short, gather_2)
GATHER(u32, gather_4)
GATHER(u64, gather_8)

// out[strided_offset(dst, i)] = in[i]: writes a contiguous block into a view (copy_from, cat).
#define SCATTER(T, NAME) \
extern "C" __global__ void NAME(T* out, const T* in, Strided dst, u64 n) { \
    FOR_EACH(i, n) out[strided_offset(dst, i)] = in[i]; \
}
SCATTER(unsigned char, scatter_1)
SCATTER(unsigned short, scatter_2)
SCATTER(u32, scatter_4)
SCATTER(u64, scatter_8)

// out[i] = pattern for n elements (the pattern is the value already encoded in the dtype).
#define FILL(T, NAME) \
extern "C" __global__ void NAME(T* out, T pattern, u64 n) { \
    FOR_EACH(i, n) out[i] = pattern; \
}
FILL(unsigned char, fill_1)
FILL(unsigned short, fill_2)
FILL(u32, fill_4)
FILL(u64, fill_8)
