// write_dense.cu: quantize-on-write for the dense families, one elementwise kernel.
//
// Formats (defines from fmt.cuda_defines()):
//   KV_FORMAT_DENSE, KV_DENSE_BF16=0  fp16 planes: plain RNE cast, overflow -> inf (NumPy's).
//   KV_FORMAT_DENSE, KV_DENSE_BF16=1  bf16 planes (uint16 bits): RNE on the float32 pattern.
//   KV_FORMAT_FP8                     E4M3 planes: byte = e4m3_satfinite(x / scale), IEEE div.
// Launch defines: KV_IN_DTYPE (0 float32, 1 float16, 2 bfloat16 bits), KV_SLOT_T, and the body
// choice (kvkit/cuda/write.py dense_launch_defines):
//   KV_DENSE_FAST 0   one chunk per thread, K loaded, encoded and stored, then V; row and slot
//                     split by run-time division; fp8: __fdiv_rn and the full encode per element.
//   KV_DENSE_FAST 1   KV_DENSE_CPT chunks per thread (1 or 2), every K and V load of the thread
//                     issued before any encode, row and slot split by the host's magic numbers,
//                     registers capped for full occupancy; fp8 with float16 inputs: a chunk whose
//                     halves are all finite, in a layer whose scale is in [2^-16, 2^16], takes
//                     the fast chunk (kv_fp8_fast_words); other chunks take the per-element path.
//
// Mapping: one thread per (token, head, KV_DENSE_CPT chunks of KV_CHUNK elements), K and V
// together. Negative slot: skipped. Slot >= capacity: skipped, error_flag |= 1 (once per token).
#include "common/arch.cuh"
#include "common/divide.cuh"
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
#ifndef KV_DENSE_FAST
#define KV_DENSE_FAST 0
#endif
#ifndef KV_DENSE_CPT
#define KV_DENSE_CPT 1
#endif
#if KV_DENSE_FAST
// 8 CTAs of 256 threads = 2048 threads, the SM's maximum: at most 32 registers. The fp8 write
// issues ~540 instructions per thread with the old body and waits on issue, not memory, at full
// occupancy (NOTES fp8w); session 8's loads-first body took 40 registers (48 warps per SM) and
// measured 9% slower, so this body keeps every SM full.
#define KV_WRITE_DENSE_MIN_CTAS 8
#else
#define KV_WRITE_DENSE_MIN_CTAS 1
#endif
#if KV_DENSE_CPT != 1 && KV_DENSE_CPT != 2
#error "KV_DENSE_CPT must be 1 or 2"
#endif
#if KV_DENSE_CPT != 1 && !KV_DENSE_FAST
#error "KV_DENSE_CPT 2 needs KV_DENSE_FAST 1"
#endif
#if KV_HEAD_DIM % (KV_CHUNK * KV_DENSE_CPT) != 0
#error "KV_HEAD_DIM must be a multiple of KV_CHUNK * KV_DENSE_CPT"
#endif

#if defined(KV_FORMAT_FP8)
typedef unsigned char kv_elem_t;
#else
typedef unsigned short kv_elem_t;
#endif

#if defined(KV_FORMAT_FP8)
// The two words (bytes 0..3, 4..7) of one chunk: per element __fdiv_rn and the full encode
// (NaN, sign and every magnitude), the spec's bytes for any input.
__device__ __forceinline__ void kv_fp8_words(const float (&x)[KV_CHUNK], float scale, unsigned int (&w)[2]) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        unsigned int lo = kv_e4m3x2_encode(__fdiv_rn(x[4 * j], scale), __fdiv_rn(x[4 * j + 1], scale));
        unsigned int hi = kv_e4m3x2_encode(__fdiv_rn(x[4 * j + 2], scale), __fdiv_rn(x[4 * j + 3], scale));
        w[j] = lo | (hi << 16);
    }
}

// The fast chunk for float16 inputs: the same bytes as kv_fp8_words when every half of hw is
// finite and d.b is in [KV_DIV_F16_LO, KV_DIV_F16_HI] (the caller checks both). Why:
// - |a| of a finite half is 0 or in [2^-24, 65504], so with b in that range every nonzero
//   |a| / b keeps divide.cuh's element condition (2^-40 <= |q0| <= 2^40; divide.cuh
//   KV_DIV_F16_LO) and kv_div_by_unchecked(|a|, d) == __fdiv_rn(|a|, b) (its proof; CPU check
//   tests/formats/test_fp8_fast_chunk.py over every finite half).
// - b > 0, so RN(a / b) = sign(a) RN(|a| / b) for every non-NaN a (IEEE division's sign rule,
//   signed zeros included), and the spec's byte is sign(a) | e4m3 magnitude of RN(|a| / b).
//   RN(|a| / b) is finite and not NaN, so no NaN fix-up; the magnitude codes come from
//   kv_e4m3x2_mag (non-negative, non-NaN inputs) and the sign bits straight from the halves'
//   bit 15 (byte 1 and byte 3 of each input word carry them in their bit 7).
__device__ __forceinline__ void kv_fp8_fast_words(const unsigned int (&hw)[KV_CHUNK / 2], const KvDivisor& d,
                                                  unsigned int (&w)[2]) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        float q[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const unsigned short hs = (unsigned short)(hw[2 * j + i / 2] >> (16 * (i % 2)));
            float a;
            asm("cvt.f32.f16 %0, %1;" : "=f"(a) : "h"(hs));  // exact
            // |a|: a free operand modifier of the division's multiply and fused multiply-adds
            q[i] = kv_div_by_unchecked(fabsf(a), d);
        }
        const unsigned int mag = kv_e4m3x2_mag(q[0], q[1]) | (kv_e4m3x2_mag(q[2], q[3]) << 16);
        const unsigned int sign = __byte_perm(hw[2 * j], hw[2 * j + 1], 0x7531);
        // (mag & ~0x80808080) | (sign & 0x80808080) in one LOP3 (lut 0xB8: a, b, c = mag, mask,
        // sign; ptxas splits the C form into an AND and a LOP3)
        asm("lop3.b32 %0, %1, %2, %3, 0xB8;" : "=r"(w[j]) : "r"(mag), "r"(0x80808080u), "r"(sign));
    }
}
#endif

// Store one chunk's bytes (fp8: the 2 words, 16-bit formats: the 4 words) at dst (one vector
// store when aligned).
__device__ __forceinline__ void kv_store_words(kv_elem_t* dst, const unsigned int* w) {
#if defined(KV_FORMAT_FP8)
    if ((reinterpret_cast<unsigned long long>(dst) & 7ull) == 0) {
        *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
    } else {
#pragma unroll
        for (int j = 0; j < KV_CHUNK; ++j) dst[j] = (unsigned char)(w[j >> 2] >> (8 * (j & 3)));
    }
#else
    if ((reinterpret_cast<unsigned long long>(dst) & 15ull) == 0) {
        *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
#pragma unroll
        for (int j = 0; j < KV_CHUNK; ++j) dst[j] = (unsigned short)(w[j >> 1] >> (16 * (j & 1)));
    }
#endif
}

// Encode and store one chunk at dst (vector store when aligned).
__device__ __forceinline__ void kv_store_chunk(kv_elem_t* dst, const float (&x)[KV_CHUNK], float scale) {
#if defined(KV_FORMAT_FP8)
    unsigned int w[2];
    kv_fp8_words(x, scale, w);
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
#endif
    kv_store_words(dst, w);
}

// The kernel's arguments, for the one-chunk body below (called by the default kernel, and by the
// fast body's fallback).
struct KvDenseArgs {
    const void* k;
    const void* v;
    const KV_SLOT_T* slot_mapping;
    long long n_tokens;
    int n_heads;
    long long capacity;
    int block_size;
    kv_elem_t* k_plane;
    long long k_stride_block, k_stride_head, k_stride_token;
    kv_elem_t* v_plane;
    long long v_stride_block, v_stride_head, v_stride_token;
    float k_scale, v_scale;
    int* error_flag;
};

// One thread's work in the default body: chunk gid % (D / KV_CHUNK) of row gid / (D / KV_CHUNK),
// K loaded, encoded and stored, then V (per element: __fdiv_rn and the full fp8 encode).
__device__ __forceinline__ void kv_dense_chunk(const KvDenseArgs& a, long long gid) {
    const int chunks = KV_HEAD_DIM / KV_CHUNK;
    long long total = a.n_tokens * a.n_heads * chunks;
    if (gid >= total) return;
    const int c = (int)(gid % chunks);
    const long long row = gid / chunks;  // token * H + head
    const bool narrow = kv_write_indices_narrow(a.n_tokens, a.n_heads, a.capacity);
    long long t, blk, off;
    int h;
    kv_row_token_head(row, a.n_heads, narrow, &t, &h);
    const long long slot = (long long)a.slot_mapping[t];
    if (slot < 0) return;
    if (slot >= a.capacity) {
        if (h == 0 && c == 0) atomicOr(a.error_flag, 1);
        return;
    }
    kv_slot_page(slot, a.block_size, narrow, &blk, &off);
    const long long src = row * KV_HEAD_DIM + c * KV_CHUNK;
    float x[KV_CHUNK];
    kv_load_inputs<KV_IN_DTYPE, KV_CHUNK>(a.k, src, x);
    kv_store_chunk(a.k_plane + blk * a.k_stride_block + h * a.k_stride_head + off * a.k_stride_token + c * KV_CHUNK,
                   x, a.k_scale);
    kv_load_inputs<KV_IN_DTYPE, KV_CHUNK>(a.v, src, x);
    kv_store_chunk(a.v_plane + blk * a.v_stride_block + h * a.v_stride_head + off * a.v_stride_token + c * KV_CHUNK,
                   x, a.v_scale);
}

#if KV_DENSE_FAST && defined(KV_FORMAT_FP8)
// The fast body's fallback for a thread whose chunks cannot take the fast path (non-finite
// inputs, a layer scale out of range; rare): the spec's bytes one element at a time (__fdiv_rn,
// kv_e4m3_encode), in a loop kept rolled. Its row, slot and addresses are recomputed from the
// thread index, read again from the special registers (asm volatile: not merged with the first
// read), so none of them stays live across the fast chunks: at 32 registers (full occupancy)
// the fast body then spills on no target.
__device__ __forceinline__ void kv_dense_fallback(const KvDenseArgs& a, const void* __restrict__ k,
                                                  const void* __restrict__ v) {
    unsigned int tid, cta, ntid;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(cta));
    asm volatile("mov.u32 %0, %%ntid.x;" : "=r"(ntid));
    const int groups = KV_HEAD_DIM / (KV_CHUNK * KV_DENSE_CPT);
    const long long gid = (long long)cta * ntid + tid;  // in range and its slot valid: checked
    const long long row = gid / groups;
    const int e0 = (int)(gid % groups) * (KV_CHUNK * KV_DENSE_CPT);  // first element
    const long long t = row / a.n_heads;
    const long long h = row - t * a.n_heads;
    const long long slot = (long long)a.slot_mapping[t];
    const long long blk = slot / a.block_size, off = slot - blk * a.block_size;
    kv_elem_t* kd = a.k_plane + blk * a.k_stride_block + h * a.k_stride_head + off * a.k_stride_token + e0;
    kv_elem_t* vd = a.v_plane + blk * a.v_stride_block + h * a.v_stride_head + off * a.v_stride_token + e0;
    const long long src = row * KV_HEAD_DIM + e0;
#pragma unroll 1
    for (int e = 0; e < KV_CHUNK * KV_DENSE_CPT; ++e) {
        kd[e] = (kv_elem_t)kv_e4m3_encode(__fdiv_rn(kv_input_to_float<KV_IN_DTYPE>(k, src + e), a.k_scale));
        vd[e] = (kv_elem_t)kv_e4m3_encode(__fdiv_rn(kv_input_to_float<KV_IN_DTYPE>(v, src + e), a.v_scale));
    }
}
#endif

extern "C" __global__ __launch_bounds__(KV_WRITE_DENSE_THREADS, KV_WRITE_DENSE_MIN_CTAS) void kvkit_write_dense(
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
    int* __restrict__ error_flag,                // (1,) bit 1: a slot >= capacity
    unsigned int heads_m, int heads_s1, int heads_s2,  // () kv_udiv_magic numbers of n_heads
    unsigned int bs_m, int bs_s1, int bs_s2)           // () ... and of block_size (fast body)
{
    const KvDenseArgs a{k, v, slot_mapping, n_tokens, n_heads, capacity, block_size,
                        k_plane, k_stride_block, k_stride_head, k_stride_token,
                        v_plane, v_stride_block, v_stride_head, v_stride_token,
                        k_scale, v_scale, error_flag};
#if !KV_DENSE_FAST
    kv_dense_chunk(a, (long long)blockIdx.x * blockDim.x + threadIdx.x);
#else
    const int groups = KV_HEAD_DIM / (KV_CHUNK * KV_DENSE_CPT);  // threads per row
    const long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (gid >= n_tokens * n_heads * groups) return;
    const int c = (int)(gid % groups) * KV_DENSE_CPT;  // the thread's first chunk
    const long long row = gid / groups;                // token * H + head
    const bool narrow = kv_write_indices_narrow(n_tokens, n_heads, capacity);
    long long t, blk, off;
    int h;
    kv_row_token_head(row, KvUDiv{n_heads, heads_m, heads_s1, heads_s2}, narrow, &t, &h);
    const long long slot = (long long)slot_mapping[t];
    if (slot < 0) return;
    if (slot >= capacity) {
        if (h == 0 && c == 0) atomicOr(error_flag, 1);
        return;
    }
    kv_slot_page(slot, KvUDiv{block_size, bs_m, bs_s1, bs_s2}, narrow, &blk, &off);
    const long long src = row * KV_HEAD_DIM + c * KV_CHUNK;
    kv_elem_t* kd = k_plane + blk * k_stride_block + h * k_stride_head + off * k_stride_token + c * KV_CHUNK;
    kv_elem_t* vd = v_plane + blk * v_stride_block + h * v_stride_head + off * v_stride_token + c * KV_CHUNK;
#if defined(KV_FORMAT_FP8)
    if constexpr (KV_IN_DTYPE == 1) {
        // Every load of the thread before any encode: K's and V's bytes in flight together.
        unsigned int kw[KV_DENSE_CPT][KV_CHUNK / 2], vw[KV_DENSE_CPT][KV_CHUNK / 2];
#pragma unroll
        for (int i = 0; i < KV_DENSE_CPT; ++i) kv_load_input_words<1, KV_CHUNK>(k, src + i * KV_CHUNK, kw[i]);
#pragma unroll
        for (int i = 0; i < KV_DENSE_CPT; ++i) kv_load_input_words<1, KV_CHUNK>(v, src + i * KV_CHUNK, vw[i]);
        // The fast chunks need both layer scales in [2^-16, 2^16] (a uniform test) and every
        // half finite: (h & 0x7FFF) < 0x7C00, i.e. (h & 0x7FFF) + 0x400 leaves bit 15 clear (no
        // carry leaves the half). One test for the thread's K and V chunks.
        unsigned int over = 0u;
#pragma unroll
        for (int i = 0; i < KV_DENSE_CPT; ++i) {
#pragma unroll
            for (int j = 0; j < KV_CHUNK / 2; ++j) {
                over |= ((kw[i][j] & 0x7FFF7FFFu) + 0x04000400u) | ((vw[i][j] & 0x7FFF7FFFu) + 0x04000400u);
            }
        }
        const bool scales_ok = k_scale >= KV_DIV_F16_LO && k_scale <= KV_DIV_F16_HI &&
                               v_scale >= KV_DIV_F16_LO && v_scale <= KV_DIV_F16_HI;
        if (scales_ok && (over & 0x80008000u) == 0u) {
            const KvDivisor kdv = kv_divisor(k_scale), vdv = kv_divisor(v_scale);
#pragma unroll
            for (int i = 0; i < KV_DENSE_CPT; ++i) {
                unsigned int w[2];
                kv_fp8_fast_words(kw[i], kdv, w);
                kv_store_words(kd + i * KV_CHUNK, w);
            }
#pragma unroll
            for (int i = 0; i < KV_DENSE_CPT; ++i) {
                unsigned int w[2];
                kv_fp8_fast_words(vw[i], vdv, w);
                kv_store_words(vd + i * KV_CHUNK, w);
            }
            return;
        }
        // Otherwise (non-finite inputs, a scale out of range): kv_dense_fallback.
        kv_dense_fallback(a, k, v);
        return;
    }
#endif
    // 16-bit formats, and fp8 with float32 / bfloat16 inputs: every load first, then the
    // per-element path.
    unsigned int kw[KV_DENSE_CPT][KvInputWords<KV_IN_DTYPE, KV_CHUNK>::n];
    unsigned int vw[KV_DENSE_CPT][KvInputWords<KV_IN_DTYPE, KV_CHUNK>::n];
#pragma unroll
    for (int i = 0; i < KV_DENSE_CPT; ++i) kv_load_input_words<KV_IN_DTYPE, KV_CHUNK>(k, src + i * KV_CHUNK, kw[i]);
#pragma unroll
    for (int i = 0; i < KV_DENSE_CPT; ++i) kv_load_input_words<KV_IN_DTYPE, KV_CHUNK>(v, src + i * KV_CHUNK, vw[i]);
#pragma unroll
    for (int i = 0; i < KV_DENSE_CPT; ++i) {
        float x[KV_CHUNK];
        kv_widen_input_words<KV_IN_DTYPE, KV_CHUNK>(kw[i], x);
        kv_store_chunk(kd + i * KV_CHUNK, x, k_scale);
    }
#pragma unroll
    for (int i = 0; i < KV_DENSE_CPT; ++i) {
        float x[KV_CHUNK];
        kv_widen_input_words<KV_IN_DTYPE, KV_CHUNK>(vw[i], x);
        kv_store_chunk(vd + i * KV_CHUNK, x, v_scale);
    }
#endif
}
