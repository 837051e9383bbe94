// decode_nvfp4.cu: split-K decode stage 1 for NVFP4 caches (kvkit/formats/nvfp4.py).
//
// Planes, in launcher order p0..p3: "k_data", "k_scale", "v_data", "v_scale", each
// (num_blocks, Hkv, block_size, width) uint8: D/2 bytes of E2M1 codes (element 2j in the low
// nibble of byte j) and D/16 E4M3 block scales (linear). The tiles hold e2m1 * e4m3(sf); the
// per-layer global scales fold in on the host: K's g into the softmax scale (scale * gk),
// V's g into v_out_scale (acc * gv when the partial state is written), so lse is the CPU
// path's (scores are the same function) and o matches (e2m1 * sf) * g up to float32 rounding.
//
// Defines: fmt.cuda_defines() (KV_HEAD_DIM, KV_PLANE_*_WIDTH, KV_NVFP4_BLOCK), KV_IN_DTYPE,
// KV_GROUP, KV_Q_LEN.

#ifndef KV_FORMAT_NVFP4
#error "decode_nvfp4.cu needs fmt.cuda_defines() of an NVFP4 format"
#endif

#define KV_NPLANES 4
#define KV_P0_BYTES KV_PLANE_K_DATA_WIDTH
#define KV_P0_ELEM 1
#define KV_P1_BYTES KV_PLANE_K_SCALE_WIDTH
#define KV_P1_ELEM 1
#define KV_P2_BYTES KV_PLANE_V_DATA_WIDTH
#define KV_P2_ELEM 1
#define KV_P3_BYTES KV_PLANE_V_SCALE_WIDTH
#define KV_P3_ELEM 1
#define KV_HAS_KMUL 0
#define KV_ROTATE_Q 0
#define KV_FAMILY_TABLE_FLOATS 0

#include "common/decode_codes.cuh"

// Elements d..d+3 (d % 4 == 0, so one block scale) of one staged token row (data rows are
// 2-byte aligned in every staging mode: D / 2 is a multiple of 8).
__device__ __forceinline__ float4 kv_nvfp4_row4(const unsigned char* data,
                                                const unsigned char* sf, int d) {
    const unsigned w = *reinterpret_cast<const unsigned short*>(data + d / 2);
    const float s = kv_dc_e4m3(sf[d / KV_NVFP4_BLOCK]);
    return make_float4(kv_dc_e2m1(w & 0xFu) * s, kv_dc_e2m1((w >> 4) & 0xFu) * s,
                       kv_dc_e2m1((w >> 8) & 0xFu) * s, kv_dc_e2m1((w >> 12) & 0xFu) * s);
}

__device__ __forceinline__ float4 kv_family_k4(const unsigned char* const* rows, int d,
                                               const float*) {
    return kv_nvfp4_row4(rows[0], rows[1], d);
}

__device__ __forceinline__ float4 kv_family_v4(const unsigned char* const* rows, int d,
                                               const float*) {
    return kv_nvfp4_row4(rows[2], rows[3], d);
}

// Tensor-core hooks (common/decode_mma.cuh): e2m1 * e4m3 products are exact fp16 operands
// (times 2^-8, see kv_dc_nvfp4x2_f16x2).
#define KV_MMA 1
#define KV_MMA_KF 256.0f
#define KV_MMA_VF 256.0f
__device__ __forceinline__ void kv_mma_k2(const unsigned char* const* rows, int d,
                                          const unsigned*, unsigned* hi, unsigned* lo) {
    *hi = kv_dc_nvfp4x2_f16x2(rows[0][d >> 1], kv_dc_nvfp4_sf_f16x2(rows[1][d / KV_NVFP4_BLOCK]));
    *lo = 0u;
}
// V elements d8..d8+7: 4 code bytes (4-byte aligned in the 16-byte aligned data rows), one
// block scale.
__device__ __forceinline__ uint4 kv_mma_v8(const unsigned char* const* rows, int d8) {
    const unsigned w = *reinterpret_cast<const unsigned*>(rows[2] + (d8 >> 1));
    const unsigned sf = kv_dc_nvfp4_sf_f16x2(rows[3][d8 / KV_NVFP4_BLOCK]);
    return make_uint4(kv_dc_nvfp4x2_f16x2(w & 0xFFu, sf), kv_dc_nvfp4x2_f16x2((w >> 8) & 0xFFu, sf),
                      kv_dc_nvfp4x2_f16x2((w >> 16) & 0xFFu, sf), kv_dc_nvfp4x2_f16x2(w >> 24, sf));
}

#include "common/decode_core.cuh"

// Grid (num_splits, Hkv, B), block kvd::THREADS, dynamic shared kv_decode_launch[0].
extern "C" __global__ __launch_bounds__(kvd::THREADS, KVD_MIN_BLOCKS) void kv_decode_nvfp4_stage1(
    const void* __restrict__ q,  // (B, q_len, Hq, D) KV_IN_DTYPE, C-contiguous
    const unsigned char* __restrict__ p0,  // k_data (num_blocks, Hkv, block_size, D/2)
    long long p0_sb, long long p0_sh, long long p0_st,  // its strides in elements (bytes)
    int p0_vec,  // widest aligned load in bytes (16, 8, 4, 2, 1)
    const unsigned char* __restrict__ p1,  // k_scale (num_blocks, Hkv, block_size, D/16)
    long long p1_sb, long long p1_sh, long long p1_st, int p1_vec,
    const unsigned char* __restrict__ p2,  // v_data, as k_data
    long long p2_sb, long long p2_sh, long long p2_st, int p2_vec,
    const unsigned char* __restrict__ p3,  // v_scale, as k_scale
    long long p3_sb, long long p3_sh, long long p3_st, int p3_vec,
    const int* __restrict__ block_tables,  // (B, max_blocks)
    int max_blocks,
    const int* __restrict__ seq_lens,  // (B,)
    int num_blocks, int block_size,
    int window,           // <= 0: no window
    float scale,          // softmax scale * k_scale (K global scale)
    float softcap,        // <= 0: no soft-cap
    float v_out_scale,    // v_scale (V global scale)
    int split_stride,     // MAX_SPLITS
    float* __restrict__ m_part,    // (B, q_len, Hq, split_stride)
    float* __restrict__ l_part,    // (B, q_len, Hq, split_stride)
    float* __restrict__ acc_part,  // (B, q_len, Hq, split_stride, D)
    float* __restrict__ o_out,     // (B, q_len, Hq, D) final o, or null: partial state only
    float* __restrict__ lse_out,   // (B, q_len, Hq) final lse (with o_out; one split, no sinks)
    int* __restrict__ error_flag)  // (1,)
{
    kv_stage1_body(q, p0, p0_sb, p0_sh, p0_st, p0_vec, p1, p1_sb, p1_sh, p1_st, p1_vec, p2,
                   p2_sb, p2_sh, p2_st, p2_vec, p3, p3_sb, p3_sh, p3_st, p3_vec, block_tables,
                   max_blocks, seq_lens, num_blocks, block_size, window, scale, softcap,
                   v_out_scale, split_stride, m_part, l_part, acc_part, o_out, lse_out,
                   error_flag);
}
