// dequant_nvfp4.cu: NVFP4 cache rows -> float32 K/V (kvkit/formats/nvfp4.py decode_blocks).
//
//   value_i = (e2m1(code_i) * e4m3(sf_block)) * g, two float32 multiplies in that order; a NaN
//   scale byte (0x7F / 0xFF) passes its NaN through, as the CPU's multiplies do.
// Launch define: KV_SLOT_T (int or long long).
//
// Mapping: one thread per (row, head, 16-element block), K and V.
// Negative slot: zeros. Slot >= capacity: zeros, error_flag |= 1 (once per row).
#include "common/arch.cuh"
#include "common/fp8.cuh"
#include "common/fp4.cuh"

#if !defined(KV_FORMAT_NVFP4) || !defined(KV_HEAD_DIM) || !defined(KV_NVFP4_BLOCK)
#error "dequant_nvfp4.cu needs the defines of an NVFP4 format (fmt.cuda_defines())"
#endif
#if KV_NVFP4_BLOCK != 16
#error "the kernel's register layout assumes 16-element scale blocks"
#endif

// __launch_bounds__(.., 1): without the minimum-blocks hint ptxas for some targets (sm_86,
// sm_120a) caps registers for occupancy and spills a few bytes; with it, no target spills.
// 128 threads: one 16-element block (8 data bytes + 1 scale byte -> 64 output bytes) each.
#define KV_DEQUANT_NVFP4_THREADS 128
#define KV_NVFP4_BLOCKS (KV_HEAD_DIM / KV_NVFP4_BLOCK)

__device__ __forceinline__ void kv_nvfp4_dequant_block(const unsigned char* data, const unsigned char* sf, float g,
                                                       float* out, bool live) {
    float y[16];
    if (live) {
        unsigned int w[2];
        if ((reinterpret_cast<unsigned long long>(data) & 7ull) == 0) {
            uint2 p = *reinterpret_cast<const uint2*>(data);
            w[0] = p.x;
            w[1] = p.y;
        } else {
            w[0] = w[1] = 0u;
#pragma unroll
            for (int j = 0; j < 8; ++j) w[j >> 2] |= (unsigned int)data[j] << (8 * (j & 3));
        }
        const float sfv = kv_e4m3_decode(*sf);
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            unsigned int code = (w[i >> 3] >> (4 * (i & 7))) & 0xFu;
            y[i] = sfv != sfv ? sfv : __fmul_rn(__fmul_rn(kv_e2m1_value(code), sfv), g);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 16; ++i) y[i] = 0.0f;
    }
    if ((reinterpret_cast<unsigned long long>(out) & 15ull) == 0) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            reinterpret_cast<float4*>(out)[q] = make_float4(y[4 * q], y[4 * q + 1], y[4 * q + 2], y[4 * q + 3]);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 16; ++i) out[i] = y[i];
    }
}

extern "C" __global__ __launch_bounds__(KV_DEQUANT_NVFP4_THREADS, 1) void kvkit_dequant_nvfp4(
    const KV_SLOT_T* __restrict__ slots,     // (N,) slot ids; negative = padding
    long long n_rows,                        // N
    int n_heads,                             // H
    long long capacity,                      // num_blocks * block_size
    int block_size,                          // tokens per page
    const unsigned char* __restrict__ k_data,  // (num_blocks, H, block_size, D/2) via strides
    long long kd_stride_block,               // bytes between pages
    long long kd_stride_head,                // bytes between heads
    long long kd_stride_token,               // bytes between tokens
    const unsigned char* __restrict__ k_sf,  // (num_blocks, H, block_size, D/16) via strides
    long long ks_stride_block,               // bytes
    long long ks_stride_head,                // bytes
    long long ks_stride_token,               // bytes
    const unsigned char* __restrict__ v_data,  // (num_blocks, H, block_size, D/2) via strides
    long long vd_stride_block,               // bytes
    long long vd_stride_head,                // bytes
    long long vd_stride_token,               // bytes
    const unsigned char* __restrict__ v_sf,  // (num_blocks, H, block_size, D/16) via strides
    long long vs_stride_block,               // bytes
    long long vs_stride_head,                // bytes
    long long vs_stride_token,               // bytes
    float k_scale,                           // () per-layer K global scale g
    float v_scale,                           // () per-layer V global scale g
    float* __restrict__ out_k,               // (N, H, D) float32, C-contiguous
    float* __restrict__ out_v,               // (N, H, D) float32, C-contiguous
    int* __restrict__ error_flag)            // (1,) bit 1: a slot >= capacity
{
    long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (gid >= n_rows * n_heads * KV_NVFP4_BLOCKS) return;
    const int b = (int)(gid % KV_NVFP4_BLOCKS);
    const long long row = gid / KV_NVFP4_BLOCKS;  // r * H + head
    const int h = (int)(row % n_heads);
    const long long r = row / n_heads;
    const long long slot = (long long)slots[r];
    const bool live = slot >= 0 && slot < capacity;
    if (slot >= capacity && h == 0 && b == 0) atomicOr(error_flag, 1);
    long long blk = 0, off = 0;
    if (live) {
        blk = slot / block_size;
        off = slot - blk * block_size;
    }
    const long long dst = row * KV_HEAD_DIM + b * KV_NVFP4_BLOCK;
    kv_nvfp4_dequant_block(k_data + blk * kd_stride_block + h * kd_stride_head + off * kd_stride_token + b * 8,
                           k_sf + blk * ks_stride_block + h * ks_stride_head + off * ks_stride_token + b, k_scale,
                           out_k + dst, live);
    kv_nvfp4_dequant_block(v_data + blk * vd_stride_block + h * vd_stride_head + off * vd_stride_token + b * 8,
                           v_sf + blk * vs_stride_block + h * vs_stride_head + off * vs_stride_token + b, v_scale,
                           out_v + dst, live);
}
