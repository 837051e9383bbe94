// write_turboquant.cu: TurboQuant quantize-on-write (kvkit/formats/turboquant.py; CPU twin
// kvkit/cpu/write.py), one fused kernel: norms, rotation, bucketing, V quantization, packing.
//
// Slot per token-head: [K | V | pad to even], TQ_SLOT_BYTES bytes, every byte written.
// K, FP8 preset (TQ_KEY_FP8=1): D bytes e4m3_satfinite(k / k_scale).
// K, MSE presets, float32 in this order:
//   n = sqrt(sum_squares(k)); t = FWHT(s * k); den = sqrt_d * n;
//   y_i = den != 0 ? t_i / den : 0; idx_i = #{midpoints <= y_i};
//   cn = sqrt(sum_squares(c[idx])); norm = fp16_sat(cn != 0 ? n / cn : 0)
// V: lo / hi = first-occurring NaN-ignoring min / max (the CPU's sequential scan, so the sign
//   of a zero lo matches too); scale = max((hi - lo) / (2^b - 1), floor);
//   q_i = clamp(floor((v_i - lo) / scale + 0.5), 0, 2^b - 1); fp16_sat(scale), fp16_sat(lo).
// Launch defines: KV_IN_DTYPE (0 float32, 1 float16, 2 bfloat16 bits), KV_SLOT_T.
//
// Mapping: one warp per (token, head). Lane l holds elements [l*E, l*E + E), E = ceil(D/32)
// (the spec's reduction layout; MSE keys need D = 32 E). Codes are staged in shared memory,
// then lanes pack bytes; the slot is assembled in shared memory and stored with 16-bit stores.
// Negative slot: skipped. Slot >= capacity: skipped, error_flag |= 1.
#include "common/arch.cuh"
#include "common/fp16.cuh"
#include "common/fp8.cuh"
#include "common/bitpack.cuh"
#include "common/hadamard.cuh"
#include "common/paged.cuh"

#if !defined(KV_FORMAT_TURBOQUANT) || !defined(KV_HEAD_DIM) || !defined(TQ_SLOT_BYTES)
#error "write_turboquant.cu needs the defines of a TurboQuant format (fmt.cuda_defines())"
#endif
#if TQ_SLOT_BYTES % 2
#error "TurboQuant slots are padded to an even size"
#endif

// __launch_bounds__(.., 1): without the minimum-blocks hint ptxas for some targets (sm_86,
// sm_120a) caps registers for occupancy and spills a few bytes; with it, no target spills.
// Warps per CTA: 4 keeps CTAs small so a handful of tokens still spreads over many SMs, and
// shared memory at 4 * (D + slot bytes) <= 5.2 KB at D = 512.
#define TQ_WARPS 4
#define TQ_E ((KV_HEAD_DIM + 31) / 32)
#define TQ_V_TOP ((1 << TQ_VALUE_BITS) - 1)

#if !TQ_KEY_FP8
#if KV_HEAD_DIM % 32 || (32 % TQ_E)
#error "MSE keys need D = 32 * E with E a power of two (D in 64, 128, 256)"
#endif
#define TQ_NUM_CENTROIDS (1 << TQ_KEY_BITS)
__constant__ float kTqCentroids[TQ_NUM_CENTROIDS] = TQ_CENTROIDS;
__constant__ float kTqMidpoints[TQ_NUM_CENTROIDS - 1] = TQ_MIDPOINTS;

// The rotation signs as a bit mask (bit i set where s_i = -1), built at compile time.
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
#endif

// Warp combine of "first-occurring NaN-ignoring min" (MAXIMUM=false) or max over lanes whose
// chunks are in index order; a NaN (also a lane with no elements) is the identity. Distances
// 1, 2, 4, 8, 16 in increasing order, so each step joins two adjacent runs of lanes, lower run
// first: the CPU writer's sequential scan, ties included (-0 before +0). Decreasing distances
// join interleaved lane sets and gave +0 for -0 on lane 1 and +0 on lane 2 (the stored zero's
// sign differed from the CPU's).
template <bool MAXIMUM>
__device__ __forceinline__ float kv_warp_first_extreme(float mine, int lane) {
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        float other = __shfl_xor_sync(KV_FULL_WARP, mine, off);
        bool lower = (lane & off) == 0;
        float a = lower ? mine : other;  // lower-index segment
        float b = lower ? other : mine;  // higher-index segment
        bool take_b = (MAXIMUM ? (b > a) : (b < a)) || (a != a);
        mine = take_b ? b : a;
    }
    return mine;
}

extern "C" __global__ __launch_bounds__(TQ_WARPS * 32, 1) void kvkit_write_turboquant(
    const void* __restrict__ k,                  // (N, H, D) KV_IN_DTYPE, C-contiguous
    const void* __restrict__ v,                  // (N, H, D) KV_IN_DTYPE, C-contiguous
    const KV_SLOT_T* __restrict__ slot_mapping,  // (N,) slot = block * block_size + offset
    long long n_tokens,                          // N
    int n_heads,                                 // H
    long long capacity,                          // num_blocks * block_size
    int block_size,                              // tokens per page
    unsigned char* __restrict__ slots,           // (num_blocks, H, block_size, TQ_SLOT_BYTES)
    long long s_stride_block,                    // bytes between pages
    long long s_stride_head,                     // bytes between heads
    long long s_stride_token,                    // bytes between tokens
    float k_scale,                               // () FP8-key presets: per-layer K scale
    int* __restrict__ error_flag)                // (1,) bit 1: a slot >= capacity
{
    __shared__ unsigned char s_codes[TQ_WARPS][TQ_E * 32];
    __shared__ unsigned short s_slot16[TQ_WARPS][TQ_SLOT_BYTES / 2];
#if !TQ_KEY_FP8
    // Codebook in shared memory: per-lane indices hit distinct banks (<= 16 entries), where a
    // constant-memory lookup would serialize and a register select chain costs registers.
    __shared__ float s_cent[TQ_NUM_CENTROIDS];
    // The midpoints padded with a NaN to 2^b entries, for the binary search below.
    __shared__ float s_mid[TQ_NUM_CENTROIDS];
    if (threadIdx.x < TQ_NUM_CENTROIDS) {
        s_cent[threadIdx.x] = kTqCentroids[threadIdx.x];
        s_mid[threadIdx.x] = threadIdx.x < TQ_NUM_CENTROIDS - 1 ? kTqMidpoints[threadIdx.x]
                                                                : __uint_as_float(0x7FC00000u);
    }
    __syncthreads();
#endif
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * TQ_WARPS + warp;  // token * H + head
    if (row >= n_tokens * n_heads) return;  // warp-uniform from here on
    const bool narrow = kv_write_indices_narrow(n_tokens, n_heads, capacity);
    long long t, blk, off;
    int h;
    kv_row_token_head(row, n_heads, narrow, &t, &h);
    const long long slot = (long long)slot_mapping[t];
    if (slot < 0) return;
    if (slot >= capacity) {
        if (lane == 0 && h == 0) atomicOr(error_flag, 1);
        return;
    }
    kv_slot_page(slot, block_size, narrow, &blk, &off);
    unsigned char* sb = reinterpret_cast<unsigned char*>(s_slot16[warp]);
    unsigned char* sc = s_codes[warp];
    const long long src = row * KV_HEAD_DIM;
    const int i0 = lane * TQ_E;

    // ---- K ----
#if TQ_KEY_FP8
#pragma unroll
    for (int j = 0; j < TQ_E; ++j) {
        int i = i0 + j;
        if (i < KV_HEAD_DIM) sb[i] = (unsigned char)kv_e4m3_encode(__fdiv_rn(kv_input_to_float<KV_IN_DTYPE>(k, src + i), k_scale));
    }
#else
    {
        float x[TQ_E];
        kv_load_inputs<KV_IN_DTYPE, TQ_E>(k, src + i0, x);  // D = 32 E: every lane is full
        const float n = __fsqrt_rn(kv_warp_sum_squares<TQ_E>(x));
        const unsigned int sbits = kTqSignMask.w[i0 >> 5] >> (i0 & 31);
#pragma unroll
        for (int j = 0; j < TQ_E; ++j) x[j] = __fmul_rn(x[j], ((sbits >> j) & 1u) ? -1.0f : 1.0f);
        kv_warp_fwht<TQ_E>(x);
        const float den = __fmul_rn(TQ_SQRT_D, n);
#pragma unroll
        for (int j = 0; j < TQ_E; ++j) {
            float y = 0.0f;
            if (den != 0.0f) y = __fdiv_rn(x[j], den);
            // idx = #{midpoints <= y}: the midpoints ascend (strictly ascending codebooks,
            // kvkit.formats.codebook), so a binary search counts them in b steps; a NaN y
            // (or the NaN pad) compares false, as in the linear count.
            int idx = 0;
#pragma unroll
            for (int step = TQ_NUM_CENTROIDS / 2; step > 0; step >>= 1)
                if (s_mid[idx + step - 1] <= y) idx += step;
            sc[i0 + j] = (unsigned char)idx;
            x[j] = s_cent[idx];
        }
        const float cn = __fsqrt_rn(kv_warp_sum_squares<TQ_E>(x));
        float ratio = 0.0f;
        if (cn != 0.0f) ratio = __fdiv_rn(n, cn);
        __syncwarp();
        for (int j = lane; j < TQ_KEY_INDEX_BYTES; j += 32) sb[j] = (unsigned char)kv_pack_byte<TQ_KEY_BITS>(sc, j, KV_HEAD_DIM);
        if (lane == 0) {
            unsigned int bits = kv_f16_bits_sat(ratio);
            sb[TQ_KEY_NORM_OFFSET] = (unsigned char)(bits & 0xFFu);
            sb[TQ_KEY_NORM_OFFSET + 1] = (unsigned char)(bits >> 8);
        }
        __syncwarp();  // every lane has packed its key bytes before sc is reused for V
    }
#endif

    // ---- V ----
    {
        float x[TQ_E];
        const float nan = __uint_as_float(0x7FC00000u);
        if (i0 + TQ_E <= KV_HEAD_DIM) {
            kv_load_inputs<KV_IN_DTYPE, TQ_E>(v, src + i0, x);
        } else {  // the last lanes when D is not a multiple of 32 (FP8 keys)
#pragma unroll
            for (int j = 0; j < TQ_E; ++j)
                x[j] = (i0 + j < KV_HEAD_DIM) ? kv_input_to_float<KV_IN_DTYPE>(v, src + i0 + j) : nan;
        }
        float lo = x[0], hi = x[0];
#pragma unroll
        for (int j = 1; j < TQ_E; ++j) {
            if (x[j] < lo || lo != lo) lo = x[j];
            if (x[j] > hi || hi != hi) hi = x[j];
        }
        lo = kv_warp_first_extreme<false>(lo, lane);
        hi = kv_warp_first_extreme<true>(hi, lane);
        const float top = (float)TQ_V_TOP;
        float scale = __fdiv_rn(__fsub_rn(hi, lo), top);
        if (!(scale >= TQ_V_SCALE_FLOOR)) scale = TQ_V_SCALE_FLOOR;
#pragma unroll
        for (int j = 0; j < TQ_E; ++j) {
            if (i0 + j < KV_HEAD_DIM) {
                float q = floorf(__fadd_rn(__fdiv_rn(__fsub_rn(x[j], lo), scale), 0.5f));
                if (!(q >= 0.0f)) q = 0.0f;
                if (q > top) q = top;
                sc[i0 + j] = (unsigned char)(int)q;
            }
        }
        __syncwarp();
        for (int j = lane; j < kv_packed_bytes(KV_HEAD_DIM, TQ_VALUE_BITS); j += 32) {
            sb[TQ_VALUE_OFFSET + j] = (unsigned char)kv_pack_byte<TQ_VALUE_BITS>(sc, j, KV_HEAD_DIM);
        }
        if (lane == 0) {
            unsigned int sbits = kv_f16_bits_sat(scale);
            unsigned int zbits = kv_f16_bits_sat(lo);
            sb[TQ_VALUE_SCALE_OFFSET] = (unsigned char)(sbits & 0xFFu);
            sb[TQ_VALUE_SCALE_OFFSET + 1] = (unsigned char)(sbits >> 8);
            sb[TQ_VALUE_ZERO_OFFSET] = (unsigned char)(zbits & 0xFFu);
            sb[TQ_VALUE_ZERO_OFFSET + 1] = (unsigned char)(zbits >> 8);
            for (int j = TQ_VALUE_ZERO_OFFSET + 2; j < TQ_SLOT_BYTES; ++j) sb[j] = 0;  // pad
        }
        __syncwarp();
    }

    // ---- store the slot ----
    unsigned char* dst = slots + blk * s_stride_block + h * s_stride_head + off * s_stride_token;
    if ((reinterpret_cast<unsigned long long>(dst) & 1ull) == 0) {
        unsigned short* d16 = reinterpret_cast<unsigned short*>(dst);
        for (int j = lane; j < TQ_SLOT_BYTES / 2; j += 32) d16[j] = s_slot16[warp][j];
    } else {
        for (int j = lane; j < TQ_SLOT_BYTES; j += 32) dst[j] = sb[j];
    }
}
