// tq_signs.cuh: TurboQuant's rotation signs s (kvkit/formats/turboquant.py, TQ_SIGNS) as a bit
// mask in __constant__ memory, bit i set where s_i = -1, built at compile time.
// Needs KV_HEAD_DIM (a multiple of 32) and TQ_SIGNS (an initializer of KV_HEAD_DIM ints +-1).
#pragma once

struct KvTqSignMask {
    unsigned int w[KV_HEAD_DIM / 32];
};
__host__ __device__ constexpr KvTqSignMask kv_tq_sign_mask() {
    KvTqSignMask m{};
    constexpr int s[KV_HEAD_DIM] = TQ_SIGNS;
    for (int i = 0; i < KV_HEAD_DIM; ++i) {
        if (s[i] < 0) m.w[i >> 5] |= 1u << (i & 31);
    }
    return m;
}
__constant__ KvTqSignMask kTqSignMask = kv_tq_sign_mask();

// Mask word j (dims 32 j .. 32 j + 31) as an immediate: a select chain over the compile-time
// words instead of a kTqSignMask load. The decode prologue signs the query once per CTA,
// between the query's arrival and the first tile, where a constant-bank load that misses
// (the first of a launch) waits on memory; with the codebook's immediates
// (decode_turboquant.cu) 1-2% off TurboQuant's small-batch steps on the H200
// (benchmarks/NOTES.md v26). The write and dequant kernels keep the loads (once per row, the
// cache warm over a long launch).
// (The selects are inline PTX: written in C++, the compiler folds the chain back into one
// indexed load of the words from local memory.)
__device__ __forceinline__ unsigned int kv_tq_sign_word(int j) {
    constexpr KvTqSignMask m = kv_tq_sign_mask();
    unsigned int w = m.w[0];
#pragma unroll
    for (int i = 1; i < KV_HEAD_DIM / 32; ++i) {
        asm("{ .reg .pred p; setp.eq.s32 p, %1, %2; selp.b32 %0, %3, %0, p; }"
            : "+r"(w)
            : "r"(j), "r"(i), "r"(m.w[i]));
    }
    return w;
}

// s_d x: x with its sign bit flipped where s_d = -1, which is the product by -1 bit for bit
// (zeros, denormals and infinities included; a NaN stays a NaN).
__device__ __forceinline__ float kv_tq_signed(float x, int d) {
    const unsigned int bit = (kv_tq_sign_word(d >> 5) >> (d & 31)) & 1u;
    return __uint_as_float(__float_as_uint(x) ^ (bit << 31));
}
