// decode_dense.cu: split-K decode stage 1 for the unquantized formats fp16 / bf16 and the
// per-layer-scaled fp8_e4m3 format (kvkit/formats/dense.py).
//
// Planes "k", "v": (num_blocks, Hkv, block_size, D) of fp16 / bf16 bits (2 bytes) or E4M3
// bytes. fp8: K's k_scale is folded into the softmax scale and V's v_scale into v_out_scale
// by the launcher, so the tiles hold e4m3(byte) only.
//
// Defines: fmt.cuda_defines() (KV_HEAD_DIM, KV_PLANE_K_WIDTH, KV_FORMAT_DENSE + KV_DENSE_BF16
// or KV_FORMAT_FP8), KV_IN_DTYPE (query dtype), KV_GROUP, KV_Q_LEN.

#if defined(KV_FORMAT_FP8)
#define KV_DENSE_ELEM 1
#elif defined(KV_FORMAT_DENSE)
#define KV_DENSE_ELEM 2
#else
#error "decode_dense.cu needs KV_FORMAT_DENSE or KV_FORMAT_FP8 (fmt.cuda_defines())"
#endif

#define KV_NPLANES 2
#define KV_P0_BYTES (KV_PLANE_K_WIDTH * KV_DENSE_ELEM)
#define KV_P0_ELEM KV_DENSE_ELEM
#define KV_P1_BYTES (KV_PLANE_V_WIDTH * KV_DENSE_ELEM)
#define KV_P1_ELEM KV_DENSE_ELEM
#define KV_HAS_KMUL 0
#define KV_ROTATE_Q 0
#define KV_FAMILY_TABLE_FLOATS 0

#include "common/decode_codes.cuh"
#include "common/vload.cuh"

#if KV_DENSE_ELEM == 1
__device__ __forceinline__ float4 kv_dense_row4(const unsigned char* row, int d) {
    const unsigned w = *reinterpret_cast<const unsigned*>(row + d);
    return make_float4(kv_dc_e4m3(w & 0xFFu), kv_dc_e4m3((w >> 8) & 0xFFu),
                       kv_dc_e4m3((w >> 16) & 0xFFu), kv_dc_e4m3(w >> 24));
}
#else
__device__ __forceinline__ float kv_dense_elem(unsigned bits) {
#if KV_DENSE_BF16
    return kv_dc_bf16((unsigned short)bits);
#else
    return kv_dc_f16((unsigned short)bits);
#endif
}
__device__ __forceinline__ float4 kv_dense_row4(const unsigned char* row, int d) {
    const uint2 w = *reinterpret_cast<const uint2*>(row + 2 * d);
    return make_float4(kv_dense_elem(w.x & 0xFFFFu), kv_dense_elem(w.x >> 16),
                       kv_dense_elem(w.y & 0xFFFFu), kv_dense_elem(w.y >> 16));
}
#endif

__device__ __forceinline__ float4 kv_family_k4(const unsigned char* const* rows, int d,
                                               const float*) {
    return kv_dense_row4(rows[0], d);
}

__device__ __forceinline__ float4 kv_family_v4(const unsigned char* const* rows, int d,
                                               const float*) {
    return kv_dense_row4(rows[1], d);
}

// Tensor-core hooks (common/decode_mma.cuh): fp16 and E4M3 values are exact fp16 operands;
// bf16 values (outside fp16's exponent range) are exact bf16 operands (KV_MMA_BF16).
#if KV_DENSE_ELEM == 1
#define KV_MMA 1
#define KV_MMA_KF KV_E4M3_F16_FACTOR
#define KV_MMA_VF KV_E4M3_F16_FACTOR
// Keys straight into registers (decode_mma.cuh KV_MMA_K_REGS): lane c's run is the KPL =
// D / 4 bytes at byte KPL c of the 16-byte aligned staged row, one or two vector loads per
// token; k-step ks takes run bytes 4 ks .. 4 ks + 3 (word ks, its halves h0 and h1).
#define KV_MMA_K_REGS 1
#define KV_MMA_KRAW (KV_HEAD_DIM / 16)
__device__ __forceinline__ int kv_mma_kpos(int ks, int j) { return 4 * ks + j; }
__device__ __forceinline__ void kv_mma_kload(const unsigned char* const* rows, int c,
                                             unsigned* raw) {
    constexpr int KPL = KV_HEAD_DIM / 4;
    kv_load_words<KPL / 4, ((KPL & -KPL) < 16 ? (KPL & -KPL) : 16)>(rows[0] + KPL * c, raw);
}
__device__ __forceinline__ void kv_mma_kstep(const unsigned* raw, int ks, const unsigned*,
                                             unsigned* h0, unsigned* h1) {
    *h0 = kv_dc_e4m3x2_f16x2(raw[ks] & 0xFFFFu);
    *h1 = kv_dc_e4m3x2_f16x2(raw[ks] >> 16);
}
// Tiles without a NaN code (decode_mma.cuh KV_MMA_NANTILE_K / _V): the same operands without
// the NaN patch.
#define KV_MMA_NANTILE_K KV_E4M3_NANTILE
#define KV_MMA_NANTILE_V KV_E4M3_NANTILE
__device__ __forceinline__ void kv_mma_kstep_finite(const unsigned* raw, int ks,
                                                    const unsigned*, unsigned* h0,
                                                    unsigned* h1) {
    kv_dc_e4m3x4_f16x2_finite(raw[ks], h0, h1);
}
// V straight into registers (decode_mma.cuh KV_MMA_V_REGS): lane group g's VPL = D / 8
// bytes at byte VPL g of the staged row (16-byte aligned rows, so VPL-aligned loads).
#define KV_MMA_V_REGS 1
#define KV_MMA_VRAW (KV_HEAD_DIM / 32)
__device__ __forceinline__ void kv_mma_vload(const unsigned char* const* rows, int g,
                                             unsigned* raw) {
    constexpr int VPL = KV_HEAD_DIM / 8;
    kv_load_words<VPL / 4, (VPL < 16 ? VPL : 16)>(rows[1] + VPL * g, raw);
}
// Elements 2j, 2j + 1 of the lane's run for tokens a (low halves) and b (high halves).
__device__ __forceinline__ unsigned kv_mma_vbytes(const unsigned* ra, const unsigned* rb, int j) {
    const int o = 2 * (j & 1);
    return __byte_perm(ra[j >> 1], rb[j >> 1],
                       o | ((4 + o) << 4) | ((o + 1) << 8) | ((5 + o) << 12));
}
__device__ __forceinline__ void kv_mma_vpair(const unsigned* ra, const unsigned* rb, int j,
                                             unsigned* w0, unsigned* w1) {
    const unsigned e = kv_mma_vbytes(ra, rb, j);
    *w0 = kv_dc_e4m3x2_f16x2(e & 0xFFFFu);
    *w1 = kv_dc_e4m3x2_f16x2(e >> 16);
}
__device__ __forceinline__ void kv_mma_vpair_finite(const unsigned* ra, const unsigned* rb,
                                                    int j, unsigned* w0, unsigned* w1) {
    kv_dc_e4m3x4_f16x2_finite(kv_mma_vbytes(ra, rb, j), w0, w1);
}
// fp8 keeps the CTA barrier on the cp.async path (decode_core.cuh KVD_CP_WARP_PIPE_ON): through
// KVKIT_ARCH=sm_80 on the H200 the page windows (2) were 3-6% faster at B = 1 / 8 / 32 but
// 2.5% slower at (64, 8192) (0.3108 -> 0.3174 ms), the shape fp8 is measured at.
#define KV_CP_ASYNC_V2_DEFAULT 0
#else
#define KV_MMA 1
#define KV_MMA_KF 1.0f
#define KV_MMA_VF 1.0f
// fp16 / bf16 K and V rows are read from the staging by ldmatrix (16-byte aligned rows);
// bf16 ones are bf16 mma operands (decode_mma.cuh KV_MMA_BF16).
#define KV_MMA_K_DIRECT 1
#define KV_MMA_V_DIRECT 1
// Tile copies on sm_90+ (decode_core.cuh KV_BULK_COPIES; KVKIT_DECODE_DENSE_BULK, env of the
// same name, kvkit/cuda/decode.py; A/B builds): 1 rows by the copy engine, one bulk copy per
// token row (kv_bulk_run), 0 the cp.async path (row runs, the build sm_80 runs). Default 0
// below head_dim 128 on sm_90 / sm_100, where a row is 64..224 bytes and the per-row copies'
// issue dominates (measured on the H200, session 25, call 6; graph ms, native copy engine
// against the cp.async path through KVKIT_ARCH=sm_80, two runs each: fp16 at D = 64 (32,
// 4096) 0.0840 / 0.0847 -> 0.0728 / 0.0731, (64, 8192) 0.3070 / 0.3073 -> 0.2605 / 0.2600,
// (16, 4096) -11%, (1, 32768) -8%; D = 96 (32, 4096) -2 to -3%; D = 128 +2.5%), 1 elsewhere
// (sm_120's not measured).
#if defined(KVKIT_DECODE_DENSE_BULK)
#define KV_DENSE_BULK KVKIT_DECODE_DENSE_BULK
#else
#define KV_DENSE_BULK (KV_HEAD_DIM >= 128 || KVKIT_ARCH >= 1200)
#endif
#if KV_DENSE_BULK
#define KV_BULK_COPIES 1
#endif
#define KV_MMA_BF16 KV_DENSE_BF16
#endif

#include "common/decode_core.cuh"

KV_DEFINE_STAGE1_KERNEL(kv_decode_dense_stage1)
