// softmax_state.cuh: online-softmax state (m, l, acc) helpers shared by decode stage 1 and 2.
//
// State of a row over a set of keys: m = max logit (-inf when the set is empty or nothing is
// visible), l = sum exp(logit - m) (0 when empty), acc = sum exp(logit - m) * v (0 when
// empty). Everything is float32 (DESIGN.md section 4). The one hazard is exp(-inf - -inf) =
// NaN: every helper here guards it, so empty states merge without NaN.
#pragma once

#define KV_WARP 32
#define KV_FULL_MASK 0xffffffffu

__device__ __forceinline__ float kv_neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float kv_warp_max(float x) {
#pragma unroll
    for (int off = KV_WARP / 2; off > 0; off >>= 1)
        x = fmaxf(x, __shfl_xor_sync(KV_FULL_MASK, x, off));
    return x;
}

__device__ __forceinline__ float kv_warp_sum(float x) {
#pragma unroll
    for (int off = KV_WARP / 2; off > 0; off >>= 1) x += __shfl_xor_sync(KV_FULL_MASK, x, off);
    return x;
}

// Weight exp(m_part - m_total) of a partial state in a merge; 0 for an empty part
// (m_part = -inf), and 0 rather than NaN when both are -inf.
__device__ __forceinline__ float kv_merge_weight(float m_part, float m_total) {
    return (m_part == kv_neg_inf()) ? 0.0f : expf(m_part - m_total);
}

// Online update of one row by a tile whose max logit is m_tile:
//   m_new = max(m_old, m_tile); alpha = exp(m_old - m_new) rescales (l, acc).
// When m_new is -inf (nothing visible yet) the state stays empty: alpha = 1, valid = false
// (callers then use p = 0 for every key instead of exp(s - m_new), which would be NaN).
struct KvOnlineStep {
    float m_new;
    float alpha;
    bool valid;
};

// Base 2 for the tensor-core core, whose logits carry the factor log2(e) (folded into the
// per-row score scale): exp2 is one special-function instruction (ex2.approx.ftz, about
// 2 ulp, like expf), where expf costs eight. Results below 2^-126 flush to 0: weights that
// small next to the row's max change no float32 sum. exp2(-inf) = 0.
#define KV_LOG2E 1.4426950408889634f
#define KV_LN2 0.6931471805599453f
__device__ __forceinline__ float kv_exp2_fast(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
// exp(x), or 2^x for base-2 logits.
template <bool BASE2>
__device__ __forceinline__ float kv_exp_base(float x) {
    if constexpr (BASE2) {
        return kv_exp2_fast(x);
    } else {
        return expf(x);
    }
}

template <bool BASE2 = false>
__device__ __forceinline__ KvOnlineStep kv_online_step(float m_old, float m_tile) {
    KvOnlineStep st;
    st.m_new = fmaxf(m_old, m_tile);
    st.valid = st.m_new != kv_neg_inf();
    // m_old = -inf with a finite m_new gives exp(-inf) = 0: the empty state is cleared.
    st.alpha = st.valid ? kv_exp_base<BASE2>(m_old - st.m_new) : 1.0f;
    return st;
}

// exp(s - m_new) for a key, 0 for a masked key (s = -inf) and for an empty state.
template <bool BASE2 = false>
__device__ __forceinline__ float kv_online_p(float s, const KvOnlineStep& st) {
    return st.valid ? kv_exp_base<BASE2>(s - st.m_new) : 0.0f;
}
