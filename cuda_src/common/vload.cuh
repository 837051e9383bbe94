// vload.cuh: W consecutive 32-bit words into registers with the widest loads (16, 8 or 4
// bytes) that W and the address's alignment allow. Shared by the write kernels' input loads
// (alignment known at run time) and the decode V operands (known at compile time), so the
// vector-width cases are written once.
#pragma once

// p is ALIGN-byte aligned (16, 8 or 4), known at compile time; w receives W words.
template <int W, int ALIGN>
__device__ __forceinline__ void kv_load_words(const void* p, unsigned int* w) {
    if constexpr (ALIGN >= 16 && W % 4 == 0) {
#pragma unroll
        for (int j = 0; j < W / 4; ++j) {
            const uint4 u = static_cast<const uint4*>(p)[j];
            w[4 * j] = u.x;
            w[4 * j + 1] = u.y;
            w[4 * j + 2] = u.z;
            w[4 * j + 3] = u.w;
        }
    } else if constexpr (ALIGN >= 8 && W % 2 == 0) {
#pragma unroll
        for (int j = 0; j < W / 2; ++j) {
            const uint2 u = static_cast<const uint2*>(p)[j];
            w[2 * j] = u.x;
            w[2 * j + 1] = u.y;
        }
    } else {
#pragma unroll
        for (int j = 0; j < W; ++j) w[j] = static_cast<const unsigned int*>(p)[j];
    }
}

// The same with the alignment found at run time; false (nothing loaded) when p is not even
// 4-byte aligned.
template <int W>
__device__ __forceinline__ bool kv_load_words_any(const void* p, unsigned int* w) {
    const unsigned long long a = reinterpret_cast<unsigned long long>(p);
    if ((a & 15ull) == 0) {
        kv_load_words<W, 16>(p, w);
    } else if ((a & 7ull) == 0) {
        kv_load_words<W, 8>(p, w);
    } else if ((a & 3ull) == 0) {
        kv_load_words<W, 4>(p, w);
    } else {
        return false;
    }
    return true;
}
