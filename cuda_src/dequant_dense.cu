// dequant_dense.cu: cache rows -> float32 K/V for the dense families (kvkit/formats/dense.py).
//
//   fp16: exact widening (NaN keeps its payload, as NumPy's astype(float32)).
//   bf16: exact (bits << 16).
//   fp8_e4m3: e4m3(byte) * scale (float32 multiply); a NaN byte passes its NaN through, as
//             the CPU's multiply does.
// Launch define: KV_SLOT_T (int or long long).
//
// Mapping: one thread per (row, head, chunk of KV_CHUNK elements), K and V together.
// Negative slot: zeros. Slot >= capacity: zeros, error_flag |= 1 (once per row).
#include "common/arch.cuh"
#include "common/fp16.cuh"
#include "common/fp8.cuh"

#ifndef KV_HEAD_DIM
#error "KV_HEAD_DIM must come from fmt.cuda_defines()"
#endif
#if !defined(KV_FORMAT_DENSE) && !defined(KV_FORMAT_FP8)
#error "dequant_dense.cu needs KV_FORMAT_DENSE or KV_FORMAT_FP8"
#endif

// 8 elements per thread: two 16-byte float4 stores; every legal D splits into whole chunks.
#define KV_CHUNK 8
// __launch_bounds__(.., 1): without the minimum-blocks hint ptxas for some targets (sm_86,
// sm_120a) caps registers for occupancy and spills a few bytes; with it, no target spills.
// 256 threads: elementwise and memory-bound, many independent rows per SM.
#define KV_DEQUANT_DENSE_THREADS 256

#if defined(KV_FORMAT_FP8)
typedef unsigned char kv_elem_t;
#else
typedef unsigned short kv_elem_t;
#endif

__device__ __forceinline__ float kv_decode_elem(unsigned int e, float scale) {
#if defined(KV_FORMAT_FP8)
    float x = kv_e4m3_decode(e);
    return x != x ? x : __fmul_rn(x, scale);
#elif KV_DENSE_BF16
    return kv_bf16_to_float(e);
#else
    return kv_f16_to_float(e);
#endif
}

__device__ __forceinline__ void kv_dequant_chunk(const kv_elem_t* src, float scale, float* out, bool live) {
    float y[KV_CHUNK];
    if (live) {
#pragma unroll
        for (int j = 0; j < KV_CHUNK; ++j) y[j] = kv_decode_elem(src[j], scale);
    } else {
#pragma unroll
        for (int j = 0; j < KV_CHUNK; ++j) y[j] = 0.0f;
    }
    if ((reinterpret_cast<unsigned long long>(out) & 15ull) == 0) {
        reinterpret_cast<float4*>(out)[0] = make_float4(y[0], y[1], y[2], y[3]);
        reinterpret_cast<float4*>(out)[1] = make_float4(y[4], y[5], y[6], y[7]);
    } else {
#pragma unroll
        for (int j = 0; j < KV_CHUNK; ++j) out[j] = y[j];
    }
}

extern "C" __global__ __launch_bounds__(KV_DEQUANT_DENSE_THREADS, 1) void kvkit_dequant_dense(
    const KV_SLOT_T* __restrict__ slots,  // (N,) slot ids; negative = padding
    long long n_rows,                     // N
    int n_heads,                          // H
    long long capacity,                   // num_blocks * block_size
    int block_size,                       // tokens per page
    const kv_elem_t* __restrict__ k_plane,  // (num_blocks, H, block_size, D) via strides
    long long k_stride_block,             // elements between pages
    long long k_stride_head,              // elements between heads
    long long k_stride_token,             // elements between tokens
    const kv_elem_t* __restrict__ v_plane,  // (num_blocks, H, block_size, D) via strides
    long long v_stride_block,             // elements
    long long v_stride_head,              // elements
    long long v_stride_token,             // elements
    float k_scale,                        // () fp8: per-layer K scale; else unused
    float v_scale,                        // () fp8: per-layer V scale; else unused
    float* __restrict__ out_k,            // (N, H, D) float32, C-contiguous
    float* __restrict__ out_v,            // (N, H, D) float32, C-contiguous
    int* __restrict__ error_flag)         // (1,) bit 1: a slot >= capacity
{
    const int chunks = KV_HEAD_DIM / KV_CHUNK;
    long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (gid >= n_rows * n_heads * chunks) return;
    const int c = (int)(gid % chunks);
    const long long row = gid / chunks;  // r * H + head
    const int h = (int)(row % n_heads);
    const long long r = row / n_heads;
    const long long slot = (long long)slots[r];
    const bool live = slot >= 0 && slot < capacity;
    if (slot >= capacity && h == 0 && c == 0) atomicOr(error_flag, 1);
    long long blk = 0, off = 0;
    if (live) {
        blk = slot / block_size;
        off = slot - blk * block_size;
    }
    const long long dst = row * KV_HEAD_DIM + c * KV_CHUNK;
    kv_dequant_chunk(k_plane + blk * k_stride_block + h * k_stride_head + off * k_stride_token + c * KV_CHUNK,
                     k_scale, out_k + dst, live);
    kv_dequant_chunk(v_plane + blk * v_stride_block + h * v_stride_head + off * v_stride_token + c * KV_CHUNK,
                     v_scale, out_v + dst, live);
}
