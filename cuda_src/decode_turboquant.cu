// decode_turboquant.cu: split-K decode stage 1 for TurboQuant caches
// (kvkit/formats/turboquant.py).
//
// One plane "slots" (num_blocks, Hkv, block_size, TQ_SLOT_BYTES) uint8: [K | V | pad].
// MSE keys (TQ_KEY_FP8 == 0): the query is rotated once per CTA, q_rot = H (s * q) (the
// FWHT in shared memory; the 1 / sqrt(D) of R = H diag(s) / sqrt(D) is folded into the
// softmax scale by the launcher), and the K tile holds the centroids c[idx] in rotated
// space, so score = scale / sqrt(D) * norm * <H (s * q), c[idx]> = scale * <q, k> with
// k = s * (FWHT(c[idx]) * norm / sqrt(D)), the spec's dequantized key.
// FP8 keys (k8v4): the K tile holds e4m3(byte); k_scale is folded into the softmax scale.
// Values are never rotated: v = float(code) * scale16 + zero16 (multiply, then add: the
// dequantizer's rounding).
//
// Defines: fmt.cuda_defines() (KV_HEAD_DIM, TQ_*), KV_IN_DTYPE, KV_GROUP, KV_Q_LEN.

#ifndef KV_FORMAT_TURBOQUANT
#error "decode_turboquant.cu needs fmt.cuda_defines() of a TurboQuant format"
#endif

#define KV_NPLANES 1
#define KV_P0_BYTES TQ_SLOT_BYTES
#define KV_P0_ELEM 1
// The slot plane is always a slab (slot widths are not whole 16-byte units): one bulk copy
// per page run (decode_core.cuh KV_BULK_COPIES), a few per tile instead of ~5 cp.async
// pieces per thread. Only from D = 128: measured on the H200 (session 10, graph replay) the
// bulk copies took 2-5% off at D = 128 / 256 ((64, 8192): 4bit_nc 0.349 -> 0.332 ms, k8v4
// 0.241 -> 0.232) but added 3-5% at D = 64 ((32, 4096): 4bit_nc 0.0642 -> 0.0663), whose
// 70-byte slots make short runs.
#if KV_HEAD_DIM >= 128
#define KV_BULK_COPIES 1
// Per-warp slabs (KVKIT_DECODE_TQ_SLABS=0 / 1, kvkit/cuda/decode.py): in the tensor-core
// launches each warp copies its own 16 tokens' slots (16 x TQ_SLOT_BYTES contiguous, 16-byte
// aligned in token-contiguous pages of >= 16 tokens) into the same unpadded staging, one copy
// per warp and tile, and (KVD_WARP_PIPE) waits on its own barriers; the CUDA-core launches
// keep the page-run copies (KV_BULK_SIMT_RUNS). Default: the codebook-key presets only.
// Measured on the H200 (session 13, call 4; graph ms, page runs -> slabs, two runs each):
// (64, 8192) 4bit_nc 0.3004 / 0.3076 -> 0.2926 / 0.2936, 3bit_nc 0.2958 / 0.2976 -> 0.2823 /
// 0.2823; (32, 4096) Hq = 128 3bit_nc 0.1584 -> 0.1371, 4bit_nc 0.1532 -> 0.1433; but k8v4
// 4-7% slower at every shape but Hq = 128 ((64, 8192) 0.2334 -> 0.2459, (1, 32768) 0.0226 ->
// 0.0241).
#if defined(KVKIT_DECODE_TQ_SLABS)
#define KV_TQ_SLABS KVKIT_DECODE_TQ_SLABS
#else
#define KV_TQ_SLABS (!TQ_KEY_FP8)
#endif
#if KV_TQ_SLABS
#define KV_BULK_WARP_SLABS 1
#define KV_BULK_SIMT_RUNS 1
#endif
#elif !defined(KVKIT_DECODE_TQ_SLABS64) || KVKIT_DECODE_TQ_SLABS64
// Below head_dim 128: warp slabs in the tensor-core launches only (16 x 70 bytes at D = 64;
// every preset); the CUDA-core launches keep the cp.async pieces. Page runs measured slower
// than cp.async here (above), warp slabs faster (session 13, call 6; graph ms, two runs each):
// (32, 4096) D = 64 k8v4 0.0508 / 0.0511 -> 0.0466 / 0.0464, 4bit_nc 0.0637 / 0.0644 ->
// 0.0611 / 0.0612; (64, 8192) D = 64 k8v4 0.1797 / 0.1808 -> 0.1563 / 0.1559, 3bit_nc 0.2221 /
// 0.2207 -> 0.2101 / 0.2099. KVKIT_DECODE_TQ_SLABS64=0 (A/B runs) keeps cp.async.
#define KV_BULK_COPIES 1
#define KV_BULK_WARP_SLABS 1
#endif

#include "common/decode_codes.cuh"

#if TQ_KEY_FP8
#define KV_HAS_KMUL 0
#define KV_ROTATE_Q 0
#define KV_FAMILY_TABLE_FLOATS 0

__device__ __forceinline__ float4 kv_tq_key4(const unsigned char* row, int d, const float*) {
    // FP8 keys occupy bytes [0, D) of the slot; d % 4 == 0 and staging rows are 4-byte
    // aligned (16 in the row modes; the k8v4 slot, 1.5 D + 4 bytes, is a multiple of 4 in
    // the slab mode), so one 4-byte load.
    const unsigned w = *reinterpret_cast<const unsigned*>(row + d);
    return make_float4(kv_dc_e4m3(w & 0xFFu), kv_dc_e4m3((w >> 8) & 0xFFu),
                       kv_dc_e4m3((w >> 16) & 0xFFu), kv_dc_e4m3(w >> 24));
}
#else
#define KV_HAS_KMUL 1
#define KV_ROTATE_Q 1
#define KV_FAMILY_TABLE_FLOATS (1 << TQ_KEY_BITS)
#include "common/tq_signs.cuh"

// The codebook as compile-time values: each CTA's prologue builds its shared table from
// immediates, not from __constant__ memory, whose first load of a launch missed and sat on the
// path to the first tile (the tensor-core table build: ~430 -> ~100 cycles of CTA 0's
// prologue at B = 1 by clock64; H200, benchmarks/NOTES.md v26).
struct KvTqCodebook {
    float c[1 << TQ_KEY_BITS];
};
// The query's rotation signs (s * q before the FWHT): x with its sign bit flipped where
// s_d = -1 (tq_signs.cuh: the mask word as an immediate).
__device__ __forceinline__ float kv_family_q_signed(float x, int d) { return kv_tq_signed(x, d); }

// The codebook goes to shared memory: per-lane table indices. Each code's store is its own
// compile-time branch (a runtime index into the constant values would put them in local
// memory).
__device__ __forceinline__ void kv_family_init_table(float* table, int tid) {
    constexpr KvTqCodebook cb = {TQ_CENTROIDS};
#pragma unroll
    for (int k = 0; k < (1 << TQ_KEY_BITS); ++k)
        if (tid == k) table[k] = cb.c[k];
}

__device__ __forceinline__ float4 kv_tq_key4(const unsigned char* row, int d,
                                             const float* table) {
    constexpr unsigned M = (1u << TQ_KEY_BITS) - 1u;
    const unsigned w = kv_dc_codes4<TQ_KEY_BITS>(row, d);
    return make_float4(table[w & M], table[(w >> TQ_KEY_BITS) & M],
                       table[(w >> (2 * TQ_KEY_BITS)) & M], table[(w >> (3 * TQ_KEY_BITS)) & M]);
}

// The stored key norm (already divided by ||c[idx]|| at write time).
__device__ __forceinline__ float kv_family_kmul(const unsigned char* const* rows) {
    return kv_dc_f16_at(rows[0] + TQ_KEY_NORM_OFFSET);
}
#endif

__device__ __forceinline__ float4 kv_family_k4(const unsigned char* const* rows, int d,
                                               const float* table) {
    return kv_tq_key4(rows[0], d, table);
}

__device__ __forceinline__ float4 kv_family_v4(const unsigned char* const* rows, int d,
                                               const float*) {
    const unsigned char* row = rows[0];
    constexpr unsigned M = (1u << TQ_VALUE_BITS) - 1u;
    const unsigned w = kv_dc_codes4<TQ_VALUE_BITS>(row + TQ_VALUE_OFFSET, d);
    const float sc = kv_dc_f16_at(row + TQ_VALUE_SCALE_OFFSET);
    const float z = kv_dc_f16_at(row + TQ_VALUE_ZERO_OFFSET);
    float4 v;
    v.x = __fadd_rn(__fmul_rn((float)(w & M), sc), z);
    v.y = __fadd_rn(__fmul_rn((float)((w >> TQ_VALUE_BITS) & M), sc), z);
    v.z = __fadd_rn(__fmul_rn((float)((w >> (2 * TQ_VALUE_BITS)) & M), sc), z);
    v.w = __fadd_rn(__fmul_rn((float)((w >> (3 * TQ_VALUE_BITS)) & M), sc), z);
    return v;
}

// Tensor-core hooks (common/decode_mma.cuh). Values: the integer codes (exact in bf16) with
// (scale, zero) per token. FP8 keys: exact fp16 operands. MSE keys: the codebook scaled by
// 2^e (max |c| to [2^14, 2^15)) and split hi + lo in fp16, one table word per code.
#define KV_MMA 1
#define KV_MMA_VCODES 1
// -DKVKIT_DECODE_TQ_PV16 (kvkit/cuda/decode.py; A/B runs; default 1; benchmarks/NOTES.md
// "tq18"): 1 runs the codebook presets' tensor-core PV on fp16 operands (decode_mma.cuh
// KV_MMA_VCODES_F16): the value codes as fp16 (kv_codes_f16x2_masked: a 4-bit pair's high
// code converts where it sits, no shift; 3-bit windows convert codes up to bit 7 straight),
// and W = p * scale_t, after a power of two 2^k_r per query row and fresh accumulator (the
// row's largest |W| there to [2^14, 2^15), kv_w16_pow2), as fp16 hi + lo: 22 significant bits
// of each term relative to the row's largest in that accumulator (the bf16 build's three
// parts: 24), one PV mma per m-tile and tile fewer (packed columns: one instead of two), and
// 2^-k_r undone exactly in the accumulator add (an FFMA where the FADD was). Any fp16 scales
// (6e-8 .. 65504 in one tile): each row's terms stay relative to that row's largest; a term
// below 2^-22 of it goes to fp16 subnormals (below float32 rounding of the largest). NaN / inf
// weights: NaN rows as before (a NaN W is skipped by the max and poisons only its row).
// Another float32 order (not bit for bit with 0). k8v4 (FP8 keys) unchanged.
// Measured on the H200 (session 18, call 2; graph ms, 0 -> 1, two runs each): (64, 8192)
// 4bit_nc 0.2343 / 0.2345 -> 0.2215 / 0.2261, 3bit_nc 0.2296 / 0.2349 -> 0.2199 / 0.2239, k3v4_nc
// 0.2353 / 0.2359 -> 0.2194 / 0.2247; (1, 131072) 4bit_nc 0.0689 / 0.0691 -> 0.0654 / 0.0656;
// (32, 4096) D = 64 4bit_nc 0.0478 / 0.0476 -> 0.0460 / 0.0463; D = 256 4bit_nc 0.1147 /
// 0.1148 -> 0.1050 / 0.1060 (every preset and shape 2-9% faster). Default 1.
#if TQ_KEY_FP8
#define KV_TQ_PV16 0
#elif defined(KVKIT_DECODE_TQ_PV16)
#define KV_TQ_PV16 KVKIT_DECODE_TQ_PV16
#else
#define KV_TQ_PV16 1
#endif
#if KV_TQ_PV16 < 0 || KV_TQ_PV16 > 1
#error "KVKIT_DECODE_TQ_PV16: 0 or 1"
#endif
// -DKVKIT_DECODE_TQ_VARIANT (kvkit/cuda/decode.py; A/B runs): 1, the default, packs the
// second operand parts into the padding columns of G * q_len <= 4 launches (decode_mma.cuh
// KV_MMA_PACK: at G = 4, D = 128 16 of 32 score mmas, 8 of 16 query ldmatrix and 8 of 24 PV
// mmas go, and the lo query rows' 8 KB of shared memory); 0 is the build before it. Default
// from D = 128 only: measured on the H200 (session 11, graph ms, 1 vs 0) 4bit_nc at D = 128,
// (64, 8192) 0.3006 / 0.3315; at (32, 4096) D = 256 0.1531 / 0.1683 but D = 64 0.0678 / 0.0635
// (all four presets 5-7% slower there: the saved mmas are too few to pay for the fold).
// With the fp16 PV (KV_TQ_PV16) the codebook presets fold at D = 64 too: measured on the H200
// (session 18, call 3; graph ms at (32, 4096) D = 64, 0 -> 1, two runs each) 4bit_nc 0.0459 /
// 0.0456 -> 0.0440 / 0.0436, 3bit_nc 0.0473 / 0.0470 -> 0.0443 / 0.0438, k3v4_nc 0.0461 /
// 0.0456 -> 0.0432 / 0.0426. k8v4 (FP8 keys, no KV_TQ_PV16) keeps 0 there.
#ifndef KVKIT_DECODE_TQ_VARIANT
#if KV_HEAD_DIM >= 128 || KV_TQ_PV16
#define KVKIT_DECODE_TQ_VARIANT 1
#else
#define KVKIT_DECODE_TQ_VARIANT 0
#endif
#endif
#define KV_MMA_PACK_OK (KVKIT_DECODE_TQ_VARIANT >= 1)
// Tile pairs (KVKIT_DECODE_TILE_PAIRS=1, decode_core.cuh) up to 8 query rows at head_dim 128
// (KVKIT_DECODE_TQ_PAIRS8 below; 4 before it): four stages (9.5 KB each at 4 bits) beside the
// key table and 5-8 rows' query buffers are 59-64 KB per CTA (sm_90 PTX), three CTAs per SM
// instead of four; 4 rows take 51-55 KB.
// Below 128 the single-tile build has four stages already (pairs cost no shared memory).
// None at D >= 128 for FP8 keys (k8v4's warp slabs, KVKIT_DECODE_TQ_SLABS=1 for A/B runs:
// 12.5 KB stages) or without the packed mma columns (KVKIT_DECODE_TQ_VARIANT=0: larger query
// buffers): four stages would not leave four CTAs per SM there.
// -DKVKIT_DECODE_TQ_PAIRS8 (kvkit/cuda/decode.py; A/B runs; default 1): 1 gives the codebook
// presets tile pairs up to 8 query rows at head_dim 128 as well, at three CTAs per SM where the
// pairs run with 5-8 rows (KV_PAIRS_MIN_BLOCKS, decode_core.cuh: the 168-register cap of
// __launch_bounds__(128, 3); 158-168 registers, no spills on sm_90 / sm_100a, 59-64 KB a CTA);
// 0 the build before (single tiles above 4 rows, four CTAs per SM). Why: G = 8 cost TurboQuant
// +37% over G = 4 at (32, 4096) where NVFP4 paid +6%, those launches running the single-tile
// loop. Measured on the H200 (session 23, call 4; graph ms at G = 8 (Hq 64, Hkv 8), 0 -> 1, two
// runs each): 4bit_nc (32, 4096) 0.0893 / 0.0890 -> 0.0861 / 0.0873, (8, 8192) 0.0513 / 0.0510
// -> 0.0446 / 0.0454, (64, 8192) 0.3159 / 0.3171 -> 0.3067 / 0.3016, (1, 32768) 0.0314 / 0.0314
// -> 0.0297 / 0.0294; 3bit_nc and k3v4_nc -3 to -13% likewise. Three CTAs per SM without the
// pairs (KVKIT_DECODE_MIN_BLOCKS=3) measured level with four (-0.3 to -1%).
#ifndef KVKIT_DECODE_TQ_PAIRS8
#define KVKIT_DECODE_TQ_PAIRS8 1
#endif
#if KV_HEAD_DIM >= 128 && (TQ_KEY_FP8 || !KV_MMA_PACK_OK)
#define KV_TILE_PAIRS_ROWS 0
#elif KVKIT_DECODE_TQ_PAIRS8 && KV_HEAD_DIM == 128
#define KV_TILE_PAIRS_ROWS 8
// (An expression, read where KVD_MIN_BLOCKS is: KV_GROUP / KV_Q_LEN may take decode_core.cuh's
// defaults, which come after this line.) Rows above 8 keep the core's two (their pairs:
// KVKIT_DECODE_PAIRS16), up to 4 its four.
#define KV_PAIRS_MIN_BLOCKS (KV_GROUP * KV_Q_LEN > 8 ? 2 : (KV_GROUP * KV_Q_LEN > 4 ? 3 : 4))
#else
#define KV_TILE_PAIRS_ROWS (KV_HEAD_DIM >= 128 ? 4 : 8)
#endif
// Tile pairs up to 16 query rows on the warp pipes (decode_core.cuh KVKIT_DECODE_PAIRS16): the
// codebook presets (measured there); FP8 keys (k8v4 at head_dim 64) keep 8.
#define KV_PAIRS16_OK (!TQ_KEY_FP8)
// -DKVKIT_DECODE_TQ_PAIRS256 (kvkit/cuda/decode.py; A/B runs): tile pairs at head_dim 256
// too (decode_core.cuh KV_TILE_PAIRS_MAX_D), up to 4 query rows as at 128. 0: none at 256, the
// build before; 1: the 3-bit-key presets (3bit_nc, k3v4_nc); 2 (the default): 4bit_nc too. At
// D = 256 a CTA has two per SM (<= 255 registers), so four stages (3bit_nc 12.7 KB each,
// 4bit_nc 16.8 KB) fit beside the rest, and the registers hold two tiles' key and value words
// beside the 64 accumulator floats. Measured on the H200 (session 15, call 2; graph ms at
// (32, 4096), Hq 32, Hkv 8, 0 -> 2, two runs each): 4bit_nc 0.1489 / 0.1497 -> 0.1320 / 0.1327,
// 3bit_nc 0.1605 / 0.1616 -> 0.1432 / 0.1446, k3v4_nc 0.1508 / 0.1521 -> 0.1405 / 0.1419.
#ifndef KVKIT_DECODE_TQ_PAIRS256
#define KVKIT_DECODE_TQ_PAIRS256 2
#endif
#if !TQ_KEY_FP8 && \
    (KVKIT_DECODE_TQ_PAIRS256 == 2 || (KVKIT_DECODE_TQ_PAIRS256 == 1 && TQ_KEY_BITS == 3))
#define KV_TILE_PAIRS_MAX_D 256
#endif
// -DKVKIT_DECODE_TQ3 (kvkit/cuda/decode.py; A/B runs): 1 takes the cheaper 3-bit plans, 0 the
// build before them. Two changes, each where the static counts (scripts/sass_path.py, sm_90,
// executed warp instructions per warp-tile; session 12) show a gain:
// - 3-bit values at D = 256: the halves plan (KV_TQ_V_HALVES below) instead of packed words:
//   3bit_nc (32 codes per lane group) 1068 -> 977 at G = 4 (4bit_nc: 1015).
// - 3-bit keys at D = 128 with more than 8 query rows: the codebook table first in shared
//   memory (decode_mma.cuh KV_MMA_TABLE_FIRST): 3bit_nc at G = 16 922 -> 855 (4bit_nc: 866).
//   Its 7 KB stages cannot hold the float query rows, whose 8 KB scratch then moved the
//   table's last rows past the 32 KB immediates that let ptxas fold the shared base.
// Measured on the H200 (session 12, call 5, graph ms at (32, 4096), 0 -> 1): 3bit_nc at
// Hq = 128 (G = 16) 0.1551 -> 0.1514 (4bit_nc 0.1535); at D = 256 0.1645 -> 0.1680 (slower
// despite the count, as the halves plan was in session 10). Default 1 only at D = 128 with
// G * q_len > 8; D = 64, D = 256 and D = 128 at G * q_len <= 8 keep 0.
#ifndef KVKIT_DECODE_TQ3
#if KV_HEAD_DIM == 128 && KV_GROUP * KV_Q_LEN > 8
#define KVKIT_DECODE_TQ3 1
#else
#define KVKIT_DECODE_TQ3 0
#endif
#endif
#if KVKIT_DECODE_TQ3 && !TQ_KEY_FP8 && TQ_KEY_BITS == 3 && KV_HEAD_DIM <= 128
#define KV_MMA_TABLE_FIRST 1
#endif
#define KV_MMA_VF 1.0f
// -DKVKIT_DECODE_TQ17 (kvkit/cuda/decode.py; A/B runs; default 1 at head_dim 64 and 256, 0 at
// 128; benchmarks/NOTES.md "tq17"): the codebook presets' tensor-core stage 1 with three
// instruction cuts
// that keep every loaded bit and every float operation:
// - value-code words by the rows' known alignment (kv_mma_vload_at4 below): the slot rows are
//   TQ_SLOT_BYTES apart (2 mod 4 at every head_dim) from a 16-byte aligned stage, so the
//   parity of a PV token's row fixes its value run's address mod 4; aligned runs take whole
//   word loads instead of 2-byte loads and permutes (or funnel shifts by a run-time shift);
// - in the tile pairs, each lane's key-run alignment (the same for its two tokens and both
//   tiles: rows 8 apart, stages whole words apart) worked out once and held (kv_mma_kload_al);
// - the online softmax without its empty-row guard (KV_MMA_EXP_CLAMP, as NVFP4's).
// Same bits, but for a row whose visible logits are all NaN (NaN there; 0 weights before).
// Session 17 on the H200, graph ms 0 -> 1 (two runs): D = 64 (32, 4096) 4bit_nc 0.0508 /
// 0.0503 -> 0.0489 / 0.0498, 3bit_nc -3 / -2%, k3v4_nc -2.4 / -1%; D = 256 (32, 4096) -2 to
// -3%; at D = 128 4bit_nc (64, 8192) 0.2436 / 0.2433 -> 0.2464 / 0.2487 (slower; (1, 131072)
// -2 / -0.3%, 3bit / k3v4 within the runs' spread), so 128 keeps 0.
#if TQ_KEY_FP8
#define KV_TQ17 0
#elif defined(KVKIT_DECODE_TQ17)
#define KV_TQ17 KVKIT_DECODE_TQ17
#elif KV_HEAD_DIM == 128
#define KV_TQ17 0
#else
#define KV_TQ17 1
#endif
#if KV_TQ17 < 0 || KV_TQ17 > 1
#error "KVKIT_DECODE_TQ17: 0 or 1"
#endif
#if KV_TQ17
#define KV_MMA_EXP_CLAMP 1
#endif
#if KV_TQ_PV16
#define KV_MMA_VCODES_F16 1
// the value codes' conversion, and the highest code bit it takes straight (3-bit windows)
#define KV_TQ_VCODES kv_codes_f16x2_masked
#define KV_TQ_VS_MAX 7
#else
#define KV_TQ_VCODES kv_codes_bf16x2_masked
#define KV_TQ_VS_MAX 4
#endif
// N words of staged bytes starting at any byte p: aligned words from the 4-byte boundary
// below, funnel-shifted down (N + 1 word loads; the caller says why the word past the run and
// the bytes before p are readable).
template <int N>
__device__ __forceinline__ void kv_tq_load_words(const unsigned char* p, unsigned* raw) {
    const unsigned a = (unsigned)reinterpret_cast<unsigned long long>(p) & 3u;
    const unsigned* q = reinterpret_cast<const unsigned*>(p - a);
    unsigned w[N + 1];
#pragma unroll
    for (int i = 0; i <= N; ++i) w[i] = q[i];
#pragma unroll
    for (int i = 0; i < N; ++i) raw[i] = __funnelshift_r(w[i], w[i + 1], 8 * a);
}
#if TQ_KEY_FP8
#define KV_MMA_KF KV_E4M3_F16_FACTOR
// Keys in registers (decode_mma.cuh KV_MMA_K_REGS): lane c's run is key bytes KPL c ..
// KPL c + KPL - 1 (KPL = D / 4), 4-byte aligned in every staging mode (the k8v4 slot,
// 1.5 D + 4 bytes, is a multiple of 4), so KPL / 4 word loads per token instead of four
// byte loads per k-step; k-step ks takes run bytes 4 ks .. 4 ks + 3 (word ks).
#define KV_MMA_K_REGS 1
#define KV_MMA_KRAW (KV_HEAD_DIM / 16)
static_assert(TQ_SLOT_BYTES % 4 == 0, "k8v4 slots keep 4-byte aligned rows");
__device__ __forceinline__ int kv_mma_kpos(int ks, int j) { return 4 * ks + j; }
__device__ __forceinline__ void kv_mma_kload(const unsigned char* const* rows, int c,
                                             unsigned* raw) {
    const unsigned* p = reinterpret_cast<const unsigned*>(rows[0] + (KV_HEAD_DIM / 4) * c);
#pragma unroll
    for (int i = 0; i < KV_MMA_KRAW; ++i) raw[i] = p[i];
}
__device__ __forceinline__ void kv_mma_kstep(const unsigned* raw, int ks, const unsigned*,
                                             unsigned* h0, unsigned* h1) {
    *h0 = kv_dc_e4m3x2_f16x2(raw[ks] & 0xFFFFu);
    *h1 = kv_dc_e4m3x2_f16x2(raw[ks] >> 16);
}
// Tiles without a NaN code (decode_mma.cuh KV_MMA_NANTILE_K): the same operands without the
// NaN patch (the values are codes, never NaN).
#define KV_MMA_NANTILE_K KV_E4M3_NANTILE
__device__ __forceinline__ void kv_mma_kstep_finite(const unsigned* raw, int ks,
                                                    const unsigned*, unsigned* h0,
                                                    unsigned* h1) {
    kv_dc_e4m3x4_f16x2_finite(raw[ks], h0, h1);
}
#else
#define KV_MMA_KF 1.0f
// Keys in registers, one table word per code (decode_mma.cuh KV_MMA_K_REGS + K_HILO): lane
// c's run is codes KPL c .. KPL c + KPL - 1 (KPL = D / 4) in natural order, k-step ks takes
// run codes 2 ks (a0 / a1) and 2 ks + 1 (a2 / a3). The table has one row of 32 words per
// code, 256 bytes apart: word (code, lane) = {hi, lo} fp16 of the centroid times 2^e, so
// lane l reads bank l whatever the code (no bank conflicts; the pair table's random indices
// cost ~3 wavefronts per load), and the byte offset code * 256 + 4 l is one byte permute
// of the code into byte 1 over 4 l (4-bit codes). 3-bit codes: rows 2^s bytes apart in four
// copies (s = 7..10), one mask per code (below).
#define KV_MMA_K_REGS 1
#define KV_MMA_K_HILO 1
#define KV_TQ_CODES (1 << TQ_KEY_BITS)
#if TQ_KEY_BITS == 3
// 3-bit codes: four copies of the table, for a code at bit s = 7, 8, 9 or 10 of the word it
// is masked from (row stride 2^s bytes; kv_tq_kplan says why). Row c of copy s is the 128-byte
// unit kv_tq_unit(s) + c 2^(s - 7); the copies interleave without overlap in 65 units:
// s = 10 on units 0, 8, .., 56, s = 9 on 1, 5, .., 29, s = 8 on 31, 33, .., 45, s = 7 on
// 57 .. 64.
#define KV_MMA_TABLE_WORDS (65 * 32)
__host__ __device__ constexpr int kv_tq_unit(int s) {
    return s == 10 ? 0 : (s == 9 ? 1 : (s == 8 ? 31 : 57));
}
#else
#define KV_MMA_TABLE_WORDS (KV_TQ_CODES * 64)
#endif
#define KV_TQ_KPL (KV_HEAD_DIM / 4)
#define KV_TQ_RUN_BYTES (KV_TQ_KPL * TQ_KEY_BITS / 8)
#define KV_TQ_RUN_WORDS ((KV_TQ_RUN_BYTES + 3) / 4)
#define KV_MMA_KRAW KV_TQ_RUN_WORDS
static_assert(KV_TQ_KPL % 8 == 0, "lane runs of whole bytes");
// floor(log2 x) as kv_ilog2 reads a float's biased exponent (-127 below the normal range),
// by constant evaluation.
__host__ __device__ constexpr int kv_ilog2_cf(float x) {
    if (x < 1.17549435e-38f) return -127;
    int e = 0;
    while (x >= 2.f) {
        x *= 0.5f;
        ++e;
    }
    while (x < 1.f) {
        x *= 2.f;
        --e;
    }
    return e;
}
// The table's power of two e: max |c| to [2^14, 2^15), clamped to [-100, 100].
__host__ __device__ constexpr int kv_tq_table_exp() {
    constexpr KvTqCodebook cb = {TQ_CENTROIDS};
    float mx = 0.f;
    for (int i = 0; i < KV_TQ_CODES; ++i) {
        const float a = cb.c[i] < 0.f ? -cb.c[i] : cb.c[i];
        mx = a > mx ? a : mx;
    }
    const int e = mx > 0.f ? 14 - kv_ilog2_cf(mx) : 0;
    return e < -100 ? -100 : (e > 100 ? 100 : e);
}
// The prologue copies before the query rows (decode_mma.cuh KVD_EARLY_ISSUE) but for the
// codebook presets at head_dim 64: there ptxas laid out the tile-pair loop up to 35
// instructions longer (sm_90: k3v4_nc at G = 4 953 -> 988, 3bit_nc at G = 8 982 -> 1001) and
// k3v4_nc measured 5-8% slower at (32, 4096) (H200, benchmarks/NOTES.md v26).
#define KV_EARLY_ISSUE_DEFAULT (TQ_KEY_FP8 || KV_HEAD_DIM >= 128)
// Builds the table; returns 2^-e (the scores' factor), e putting max |c| in [2^14, 2^15).
// Warp w of the nthreads / 32 (nthreads a multiple of 32: the core's 128) writes the 32 lanes'
// words of codes w, w + nthreads / 32, ...: each code a compile-time branch of the unrolled
// loop, so its centroid is an immediate (a runtime code index into the constant values would
// put them in local memory).
__device__ __forceinline__ float kv_mma_init_table(unsigned* table, int tid, int nthreads) {
    constexpr KvTqCodebook cb = {TQ_CENTROIDS};
    enum : int { E = kv_tq_table_exp() };
    const float f = kv_pow2(E);
    const int warp = tid / 32;
    const int lane = tid & 31;
    const int nw = nthreads / 32;
#pragma unroll
    for (int code = 0; code < KV_TQ_CODES; ++code) {
        if (code % nw != warp) continue;
        unsigned hi, lo;
        kv_split_f16x2(cb.c[code] * f, 0.f, &hi, &lo);
        const unsigned w = (hi & 0xFFFFu) | (lo << 16);
#if TQ_KEY_BITS == 3
#pragma unroll
        for (int s = 7; s <= 10; ++s)
            table[(kv_tq_unit(s) + (code << (s - 7))) * 32 + lane] = w;
#else
        table[code * 64 + lane] = w;
#endif
    }
    return kv_pow2(-E);
}
__device__ __forceinline__ int kv_mma_kpos(int ks, int j) { return 2 * ks + j; }
// -DKVKIT_DECODE_K3V4 (kvkit/cuda/decode.py; A/B runs; default 1; 0 is the build before): k3v4_nc at
// head_dim 256 and 64. 1: at 256 lane-interleaved key runs (KV_TQ_KSPLIT) and 4bit_nc's order
// of KVKIT_DECODE_TQ_TOKEN_ORDER=2 (a(c) = 2 c, B = 8, K = 1; below), at 64 a token order of
// its own (below); 2: the key runs alone (256; 64 as before).
// Why: k3v4_nc's pair executes 1864 warp instructions where 4bit_nc's takes 1852 (static walk,
// sm_90, 4 x 1; benchmarks/NOTES.md k3), yet it measured 5% slower: its 230-byte rows put a
// lane's 24-byte key run (words 57.5 g + 6 c + i) 4-way on the banks, 60 key + 28 value
// wavefronts per warp-tile against 4bit_nc's 38 + 28 (tests/cuda/test_tq_token_order_model.py).
// Runs of two 12-byte chunks (codes 32 c .. 32 c + 31 and 128 + 32 c .., the query's dims
// permuted to match through kv_mma_kdim) step 3 words per lane: 52 + 28 in order, 34 + 28 with
// that order (62, below 4bit_nc's 66), for one more word load per token (two chunks of 3 + 1).
// The chunks are whole codes (96 bits), so raw[] holds the lane's 64 codes as one bit stream as
// before: kv_tq_kplan and the table offsets are unchanged. Scores are the same products summed
// in another order (the mma's k order and which lane sums which token): float32 rounding.
// Measured on the H200 (session 16, call 5; graph ms, 0 / 0 -> 1 / 1): (32, 4096) D = 256
// 0.1272 / 0.1271 -> 0.1210 / 0.1202 (2: 0.1248), (8, 8192) D = 256 0.0725 / 0.0728 -> 0.0694 /
// 0.0694, (32, 4096) D = 64 0.0523 / 0.0525 -> 0.0496 / 0.0497; 4bit_nc in the same call 0.1216,
// 0.0694, 0.0498. Default 1.
#ifndef KVKIT_DECODE_K3V4
#define KVKIT_DECODE_K3V4 1
#endif
#if KVKIT_DECODE_K3V4 && TQ_KEY_BITS == 3 && TQ_VALUE_BITS == 4 && KV_HEAD_DIM == 256
#define KV_TQ_KSPLIT 1
#define KV_TQ_KCHUNK (KV_TQ_RUN_BYTES / 2)
static_assert(KV_TQ_KCHUNK % 4 == 0 && 8 * KV_TQ_KCHUNK == (KV_TQ_KPL / 2) * TQ_KEY_BITS,
              "chunks of whole words and whole codes");
// Lane c's run element e (decode_mma.cuh kv_mma_qdim): chunk c, then chunk c + 4.
#define KV_MMA_KDIM 1
__device__ __forceinline__ int kv_mma_kdim(int c, int e) {
    constexpr int H = KV_TQ_KPL / 2;  // codes per chunk
    return e < H ? H * c + e : 4 * H + H * c + (e - H);
}
#else
#define KV_TQ_KSPLIT 0
#endif
#if KV_TQ_KSPLIT
// A lane's two key chunks from q (4-byte aligned) and q + KV_TQ_KCHUNK bytes on (a whole number
// of words: the second chunk's loads at an immediate offset), each as N + 1 aligned words
// funnel-shifted down by sh bits as kv_tq_load_words does (the word past chunk c is chunk
// c + 1's; past chunk c + 4 the norm or chunk c + 5's: inside the slot).
__device__ __forceinline__ void kv_tq_kchunks(const unsigned* q, unsigned sh, unsigned* raw) {
    constexpr int N = KV_TQ_RUN_WORDS / 2, CW = KV_TQ_KCHUNK;  // words per chunk; CW words on
    unsigned w[2][N + 1];
#pragma unroll
    for (int i = 0; i <= N; ++i) {
        w[0][i] = q[i];
        w[1][i] = q[CW + i];
    }
#pragma unroll
    for (int i = 0; i < N; ++i) {
        raw[i] = __funnelshift_r(w[0][i], w[0][i + 1], sh);
        raw[N + i] = __funnelshift_r(w[1][i], w[1][i + 1], sh);
    }
}
#endif
// The run's bytes from the staged slot (rows are 2-byte aligned in the slab mode, the run
// may start at any byte): aligned words from the 4-byte boundary below, funnel-shifted down.
// The one word read past the run stays in the slot (the norm and the values follow the
// codes); the bytes read before a row start belong to the previous staged row (the first
// row of a stage is 16-byte aligned).
__device__ __forceinline__ void kv_mma_kload(const unsigned char* const* rows, int c,
                                             unsigned* raw) {
#if KV_TQ_KSPLIT
    // Chunks c and c + 4: one alignment and one base for both (kv_tq_kchunks).
    const unsigned char* p = rows[0] + KV_TQ_KCHUNK * c;
    const unsigned a = (unsigned)reinterpret_cast<unsigned long long>(p) & 3u;
    kv_tq_kchunks(reinterpret_cast<const unsigned*>(p - a), 8 * a, raw);
#else
    kv_tq_load_words<KV_TQ_RUN_WORDS>(rows[0] + KV_TQ_RUN_BYTES * c, raw);
#endif
}
#if KV_TQ17
// (KV_TQ17) kv_mma_kload's words for a run at p + sh / 8, p 4-byte aligned (the tile pairs
// hold the lane's rounded offset and shift: decode_mma_pairs.cuh KV_MMA_KLOAD_AL, the hook's
// c = 0 there). The same loads and funnel shifts, without the per-run alignment arithmetic.
#define KV_MMA_KLOAD_AL 1
// CLAMP (KVKIT_DECODE_TQ3_ORDER64, decode_mma_pairs.cuh KV_MMA_KLOAD_AL2): a run at byte 2 or 4
// of the word at p (sh = 16 or 32); the same N + 1 word loads (the run's last byte is at most
// byte 3 + KV_TQ_RUN_BYTES of them: inside the slot, as kv_tq_load_words' word past the run),
// funnel shifts that clamp, so sh = 32 takes the next word whole.
template <bool CLAMP = false>
__device__ __forceinline__ void kv_mma_kload_al(const unsigned char* p, unsigned sh,
                                                unsigned* raw) {
    const unsigned* q = reinterpret_cast<const unsigned*>(p);
#if KV_TQ_KSPLIT
    static_assert(!CLAMP, "clamped runs: whole runs only");
    kv_tq_kchunks(q, sh, raw);
#else
    constexpr int N = KV_TQ_RUN_WORDS;
    static_assert(!CLAMP || 4 + KV_TQ_RUN_BYTES <= 4 * (N + 1),
                  "the run at byte 4 inside the N + 1 words");
    unsigned w[N + 1];
#pragma unroll
    for (int i = 0; i <= N; ++i) w[i] = q[i];
#pragma unroll
    for (int i = 0; i < N; ++i)
        raw[i] = CLAMP ? __funnelshift_rc(w[i], w[i + 1], sh) : __funnelshift_r(w[i], w[i + 1], sh);
#endif
}
#endif
#if TQ_KEY_BITS == 3
// 3-bit codes: the table offset of a code is (y & (7 << s)) | 4 lane, one LOP3, where y is a
// word holding the code at bit s in {7, .., 10} (a table copy per s, KV_MMA_TABLE_WORDS).
// A word shifted to put code k at bit 7 also holds code k + 1 at bit 10, so one shift (or
// funnel shift) serves two codes where a single table (one s) takes a shift per code. Codes
// already at bits 7..10 of a run word need no shift. kv_tq_kplan(E) replays this choice over
// codes 0..E and returns code E's word (kind 0: raw[i] >> r, 1: funnel shift of raw[i],
// raw[i + 1] by r, 2: raw[0] << r) and bit s. tests/cuda/test_tq3_unpack_model.py checks the
// plan against the spec's bit stream.
struct KvTqKPlace {
    int kind, i, r, s;
};
__host__ __device__ constexpr bool kv_tq_kfits(KvTqKPlace w, int s) {
    return w.kind != 0 || w.r + s + 3 <= 32;  // bits s..s + 2 of raw[i] >> r exist
}
__host__ __device__ constexpr KvTqKPlace kv_tq_kplan(int E) {
    KvTqKPlace pl{0, 0, 0, 0};
    bool have = false;
    for (int k = 0; k <= E; ++k) {
        const int b = 3 * k;
        if (have && pl.s + 3 <= 10 && kv_tq_kfits(pl, pl.s + 3)) {
            pl.s += 3;  // the previous code's word, 3 bits up
            continue;
        }
        have = true;
        const int i = b >> 5, p = b & 31;
        if (p >= 7 && p <= 10 && p + 3 <= 32) {
            pl = KvTqKPlace{0, i, 0, p};  // straight from the run word
            continue;
        }
        const int t = b - 7;  // the word's bit 0 in the run: code k at bit 7
        if (t < 0) {
            pl = KvTqKPlace{2, 0, -t, 7};
        } else {
            const int j = t >> 5, r = t & 31;
            const bool one = r == 0 || r + 13 <= 32 || j + 1 >= KV_TQ_RUN_WORDS;
            pl = KvTqKPlace{one ? 0 : 1, j, r, 7};
        }
    }
    return pl;
}
template <int E>
__device__ __forceinline__ unsigned kv_tq_code_off_c(const unsigned* raw, unsigned lb) {
    constexpr KvTqKPlace pl = kv_tq_kplan(E);
    static_assert(pl.kind != 0 || pl.r + pl.s + 3 <= 32, "code inside the word");
    unsigned y;
    if constexpr (pl.kind == 0)
        y = raw[pl.i] >> pl.r;
    else if constexpr (pl.kind == 1)
        y = __funnelshift_r(raw[pl.i], raw[pl.i + 1], pl.r);
    else
        y = raw[0] << pl.r;
    return kv_tq_unit(pl.s) * 128u + ((y & (7u << pl.s)) | lb);
}
// E is a constant after the k-step loop's unrolling: the chain folds to one case.
template <int E = 0>
__device__ __forceinline__ unsigned kv_tq_code_off3(const unsigned* raw, int e, unsigned lb) {
    if constexpr (E + 1 < KV_TQ_KPL) {
        if (e != E) return kv_tq_code_off3<E + 1>(raw, e, lb);
    }
    return kv_tq_code_off_c<E>(raw, lb);
}
#endif
// Byte offset in the table of run code E for this lane: code * 256 + 4 lane (4-bit codes).
__device__ __forceinline__ unsigned kv_tq_code_off(const unsigned* raw, int E, unsigned lb) {
    constexpr int B = TQ_KEY_BITS;
    if constexpr (B == 4) {
        const unsigned w = raw[E >> 3];
        const unsigned x = (E & 1) ? ((w >> 4) & 0x0F0F0F0Fu) : (w & 0x0F0F0F0Fu);
        return __byte_perm(x, lb, 0x7604u | ((unsigned)((E & 7) >> 1) << 4));
    } else {
#if TQ_KEY_BITS == 3
        return kv_tq_code_off3(raw, E, lb);
#else
        const int bit = E * B;
        const int i = bit >> 5;
        const int sh = bit & 31;
        unsigned x;
        if (sh + B <= 32) {
            x = sh >= 8 ? raw[i] >> (sh - 8) : raw[i] << (8 - sh);
        } else {
            x = __funnelshift_r(raw[i], raw[i + 1], sh - 8);
        }
        return (x & (((1u << B) - 1u) << 8)) | lb;
#endif
    }
}
__device__ __forceinline__ void kv_mma_kstep(const unsigned* raw, int ks, const unsigned* table,
                                             unsigned* h0, unsigned* h1) {
    const unsigned lb = 4u * (threadIdx.x & 31u);
    const unsigned char* t = reinterpret_cast<const unsigned char*>(table);
    *h0 = *reinterpret_cast<const unsigned*>(t + kv_tq_code_off(raw, 2 * ks, lb));
    *h1 = *reinterpret_cast<const unsigned*>(t + kv_tq_code_off(raw, 2 * ks + 1, lb));
}
#endif
// Codes are centred, c - 2^(bits-1), and the zero moved by 2^(bits-1) * scale, so the code
// and zero sums do not cancel (float32 error stays relative to the values, not to zero).
#define KV_MMA_VCODE_OFFSET (1 << (TQ_VALUE_BITS - 1))
// V straight into registers (decode_mma.cuh KV_MMA_V_REGS): lane group g's VPL = D / 8
// contiguous codes, VPL * bits bits per token: <= 64 at D <= 128 (two words), 96 or 128 at
// D = 256 (three or four words).
#if KV_HEAD_DIM <= 128 || KV_HEAD_DIM == 256
#define KV_MMA_V_REGS 1
// 3-bit codes (kv_tq_vplan below says why): runs of whole 16-bit units (D = 128: 48 bits per
// lane group) stay one unit per register ("halves"); the 24-bit run of D = 64 is one word,
// run bit 0 at bit 0 ("word"). Other runs are packed into 32-bit words. D = 256 fits the
// halves plan too (96 bits, 11 windows + 12 shifts per token pair, against 16 pairs of two
// shifts and a merge); measured on the H200 in session 10 it was no faster than the packed
// words (0.1824 vs 0.1809 ms, 3bit_nc at (32, 4096)), but the kernel has since become
// instruction-bound and the static count is 91 warp instructions per tile lower (session
// 12), so the KVKIT_DECODE_TQ3=1 build takes it; re-measured in session 12 it was 2% slower
// (0.1645 -> 0.1680 ms), so the default build does not. The word plan at D = 64
// was 5% faster (0.0643 vs 0.0675 ms).
#define KV_TQ_V_HALVES                                                        \
    (TQ_VALUE_BITS == 3 && (KV_HEAD_DIM <= 128 || KVKIT_DECODE_TQ3) && \
     ((KV_HEAD_DIM / 8) * TQ_VALUE_BITS) % 16 == 0)
#define KV_TQ_V_WORD (TQ_VALUE_BITS == 3 && KV_HEAD_DIM == 64)
// -DKVKIT_DECODE_TQ3_256 (kvkit/cuda/decode.py; A/B runs; default 2; 0 is the build before): 1
// unpacks 3-bit values at D = 256 by the halves plan's windows (kv_tq_vplan) cut from the
// packed words ("windows on words"): the loads stay kv_tq_load_words' 4 word loads per token
// (the halves plan's 6 two-byte loads per token took 104 value wavefronts per tile where the
// words take 72, session 12), and the unpacking drops from 16 code pairs of two shifts and a
// merge per token pair to 11 windows (one byte permute each) and 12 shifts. The same bf16
// operands, so the same scores and sums, bit for bit. Why: Nsight Compute of turboquant_3bit_nc
// at (32, 4096) D = 256 (H200, session 16; benchmarks/NOTES.md d3) has 3bit executing 163
// more warp instructions per tile pair than 4bit_nc (2071 vs 1908); the static walk puts
// +108 of them in the value unpacking (kv_mma_vpair 236 vs 128 per pair).
// 2: that, and 3bit_nc's bank-friendly token order (KVKIT_DECODE_TQ_TOKEN_ORDER=1's, below)
// with the tile pairs' lane offsets (KVKIT_DECODE_PAIR_ADDR, otherwise off for 3bit_nc at
// D = 256): 3bit_nc's staged key and value word loads run 4-way bank conflicts (60 of its
// LDS per pair at 4 wavefronts for 1, 505 wavefronts per pair against 4bit_nc's 377 under
// Nsight Compute); the order cuts the model's 130 to 102 per warp-tile. Another float32
// order (which lane sums which token): not bit for bit with 0. KVKIT_DECODE_TQ3=1 (the halves
// plan's 2-byte loads) wins over 1's windows; 2's order and pair addresses still apply.
// Measured on the H200 (session 16, call 3; 3bit_nc, graph ms, two runs): (32, 4096) D = 256
// 0 0.1429 / 0.1429, 1 0.1421 / 0.1422, 2 0.1201 / 0.1204 (pair addresses alone 0.1347, with
// the windows 0.1237); (8, 8192) D = 256 0.0808 / 0.0809 -> 0.0801 / 0.0800 -> 0.0695 / 0.0693.
// 4bit_nc in the same call: 0.1212 and 0.0694. Default 2.
#ifndef KVKIT_DECODE_TQ3_256
#define KVKIT_DECODE_TQ3_256 2
#endif
#define KV_TQ_V_WINS \
    (TQ_VALUE_BITS == 3 && KV_HEAD_DIM == 256 && KVKIT_DECODE_TQ3_256 && !KV_TQ_V_HALVES)
#if KV_TQ_V_HALVES
#define KV_MMA_VRAW ((KV_HEAD_DIM / 8) * TQ_VALUE_BITS / 16)
#elif KV_TQ_V_WORD
#define KV_MMA_VRAW 1
#else
#define KV_MMA_VRAW (KV_HEAD_DIM <= 128 ? 2 : (KV_HEAD_DIM / 8) * TQ_VALUE_BITS / 32)
#endif
static_assert(TQ_VALUE_OFFSET % 2 == 0, "value codes start 2-byte aligned in the slot");
// The byte offset of lane group g's first value-code unit after TQ_VALUE_OFFSET (word mode:
// the 2-byte unit at or below the run). kv_mma_vload adds it; LANED (the tile pairs' lane
// offsets, decode_core.cuh KVD_PAIR_ADDR) finds it in rows[0] already, and takes g only for
// the word mode's byte-permute selector.
__device__ __forceinline__ int kv_tq_vlane(int g) {
    constexpr int VB = (KV_HEAD_DIM / 8) * TQ_VALUE_BITS;
#if KV_TQ_V_WORD
    (void)VB;
    return 3 * g - (g & 1);
#else
    return (VB / 8) * g;
#endif
}
template <bool LANED = false>
__device__ __forceinline__ void kv_mma_vload_t(const unsigned char* const* rows, int g,
                                               unsigned* raw) {
    [[maybe_unused]] constexpr int VB = (KV_HEAD_DIM / 8) * TQ_VALUE_BITS;  // bits per lane group
    const int vl = LANED ? 0 : kv_tq_vlane(g);
    (void)vl;
#if KV_TQ_V_HALVES
    // Even byte offsets (slots and staged rows are 2-byte aligned): one 2-byte load per
    // register, bits 16 i .. 16 i + 15 of the run in raw[i] (high half zero).
    const unsigned short* q = reinterpret_cast<const unsigned short*>(
        rows[0] + TQ_VALUE_OFFSET + vl);
#pragma unroll
    for (int i = 0; i < KV_MMA_VRAW; ++i) raw[i] = q[i];
#elif KV_TQ_V_WORD
    // Run bytes 3 g .. 3 g + 2 from the two 2-byte units at the even byte 3 g - (g & 1) (the
    // byte before the run, read for odd g, is the previous lane group's; the byte
    // past it the next group's or the value scale: all inside the slot), joined by one byte
    // permute whose selector depends on g only (loop-invariant): run bit 0 at bit 0, and
    // bits 24..31 whatever follows (no code is read there).
    // (Without LANED the expression before kv_tq_vlane: the default build's PTX unchanged.)
    const unsigned short* q = reinterpret_cast<const unsigned short*>(
        LANED ? rows[0] + TQ_VALUE_OFFSET : rows[0] + TQ_VALUE_OFFSET + 3 * g - (g & 1));
    raw[0] = __byte_perm(q[0], q[1], (g & 1) ? 0x6541u : 0x5410u);
    static_assert(VB == 24, "the word mode is the 24-bit run of D = 64");
#elif KV_HEAD_DIM == 256
    // Whole words of codes (VB / 8 bytes per lane group at an even offset): aligned words
    // from the 4-byte boundary below, funnel-shifted down (as kv_mma_kload; a word load per
    // 4 bytes where 2-byte loads would take two). The word past the run stays in the slot
    // (the value scale and zero follow the codes).
    static_assert(VB % 32 == 0 && VB / 32 == KV_MMA_VRAW, "whole words per lane group");
    kv_tq_load_words<KV_MMA_VRAW>(rows[0] + TQ_VALUE_OFFSET + vl, raw);
#else
    static_assert(VB <= 64, "one lane's codes fit 64 bits");
    static_assert(!LANED || VB % 16 == 0, "lane offsets: runs of whole 2-byte units");
    const unsigned char* p = rows[0] + TQ_VALUE_OFFSET;
    unsigned long long x = 0ull;
    if constexpr (VB % 16 == 0) {
        // Even byte offsets (slots and staged rows are 2-byte aligned): 2-byte loads.
        const unsigned short* q = reinterpret_cast<const unsigned short*>(p + vl);
#pragma unroll
        for (int i = 0; i < VB / 16; ++i) x |= (unsigned long long)q[i] << (16 * i);
    } else {
        // Any bit offset: the bytes that hold the codes (at most one past them, which is
        // still the slot's scale field), shifted down.
        const int bit = VB * g;
        const unsigned char* q = p + (bit >> 3);
        constexpr int NBY = (VB + 7 + 7) / 8;
#pragma unroll
        for (int i = 0; i < NBY; ++i) x |= (unsigned long long)q[i] << (8 * i);
        x >>= (bit & 7);
    }
    raw[0] = (unsigned)x;
    raw[1] = (unsigned)(x >> 32);
#endif
}
__device__ __forceinline__ void kv_mma_vload(const unsigned char* const* rows, int g,
                                             unsigned* raw) {
    kv_mma_vload_t<false>(rows, g, raw);
}
#if !TQ_KEY_FP8
// Tile pairs' lane offsets (decode_core.cuh KVD_PAIR_ADDR, decode_mma_pairs.cuh): the codebook
// presets' slot row holds the key codes, the key norm, the value codes and the value scale and
// zero, so the pair loop holds three per-lane offsets into it (the score token's row, that row
// plus kv_mma_klane, the PV token's row plus kv_mma_vlane) and reads through kv_mma_kload with
// c = 0 and kv_mma_vload_at. FP8 keys (k8v4) keep the build before. On by default but for
// turboquant_3bit_nc at head_dim 256 (KV_PAIR_ADDR_DEFAULT; KVKIT_DECODE_PAIR_ADDR=0 / 1 for
// A/B runs). Measured on the H200 (session 15, call 6; graph ms, 0 / 0 -> 1 / 1): 4bit_nc
// (64, 8192) 0.2580 / 0.2626 -> 0.2493 / 0.2588, (1, 131072) 0.0757 / 0.0766 -> 0.0741 /
// 0.0745, D = 64 (32, 4096) 0.0552 / 0.0559 -> 0.0526 / 0.0526, D = 256 0.1318 / 0.1329 ->
// 0.1249 / 0.1249; 3bit_nc and k3v4_nc -2 to -6% likewise, except 3bit_nc at D = 256:
// 0.1438 / 0.1434 -> 0.1454 / 0.1447 (+1%), which keeps the build before unless
// KVKIT_DECODE_TQ3_256 is 2 (its default; with session 16's pair trims pair addresses alone
// measured -6% there, 0.1429 -> 0.1347).
#define KV_MMA_LANE_OFFS 1
#define KV_MMA_LANE_SLOT 1
// (KVKIT_DECODE_TQ3_256=2 takes them there too, for its token order: below.)
#if TQ_KEY_BITS == 3 && TQ_VALUE_BITS == 3 && KV_HEAD_DIM == 256 && KVKIT_DECODE_TQ3_256 < 2
#define KV_PAIR_ADDR_DEFAULT 0
#endif
__device__ __forceinline__ int kv_mma_klane(int, int c) {
#if KV_TQ_KSPLIT
    return KV_TQ_KCHUNK * c;
#else
    return KV_TQ_RUN_BYTES * c;
#endif
}
__device__ __forceinline__ int kv_mma_vlane(int, int g) { return kv_tq_vlane(g); }
__device__ __forceinline__ void kv_mma_vload_at(const unsigned char* const* rows, int g,
                                                unsigned* raw) {
    kv_mma_vload_t<true>(rows, g, raw);
}
#if KV_TQ17
// (KV_TQ17) kv_mma_vload_at for a row whose address is M mod 4 (the pair loop knows it at
// compile time: decode_mma_pairs.cuh KV_MMA_VLOAD_AT4). The lane term kv_tq_vlane(g) is a
// multiple of 4 wherever this changes anything, so the run starts at (M + TQ_VALUE_OFFSET)
// mod 4. Whole words where that is 0; where it is 2, words from 2 bytes below joined by
// constant byte permutes (D = 256: what kv_tq_load_words' funnel shift by the run-time 8 a
// does) or a 2-byte, a word and a 2-byte load (D <= 128). The same run bits in raw.
#define KV_MMA_VLOAD_AT4 1
template <int M>
__device__ __forceinline__ void kv_mma_vload_at4(const unsigned char* const* rows, int g,
                                                 unsigned* raw) {
    [[maybe_unused]] constexpr int VB = (KV_HEAD_DIM / 8) * TQ_VALUE_BITS;  // bits per lane group
    constexpr int A = (M + TQ_VALUE_OFFSET) % 4;
    const unsigned char* p = rows[0] + TQ_VALUE_OFFSET;
#if KV_TQ_V_HALVES || KV_TQ_V_WORD
    (void)A;
    (void)p;
    kv_mma_vload_t<true>(rows, g, raw);  // 16-bit units or 3-byte runs: as before
#elif KV_HEAD_DIM == 256
    static_assert((VB / 8) % 4 == 0 && VB / 32 == KV_MMA_VRAW, "whole words per lane group");
    if constexpr (A % 2 != 0) {
        kv_mma_vload_t<true>(rows, g, raw);
    } else if constexpr (A == 0) {
        const unsigned* q = reinterpret_cast<const unsigned*>(p);
#pragma unroll
        for (int i = 0; i < KV_MMA_VRAW; ++i) raw[i] = q[i];
    } else {
        const unsigned* q = reinterpret_cast<const unsigned*>(p - A);
        unsigned w[KV_MMA_VRAW + 1];
#pragma unroll
        for (int i = 0; i <= KV_MMA_VRAW; ++i) w[i] = q[i];
#pragma unroll
        for (int i = 0; i < KV_MMA_VRAW; ++i) raw[i] = __byte_perm(w[i], w[i + 1], 0x5432);
    }
#else
    static_assert(VB == 32 || VB == 64, "4-bit runs of one or two words at D <= 128");
    static_assert((VB / 8) % 4 == 0, "lane terms in whole words");
    if constexpr (A == 0) {
        const unsigned* q = reinterpret_cast<const unsigned*>(p);
        raw[0] = q[0];
        raw[1] = VB == 64 ? q[1] : 0u;
    } else if constexpr (A == 2 && VB == 64) {
        const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
        const unsigned mid = *reinterpret_cast<const unsigned*>(p + 2);
        raw[0] = __byte_perm(h[0], mid, 0x5410);
        raw[1] = __byte_perm(mid, h[3], 0x5432);
    } else {
        kv_mma_vload_t<true>(rows, g, raw);  // odd, or two 2-byte loads and a permute: as before
    }
#endif
}
#endif
#endif
#if KV_TQ_V_HALVES || KV_TQ_V_WORD || KV_TQ_V_WINS
// 3-bit codes from 16-bit units: a "window" t (a multiple of 8) is the word holding run bits
// t .. t + 15 of token a in its low half and of token b in its high half. Halves: one byte
// permute of the two tokens' units for t % 16 == 0, one byte permute of the two neighbouring
// windows for t % 16 == 8. Word (D = 64): one byte permute of the two tokens' words.
// A code at bit p <= 4 (fp16 codes, KV_TQ_PV16: 7) of a window's halves converts straight from it
// (kv_codes_bf16x2_masked, S = p); a code further up takes the window shifted right by p - 1
// (one shift for both tokens), which puts it at bit 1 and the next code at bit 4 of the same
// shifted word, so the next code is free. Window t = 8 floor(3 i / 8) for code i (capped at
// the last whole window, run bits VB - 16 .. VB - 1): every code then sits at p <= 7 of its
// window (the last, capped, at 13: one more shift). A run of 16 codes (D = 128) takes 5
// windows and 6 shifts where per-pair shifts and merges took 24; 8 codes (D = 64) 2 and 3
// (4-bit codes: 4 byte permutes and 4 shifts); 32 codes (D = 256) take 11 and 12, from
// 16-bit units (KV_TQ_V_HALVES, KVKIT_DECODE_TQ3=1) or from packed words (KV_TQ_V_WINS,
// KVKIT_DECODE_TQ3_256=1).
// Returns (t, s, S) for code i: window, right shift, code bit in the shifted halves.
struct KvTqVPlace {
    int t, s, S;
};
__host__ __device__ constexpr KvTqVPlace kv_tq_vplan(int i) {
    constexpr int LAST = (KV_HEAD_DIM / 8) * 3 - 16;  // the last window inside the run
    KvTqVPlace pl{0, 0, 0};
    bool shifted_prev = false;  // code k - 1 took a shift that also places code k
    KvTqVPlace prev{0, 0, 0};
    for (int k = 0; k <= i; ++k) {
        const int b = 3 * k;
        if (shifted_prev && b + 3 <= prev.t + 16 && b - prev.t - prev.s <= KV_TQ_VS_MAX) {
            pl = KvTqVPlace{prev.t, prev.s, b - prev.t - prev.s};
            shifted_prev = false;
            continue;
        }
        int t = (b / 8) * 8;
        if (t > LAST) t = LAST;
        const int p = b - t;
        if (p <= KV_TQ_VS_MAX) {
            pl = KvTqVPlace{t, 0, p};
            shifted_prev = false;
        } else {
            pl = KvTqVPlace{t, p - 1, 1};
            shifted_prev = true;
            prev = pl;
        }
    }
    return pl;
}
// Window t of tokens a, b (see kv_tq_vplan).
template <int T>
__device__ __forceinline__ unsigned kv_tq_vwin(const unsigned* ra, const unsigned* rb) {
#if KV_TQ_V_WORD
    static_assert(T == 0 || T == 8, "window inside the 24-bit run");
    // run bytes T / 8, T / 8 + 1 of a (low half) and of b (high half)
    return __byte_perm(ra[0], rb[0], T == 0 ? 0x5410 : 0x6521);
#elif KV_TQ_V_WINS
    // Packed words (raw[i] = run bits 32 i .. 32 i + 31): a window inside one word is one byte
    // permute of the two tokens' words (run bytes T / 8, T / 8 + 1 at bytes T % 32 / 8 and
    // one up); one across two words (T % 32 == 24) joins the windows either side as the
    // halves plan does (they are the windows of codes nearby, so mostly built anyway).
    static_assert(T % 8 == 0 && T >= 0 && T + 16 <= 32 * KV_MMA_VRAW, "window inside the run");
    constexpr int o = (T % 32) / 8;  // the window's first byte in word T / 32
    if constexpr (o < 3) {
        return __byte_perm(ra[T / 32], rb[T / 32], (o | ((o + 1) << 4) | ((o + 4) << 8) |
                                                   ((o + 5) << 12)));
    } else {
        return __byte_perm(kv_tq_vwin<T - 8>(ra, rb), kv_tq_vwin<T + 8>(ra, rb), 0x6341);
    }
#else
    static_assert(T % 8 == 0 && T >= 0 && T + 16 <= 16 * KV_MMA_VRAW, "window inside the run");
    if constexpr (T % 16 == 0) {
        return __byte_perm(ra[T / 16], rb[T / 16], 0x5410);  // a's unit low, b's unit high
    } else {
        // bytes 1 and 3 of window T - 8 (a's and b's run byte T / 8), bytes 0 and 2 of
        // window T + 8 (run byte T / 8 + 1).
        return __byte_perm(kv_tq_vwin<T - 8>(ra, rb), kv_tq_vwin<T + 8>(ra, rb), 0x6341);
    }
#endif
}
template <int I>
__device__ __forceinline__ unsigned kv_tq_vcode(const unsigned* ra, const unsigned* rb) {
    constexpr KvTqVPlace pl = kv_tq_vplan(I);
    constexpr unsigned MM = 7u * 0x00010001u;
    const unsigned w = kv_tq_vwin<pl.t>(ra, rb) >> pl.s;
    return KV_TQ_VCODES<KV_MMA_VCODE_OFFSET, MM, pl.S>(w);
}
// Pair j (a compile-time constant after the m-tile loop's unrolling: the chain folds to one
// case; only pairs inside the run are instantiated).
template <int J = 0>
__device__ __forceinline__ void kv_tq_vpair_h(const unsigned* ra, const unsigned* rb, int j,
                                              unsigned* w0, unsigned* w1) {
    if constexpr (J + 1 < KV_HEAD_DIM / 16) {
        if (j != J) {
            kv_tq_vpair_h<J + 1>(ra, rb, j, w0, w1);
            return;
        }
    }
    *w0 = kv_tq_vcode<2 * J>(ra, rb);
    *w1 = kv_tq_vcode<2 * J + 1>(ra, rb);
}
#endif
// Codes 2j, 2j + 1 of the lane's run for tokens a (low halves) and b (high halves), as
// bf16 of c - KV_MMA_VCODE_OFFSET.
__device__ __forceinline__ void kv_mma_vpair(const unsigned* ra, const unsigned* rb, int j,
                                             unsigned* w0, unsigned* w1) {
    constexpr int B = TQ_VALUE_BITS;
    constexpr unsigned MM = ((1u << B) - 1u) * 0x00010001u;
#if KV_TQ_V_HALVES || KV_TQ_V_WORD || KV_TQ_V_WINS
    (void)MM;
    kv_tq_vpair_h(ra, rb, j, w0, w1);
#else
    if constexpr (B == 4) {
        // Byte j of each: a's to byte 0, b's to byte 2.
        const int o = j & 3;
        const unsigned e = __byte_perm(ra[j >> 2], rb[j >> 2], o | ((4 + o) << 8));
        *w0 = KV_TQ_VCODES<KV_MMA_VCODE_OFFSET, MM>(e);
#if KV_TQ_PV16
        *w1 = KV_TQ_VCODES<KV_MMA_VCODE_OFFSET, MM, B>(e);  // (fp16: in place)
#else
        *w1 = KV_TQ_VCODES<KV_MMA_VCODE_OFFSET, MM>(e >> B);
#endif
    } else {
        // Codes 2j, 2j + 1 at bit sh = 2 B j of the lane's run: a's pair shifted to bit 0,
        // b's to bit 16 (a shift, or a funnel shift where the pair straddles the two words),
        // one bit select joins them, and the high code is converted where it sits (bit B).
        const int sh = 2 * B * j;
        auto down = [](const unsigned* r, int s) -> unsigned {  // run bits s.. at bit 0
            constexpr int L = KV_MMA_VRAW - 1;  // the last word: nothing above it
            return s >= 32 * L ? r[L] >> (s - 32 * L)
                               : __funnelshift_r(r[s >> 5], r[(s >> 5) + 1], s & 31);
        };
        const unsigned xa = down(ra, sh);
        const unsigned xb = sh >= 16 ? down(rb, sh - 16) : rb[0] << (16 - sh);
        const unsigned e = (xa & 0xFFFFu) | (xb & 0xFFFF0000u);
        *w0 = KV_TQ_VCODES<KV_MMA_VCODE_OFFSET, MM>(e);
        *w1 = KV_TQ_VCODES<KV_MMA_VCODE_OFFSET, MM, B>(e);
    }
#endif
}
#endif
__device__ __forceinline__ void kv_mma_vtok(const unsigned char* const* rows, float* sc,
                                            float* z) {
    const float s = kv_dc_f16_at(rows[0] + TQ_VALUE_SCALE_OFFSET);
    *sc = s;
    *z = fmaf((float)KV_MMA_VCODE_OFFSET, s, kv_dc_f16_at(rows[0] + TQ_VALUE_ZERO_OFFSET));
}

// 3-bit MSE keys' four table copies take 6 KB more shared memory than one (kv_tq_kplan). At
// D = 128 with <= 8 query rows (the tensor-core core at four CTAs per SM) a 3bit_nc CTA then
// needs three 7 KB stages instead of four to stay under a quarter of an SM (~56 KB): a 27 KB
// budget (the default is 28) gives three, as 4bit_nc and k3v4_nc have (their stages are
// 9 KB). A launcher budget (sweeps) still wins.
#if !TQ_KEY_FP8 && TQ_KEY_BITS == 3 && KV_HEAD_DIM == 128 && KV_GROUP * KV_Q_LEN <= 8 && \
    !defined(KVD_STAGE_BUDGET_KB) && !(defined(KVKIT_DECODE_SIMT) && KVKIT_DECODE_SIMT)
#define KVD_STAGE_BUDGET_KB 27
#endif

// -DKVKIT_DECODE_TQ_TOKEN_ORDER (kvkit/cuda/decode.py; A/B runs): the order in which the
// tensor-core core takes a warp's 16 staged tokens at head_dim 256 (decode_mma.cuh
// KV_MMA_TOKEN_A / _B / _K). 0 (default): tokens in order, the build before. 1: the orders
// below for 3bit_nc; 2: for 4bit_nc too (k3v4_nc keeps the order: none of this form helps it).
// Why: the staged rows are the unpadded slots (TQ_SLOT_BYTES apart, 2-byte aligned), and a
// warp's key loads (lane c's code run of tokens g, g + 8: KV_TQ_RUN_WORDS + 1 words each) and
// value loads (lane group g's codes of tokens 2c + {0, 1, 8, 9}: KV_MMA_VRAW + 1 words) hit
// the same banks for several lanes: the 198-byte 3bit_nc slot takes 4 wavefronts per value
// word load (lane (g, c)'s run starts at word 99 c + 3 g + const: 11 banks for 32 lanes).
// Which token a lane reads is free (the same attention up to float32 rounding: which lane
// sums which token); orders of the form tok(2c + e + 8f) = a(c) + B e + K f keep a lane's
// rows one base plus constants (a free permutation cost the tile pairs ~30 instructions per
// warp-tile in row offsets). Shared-memory wavefronts per warp-tile of the key + value loads
// (norm, scale and zero included; tests/cuda/test_tq_token_order_model.py), in order ->
// below: 3bit_nc 58 + 72 -> 46 + 56 (the best of the form; a free permutation 44 + 48),
// 4bit_nc 38 + 28 -> 20 + 28, k3v4_nc 60 + 28 (best of the form 58 + 28; free 52 + 28).
// Not at D = 64 (3bit_nc 20 + 24 and k3v4_nc 20 + 40 could go to 14 + 16 / 14 + 24 with free
// permutations, but the 128-register pairs there recompute the lane's row offsets: +67 to
// +72 instructions per pair) nor D = 128 (little to gain). The session-12 value-halves plan
// at D = 256 (2-byte value loads) takes 104 value wavefronts where the words take 72, the
// likely reason it measured slower while 91 instructions per warp-tile cheaper.
#ifndef KVKIT_DECODE_TQ_TOKEN_ORDER
#define KVKIT_DECODE_TQ_TOKEN_ORDER 0
#endif
// KVKIT_DECODE_TQ3_256=2 (above) takes 3bit_nc's order with the pair addresses: the tile
// pairs' ~30 extra instructions per warp-tile for the order came from row offsets rebuilt per
// pair, which the lane offsets of KVD_PAIR_ADDR hold instead (static walk, sm_90, 4 x 1, with
// the value windows: 1779 per pair in order without pair addresses, 1790 with them, 1790 with
// them and the order, 1852 with the order alone), against 28 fewer wavefronts per warp-tile.
// -DKVKIT_DECODE_TQ3_BANKS (kvkit/cuda/decode.py; A/B runs; default 1; 0 is the build before): 1
// takes turboquant_3bit_nc's staged slot loads at head_dim 128 in a bank-friendly token order
// (below; every G and q_len: the single-tile loop of G * q_len > 4 reads the rows through
// kv_mma_tok, the tile pairs through their lane offsets). Why: Nsight Compute at (32, 4096),
// Hq = 128 (G = 16; H200, session 20) has 3bit_nc executing no more warp instructions than
// 4bit_nc (60.8 M vs 61.2 M) but 32% more short-scoreboard stalls (shared-memory results).
// The wavefront model (tests/cuda/test_tq_token_order_model.py, the loads this build issues:
// the key run as 3 + 1 words, the norm, the value scale and zero of the score tokens, the
// values as three 2-byte units per PV token) puts the 102-byte rows' key words 3-way on the
// banks: 28 key + 32 value wavefronts per warp-tile in 26 loads (4bit_nc: 22 + 36 in 32);
// this order, the best of the form a(c) + B e + K f (and of a search over free permutations),
// 18 + 28. The value units stay 2-way (six-byte lane strides: 44 words for 4 tokens). Another
// float32 order (which lane sums which token): not bit for bit with 0. In launches whose
// slots are staged as padded 112-byte rows (caches without token-contiguous slot slabs) the
// order costs instead (model: 10 + 28 -> 20 + 32).
// Measured on the H200 (session 20, call 6; 3bit_nc graph ms, 0 / 0 -> 1 / 1): (32, 4096)
// Hq = 128 0.1404 / 0.1406 -> 0.1374 / 0.1372 (4bit_nc 0.1372 / 0.1371, the same build either
// way, 0.1376 / 0.1362), (64, 8192) 0.2217 / 0.2233 -> 0.2121 / 0.2161, (1, 131072) 0.0645 /
// 0.0648 -> 0.0624 / 0.0626, (8, 8192) 0.0380 / 0.0378 -> 0.0366 / 0.0368; Nsight Compute at
// Hq = 128: short-scoreboard stall samples 2925 -> 2394, stage 1 184.8 -> 179.1 us. Default 1.
#ifndef KVKIT_DECODE_TQ3_BANKS
#define KVKIT_DECODE_TQ3_BANKS 1
#endif
#if KVKIT_DECODE_TQ3_BANKS < 0 || KVKIT_DECODE_TQ3_BANKS > 1
#error "KVKIT_DECODE_TQ3_BANKS: 0 or 1"
#endif
// -DKVKIT_DECODE_TQ4_ORDER64 (kvkit/cuda/decode.py; A/B runs; default 1; 0 is the build before): 1
// takes turboquant_4bit_nc's staged slot loads at head_dim 64 (70-byte rows) in the order
// a(c) = 4 c, B = 1, K = 2 (tokens 0 1 4 5 8 9 12 13 2 3 6 7 10 11 14 15). Why: the wavefront
// model (tests/cuda/test_tq_token_order_model.py) has the value loads at 22 wavefronts per
// warp-tile in order and 18 in this order, the best of the form a(c) + B e + K f that keeps
// the tile pairs' held key-run alignment (KAL: K rows a whole number of words apart, 140
// bytes) and the value words' compile-time alignment (KV_MMA_VLOAD_AT4: every a(c) even);
// the best form without them (B = 2, K = 1: 14 + 16) would load the key runs by their
// run-time alignment again (+12 instructions a pair). The same loads and instructions; which
// lane sums which token changes: float32 rounding apart, the same attention.
// Measured on the H200 (session 20, call 10; 4bit_nc graph ms, 0 / 0 -> 1 / 1, 3bit_nc's
// unchanged build beside it within +0.5%): (32, 4096) D = 64 0.0431 / 0.0435 -> 0.0427 /
// 0.0430, (8, 8192) 0.0256 / 0.0259 -> 0.0255 / 0.0256, (1, 32768) 0.0174 / 0.0173 -> 0.0173 /
// 0.0173: about 1%, the size of the spread. Default 1 since session 21: with the switch at 1
// every 4-bit decode and plan GPU test (-k "4bit and not write", 329) passed natively and 329
// through sm_80 (session 21, call 1).
#ifndef KVKIT_DECODE_TQ4_ORDER64
#define KVKIT_DECODE_TQ4_ORDER64 1
#endif
#if KVKIT_DECODE_TQ4_ORDER64 < 0 || KVKIT_DECODE_TQ4_ORDER64 > 1
#error "KVKIT_DECODE_TQ4_ORDER64: 0 or 1"
#endif
// -DKVKIT_DECODE_TQ3_ORDER64 (kvkit/cuda/decode.py; A/B runs; default 1; 0 is the build before): 1
// takes turboquant_3bit_nc's staged slot loads at head_dim 64 (54-byte rows) in the order
// a(c) = 4 c, B = 2, K = 1 (tokens 0 2 4 6 8 10 12 14 1 3 5 7 9 11 13 15), with the tile pairs'
// key runs of the K rows read from the held word below (KV_MMA_KLOAD_AL2). Why: 3bit_nc at
// D = 64 measured 2.6% slower than 4bit_nc (H200, (32, 4096), 0.0438 vs 0.0427 ms) and still
// took its tokens in order. The wavefront model (tests/cuda/test_tq_token_order_model.py) has
// it at 20 key + 20 value wavefronts per warp-tile in order; among the orders of the form
// a(c) + B e + K f those that keep the pairs' held key-run alignment (KAL: K rows a whole
// number of words apart, K even on 54-byte rows) reach no fewer than 40, and the best of the
// form (K = 1, 17 + 20) has the K rows 2 mod 4 bytes on, which would load the key runs by their
// run-time alignment again (+12 instructions a pair, as 4bit_nc's comment above says). So the
// K row's run is read from the same held word instead: it lies 2 bytes further on than the
// score token's (a lane's run at 0 or 2 mod 4 becomes 2 or 0), so its three words from the
// held word plus 4 floor(54 K / 4) bytes cover it at byte 2 or 4, and one more held shift (16
// or 32 bits, a clamped funnel shift) takes it down: the same loads and funnel shifts a pair.
// Those word loads are the ones the model counts for the pairs: 14 + 20 (the single-tile loop
// of G * q_len > 4 and an odd last tile, by run-time alignment: 17 + 20). The value loads
// (KV_TQ_V_WORD: two 2-byte units per token whatever the row's parity) and the norm, scale and
// zero (2-byte loads) need no alignment. Static walk (scripts/sass_path.py, sm_90, 4 x 1,
// --pairs --common warps23): 775 -> 772 warp instructions per pair, LDS 108 and SHF 40 both
// ways (the held shift is one more register: 109 -> 109 on sm_90 at 4 x 1, 119 -> 127 at 8 x 1,
// no spills); the single-tile loop (16 x 1) 689 -> 692 per warp-tile. In staged rows padded to
// 80 bytes (caches without token-contiguous slot slabs) the order costs (model: 14 + 12 -> 16 +
// 24), as KVKIT_DECODE_TQ3_BANKS's does at 128. Which lane sums which token changes: float32
// rounding apart, the same attention.
// Measured on the H200 (session 22, call 2; graph ms, 0 / 1 / 0 / 1, 4bit_nc's unchanged build
// beside it): (32, 4096) D = 64 0.0442 / 0.0427 / 0.0438 / 0.0426 (4bit_nc 0.0434 / 0.0429 /
// 0.0428 / 0.0429), (8, 8192) 0.0262 / 0.0255 / 0.0260 / 0.0256 (0.0258 / 0.0258 / 0.0257 /
// 0.0257), (1, 32768) 0.0179 / 0.0174 / 0.0177 / 0.0174 (0.0175 / 0.0174 / 0.0173 / 0.0174):
// -2.3 to -3.4%, level with or faster than 4bit_nc. With the switch at 1 every 3-bit decode
// and plan GPU test (-k "3bit and not write", 300) passed natively and 300 through sm_80,
// memcheck of sanitize_targets 64 and the order's tests: 0 errors. Default 1.
#ifndef KVKIT_DECODE_TQ3_ORDER64
#define KVKIT_DECODE_TQ3_ORDER64 1
#endif
#if KVKIT_DECODE_TQ3_ORDER64 < 0 || KVKIT_DECODE_TQ3_ORDER64 > 1
#error "KVKIT_DECODE_TQ3_ORDER64: 0 or 1"
#endif
#if !TQ_KEY_FP8 && KV_HEAD_DIM == 256 && TQ_KEY_BITS == 3 && TQ_VALUE_BITS == 3 && \
    (KVKIT_DECODE_TQ_TOKEN_ORDER >= 1 || KVKIT_DECODE_TQ3_256 >= 2)
// a(c) = 0, 1, 8, 9; B = 2, K = 4: tokens 0 2 1 3 8 10 9 11 4 6 5 7 12 14 13 15
#define KV_MMA_TOKEN_A 0x9810u
#define KV_MMA_TOKEN_B 2
#define KV_MMA_TOKEN_K 4
#elif !TQ_KEY_FP8 && KV_HEAD_DIM == 256 && TQ_KEY_BITS == 4 && TQ_VALUE_BITS == 4 && \
    KVKIT_DECODE_TQ_TOKEN_ORDER == 2
// a(c) = 2 c; B = 8, K = 1: tokens 0 8 2 10 4 12 6 14 1 9 3 11 5 13 7 15
#define KV_MMA_TOKEN_A 0x6420u
#define KV_MMA_TOKEN_B 8
#define KV_MMA_TOKEN_K 1
#elif !TQ_KEY_FP8 && KV_HEAD_DIM == 256 && TQ_KEY_BITS == 3 && TQ_VALUE_BITS == 4 && \
    KVKIT_DECODE_K3V4 == 1
// a(c) = 2 c; B = 8, K = 1 (KVKIT_DECODE_K3V4 above): with the interleaved key runs 34 + 28
// wavefronts per warp-tile (the best of the form; in order 52 + 28)
#define KV_MMA_TOKEN_A 0x6420u
#define KV_MMA_TOKEN_B 8
#define KV_MMA_TOKEN_K 1
#elif !TQ_KEY_FP8 && KV_HEAD_DIM == 128 && TQ_KEY_BITS == 3 && TQ_VALUE_BITS == 3 && \
    KVKIT_DECODE_TQ3_BANKS == 1
// 3bit_nc at D = 128 (102-byte rows; KVKIT_DECODE_TQ3_BANKS=1, above): a(c) = 2 c; B = 8,
// K = 1, 4bit_nc's order at 256: tokens 0 8 2 10 4 12 6 14 1 9 3 11 5 13 7 15
#define KV_MMA_TOKEN_A 0x6420u
#define KV_MMA_TOKEN_B 8
#define KV_MMA_TOKEN_K 1
#elif !TQ_KEY_FP8 && KV_HEAD_DIM == 64 && TQ_KEY_BITS == 4 && TQ_VALUE_BITS == 4 && \
    KVKIT_DECODE_TQ4_ORDER64 == 1
// 4bit_nc at D = 64 (KVKIT_DECODE_TQ4_ORDER64=1, above): a(c) = 4 c; B = 1, K = 2
#define KV_MMA_TOKEN_A 0xc840u
#define KV_MMA_TOKEN_B 1
#define KV_MMA_TOKEN_K 2
#elif !TQ_KEY_FP8 && KV_HEAD_DIM == 64 && TQ_KEY_BITS == 3 && TQ_VALUE_BITS == 4 && \
    KVKIT_DECODE_K3V4 == 1
// k3v4_nc at D = 64 (62-byte rows; KVKIT_DECODE_K3V4=1): a(c) = 0, 1, 4, 5; B = 8, K = 2, the
// best of the form, takes the key + value loads (the model of test_tq_token_order_model.py
// with D = 64's 2-byte value loads) from 20 + 40 wavefronts per warp-tile in order to 14 + 24
// (4bit_nc in order: 14 + 32). The pair addresses hold the lane offsets (the order's row
// offsets are worked out once, before the loop).
#define KV_MMA_TOKEN_A 0x5410u
#define KV_MMA_TOKEN_B 8
#define KV_MMA_TOKEN_K 2
#elif !TQ_KEY_FP8 && KV_HEAD_DIM == 64 && TQ_KEY_BITS == 3 && TQ_VALUE_BITS == 3 && \
    KVKIT_DECODE_TQ3_ORDER64 == 1
// 3bit_nc at D = 64 (54-byte rows; KVKIT_DECODE_TQ3_ORDER64=1, above): a(c) = 4 c; B = 2,
// K = 1, the K row's key run from the held word (KV_MMA_KLOAD_AL2): 20 + 20 -> 14 + 20
#define KV_MMA_TOKEN_A 0xc840u
#define KV_MMA_TOKEN_B 2
#define KV_MMA_TOKEN_K 1
#if KV_TQ17 && !KV_TQ_KSPLIT
#define KV_MMA_KLOAD_AL2 1
static_assert(KV_TQ_RUN_BYTES % 2 == 0 && TQ_SLOT_BYTES % 2 == 0,
              "held K-row runs: the lane's run at 0 or 2 mod 4 (even lane terms and rows)");
#endif
#endif

#include "common/decode_core.cuh"

KV_DEFINE_STAGE1_KERNEL(kv_decode_turboquant_stage1)
