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

// s_d x: x with its sign bit flipped where s_d = -1, which is the product by -1 bit for bit
// (zeros, denormals and infinities included; a NaN stays a NaN). Where a warp's 32 lanes take
// 32 consecutive d, the mask word is one address for the warp: a per-lane index into a float
// table of signs made 32 constant-cache accesses of every such load.
__device__ __forceinline__ float kv_tq_signed(float x, int d) {
    const unsigned int bit = (kTqSignMask.w[d >> 5] >> (d & 31)) & 1u;
    return __uint_as_float(__float_as_uint(x) ^ (bit << 31));
}
