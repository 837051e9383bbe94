// write_nvfp4.cu: NVFP4 quantize-on-write (kvkit/formats/nvfp4.py; CPU twin kvkit/cpu/write.py).
//
// Per 16-element block x (float32), in this order (no fused multiply-add anywhere):
//   amax = fmaxf-fold of |x_i| (NaN-ignoring)
//   sf   = e4m3_satfinite(amax / (6 * g));  den = e4m3(sf) * g;  inv = den != 0 ? 1 / den : 0
//   q_i  = e2m1_satfinite(x_i * inv)
// KV_NVFP4_FOUR_OVER_SIX=1 also forms the candidate with 4 in place of 6 and keeps it when its
// squared error sum_i d_i*d_i (d_i = x_i - (e2m1(q_i) * e4m3(sf)) * g, summed i = 0..15 in
// float32) is strictly lower.
// Launch defines: KV_IN_DTYPE (0 float32, 1 float16, 2 bfloat16 bits), KV_SLOT_T.
//
// Mapping: one thread per (token, head, 16-element block), K then V. Negative slot: skipped.
// Slot >= capacity: skipped, error_flag |= 1 (once per token).
#include "common/arch.cuh"
#include "common/fp16.cuh"
#include "common/fp8.cuh"
#include "common/fp4.cuh"
#include "common/paged.cuh"

#if !defined(KV_FORMAT_NVFP4) || !defined(KV_HEAD_DIM) || !defined(KV_NVFP4_BLOCK)
#error "write_nvfp4.cu needs the defines of an NVFP4 format (fmt.cuda_defines())"
#endif
#if KV_NVFP4_BLOCK != 16
#error "the kernel's register layout assumes 16-element scale blocks"
#endif

// __launch_bounds__(.., 1): without the minimum-blocks hint ptxas for some targets (sm_86,
// sm_120a) caps registers for occupancy and spills a few bytes; with it, no target spills.
// 128 threads: one block scale per thread keeps ~50 registers live (16 inputs, 2 candidates);
// small CTAs spread short writes (a few tokens) over more SMs.
#define KV_WRITE_NVFP4_THREADS 128
#define KV_NVFP4_BLOCKS (KV_HEAD_DIM / KV_NVFP4_BLOCK)

// One candidate: codes packed as 8 bytes (w[0] bytes 0..3, w[1] bytes 4..7); returns sf code.
// finite: amax is finite (so is every x_i). Then with a finite inv no product is NaN and the
// encoder without NaN handling gives the same bytes (a NaN or infinite amax is rare: the
// general encoder, per thread).
__device__ __forceinline__ unsigned int kv_nvfp4_candidate(const float (&x)[16], float amax, bool finite, float target,
                                                           float g, unsigned int (&w)[2], float& sfv) {
    unsigned int sfc = kv_e4m3_encode(__fdiv_rn(amax, __fmul_rn(target, g)));
    sfv = kv_e4m3_decode_pos(sfc);  // sfc <= 0x7F: amax >= 0 or NaN
    float den = __fmul_rn(sfv, g);
    float inv = 0.0f;
    if (den != 0.0f) inv = __frcp_rn(den);  // == __fdiv_rn(1, den); NaN den gives NaN, as the CPU
    w[0] = 0u;
    w[1] = 0u;
    if (finite && fabsf(inv) < __uint_as_float(0x7F800000u)) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            unsigned int b = kv_e2m1x2_encode_nonan(__fmul_rn(x[2 * j], inv), __fmul_rn(x[2 * j + 1], inv));
            w[j >> 2] |= b << (8 * (j & 3));
        }
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            unsigned int b = kv_e2m1x2_encode(__fmul_rn(x[2 * j], inv), __fmul_rn(x[2 * j + 1], inv));
            w[j >> 2] |= b << (8 * (j & 3));
        }
    }
    return sfc;
}

__device__ __forceinline__ float kv_nvfp4_sq_error(const float (&x)[16], const unsigned int (&w)[2], float sfv,
                                                   float g) {
    float err = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        unsigned int code = (w[i >> 3] >> (4 * (i & 7))) & 0xFu;
        float d = __fsub_rn(x[i], __fmul_rn(__fmul_rn(kv_e2m1_value_scaled(code), sfv), g));
        float dd = __fmul_rn(d, d);
        err = i == 0 ? dd : __fadd_rn(err, dd);
    }
    return err;
}

__device__ __forceinline__ void kv_nvfp4_encode_block(const float (&x)[16], float g, unsigned char* data,
                                                      unsigned char* sf) {
    // amax with NaN propagating (max.NaN, the same cost): finite means no NaN or inf input;
    // otherwise the spec's NaN-ignoring fold again (rare).
    float amax = fabsf(x[0]);
#pragma unroll
    for (int i = 1; i < 16; ++i) asm("max.NaN.f32 %0, %1, %2;" : "=f"(amax) : "f"(amax), "f"(fabsf(x[i])));
    const bool finite = fabsf(amax) < __uint_as_float(0x7F800000u);
    if (!finite) {
        amax = fabsf(x[0]);
#pragma unroll
        for (int i = 1; i < 16; ++i) amax = fmaxf(amax, fabsf(x[i]));  // a NaN operand loses
    }
    unsigned int w[2];
    float sfv;
    unsigned int sfc = kv_nvfp4_candidate(x, amax, finite, 6.0f, g, w, sfv);
#if KV_NVFP4_FOUR_OVER_SIX
    {
        unsigned int w4[2];
        float sfv4;
        unsigned int sfc4 = kv_nvfp4_candidate(x, amax, finite, 4.0f, g, w4, sfv4);
        if (kv_nvfp4_sq_error(x, w4, sfv4, g) < kv_nvfp4_sq_error(x, w, sfv, g)) {  // ties keep 6
            sfc = sfc4;
            w[0] = w4[0];
            w[1] = w4[1];
        }
    }
#endif
    if ((reinterpret_cast<unsigned long long>(data) & 7ull) == 0) {
        *reinterpret_cast<uint2*>(data) = make_uint2(w[0], w[1]);
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) data[j] = (unsigned char)(w[j >> 2] >> (8 * (j & 3)));
    }
    *sf = (unsigned char)sfc;
}

extern "C" __global__ __launch_bounds__(KV_WRITE_NVFP4_THREADS, 1) void kvkit_write_nvfp4(
    const void* __restrict__ k,                  // (N, H, D) KV_IN_DTYPE, C-contiguous
    const void* __restrict__ v,                  // (N, H, D) KV_IN_DTYPE, C-contiguous
    const KV_SLOT_T* __restrict__ slot_mapping,  // (N,) slot = block * block_size + offset
    long long n_tokens,                          // N
    int n_heads,                                 // H
    long long capacity,                          // num_blocks * block_size
    int block_size,                              // tokens per page
    unsigned char* __restrict__ k_data,          // (num_blocks, H, block_size, D/2) via strides
    long long kd_stride_block,                   // bytes between pages
    long long kd_stride_head,                    // bytes between heads
    long long kd_stride_token,                   // bytes between tokens
    unsigned char* __restrict__ k_sf,            // (num_blocks, H, block_size, D/16) via strides
    long long ks_stride_block,                   // bytes
    long long ks_stride_head,                    // bytes
    long long ks_stride_token,                   // bytes
    unsigned char* __restrict__ v_data,          // (num_blocks, H, block_size, D/2) via strides
    long long vd_stride_block,                   // bytes
    long long vd_stride_head,                    // bytes
    long long vd_stride_token,                   // bytes
    unsigned char* __restrict__ v_sf,            // (num_blocks, H, block_size, D/16) via strides
    long long vs_stride_block,                   // bytes
    long long vs_stride_head,                    // bytes
    long long vs_stride_token,                   // bytes
    float k_scale,                               // () per-layer K global scale g
    float v_scale,                               // () per-layer V global scale g
    int* __restrict__ error_flag)                // (1,) bit 1: a slot >= capacity
{
    long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (gid >= n_tokens * n_heads * KV_NVFP4_BLOCKS) return;
    const int b = (int)(gid % KV_NVFP4_BLOCKS);
    const long long row = gid / KV_NVFP4_BLOCKS;  // token * H + head
    const bool narrow = kv_write_indices_narrow(n_tokens, n_heads, capacity);
    long long t, blk, off;
    int h;
    kv_row_token_head(row, n_heads, narrow, &t, &h);
    const long long slot = (long long)slot_mapping[t];
    if (slot < 0) return;
    if (slot >= capacity) {
        if (h == 0 && b == 0) atomicOr(error_flag, 1);
        return;
    }
    kv_slot_page(slot, block_size, narrow, &blk, &off);
    const long long src = row * KV_HEAD_DIM + b * KV_NVFP4_BLOCK;
    // K's and V's loads both before any arithmetic: one memory wait per thread, not two.
    unsigned int kw[KvInputWords<KV_IN_DTYPE, 16>::n], vw[KvInputWords<KV_IN_DTYPE, 16>::n];
    kv_load_input_words<KV_IN_DTYPE, 16>(k, src, kw);
    kv_load_input_words<KV_IN_DTYPE, 16>(v, src, vw);
    float x[16];
    kv_widen_input_words<KV_IN_DTYPE, 16>(kw, x);
    kv_nvfp4_encode_block(x, k_scale,
                          k_data + blk * kd_stride_block + h * kd_stride_head + off * kd_stride_token + b * 8,
                          k_sf + blk * ks_stride_block + h * ks_stride_head + off * ks_stride_token + b);
    kv_widen_input_words<KV_IN_DTYPE, 16>(vw, x);
    kv_nvfp4_encode_block(x, v_scale,
                          v_data + blk * vd_stride_block + h * vd_stride_head + off * vd_stride_token + b * 8,
                          v_sf + blk * vs_stride_block + h * vs_stride_head + off * vs_stride_token + b);
}
