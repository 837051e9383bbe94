// write_dense.cu: quantize-on-write for the dense families, one elementwise kernel.
//
// Formats (defines from fmt.cuda_defines()):
//   KV_FORMAT_DENSE, KV_DENSE_BF16=0  fp16 planes: plain RNE cast, overflow -> inf (NumPy's).
//   KV_FORMAT_DENSE, KV_DENSE_BF16=1  bf16 planes (uint16 bits): RNE on the float32 pattern.
//   KV_FORMAT_FP8                     E4M3 planes: byte = e4m3_satfinite(x / scale), IEEE div.
// Launch defines: KV_IN_DTYPE (0 float32, 1 float16, 2 bfloat16 bits), KV_SLOT_T.
//
// Mapping: one thread per (token, head, chunk of KV_CHUNK elements), K and V together.
// Negative slot: skipped. Slot >= capacity: skipped, error_flag |= 1 (once per token).
#include "common/arch.cuh"
#include "common/fp16.cuh"
#include "common/fp8.cuh"
#include "common/paged.cuh"

#ifndef KV_HEAD_DIM
#error "KV_HEAD_DIM must come from fmt.cuda_defines()"
#endif
#if !defined(KV_FORMAT_DENSE) && !defined(KV_FORMAT_FP8)
#error "write_dense.cu needs KV_FORMAT_DENSE or KV_FORMAT_FP8"
#endif

// 8 elements per thread: a 16-byte fp16/bf16 store or an 8-byte fp8 store, and one or two
// 16-byte input loads; every legal D (a multiple of 16) splits into whole chunks.
#define KV_CHUNK 8
// __launch_bounds__(.., 1): without the minimum-blocks hint ptxas for some targets (sm_86,
// sm_120a) caps registers for occupancy and spills a few bytes; with it, no target spills.
// 256 threads: plenty of independent rows per SM for an elementwise, memory-bound kernel.
#define KV_WRITE_DENSE_THREADS 256

#if defined(KV_FORMAT_FP8)
typedef unsigned char kv_elem_t;
#else
typedef unsigned short kv_elem_t;
#endif

// Encode and store one chunk at dst (vector store when aligned).
__device__ __forceinline__ void kv_store_chunk(kv_elem_t* dst, const float (&x)[KV_CHUNK], float scale) {
#if defined(KV_FORMAT_FP8)
    unsigned int w[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        unsigned int lo = kv_e4m3x2_encode(__fdiv_rn(x[4 * j], scale), __fdiv_rn(x[4 * j + 1], scale));
        unsigned int hi = kv_e4m3x2_encode(__fdiv_rn(x[4 * j + 2], scale), __fdiv_rn(x[4 * j + 3], scale));
        w[j] = lo | (hi << 16);
    }
    if ((reinterpret_cast<unsigned long long>(dst) & 7ull) == 0) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
    } else {
#pragma unroll
        for (int j = 0; j < KV_CHUNK; ++j) dst[j] = (unsigned char)(w[j >> 2] >> (8 * (j & 3)));
    }
#else
    unsigned int w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#if KV_DENSE_BF16
        w[j] = kv_bf16_bits(x[2 * j]) | (kv_bf16_bits(x[2 * j + 1]) << 16);
#else
        w[j] = kv_f16_bits(x[2 * j]) | (kv_f16_bits(x[2 * j + 1]) << 16);
#endif
    }
    if ((reinterpret_cast<unsigned long long>(dst) & 15ull) == 0) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
#pragma unroll
        for (int j = 0; j < KV_CHUNK; ++j) dst[j] = (unsigned short)(w[j >> 1] >> (16 * (j & 1)));
    }
#endif
}

extern "C" __global__ __launch_bounds__(KV_WRITE_DENSE_THREADS, 1) void kvkit_write_dense(
    const void* __restrict__ k,                  // (N, H, D) KV_IN_DTYPE, C-contiguous
    const void* __restrict__ v,                  // (N, H, D) KV_IN_DTYPE, C-contiguous
    const KV_SLOT_T* __restrict__ slot_mapping,  // (N,) slot = block * block_size + offset
    long long n_tokens,                          // N
    int n_heads,                                 // H
    long long capacity,                          // num_blocks * block_size
    int block_size,                              // tokens per page
    kv_elem_t* __restrict__ k_plane,             // (num_blocks, H, block_size, D) via strides
    long long k_stride_block,                    // elements between pages of k_plane
    long long k_stride_head,                     // elements between heads of k_plane
    long long k_stride_token,                    // elements between tokens of k_plane
    kv_elem_t* __restrict__ v_plane,             // (num_blocks, H, block_size, D) via strides
    long long v_stride_block,                    // elements
    long long v_stride_head,                     // elements
    long long v_stride_token,                    // elements
    float k_scale,                               // () fp8: per-layer K scale; else unused
    float v_scale,                               // () fp8: per-layer V scale; else unused
    int* __restrict__ error_flag)                // (1,) bit 1: a slot >= capacity
{
    const int chunks = KV_HEAD_DIM / KV_CHUNK;
    long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = n_tokens * n_heads * chunks;
    if (gid >= total) return;
    const int c = (int)(gid % chunks);
    const long long row = gid / chunks;  // token * H + head
    const bool narrow = kv_write_indices_narrow(n_tokens, n_heads, capacity);
    long long t, blk, off;
    int h;
    kv_row_token_head(row, n_heads, narrow, &t, &h);
    const long long slot = (long long)slot_mapping[t];
    if (slot < 0) return;
    if (slot >= capacity) {
        if (h == 0 && c == 0) atomicOr(error_flag, 1);
        return;
    }
    kv_slot_page(slot, block_size, narrow, &blk, &off);
    const long long src = row * KV_HEAD_DIM + c * KV_CHUNK;
    float x[KV_CHUNK];
    kv_load_inputs<KV_IN_DTYPE, KV_CHUNK>(k, src, x);
    kv_store_chunk(k_plane + blk * k_stride_block + h * k_stride_head + off * k_stride_token + c * KV_CHUNK, x,
                   k_scale);
    kv_load_inputs<KV_IN_DTYPE, KV_CHUNK>(v, src, x);
    kv_store_chunk(v_plane + blk * v_stride_block + h * v_stride_head + off * v_stride_token + c * KV_CHUNK, x,
                   v_scale);
}
