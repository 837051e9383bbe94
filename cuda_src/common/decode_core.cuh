// decode_core.cuh: the format-independent body of split-K decode stage 1 (DESIGN.md section 5).
//
// One CTA per (split, kv_head, batch) = (blockIdx.x, blockIdx.y, blockIdx.z) serves all
// G = KV_GROUP query heads and all KV_Q_LEN queries of its KV head: R = G * q_len rows. The
// CTA walks the tokens of its page-aligned split (kvkit.splits.page_range, paged.cuh) in
// tiles of KVD_TILE tokens; per tile:
//   (a) warp 0 looks the tile's pages up in the block table (bad entries: flag bit 2, the
//       token is skipped);
//   (b) every thread copies the tile's raw plane rows into shared staging (vector loads of
//       the widest width the plane's alignment allows, chosen by the host per plane);
//   (c) the tile is dequantized ONCE into float32 K and V tiles in shared memory (the family
//       hook kv_family_dequant4; global scales are folded into the softmax scale for K and
//       into v_out_scale for V, so the tiles hold e.g. e2m1 * sf only);
//   (d) warp w computes the scores of rows w, w + 8, ... against the tile's 32 tokens (lane
//       = token), masks (causal offsets, window, bad pages), soft-caps and updates the row's
//       online-softmax state (m, l in registers of the owning warp, softmax_state.cuh);
//   (e) every thread accumulates p * V for its (row set, 4 columns) in float32 registers.
// At the end the CTA writes its partial state (m, l, acc * v_out_scale) to the partial
// buffers, whose split axis has stride split_stride (= kvkit.splits.MAX_SPLITS), so the grid
// and buffers stay static. An empty split (or a bad seq_len: flag bit 4) writes
// (m = -inf, l = 0, acc = 0). Stage 2 (decode_merge.cu) merges the splits and the sinks.
//
// An entry defines, before including this file:
//   KV_NPLANES (1..4); KV_Pi_BYTES (row width in bytes of plane i) and KV_Pi_ELEM (bytes per
//   element: plane strides arrive in elements) for i < KV_NPLANES;
//   KV_HAS_KMUL (1: kv_family_kmul(rows) gives a per-token factor of the key, e.g. the
//   TurboQuant norm); KV_ROTATE_Q (1: kv_family_q_sign(d) and an FWHT of the query rows,
//   the TurboQuant rotation without its 1 / sqrt(D), which the host folds into scale);
//   KV_FAMILY_TABLE_FLOATS and kv_family_init_table(float*, tid) (a shared table, e.g. the
//   codebook); kv_family_dequant4(rows, d, table, k, v): elements d..d+3 of a token's K
//   and V from its staged rows (rows[i] = staging row of plane i, 16-byte aligned).
#pragma once

#include "common/decode_codes.cuh"
#include "common/paged.cuh"
#include "common/softmax_state.cuh"

#ifndef KV_IN_DTYPE
#define KV_IN_DTYPE 0
#endif
// Compile-time G and q_len (the launcher always defines them; these defaults serve the
// compile-only CI builds): rows per warp and per thread become register arrays.
#ifndef KV_GROUP
#define KV_GROUP 8
#endif
#ifndef KV_Q_LEN
#define KV_Q_LEN 1
#endif
#ifndef KV_HAS_KMUL
#define KV_HAS_KMUL 0
#endif
#ifndef KV_ROTATE_Q
#define KV_ROTATE_Q 0
#endif
#ifndef KV_FAMILY_TABLE_FLOATS
#define KV_FAMILY_TABLE_FLOATS 0
#endif
#ifndef KV_P1_BYTES
#define KV_P1_BYTES 0
#define KV_P1_ELEM 1
#endif
#ifndef KV_P2_BYTES
#define KV_P2_BYTES 0
#define KV_P2_ELEM 1
#endif
#ifndef KV_P3_BYTES
#define KV_P3_BYTES 0
#define KV_P3_ELEM 1
#endif

// Register budget: ptxas left alone caps 256-thread kernels at 64 registers and spills; two
// CTAs per SM (128 registers) hold the accumulators of R * D <= 2048 without spills, larger
// row counts get the full 255 (one CTA per SM; their shared memory allows no more anyway).
#define KVD_MIN_BLOCKS ((KV_GROUP * KV_Q_LEN * KV_HEAD_DIM) <= 2048 ? 2 : 1)

namespace kvd {

constexpr int D = KV_HEAD_DIM;
constexpr int D4 = D / 4;
// 256 threads = 8 warps: enough loads in flight to stream a page while keeping the
// per-thread accumulator (R * D / 256 floats) in registers for every G * q_len we accept.
constexpr int THREADS = 256;
constexpr int NW = THREADS / KV_WARP;
// One token per lane in the score phase, so a tile's max / sum are single warp reductions.
constexpr int TILE = KV_WARP;
constexpr int G = KV_GROUP;
constexpr int QL = KV_Q_LEN;
constexpr int R = G * QL;
constexpr int RW = (R + NW - 1) / NW;      // score rows per warp
constexpr int RG = THREADS / D4;           // row groups of the PV phase
constexpr int RPT = (R + RG - 1) / RG;     // PV rows per thread
// Per-tile partial sums of p * v in registers (see phase (e)) while they fit beside acc.
constexpr bool TWO_LEVEL = RPT <= 8;
// K tile rows padded by one float4: the 8 lanes of a quarter-warp reading 8 different
// tokens at the same column then hit 8 different 16-byte bank groups (D4 + 1 is odd).
constexpr int KSTR4 = D4 + 1;
// P rows padded by one float: PV threads of one warp may read two rows at the same token.
constexpr int PSTR = TILE + 1;

static_assert(D % 16 == 0, "head_dim must be a multiple of 16");
static_assert(D4 <= THREADS, "head_dim too large for one CTA");
// The launcher rejects larger G * q_len with a ValueError (kvkit/cuda/decode.py).
static_assert(RW <= 16 && RPT <= 16, "G * q_len too large for the register accumulators");

__host__ __device__ constexpr int a16(int x) { return (x + 15) & ~15; }

constexpr int OFF_Q = 0;
constexpr int OFF_K = OFF_Q + a16(R * D * 4);
constexpr int OFF_V = OFF_K + a16(TILE * KSTR4 * 16);
constexpr int OFF_P = OFF_V + a16(TILE * D * 4);
constexpr int OFF_A = OFF_P + a16(R * PSTR * 4);
constexpr int OFF_KM = OFF_A + a16(R * 4);
constexpr int OFF_TP = OFF_KM + a16(TILE * 4);
constexpr int OFF_TO = OFF_TP + a16(TILE * 4);
constexpr int OFF_TAB = OFF_TO + a16(TILE * 4);
constexpr int WP0 = a16(KV_P0_BYTES);
constexpr int WP1 = a16(KV_P1_BYTES);
constexpr int WP2 = a16(KV_P2_BYTES);
constexpr int WP3 = a16(KV_P3_BYTES);
constexpr int OFF_S0 = OFF_TAB + a16(KV_FAMILY_TABLE_FLOATS * 4);
constexpr int OFF_S1 = OFF_S0 + TILE * WP0;
constexpr int OFF_S2 = OFF_S1 + TILE * WP1;
constexpr int OFF_S3 = OFF_S2 + TILE * WP2;
constexpr int SMEM = OFF_S3 + TILE * WP3;

}  // namespace kvd

// Dynamic shared memory bytes the stage-1 kernel of this module needs; the launcher reads it
// once per module (cupy RawModule.get_global) so host and device can never disagree.
extern "C" {
__device__ int kv_decode_smem_bytes = kvd::SMEM;
}

__device__ __forceinline__ float kv_load_q(const void* q, long long idx) {
#if KV_IN_DTYPE == 0
    return static_cast<const float*>(q)[idx];
#elif KV_IN_DTYPE == 1
    return kv_dc_f16(static_cast<const unsigned short*>(q)[idx]);
#elif KV_IN_DTYPE == 2
    return kv_dc_bf16(static_cast<const unsigned short*>(q)[idx]);
#else
#error "KV_IN_DTYPE must be 0 (float32), 1 (float16) or 2 (bfloat16 bits)"
#endif
}

template <int C>
__device__ __forceinline__ void kv_copy_chunk(unsigned char* dst, const unsigned char* src) {
    if constexpr (C == 16) {
        *reinterpret_cast<uint4*>(dst) = __ldg(reinterpret_cast<const uint4*>(src));
    } else if constexpr (C == 8) {
        *reinterpret_cast<uint2*>(dst) = __ldg(reinterpret_cast<const uint2*>(src));
    } else if constexpr (C == 4) {
        *reinterpret_cast<unsigned*>(dst) = __ldg(reinterpret_cast<const unsigned*>(src));
    } else if constexpr (C == 2) {
        *reinterpret_cast<unsigned short*>(dst) =
            __ldg(reinterpret_cast<const unsigned short*>(src));
    } else {
        *dst = __ldg(src);
    }
}

// Copy the tile's rows of one plane (W bytes per row) into staging rows of a16(W) bytes,
// C bytes per load. Tokens without a valid page (tp[t] < 0) are not read.
template <int W, int C>
__device__ __forceinline__ void kv_copy_rows(unsigned char* stage, const unsigned char* base,
                                             long long sb, long long sh, long long st,
                                             int elem, int kvh, const int* tp, const int* to,
                                             int n_tile) {
    constexpr int NCH = W / C;
    constexpr int WP = kvd::a16(W);
    const long long head_off = (long long)kvh * sh;
    // Not unrolled: a 16-byte copy is at most a couple of items per thread, and unrolled
    // copies of five widths x four planes only cost registers.
#pragma unroll 1
    for (int item = threadIdx.x; item < n_tile * NCH; item += kvd::THREADS) {
        const int t = item / NCH;
        const int ch = item - t * NCH;
        const int page = tp[t];
        if (page < 0) continue;
        const long long off = ((long long)page * sb + head_off + (long long)to[t] * st) * elem;
        kv_copy_chunk<C>(stage + t * WP + ch * C, base + off + ch * C);
    }
}

// vec: the largest load width (16, 8, 4, 2, 1) that the plane's base pointer and strides
// allow (host side); a width that does not divide the row is stepped down here.
template <int W>
__device__ __forceinline__ void kv_copy_plane(unsigned char* stage, const unsigned char* base,
                                              long long sb, long long sh, long long st,
                                              int elem, int vec, int kvh, const int* tp,
                                              const int* to, int n_tile) {
    if constexpr (W > 0) {
        if constexpr (W % 16 == 0) {
            if (vec >= 16) {
                kv_copy_rows<W, 16>(stage, base, sb, sh, st, elem, kvh, tp, to, n_tile);
                return;
            }
        }
        if constexpr (W % 8 == 0) {
            if (vec >= 8) {
                kv_copy_rows<W, 8>(stage, base, sb, sh, st, elem, kvh, tp, to, n_tile);
                return;
            }
        }
        if constexpr (W % 4 == 0) {
            if (vec >= 4) {
                kv_copy_rows<W, 4>(stage, base, sb, sh, st, elem, kvh, tp, to, n_tile);
                return;
            }
        }
        if constexpr (W % 2 == 0) {
            if (vec >= 2) {
                kv_copy_rows<W, 2>(stage, base, sb, sh, st, elem, kvh, tp, to, n_tile);
                return;
            }
        }
        kv_copy_rows<W, 1>(stage, base, sb, sh, st, elem, kvh, tp, to, n_tile);
    }
}

__device__ __forceinline__ void kv_fma4(float4& acc, float p, const float4& v) {
    acc.x = fmaf(p, v.x, acc.x);
    acc.y = fmaf(p, v.y, acc.y);
    acc.z = fmaf(p, v.z, acc.z);
    acc.w = fmaf(p, v.w, acc.w);
}

__device__ __forceinline__ float kv_dot4(const float4& a, const float4& b, float acc) {
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
    acc = fmaf(a.z, b.z, acc);
    return fmaf(a.w, b.w, acc);
}

// The stage-1 body; every entry's extern "C" kernel forwards its parameters here.
// Parameter shapes: see the kernels in decode_dense.cu (identical for every family).
__device__ __forceinline__ void kv_stage1_body(
    const void* __restrict__ q,
    const unsigned char* __restrict__ p0, long long p0_sb, long long p0_sh, long long p0_st,
    int p0_vec,
    const unsigned char* __restrict__ p1, long long p1_sb, long long p1_sh, long long p1_st,
    int p1_vec,
    const unsigned char* __restrict__ p2, long long p2_sb, long long p2_sh, long long p2_st,
    int p2_vec,
    const unsigned char* __restrict__ p3, long long p3_sb, long long p3_sh, long long p3_st,
    int p3_vec,
    const int* __restrict__ block_tables, int max_blocks, const int* __restrict__ seq_lens,
    int num_blocks, int block_size, int window, float scale, float softcap, float v_out_scale,
    int split_stride, float* __restrict__ m_part, float* __restrict__ l_part,
    float* __restrict__ acc_part, int* __restrict__ error_flag) {
    using namespace kvd;
    extern __shared__ __align__(16) unsigned char kv_smem[];
    float* q_s = reinterpret_cast<float*>(kv_smem + OFF_Q);
    const float4* q_s4 = reinterpret_cast<const float4*>(kv_smem + OFF_Q);
    float4* k_s4 = reinterpret_cast<float4*>(kv_smem + OFF_K);
    float4* v_s4 = reinterpret_cast<float4*>(kv_smem + OFF_V);
    float* p_s = reinterpret_cast<float*>(kv_smem + OFF_P);
    float* a_s = reinterpret_cast<float*>(kv_smem + OFF_A);
#if KV_HAS_KMUL
    float* km_s = reinterpret_cast<float*>(kv_smem + OFF_KM);
#endif
    int* tp_s = reinterpret_cast<int*>(kv_smem + OFF_TP);
    int* to_s = reinterpret_cast<int*>(kv_smem + OFF_TO);
    float* tab_s = reinterpret_cast<float*>(kv_smem + OFF_TAB);
    unsigned char* st0 = kv_smem + OFF_S0;
    unsigned char* st1 = kv_smem + OFF_S1;
    unsigned char* st2 = kv_smem + OFF_S2;
    unsigned char* st3 = kv_smem + OFF_S3;
    (void)tab_s;

    const int split = blockIdx.x;
    const int num_splits = gridDim.x;
    const int kvh = blockIdx.y;
    const int b = blockIdx.z;
    const int num_heads = gridDim.y * G;
    const int tid = threadIdx.x;
    const int lane = tid & (KV_WARP - 1);
    const int warp = tid / KV_WARP;

    // --- the split's token range [t_lo, t_hi) --------------------------------------------
    const int seq_len = seq_lens[b];
    const bool len_ok = kv_seq_len_ok(seq_len, QL, max_blocks, block_size);
    if (!len_ok && split == 0 && tid == 0) atomicOr(error_flag, KV_ERR_SEQ_LEN);
    int t_lo = 0;
    int t_hi = 0;
    if (len_ok) {
        int first, end;
        kv_page_range(seq_len, block_size, num_splits, split, &first, &end);
        if (first < end) {
            // first < n_pages, so first * block_size < seq_len fits in int.
            t_lo = first * block_size;
            const long long hi = (long long)end * block_size;
            t_hi = hi < seq_len ? (int)hi : seq_len;
            if (window > 0) {
                // No query sees a token before (seq_len - q_len) - window + 1.
                const long long w_lo = (long long)seq_len - QL - window + 1;
                if (w_lo > t_lo) t_lo = (int)w_lo;
            }
        }
    }

    float4 acc[RPT];
#pragma unroll
    for (int j = 0; j < RPT; ++j) acc[j] = make_float4(0.f, 0.f, 0.f, 0.f);
    float m_r[RW];
    float l_r[RW];
#pragma unroll
    for (int j = 0; j < RW; ++j) {
        m_r[j] = kv_neg_inf();
        l_r[j] = 0.f;
    }

    if (t_lo < t_hi) {  // uniform over the CTA
        // --- queries (and the TurboQuant rotation) --------------------------------------
        for (int idx = tid; idx < R * D; idx += THREADS) {
            const int r = idx / D;
            const int d = idx - r * D;
            const int i = r / G;
            const int g = r - i * G;
            const long long src =
                (((long long)b * QL + i) * num_heads + (long long)kvh * G + g) * D + d;
            float x = kv_load_q(q, src);
#if KV_ROTATE_Q
            x *= kv_family_q_sign(d);
#endif
            q_s[idx] = x;
        }
#if KV_FAMILY_TABLE_FLOATS > 0
        kv_family_init_table(tab_s, tid);
#endif
        __syncthreads();
#if KV_ROTATE_Q
        // Unnormalized FWHT of every query row (stages h = 1, 2, ..., D/2), in place.
        for (int h = 1; h < D; h <<= 1) {
            for (int p = tid; p < R * (D / 2); p += THREADS) {
                const int r = p / (D / 2);
                const int j = p - r * (D / 2);
                const int i0 = ((j & ~(h - 1)) << 1) | (j & (h - 1));
                float* row = q_s + r * D;
                const float a = row[i0];
                const float c = row[i0 + h];
                row[i0] = a + c;
                row[i0 + h] = a - c;
            }
            __syncthreads();
        }
#endif

        for (int t0 = t_lo; t0 < t_hi; t0 += TILE) {
            const int n_tile = min(TILE, t_hi - t0);

            // (a) pages of the tile's tokens
            if (warp == 0) {
                int page = -1;
                int off = 0;
                bool bad = false;
                if (lane < n_tile) {
                    const int tok = t0 + lane;
                    const int pi = tok / block_size;
                    off = tok - pi * block_size;
                    const int e = block_tables[(long long)b * max_blocks + pi];
                    if (kv_page_ok(e, num_blocks))
                        page = e;
                    else
                        bad = true;
                }
                tp_s[lane] = page;
                to_s[lane] = off;
                const unsigned bad_mask = __ballot_sync(KV_FULL_MASK, bad);
                if (bad_mask != 0u && lane == 0) atomicOr(error_flag, KV_ERR_BLOCK_TABLE);
            }
            __syncthreads();

            // (b) raw rows -> staging
            kv_copy_plane<KV_P0_BYTES>(st0, p0, p0_sb, p0_sh, p0_st, KV_P0_ELEM, p0_vec, kvh,
                                       tp_s, to_s, n_tile);
            kv_copy_plane<KV_P1_BYTES>(st1, p1, p1_sb, p1_sh, p1_st, KV_P1_ELEM, p1_vec, kvh,
                                       tp_s, to_s, n_tile);
            kv_copy_plane<KV_P2_BYTES>(st2, p2, p2_sb, p2_sh, p2_st, KV_P2_ELEM, p2_vec, kvh,
                                       tp_s, to_s, n_tile);
            kv_copy_plane<KV_P3_BYTES>(st3, p3, p3_sb, p3_sh, p3_st, KV_P3_ELEM, p3_vec, kvh,
                                       tp_s, to_s, n_tile);
            __syncthreads();

            // (c) dequantize the tile once: float32 K (rows padded) and V; skipped tokens
            // are zeros so that p = 0 never meets a NaN / inf of garbage staging bytes.
#pragma unroll 1
            for (int e = tid; e < TILE * D4; e += THREADS) {
                const int t = e / D4;
                const int c = e - t * D4;
                float4 kk = make_float4(0.f, 0.f, 0.f, 0.f);
                float4 vv = kk;
                const bool live = t < n_tile && tp_s[t] >= 0;
                const unsigned char* rows[4] = {st0 + t * WP0, st1 + t * WP1, st2 + t * WP2,
                                                st3 + t * WP3};
                if (live) kv_family_dequant4(rows, 4 * c, tab_s, kk, vv);
                k_s4[t * KSTR4 + c] = kk;
                v_s4[t * D4 + c] = vv;
#if KV_HAS_KMUL
                if (c == 0) km_s[t] = live ? kv_family_kmul(rows) : 0.f;
#endif
            }
            __syncthreads();

            // (d) scores and online softmax; warp w owns rows w, w + NW, ...
            if (warp < R) {
                float dot[RW];
#pragma unroll
                for (int j = 0; j < RW; ++j) dot[j] = 0.f;
#pragma unroll 4
                for (int c = 0; c < D4; ++c) {
                    const float4 kk = k_s4[lane * KSTR4 + c];
#pragma unroll
                    for (int j = 0; j < RW; ++j) {
                        const int r = warp + NW * j;
                        if (r < R) dot[j] = kv_dot4(q_s4[r * D4 + c], kk, dot[j]);
                    }
                }
                const int tok = t0 + lane;
                const bool tok_ok = lane < n_tile && tp_s[lane] >= 0;
#if KV_HAS_KMUL
                const float kmul = km_s[lane];
#endif
#pragma unroll
                for (int j = 0; j < RW; ++j) {
                    const int r = warp + NW * j;
                    if (r < R) {
                        const int pos = seq_len - QL + r / G;
                        const bool vis =
                            tok_ok && tok <= pos && (window <= 0 || tok > pos - window);
                        float s = kv_neg_inf();
                        if (vis) {
#if KV_HAS_KMUL
                            s = (dot[j] * kmul) * scale;
#else
                            s = dot[j] * scale;
#endif
                            if (softcap > 0.f) s = softcap * tanhf(s / softcap);
                        }
                        const KvOnlineStep stp = kv_online_step(m_r[j], kv_warp_max(s));
                        const float p = vis ? kv_online_p(s, stp) : 0.f;
                        const float p_sum = kv_warp_sum(p);
                        l_r[j] = l_r[j] * stp.alpha + p_sum;
                        m_r[j] = stp.m_new;
                        p_s[r * PSTR + lane] = p;
                        if (lane == 0) a_s[r] = stp.alpha;
                    }
                }
            }
            __syncthreads();

            // (e) acc = acc * alpha + sum_t p_t v_t for this thread's rows and 4 columns. The
            // tile's sum is formed first and then added (two-level sums, as the CPU path),
            // so float32 error grows with the number of tiles, not of tokens (a 100k-token
            // split is 3125 additions per element, not 100k); row counts whose tile sums
            // would not fit the registers accumulate directly.
            if (tid < RG * D4) {
                const int c = tid % D4;
                const int rg = tid / D4;
                float4 part[TWO_LEVEL ? RPT : 1];
#pragma unroll
                for (int j = 0; j < (TWO_LEVEL ? RPT : 1); ++j)
                    part[j] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
                for (int j = 0; j < RPT; ++j) {
                    const int r = rg + RG * j;
                    if (r < R) {
                        const float a = a_s[r];
                        acc[j].x *= a;
                        acc[j].y *= a;
                        acc[j].z *= a;
                        acc[j].w *= a;
                    }
                }
                for (int t = 0; t < n_tile; ++t) {
                    const float4 vv = v_s4[t * D4 + c];
#pragma unroll
                    for (int j = 0; j < RPT; ++j) {
                        const int r = rg + RG * j;
                        if (r < R) {
                            if constexpr (TWO_LEVEL)
                                kv_fma4(part[j], p_s[r * PSTR + t], vv);
                            else
                                kv_fma4(acc[j], p_s[r * PSTR + t], vv);
                        }
                    }
                }
                if constexpr (TWO_LEVEL) {
#pragma unroll
                    for (int j = 0; j < RPT; ++j) {
                        acc[j].x += part[j].x;
                        acc[j].y += part[j].y;
                        acc[j].z += part[j].z;
                        acc[j].w += part[j].w;
                    }
                }
            }
            // The next tile's first write to shared memory that this tile still reads
            // (k_s / v_s in (c), p_s / a_s in (d)) comes after its barriers (a) and (b).
        }
    }

    // --- partial state out: row (b, i, h) at [((b * q_len + i) * Hq + h) * split_stride + split]
    if (warp < R && lane == 0) {
#pragma unroll
        for (int j = 0; j < RW; ++j) {
            const int r = warp + NW * j;
            if (r < R) {
                const int i = r / G;
                const int g = r - i * G;
                const long long row = ((long long)b * QL + i) * num_heads + (long long)kvh * G + g;
                m_part[row * split_stride + split] = m_r[j];
                l_part[row * split_stride + split] = l_r[j];
            }
        }
    }
    if (tid < RG * D4) {
        const int c = tid % D4;
        const int rg = tid / D4;
#pragma unroll
        for (int j = 0; j < RPT; ++j) {
            const int r = rg + RG * j;
            if (r < R) {
                const int i = r / G;
                const int g = r - i * G;
                const long long row = ((long long)b * QL + i) * num_heads + (long long)kvh * G + g;
                float4 o = acc[j];
                o.x *= v_out_scale;
                o.y *= v_out_scale;
                o.z *= v_out_scale;
                o.w *= v_out_scale;
                reinterpret_cast<float4*>(acc_part + (row * split_stride + split) * D)[c] = o;
            }
        }
    }
}
