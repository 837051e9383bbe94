// dequant_turboquant.cu: TurboQuant slots -> float32 K/V, K in the original (un-rotated)
// space (kvkit/formats/turboquant.py decode; CPU twin kvkit/cpu/dequant.py).
//
//   K, FP8 preset:  e4m3(byte) * k_scale.
//   K, MSE presets: t = FWHT(c[idx]); f = norm16 / sqrt_d; k_i = (t_i * f) * s_i.
//   V:              v_i = float(q_i) * scale16 + zero16 (multiply, then add; no FMA).
// fp16 fields decode like codecs.f16_value (a NaN becomes the canonical quiet NaN of its
// sign), and every multiply / add follows the CPU's (x86 SSE) NaN rules: a NaN operand passes
// through quieted, an invalid operation gives the default NaN 0xFFC00000. Finite results are
// plain IEEE float32 either way.
// Launch define: KV_SLOT_T (int or long long).
//
// Mapping: one warp per (row, head); lane l owns elements [l*E, l*E + E), E = ceil(D/32).
// Negative slot: zeros. Slot >= capacity: zeros, error_flag |= 1.
#include "common/arch.cuh"
#include "common/fp16.cuh"
#include "common/fp8.cuh"
#include "common/bitpack.cuh"
#include "common/hadamard.cuh"

#if !defined(KV_FORMAT_TURBOQUANT) || !defined(KV_HEAD_DIM) || !defined(TQ_SLOT_BYTES)
#error "dequant_turboquant.cu needs the defines of a TurboQuant format (fmt.cuda_defines())"
#endif

// __launch_bounds__(.., 1): without the minimum-blocks hint ptxas for some targets (sm_86,
// sm_120a) caps registers for occupancy and spills a few bytes; with it, no target spills.
// Warps per CTA: 4, so a few rows still spread over many SMs.
#define TQ_WARPS 4
#define TQ_E ((KV_HEAD_DIM + 31) / 32)

#if !TQ_KEY_FP8
#if KV_HEAD_DIM % 32 || (32 % TQ_E)
#error "MSE keys need D = 32 * E with E a power of two (D in 64, 128, 256)"
#endif
#define TQ_NUM_CENTROIDS (1 << TQ_KEY_BITS)
__constant__ float kTqCentroids[TQ_NUM_CENTROIDS] = TQ_CENTROIDS;

#include "common/tq_signs.cuh"
#endif

__device__ __forceinline__ float kv_quiet(float a) { return __uint_as_float(__float_as_uint(a) | 0x400000u); }

__device__ __forceinline__ float kv_cpu_mul(float a, float b) {
    float r = __fmul_rn(a, b);
    if (r == r) return r;
    if (a != a) return kv_quiet(a);
    if (b != b) return kv_quiet(b);
    return __uint_as_float(0xFFC00000u);
}

__device__ __forceinline__ float kv_cpu_add(float a, float b) {
    float r = __fadd_rn(a, b);
    if (r == r) return r;
    if (a != a) return kv_quiet(a);
    if (b != b) return kv_quiet(b);
    return __uint_as_float(0xFFC00000u);
}

__device__ __forceinline__ float kv_cpu_div(float a, float b) {
    float r = __fdiv_rn(a, b);
    if (r == r) return r;
    if (a != a) return kv_quiet(a);
    if (b != b) return kv_quiet(b);
    return __uint_as_float(0xFFC00000u);
}

// codecs.f16_value of the little-endian fp16 at p[0..1], as float32.
__device__ __forceinline__ float kv_tq_f16_at(const unsigned char* p) {
    unsigned int h = (unsigned int)p[0] | ((unsigned int)p[1] << 8);
    if ((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu)) return __uint_as_float(((h & 0x8000u) << 16) | 0x7FC00000u);
    return kv_f16_to_float(h);
}

extern "C" __global__ __launch_bounds__(TQ_WARPS * 32, 1) void kvkit_dequant_turboquant(
    const KV_SLOT_T* __restrict__ slots,       // (N,) slot ids; negative = padding
    long long n_rows,                          // N
    int n_heads,                               // H
    long long capacity,                        // num_blocks * block_size
    int block_size,                            // tokens per page
    const unsigned char* __restrict__ plane,   // (num_blocks, H, block_size, TQ_SLOT_BYTES)
    long long s_stride_block,                  // bytes between pages
    long long s_stride_head,                   // bytes between heads
    long long s_stride_token,                  // bytes between tokens
    float k_scale,                             // () FP8-key presets: per-layer K scale
    float* __restrict__ out_k,                 // (N, H, D) float32, C-contiguous
    float* __restrict__ out_v,                 // (N, H, D) float32, C-contiguous
    int* __restrict__ error_flag)              // (1,) bit 1: a slot >= capacity
{
#if !TQ_KEY_FP8
    // Codebook in shared memory: per-lane indices hit distinct banks (<= 16 entries), where a
    // constant-memory lookup would serialize and a register select chain costs registers.
    __shared__ float s_cent[TQ_NUM_CENTROIDS];
    if (threadIdx.x < TQ_NUM_CENTROIDS) s_cent[threadIdx.x] = kTqCentroids[threadIdx.x];
    __syncthreads();
#endif
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * TQ_WARPS + warp;  // r * H + head
    if (row >= n_rows * n_heads) return;  // warp-uniform from here on
    const int h = (int)(row % n_heads);
    const long long r = row / n_heads;
    const long long slot = (long long)slots[r];
    const int i0 = lane * TQ_E;
    float* ok = out_k + row * KV_HEAD_DIM + i0;
    float* ov = out_v + row * KV_HEAD_DIM + i0;
    if (slot < 0 || slot >= capacity) {
        if (slot >= capacity && lane == 0 && h == 0) atomicOr(error_flag, 1);
#pragma unroll
        for (int j = 0; j < TQ_E; ++j) {
            if (i0 + j < KV_HEAD_DIM) {
                ok[j] = 0.0f;
                ov[j] = 0.0f;
            }
        }
        return;
    }
    const long long blk = slot / block_size;
    const long long off = slot - blk * block_size;
    const unsigned char* s = plane + blk * s_stride_block + h * s_stride_head + off * s_stride_token;

    // ---- K ----
#if TQ_KEY_FP8
#pragma unroll
    for (int j = 0; j < TQ_E; ++j) {
        if (i0 + j < KV_HEAD_DIM) ok[j] = kv_cpu_mul(kv_e4m3_decode(s[i0 + j]), k_scale);
    }
#else
    {
        float x[TQ_E];
#pragma unroll
        for (int j = 0; j < TQ_E; ++j) {
            x[j] = s_cent[kv_get_code<TQ_KEY_BITS>(s, i0 + j)];
        }
        kv_warp_fwht<TQ_E>(x);
        const float f = kv_cpu_div(kv_tq_f16_at(s + TQ_KEY_NORM_OFFSET), TQ_SQRT_D);
        const unsigned int sbits = kTqSignMask.w[i0 >> 5] >> (i0 & 31);
#pragma unroll
        for (int j = 0; j < TQ_E; ++j) {
            ok[j] = kv_cpu_mul(kv_cpu_mul(x[j], f), ((sbits >> j) & 1u) ? -1.0f : 1.0f);
        }
    }
#endif

    // ---- V ----
    {
        const float scale = kv_tq_f16_at(s + TQ_VALUE_SCALE_OFFSET);
        const float zero = kv_tq_f16_at(s + TQ_VALUE_ZERO_OFFSET);
#pragma unroll
        for (int j = 0; j < TQ_E; ++j) {
            if (i0 + j < KV_HEAD_DIM) {
                float q = (float)kv_get_code<TQ_VALUE_BITS>(s + TQ_VALUE_OFFSET, i0 + j);
                ov[j] = kv_cpu_add(kv_cpu_mul(q, scale), zero);
            }
        }
    }
}
