// decode_mma.cuh: split-K decode stage 1 on tensor cores (mma.sync m16n8k16, sm_80+), for
// G * q_len <= 16 query rows and head_dim in {32, 64, 96, 128}, and G * q_len <= 8 at head_dim
// 256 (two row tiles there would keep 128 accumulator floats per thread; the CUDA-core core
// serves them). Included by decode_core.cuh when
// KVD_USE_MMA is 1; the tile pipeline (cp.async staging, page ring, copy modes) is the
// one of decode_core.cuh, only the arithmetic differs.
//
// Work split: 4 warps, 64-token tiles, warp w owns tokens [16 w, 16 w + 16) of every tile and
// keeps its own online-softmax state (m, l) and accumulator for all 16 (padded) rows; the four
// warp states meet once, at the end of the split, in shared memory. No barrier per tile
// beyond the pipeline's one.
//
// Exactness (DESIGN.md section 4: float32 rounding only). fp16 mma products are exact and
// accumulate in float32, so every operand is made exact in fp16 (or bf16):
//   scores S = Q K^T: each query row is scaled by a power of two 2^e_r (max |q| to
//     [2^14, 2^15)) and split q = hi + lo in fp16 (lo = 0, and skipped, for fp16 queries
//     without rotation); keys are exact fp16 (fp16, E4M3 and NVFP4 values, up to a power of
//     two the family names) or, for codebook keys, split hi + lo by the family's table.
//     S = (hi K + lo K [+ hi K_lo]) 2^-e_r; the q_lo * K_lo term (2^-22 relative) is dropped.
//   PV, family values exact in fp16 (KV_MMA_VCODES 0): P (in [0, 1]) is scaled by 2^15 and
//     split hi + lo in fp16; O = (P_hi V + P_lo V) 2^-15.
//   PV, TurboQuant values (KV_MMA_VCODES 1, v = code * scale_t + zero_t): the integer codes
//     are exact in bf16; W = P * scale_t is split in three bf16 parts (24 bits, any float32
//     range) and O = W_hi C + W_mid C + W_lo C + sum_t p_t zero_t (the last in float32 on the
//     CUDA cores). KV_MMA_VCODES_F16: the codes exact in fp16, and per fresh accumulator and
//     row r a power of two s_r = 2^k_r (kv_w16_pow2: the largest |W| of the row's tokens in
//     that accumulator to [2^14, 2^15)), W s_r split hi + lo in fp16 (22 bits, as P's), and
//     the accumulator added into the running one times the exact 2^-k_r (one FFMA).
// Softmax state, masks, soft-cap and the merge are float32 as in the SIMT core.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .row.col): g = lane / 4, c = lane % 4.
//   A (16 x 16): a0 (row g, k 2c..2c+1), a1 (row g+8, same k), a2 (row g, k 2c+8..),
//     a3 (row g+8, k 2c+8..); B (16 x 8): b0 (k 2c..2c+1, col g), b1 (k 2c+8.., col g);
//   C (16 x 8): c0 (g, 2c), c1 (g, 2c+1), c2 (g+8, 2c), c3 (g+8, 2c+1).
// Orientation: the query rows are the mma N (8 per row tile, NR = ceil(R / 8) tiles), so
// R = 4..8 wastes nothing of M and the accumulator is D / 16 m-tiles x 4 floats per row tile.
//   Scores S^T = K Q^T: M = the warp's 16 tokens, K = 16 dims per k-step; the thread's C
//     holds tokens g, g + 8 x rows 8 nr + 2c, +1 (its softmax rows).
//   PV O^T = V^T P^T: M = 16 dims per m-tile, K = the warp's 16 tokens; B = P^T is the
//     transpose (movmatrix) of the thread's score C pairs, A = V^T comes from a row-major
//     [token][dim] 16-bit tile by ldmatrix.trans; the thread's C holds dims 16 mi + g, + 8 x
//     rows 8 nr + 2c, +1: the rows whose softmax state it owns (no shuffles for alpha).
//
// Family hooks (defined by the entry before including decode_core.cuh):
//   KV_MMA_VCODES     0: kv_mma_v8 returns fp16 values (times KV_MMA_VF^-1);
//                     1: bf16 integer codes (minus KV_MMA_VCODE_OFFSET), and kv_mma_vtok
//                     gives (scale_t, zero_t + offset * scale_t)
//   KV_MMA_KF / VF    float: true key / value = operand value * KF / VF
//   KV_MMA_TABLE_WORDS, kv_mma_init_table(tab, tid, nthreads) -> float factor: a shared
//                     table built per CTA (TurboQuant: the codebook's {hi, lo} word per code
//                     and lane), and a power-of-two factor the scores are multiplied by
//   KV_MMA_K_DIRECT   1: fp16 keys read from the staged plane-0 rows by ldmatrix
//   kv_mma_k4(rows, ks, c, &h0, &h1): key elements 16 ks + 2c, +1 (h0) and
//                     16 ks + 2c + 8, +9 (h1) of one token as fp16x2
//   KV_MMA_K_REGS     1: the score mma's K (dims) permuted so a lane's key elements of a
//                     token are one contiguous run (the query rows in shared memory take the
//                     same permutation, once per CTA): lane c holds dims KPL c .. KPL c +
//                     KPL - 1 (KPL = D / 4) of its tokens g and g + 8;
//                     kv_mma_kload(rows, c, raw) loads one token's run into KV_MMA_KRAW
//                     words (one wide load instead of two narrow ones per k-step),
//                     kv_mma_kstep(raw, ks, tab, &h0, &h1) gives k-step ks's operands:
//                     h0 = run elements kv_mma_kpos(ks, 0) (low half), kv_mma_kpos(ks, 1)
//                     (high half), h1 = kv_mma_kpos(ks, 2), kv_mma_kpos(ks, 3); the family
//                     picks the order within the run that makes its unpacking cheapest.
//                     kstep also gets the family table (KV_MMA_TABLE_WORDS).
//   KV_MMA_KDIM       1 (with K_HILO or K_REGS): lane c's run element e is dim
//                     kv_mma_kdim(c, e), not KPL c + e (the family's run layout; the query
//                     rows follow it)
//   KV_MMA_K_HILO     1 (with K_REGS): each A register holds one key element as {hi, lo}
//                     (fp16 halves, element = hi + lo), and the query rows hold every
//                     query dim twice, so the mma's K extent is 2 D and one product
//                     q (hi + lo) per element pair comes out of one mma: codebook keys read
//                     one table word per element (no lo mma chain, no pair assembly).
//                     kpos(ks, j), j = 0 (a0 / a1) and 1 (a2 / a3), over D / 8 k-steps.
//   KV_MMA_V_DIRECT   1: fp16 values read from the staged plane-1 rows by ldmatrix.trans
//   kv_mma_v8(rows, d8): value elements d8..d8+7 of one token as 4 x 16-bit pairs (families
//                     with neither direct nor register V: NVFP4 at D = 96 under
//                     KVKIT_DECODE_NV96=0, decode_nvfp4.cu)
//   KV_MMA_V_REGS     1: the V operand straight from the staged rows into registers, with
//                     the PV mma's M (output dims) permuted so a lane's dims are contiguous:
//                     kv_mma_vload(rows, g, raw) loads one token's dims VPL g .. VPL g +
//                     VPL - 1 (VPL = D / 8) into KV_MMA_VRAW words, and
//                     kv_mma_vpair(raw_a, raw_b, j, &w0, &w1) returns dims VPL g + 2 j (w0)
//                     and + 1 (w1) of tokens a (low half) and b (high half); with KV_MMA_VCODES 0,
//                     all-zero raw words (an invalid token's, masked) must give +0 operands
//   KV_MMA_VDIM       1 (with V_REGS): pair j of lane group g is dims kv_mma_vdim(g, j), + 1,
//                     not VPL g + 2 j (the family's run layout; the output rows follow it)
//   KV_MMA_BF16       1: bf16 keys and values, read from the staged rows (K_DIRECT and
//                     V_DIRECT): scores and PV on bf16 mma, the query rows and P split in
//                     three bf16 parts each (hi + mid + lo: 24 bits, so every product is
//                     exact as in the fp16 case; bf16's exponent range needs no scaling).
//   KV_HAS_KMUL / kv_family_kmul(rows): per-token score factor (shared with the SIMT core)
//   KV_MMA_NANTILE_K  1 (with K_REGS): the raw key words are E4M3 bytes, and
//                     kv_mma_kstep_finite (same arguments) gives kv_mma_kstep's operands for
//                     every byte but a NaN code; the tile loop tests the warp's raw words
//                     (kv_dc_e4m3_nan_acc, one vote) and takes it where none holds one
//   KV_MMA_NANTILE_V  1 (with V_REGS, VCODES 0): the same for values, kv_mma_vpair_finite
//                     beside kv_mma_vpair (tested after the invalid tokens' words are zeroed)
//   KV_MMA_TOKEN_SWAP 1 (with K_REGS and V_REGS): the warp's 16 tokens in the order
//                     kv_mma_tok below (score M row / PV k index i is token kv_mma_tok(i)),
//                     for staging layouts whose bank pattern wants it (NVFP4's unpadded
//                     64-byte value rows, decode_nvfp4.cu)
//   KV_MMA_TOKEN_A, _B, _K (with K_REGS and V_REGS, not with TOKEN_SWAP): the warp's tokens
//                     in the order kv_mma_tok(2 c + e + 8 f) = a(c) + B e + K f (c = 0..3,
//                     e, f = 0 or 1; a(c) nibble c of KV_MMA_TOKEN_A), a permutation of 0..15
//                     of a family's choice for its staging rows' bank pattern
//                     (decode_turboquant.cu). A lane's key rows (tokens g, g + 8) and value
//                     rows (2 c + {0, 1, 8, 9}) stay one base plus constants, as in order.
#pragma once

#ifndef KV_MMA_VCODES
#define KV_MMA_VCODES 0
#endif
#ifndef KV_MMA_K_DIRECT
#define KV_MMA_K_DIRECT 0
#endif
#ifndef KV_MMA_V_DIRECT
#define KV_MMA_V_DIRECT 0
#endif
#ifndef KV_MMA_TABLE_WORDS
#define KV_MMA_TABLE_WORDS 0
#endif
#ifndef KV_MMA_V_REGS
#define KV_MMA_V_REGS 0
#endif
#ifndef KV_MMA_BF16
#define KV_MMA_BF16 0
#endif
#ifndef KV_MMA_K_REGS
#define KV_MMA_K_REGS 0
#endif
#ifndef KV_MMA_K_HILO
#define KV_MMA_K_HILO 0
#endif
#ifndef KV_MMA_TOKEN_SWAP
#define KV_MMA_TOKEN_SWAP 0
#endif
#ifndef KV_MMA_NANTILE_K
#define KV_MMA_NANTILE_K 0
#endif
#ifndef KV_MMA_NANTILE_V
#define KV_MMA_NANTILE_V 0
#endif
#if KV_MMA_NANTILE_K && !KV_MMA_K_REGS
#error "KV_MMA_NANTILE_K needs KV_MMA_K_REGS"
#endif
#if KV_MMA_NANTILE_V && !(KV_MMA_V_REGS && !KV_MMA_VCODES)
#error "KV_MMA_NANTILE_V needs KV_MMA_V_REGS with KV_MMA_VCODES 0"
#endif
#if KV_MMA_TOKEN_SWAP && !(KV_MMA_K_REGS && KV_MMA_V_REGS)
#error "KV_MMA_TOKEN_SWAP needs keys and values in registers (the ldmatrix paths take rows in order)"
#endif
#if KV_MMA_K_HILO && !KV_MMA_K_REGS
#error "KV_MMA_K_HILO needs KV_MMA_K_REGS"
#endif
#if defined(KV_MMA_TOKEN_A) && (KV_MMA_TOKEN_SWAP || !(KV_MMA_K_REGS && KV_MMA_V_REGS))
#error "KV_MMA_TOKEN_A needs keys and values in registers and no KV_MMA_TOKEN_SWAP"
#endif
// -DKVKIT_DECODE_MASK_ALL=1: every tile through the masked softmax (no fully-visible-tile
// fast path), for tests that compare the two bit for bit.
#if defined(KVKIT_DECODE_MASK_ALL) && KVKIT_DECODE_MASK_ALL
#define KVD_MASK_ALL 1
#else
#define KVD_MASK_ALL 0
#endif
// fp16 queries without a rotation are exact fp16 operands of fp16 keys: no lo part, no row
// scaling.
#if KV_IN_DTYPE == 1 && !KV_ROTATE_Q && !KV_MMA_BF16
#define KV_MMA_QSPLIT 0
#else
#define KV_MMA_QSPLIT 1
#endif
// Value codes as fp16 operands (a family's opt-in, TurboQuant: decode_turboquant.cu
// KV_TQ_PV16): W = P * scale_t split hi + lo in fp16 after a power of two per row and fresh
// accumulator (kv_w16_pow2), the PV mma on fp16, one part fewer than bf16's three.
#ifndef KV_MMA_VCODES_F16
#define KV_MMA_VCODES_F16 0
#endif
#if KV_MMA_VCODES_F16 && !KV_MMA_VCODES
#error "KV_MMA_VCODES_F16 needs KV_MMA_VCODES"
#endif
// The PV mma on bf16 operands (value codes, or bf16 values), else on fp16.
#define KV_MMA_PV_BF16 ((KV_MMA_VCODES && !KV_MMA_VCODES_F16) || KV_MMA_BF16)
// bf16 keys: the query parts that can be non-zero. A bf16 query (8 significant bits, times
// its row's power of two) is its hi part; an fp16 one (11 bits, no subnormals after the row
// scaling) is hi + mid exactly; float32 needs hi + mid + lo. The parts past these are
// exactly 0, so their mma add nothing and are skipped.
#define KV_MMA_BF16_QPARTS (KV_IN_DTYPE == 2 ? 1 : (KV_IN_DTYPE == 1 ? 2 : 3))
// Packed columns (KV_MMA_PACK_OK, a family's opt-in; TurboQuant: decode_turboquant.cu): with
// at most 4 query rows (R = G * q_len <= 4, one row tile) the mma's N columns 4..7 are padding
// that every score and PV mma computes for nothing. They carry the second operand part of
// rows 0..3 instead, so one mma does the work of two:
//   scores: B column r + 4 is row r's query lo part (QSPLIT; without it, its hi part again),
//     so the q lo chain (a second mma per k-step and its ldmatrix) goes; lanes c and c ^ 2
//     then hold row 2 (c & 1) + j's hi and lo sums, which one shuffle and the same float32
//     add (hi + lo == lo + hi) join, so both hold row 2 (c & 1) + j's score, bit for bit the
//     unpacked build's;
//   PV (value codes): lanes c >= 2 run the softmax of those same rows (same scores, same
//     operations: the same bits), and their B columns carry the mid part of W = p * scale
//     where lanes c < 2 carry hi, then lo where lanes c < 2 carry lo: two mmas per m-tile
//     instead of three. The accumulators of lanes c >= 2 (the mid sums) join those of lanes
//     c < 2 once, after the tile loop (float32 rounding only: the three parts were one
//     tensor-core chain per tile before).
//   PV (fp16 values, KV_MMA_PACK_F16, a family's opt-in; NVFP4: decode_nvfp4.cu): P's two fp16
//     parts (hi + lo of p * P_SCALE, kv_split_f16x2) the same way: lanes c < 2 carry hi,
//     lanes c >= 2 lo (kv_split_f16x2_packed), one mma per m-tile and tile instead of two,
//     the lo sums joined after the tile loop (float32 rounding only: hi and lo were one
//     tensor-core chain per tile or pair before).
#ifndef KV_MMA_PACK_OK
#define KV_MMA_PACK_OK 0
#endif
#ifndef KV_MMA_PACK_F16
#define KV_MMA_PACK_F16 0
#endif
// The online softmax's exps without kv_online_step's empty-row guard, the running max starting
// at -FLT_MAX (kv_mma_softmax_step; a family's opt-in, NVFP4: decode_nvfp4.cu): the same bits
// for every row with a visible key.
#ifndef KV_MMA_EXP_CLAMP
#define KV_MMA_EXP_CLAMP 0
#endif
#define KV_MMA_PACK                                                     \
    (KV_MMA_PACK_OK && KV_GROUP * KV_Q_LEN <= 4 && (KV_MMA_VCODES || KV_MMA_PACK_F16) && \
     !KV_MMA_BF16)

namespace kvm {
using kvd::D;
using kvd::G;
using kvd::QL;
using kvd::R;
using kvd::THREADS;
using kvd::TILE;
constexpr int NWM = THREADS / KV_WARP;  // 4 warps
constexpr int WT = TILE / NWM;          // 16 tokens per warp per tile
constexpr int KQ = KV_MMA_K_HILO ? 2 * D : D;  // the score mma's K extent
constexpr int KS = KQ / 16;             // k-steps of the score mma (even: D % 32 == 0)
constexpr int MT = D / 16;              // m-tiles (16 dims) of the PV mma
constexpr int NR = (R + 7) / 8;         // row tiles of 8 (the mma N)
// q rows in shared memory: KQ halves + 16 bytes, so the 8 row addresses of an ldmatrix
// fall into different banks.
constexpr int QSTR = KQ + 8;
// P is scaled by 2^15 before its fp16 split: p <= 1 stays below 65504 and p down to 2^-29
// keeps a normal fp16 hi part.
constexpr float P_SCALE = 32768.0f;
static_assert(WT == 16, "one 16-token mma k-step per warp and tile");
static_assert(R <= 16, "the mma core serves at most 16 query rows");
static_assert(D % 32 == 0 && (D <= 128 || (D == 256 && NR == 1)), "mma core head_dim");

// Per-warp V operand tile [16 tokens][VSTR] of 16-bit values (families without direct V).
constexpr int VSTR = D + 8;
// V_REGS: lane group g holds the VPL contiguous output dims VPL g .. VPL g + VPL - 1; m-tile
// mi's A rows g and g + 8 are dims VPL g + 2 mi and VPL g + 2 mi + 1.
constexpr int VPL = D / 8;
#if KV_MMA_V_DIRECT || KV_MMA_V_REGS
constexpr int VT_BYTES = 0;
#else
constexpr int VT_BYTES = NWM * 16 * VSTR * 2;
#endif
// The float query rows live only until the fp16 operands are built: they sit in the last
// cp.async stage when it holds them (the prologue fills stages 0 .. STAGES - 2; the tile
// loop's first issue, after a barrier, is the first write to stage STAGES - 1), else in the
// scratch region with the V tiles (which live only in the tile loop).
constexpr int QF_BYTES = 16 * D * 4;
constexpr bool QF_IN_STAGE = kvd::STAGE_BYTES >= QF_BYTES;
constexpr int SCRATCH = QF_IN_STAGE ? VT_BYTES : (VT_BYTES > QF_BYTES ? VT_BYTES : QF_BYTES);
// KV_MMA_TABLE_FIRST (a family's choice): the table at byte 0 instead of after the page
// ring. Table loads are LDS [offset + shared base + immediate] with the row's constant part in
// the immediate; sm_90's ptxas folds the base into a uniform register only while the
// immediates stay below 32 KB (seen on TurboQuant 3-bit keys at D = 128, G = 16, whose 8 KB
// query scratch pushed the table's last rows past it: one IADD per lookup, ~50 per tile).
#ifndef KV_MMA_TABLE_FIRST
#define KV_MMA_TABLE_FIRST 0
#endif
constexpr int TAB_BYTES = kvd::a16(KV_MMA_TABLE_WORDS * 4 + 16);
constexpr int OFF_LO = KV_MMA_TABLE_FIRST ? TAB_BYTES : 0;     // start of everything else
constexpr int OFF_VT = OFF_LO;                                // V tiles
constexpr int OFF_QH = OFF_LO + kvd::a16(SCRATCH);            // fp16 [16][QSTR] hi
constexpr int OFF_QL = OFF_QH + kvd::a16(16 * QSTR * 2);      // fp16 [16][QSTR] lo
constexpr int OFF_QM =                                        // bf16 mid
    OFF_QL + kvd::a16(KV_MMA_QSPLIT && !KV_MMA_PACK ? 16 * QSTR * 2 : 0);
constexpr int OFF_RS = OFF_QM + kvd::a16(KV_MMA_BF16 ? 16 * QSTR * 2 : 0);    // float [16]
constexpr int OFF_TP = OFF_RS + kvd::a16(16 * 4);             // int [NP][TILE] page ring
constexpr int OFF_TAB = KV_MMA_TABLE_FIRST ? 0 : OFF_TP + kvd::a16(kvd::TP_BYTES);
constexpr int OFF_STG = OFF_TP + kvd::a16(kvd::TP_BYTES) + (KV_MMA_TABLE_FIRST ? 0 : TAB_BYTES);
constexpr int OFF_QF =                                        // float [16][D] query rows
    QF_IN_STAGE ? OFF_STG + (kvd::STAGES - 1) * kvd::STAGE_BYTES : OFF_LO;
// After the tile loop the staging holds the per-warp accumulators, then the warp states.
constexpr int RED_BYTES = NWM * R * D * 4;
constexpr int OFF_ML = OFF_STG + kvd::a16(RED_BYTES);         // float [NWM][16][2] (m, l)
constexpr int ML_BYTES = NWM * 16 * 2 * 4;
constexpr int STG_BYTES = kvd::STAGES * kvd::STAGE_BYTES > kvd::a16(RED_BYTES) + ML_BYTES
                              ? kvd::STAGES * kvd::STAGE_BYTES
                              : kvd::a16(RED_BYTES) + ML_BYTES;
constexpr int SMEM = OFF_STG + STG_BYTES;
#if KVD_TILE_PAIRS
// Tile pairs' four stages must leave KVD_MIN_BLOCKS CTAs per SM (four at D <= 128: the
// 128-register cap assumes them; two at D = 256): 228 KB per SM on sm_90 / sm_100, 1 KB of it
// reserved per CTA (KV_TILE_PAIRS_ROWS limits the rows where they would not fit).
static_assert(SMEM + 1024 <= 228 * 1024 / KVD_MIN_BLOCKS,
              "tile pairs: KVD_MIN_BLOCKS CTAs per SM must fit");
#endif
}  // namespace kvm

// The warp's token (0..15) at score M row / PV k index i. KV_MMA_TOKEN_SWAP: i ^ ((i / 2) % 2),
// which swaps tokens 4m + 2 and 4m + 3, so the PV A operand's tokens 2c + e (e in {0, 1, 8,
// 9}, c = 0..3) alternate in parity over c (0, 3, 4, 7 for e = 0): in unpadded 64-byte rows
// the four c of a lane group g then fall on two bank halves, two each, and not all four on
// one (2 wavefronts per 8-byte value load, not 4). The score tokens g and g + 8 of a lane are
// a permutation of the same 16, so any such order is the same attention up to float32
// rounding (which lane sums which token).
__device__ __forceinline__ int kv_mma_tok(int i) {
#if defined(KV_MMA_TOKEN_A)
    return (int)(((unsigned)(KV_MMA_TOKEN_A) >> (4 * ((i >> 1) & 3))) & 15u) +
           (KV_MMA_TOKEN_B) * (i & 1) + (KV_MMA_TOKEN_K) * (i >> 3);
#elif KV_MMA_TOKEN_SWAP
    return i ^ ((i >> 1) & 1);
#else
    return i;
#endif
}

// The query dim at position p (= 16 ks + kk) of the shared fp16 query rows: the mma pairs
// position kk of k-step ks with A element (row, kk), which lane c = (kk % 8) / 2 holds as
// its run element kv_mma_kpos(ks, (kk % 2) + 2 (kk / 8)) (KV_MMA_K_REGS; with K_HILO both
// halves of a register are one element, kv_mma_kpos(ks, kk / 8)), else dim p.
__device__ __forceinline__ int kv_mma_qdim(int p) {
#if KV_MMA_K_HILO && defined(KV_MMA_KDIM)
    // The family's own lane runs (decode_turboquant.cu KV_TQ_KSPLIT).
    const int kk = p & 15;
    return kv_mma_kdim((kk & 7) >> 1, kv_mma_kpos(p >> 4, kk >> 3));
#elif KV_MMA_K_HILO
    const int kk = p & 15;
    return (kvm::D / 4) * ((kk & 7) >> 1) + kv_mma_kpos(p >> 4, kk >> 3);
#elif KV_MMA_K_REGS && defined(KV_MMA_KDIM)
    // The family's own lane runs (decode_nvfp4.cu at head_dim 96).
    const int kk = p & 15;
    return kv_mma_kdim((kk & 7) >> 1, kv_mma_kpos(p >> 4, (kk & 1) | ((kk >> 3) << 1)));
#elif KV_MMA_K_REGS
    const int kk = p & 15;
    return (kvm::D / 4) * ((kk & 7) >> 1) + kv_mma_kpos(p >> 4, (kk & 1) | ((kk >> 3) << 1));
#else
    return p;
#endif
}

// The tile loop's score and PV loops are lambdas called with a constant `finite` on each
// side of a warp-uniform branch (KV_MMA_NANTILE_K / _V): inlined, each call keeps one
// operand conversion.
#if KV_MMA_K_REGS
__device__ __forceinline__ void kv_mma_kstep_sel(bool finite, const unsigned* raw, int ks,
                                                 const unsigned* tab, unsigned* h0,
                                                 unsigned* h1) {
#if KV_MMA_NANTILE_K
    if (finite) {
        kv_mma_kstep_finite(raw, ks, tab, h0, h1);
        return;
    }
#endif
    (void)finite;
    kv_mma_kstep(raw, ks, tab, h0, h1);
}
#endif
#if KV_MMA_V_REGS
__device__ __forceinline__ void kv_mma_vpair_sel(bool finite, const unsigned* ra,
                                                 const unsigned* rb, int j, unsigned* w0,
                                                 unsigned* w1) {
#if KV_MMA_NANTILE_V
    if (finite) {
        kv_mma_vpair_finite(ra, rb, j, w0, w1);
        return;
    }
#endif
    (void)finite;
    kv_mma_vpair(ra, rb, j, w0, w1);
}
#endif

__device__ __forceinline__ void kv_mma_f16(float* c, const unsigned* a, unsigned b0,
                                           unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void kv_mma_bf16(float* c, const unsigned* a, unsigned b0,
                                            unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The tile's PV sum (16 tokens, fresh mma accumulator) added to the running accumulator in
// IEEE float32: the tensor cores' accumulator adds align to the larger operand and truncate,
// so small parts (the lo splits) added straight into a large running sum would be lost.
__device__ __forceinline__ void kv_acc_add4(float* acc, const float* t4) {
    acc[0] += t4[0];
    acc[1] += t4[1];
    acc[2] += t4[2];
    acc[3] += t4[3];
}

__device__ __forceinline__ void kv_ldsm_x4(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

#if KV_MMA_K_REGS && KV_HEAD_DIM > 128
// Tile pairs at D = 256 (decode_mma_pairs.cuh, KV_TILE_PAIRS_MAX_D): the pair's score k-steps
// KS0, KS0 + 2, .. with compile-time indices (template recursion), where #pragma unroll left
// the loop rolled for 3-bit keys (kv_tq_code_off3's chain folds only for a constant code
// index, and the unroller judged the unfolded body too large). The same operations in the
// same order as the loop of the D <= 128 pairs.
template <int KS0>
__device__ __forceinline__ void kv_pair_scores(const unsigned (*kraw)[2][KV_MMA_KRAW],
                                               const unsigned* tab, unsigned qh_addr,
                                               float (*sc)[kvm::NR][4]) {
    if constexpr (KS0 < kvm::KS) {
        unsigned qh[kvm::NR][4];
#pragma unroll
        for (int nr = 0; nr < kvm::NR; ++nr)
            kv_ldsm_x4(qh[nr], qh_addr + nr * 16 * kvm::QSTR + KS0 * 32);
#pragma unroll
        for (int u = 0; u < 2; ++u) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                unsigned ah[4];
                kv_mma_kstep_sel(false, kraw[h][0], KS0 + u, tab, &ah[0], &ah[2]);
                kv_mma_kstep_sel(false, kraw[h][1], KS0 + u, tab, &ah[1], &ah[3]);
#pragma unroll
                for (int nr = 0; nr < kvm::NR; ++nr)
                    kv_mma_f16(sc[h][nr], ah, qh[nr][2 * u], qh[nr][2 * u + 1]);
            }
        }
        kv_pair_scores<KS0 + 2>(kraw, tab, qh_addr, sc);
    }
}
#endif
// The transpose of an 8 x 8 matrix of 16-bit values held in mma fragment layout (lane l
// holds row l / 4, columns 2 (l % 4), +1), in the same layout (sm_75+).
__device__ __forceinline__ unsigned kv_movmatrix_trans(unsigned x) {
    unsigned r;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(r) : "r"(x));
    return r;
}

__device__ __forceinline__ void kv_ldsm_x4_trans(unsigned* r, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ unsigned kv_pack_bf16x2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// x = hi + mid + lo (three bf16x2 words, 24 significant bits) for the pair (x0, x1).
__device__ __forceinline__ void kv_split3_bf16x2(float x0, float x1, unsigned* p) {
    const unsigned h = kv_pack_bf16x2(x0, x1);
    const float r0 = x0 - __uint_as_float(h << 16);
    const float r1 = x1 - __uint_as_float(h & 0xFFFF0000u);
    const unsigned m = kv_pack_bf16x2(r0, r1);
    p[0] = h;
    p[1] = m;
    p[2] = kv_pack_bf16x2(r0 - __uint_as_float(m << 16), r1 - __uint_as_float(m & 0xFFFF0000u));
}


// Validity masks of the thread's V^T A elements: tokens 2c, 2c + 1 (vm[0]: a0, a1) and
// 2c + 8, 2c + 9 (vm[1]: a2, a3) of the warp's 16; a dropped token's half is 0. Staged rows of
// invalid tokens may hold any bits (NaN included), which an mma would spread.
__device__ __forceinline__ void kv_v_token_masks(int tw0, int c, int n_tile, const int* tp,
                                                 unsigned* vm) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int ta = tw0 + 2 * c + 8 * h;
        const bool oa = ta < n_tile && tp[ta] >= 0;
        const bool ob = ta + 1 < n_tile && tp[ta + 1] >= 0;
        vm[h] = (oa ? 0xFFFFu : 0u) | (ob ? 0xFFFF0000u : 0u);
    }
}

__device__ __forceinline__ void kv_mask_v_operand(unsigned* av, const unsigned* vm) {
    av[0] &= vm[0];
    av[1] &= vm[0];
    av[2] &= vm[1];
    av[3] &= vm[1];
}

#if KV_MMA_VCODES_F16
// (KV_MMA_VCODES_F16) kv_acc_add4 with the rows' exact powers of two undone: C columns 2c
// (t4[0], t4[2]) are the thread's row j = 0, 2c + 1 (t4[1], t4[3]) row 1; t4 * inv is exact
// (no underflow past float32's normals matters: kv_w16_pow2), so each is the one rounding of
// the add, as kv_acc_add4's.
__device__ __forceinline__ void kv_acc_fma4(float* acc, const float* t4, const float* inv) {
    acc[0] = fmaf(t4[0], inv[0], acc[0]);
    acc[1] = fmaf(t4[1], inv[1], acc[1]);
    acc[2] = fmaf(t4[2], inv[0], acc[2]);
    acc[3] = fmaf(t4[3], inv[1], acc[3]);
}
__device__ __forceinline__ unsigned kv_max_bf16x2(unsigned a, unsigned b) {
    unsigned r;
    asm("max.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
// (KV_MMA_VCODES_F16) The thread's rows j = 0, 1: w[j][0 .. NT - 1] its W = p * scale_t of
// the tokens one fresh accumulator sums (the lanes that share c hold the rest). m_j = max |W|
// over all of them (NaN skipped: fmaxf / max.bf16x2 return the other operand; at least
// 2^-100, so a row with no weight still gets finite powers); e_j = m_j's biased exponent (its
// bf16 truncation keeps it; both rows' in one word, so one shuffle chain over the 8 lanes);
// s_j = 2^(141 - e_j) puts m_j s_j in [2^14, 2^15) (hi + lo below 65504, and a term down to
// 2^-22 of m_j keeps normal fp16 parts), inv_j = 2^(e_j - 141): e_j in [27, 255] keeps both
// normal floats (inf: e = 255, s = 2^-114, W s inf and NaN after the split, as the bf16 parts
// gave).
template <int NT>
__device__ __forceinline__ void kv_w16_pow2(const float (*w)[NT], float* s, float* inv) {
    float m[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        m[j] = fabsf(w[j][0]);
#pragma unroll
        for (int t = 1; t < NT; ++t) m[j] = fmaxf(m[j], fabsf(w[j][t]));
    }
    // row 0's top half high, row 1's low
    unsigned x = __byte_perm(__float_as_uint(m[1]), __float_as_uint(m[0]), 0x7632);
    x = kv_max_bf16x2(x, 0x0D800D80u);  // 2^-100
#pragma unroll
    for (int off = 4; off < KV_WARP; off <<= 1)
        x = kv_max_bf16x2(x, __shfl_xor_sync(KV_FULL_MASK, x, off));
    const unsigned e0 = x & 0x7F800000u;          // e_0 << 23
    const unsigned e1 = (x << 16) & 0x7F800000u;  // e_1 << 23
    s[0] = __uint_as_float((268u << 23) - e0);
    s[1] = __uint_as_float((268u << 23) - e1);
    inv[0] = __uint_as_float(e0 - (14u << 23));
    inv[1] = __uint_as_float(e1 - (14u << 23));
}
#endif

// The PV tile's fresh accumulator t4 into the running one: an IEEE add, or with inv
// (KV_MMA_VCODES_F16: the row tile's powers of two, inv[nr][j]) the add that undoes them.
__device__ __forceinline__ void kv_pv_acc(float* acc, const float* t4, const float (*inv)[2],
                                          int nr) {
#if KV_MMA_VCODES_F16
    if (inv != nullptr) {
        kv_acc_fma4(acc, t4, inv[nr]);
        return;
    }
#endif
    (void)inv;
    (void)nr;
    kv_acc_add4(acc, t4);
}

// One m-tile of O^T += V^T P^T: a fresh accumulator per row tile over the NPART parts of P^T
// (bf16 for value codes, fp16 otherwise and for KV_MMA_VCODES_F16), then added to the running
// one in IEEE float32 (kv_pv_acc; inv: KV_MMA_VCODES_F16's powers of two, else nullptr).
template <int NPART>
__device__ __forceinline__ void kv_pv_mtile(float (*acc_mi)[4], const unsigned* av,
                                            const unsigned (*bp)[NPART][2], int acc_stride,
                                            const float (*inv)[2] = nullptr) {
#pragma unroll
    for (int nr = 0; nr < kvm::NR; ++nr) {
        float t4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int k = 0; k < NPART; ++k) {
#if KV_MMA_PV_BF16
            kv_mma_bf16(t4, av, bp[nr][k][0], bp[nr][k][1]);
#else
            kv_mma_f16(t4, av, bp[nr][k][0], bp[nr][k][1]);
#endif
        }
        kv_pv_acc(acc_mi[nr * acc_stride], t4, inv, nr);
    }
}

#if KVD_TILE_PAIRS
// Tile pairs' PV of m-tile mi: tile a's and tile b's P parts into ONE fresh accumulator per
// row tile (2 NPART mma deep), then one IEEE add into the running sum: the add keeps the
// tensor cores' truncating adds off the large running sum, as kv_pv_mtile's does, once per
// 32 tokens instead of once per 16. inv: as kv_pv_mtile's (one power of two per row and pair:
// both tiles' tokens).
template <int NPART>
__device__ __forceinline__ void kv_pv_mtile2(float (*acc_mi)[4], const unsigned (*av)[4],
                                             const unsigned (*bp)[kvm::NR][NPART][2],
                                             int acc_stride, const float (*inv)[2] = nullptr) {
#pragma unroll
    for (int nr = 0; nr < kvm::NR; ++nr) {
        float t4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int k = 0; k < NPART; ++k) {
#if KV_MMA_PV_BF16
                kv_mma_bf16(t4, av[h], bp[h][nr][k][0], bp[h][nr][k][1]);
#else
                kv_mma_f16(t4, av[h], bp[h][nr][k][0], bp[h][nr][k][1]);
#endif
            }
        }
        kv_pv_acc(acc_mi[nr * acc_stride], t4, inv, nr);
    }
}
#endif

// The online-softmax step of the warp's scores ((b) of kv_stage1_body; (b2) of the tile
// pairs): per row, the max of the thread's N scores (N = 2: tokens g, g + 8 of one tile; 4:
// of a pair's two tiles) and of the row's other lanes, the weights, l and m; then the
// accumulator rescaled where a row's max moved (one warp vote). alpha: each row's factor (the
// callers scale their zero sums with it).
template <int N>
__device__ __forceinline__ void kv_mma_softmax_step(float (&p)[kvm::NR][2][N],
                                                    float (&m_r)[kvm::NR][2],
                                                    float (&l_r)[kvm::NR][2],
                                                    float (&acc)[kvm::NR][kvm::MT][4],
                                                    float (&alpha)[kvm::NR][2]) {
    static_assert(N == 2 || N == 4, "one tile or a pair");
#pragma unroll
    for (int nr = 0; nr < kvm::NR; ++nr) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            float mx;
            if constexpr (N == 2) {
                mx = kv_neg_inf();
#pragma unroll
                for (int tt = 0; tt < 2; ++tt) mx = fmaxf(mx, p[nr][j][tt]);
            } else {
                mx = fmaxf(fmaxf(p[nr][j][0], p[nr][j][1]), fmaxf(p[nr][j][2], p[nr][j][3]));
            }
            mx = fmaxf(mx, __shfl_xor_sync(KV_FULL_MASK, mx, 4));
            mx = fmaxf(mx, __shfl_xor_sync(KV_FULL_MASK, mx, 8));
            mx = fmaxf(mx, __shfl_xor_sync(KV_FULL_MASK, mx, 16));
#if KV_MMA_EXP_CLAMP
            // (KV_MMA_EXP_CLAMP) The running max starts at -FLT_MAX instead of -inf (the
            // state's m is -inf again where it leaves the thread, kv_stage1_body's ml_s), so
            // m_new is finite and the exps need no guard: for a row with a visible key m_new is
            // the same max (the same exps, the same bits: the first visible tile's alpha is
            // exp2(-FLT_MAX - m_new) = 0, as exp2(-inf) was); for a row with none yet (every
            // logit -inf) p = exp2(-inf) = 0 and alpha = exp2(0) = 1, as the guard gave.
            // kv_online_step's guard costs a test, predicated exps and a move per weight.
            KvOnlineStep stp;
            {
                stp.m_new = fmaxf(m_r[nr][j], mx);
                stp.alpha = kv_exp2_fast(m_r[nr][j] - stp.m_new);
                stp.valid = true;
#pragma unroll
                for (int q4 = 0; q4 < N; ++q4)
                    p[nr][j][q4] = kv_exp2_fast(p[nr][j][q4] - stp.m_new);
            }
#else
            const KvOnlineStep stp = kv_online_step<true>(m_r[nr][j], mx);
#endif
            if constexpr (N == 2) {
#if !KV_MMA_EXP_CLAMP
                p[nr][j][0] = kv_online_p<true>(p[nr][j][0], stp);
                p[nr][j][1] = kv_online_p<true>(p[nr][j][1], stp);
#endif
                l_r[nr][j] = l_r[nr][j] * stp.alpha + (p[nr][j][0] + p[nr][j][1]);
            } else {
#if !KV_MMA_EXP_CLAMP
#pragma unroll
                for (int q4 = 0; q4 < 4; ++q4) p[nr][j][q4] = kv_online_p<true>(p[nr][j][q4], stp);
#endif
                l_r[nr][j] = l_r[nr][j] * stp.alpha +
                             ((p[nr][j][0] + p[nr][j][1]) + (p[nr][j][2] + p[nr][j][3]));
            }
            m_r[nr][j] = stp.m_new;
            alpha[nr][j] = stp.alpha;
        }
    }
    bool rescale = false;
#pragma unroll
    for (int nr = 0; nr < kvm::NR; ++nr) rescale |= alpha[nr][0] != 1.f || alpha[nr][1] != 1.f;
    if (__any_sync(KV_FULL_MASK, rescale)) {
#pragma unroll
        for (int nr = 0; nr < kvm::NR; ++nr) {
#pragma unroll
            for (int mi = 0; mi < kvm::MT; ++mi) {
                acc[nr][mi][0] *= alpha[nr][0];
                acc[nr][mi][1] *= alpha[nr][1];
                acc[nr][mi][2] *= alpha[nr][0];
                acc[nr][mi][3] *= alpha[nr][1];
            }
        }
    }
}

#if !KV_MMA_V_REGS
// The warp's V operand: a row-major [16 tokens][d] tile of 16-bit values (fp16 values, or
// bf16 codes), as the shared address ldmatrix.trans lane `lane` passes for the first two
// n-tiles (+16 bytes per n-tile after that): rows (lane % 8) + 8 ((lane / 8) % 2), dims
// 8 (lane / 16). Direct families use the staged V rows (plane 1, row stride rs1); the others
// dequantize their 16 tokens here (kv_mma_v8: 8 values per 16-byte store; invalid tokens 0).
__device__ __forceinline__ unsigned kv_v_operand_tile(const KvTilePipe& pipe,
                                                      const unsigned char* s, int tw0, int lane,
                                                      int n_tile, const int* tp,
                                                      unsigned short* vt_s, int warp) {
    // A fragments of V^T by ldmatrix.trans: matrices (tokens 0-7 | 8-15) x (dims 0-7 |
    // 8-15) transposed are a0 (tokens 0-7, dims 0-7), a1 (tokens 0-7, dims 8-15),
    // a2 (tokens 8-15, dims 0-7), a3: lane l gives token (l & 7) + 8 (l >> 4), dims
    // 8 ((l >> 3) & 1), + 32 bytes per m-tile.
    const int lrow = (lane & 7) + 8 * (lane >> 4);
    const int lcol = 8 * ((lane >> 3) & 1);
#if KV_MMA_V_DIRECT
    (void)n_tile;
    (void)tp;
    (void)vt_s;
    (void)warp;
    return kv_smem_addr(s + kvd::SO1 + (tw0 + lrow) * pipe.rs[1] + 2 * lcol);
#else
    unsigned short* vt = vt_s + warp * 16 * kvm::VSTR;
    constexpr int C8 = kvm::D / 8;
#pragma unroll 2
    for (int qc = lane; qc < 16 * C8; qc += KV_WARP) {
        const int t = qc / C8;
        const int d8 = 8 * (qc - t * C8);
        const int tl = tw0 + t;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (tl < n_tile && tp[tl] >= 0) {
            const unsigned char* rows[4];
            pipe.rows(s, tl, rows);
            v = kv_mma_v8(rows, d8);
        }
        *reinterpret_cast<uint4*>(vt + t * kvm::VSTR + d8) = v;
    }
    __syncwarp();
    return kv_smem_addr(vt + lrow * kvm::VSTR + lcol);
#endif
}
#endif  // !KV_MMA_V_REGS

#if KV_ROTATE_Q
// In-place FWHT of this warp's query rows r = warp, warp + NWM, ... < R (the rows the row
// exponents below take, so no CTA barrier is needed): lane l holds dims DPL l .. DPL l +
// DPL - 1, stages h < DPL in registers, the others by shuffles with lane l ^ (h / DPL). The
// stage order and the operations (a + c to the lower index, a - c to the upper) are those of
// kv_fwht_rows, so the rows are the same bit for bit, without its seven barriers (at B = 1
// each CTA pays the prologue for one or two tiles).
__device__ __forceinline__ void kv_fwht_rows_warp(float* rows, int warp, int lane) {
    constexpr int DPL = kvm::D / KV_WARP;
    static_assert(kvm::D % KV_WARP == 0 && (DPL & (DPL - 1)) == 0, "power-of-two dims per lane");
    for (int r = warp; r < kvd::R; r += kvm::NWM) {
        float* row = rows + r * kvm::D + DPL * lane;
        float x[DPL];
#pragma unroll
        for (int i = 0; i < DPL; ++i) x[i] = row[i];
#pragma unroll
        for (int h = 1; h < DPL; h <<= 1) {
#pragma unroll
            for (int i = 0; i < DPL; ++i) {
                if (!(i & h)) {
                    const float a = x[i];
                    const float c = x[i + h];
                    x[i] = a + c;
                    x[i + h] = a - c;
                }
            }
        }
#pragma unroll
        for (int m = 1; m < KV_WARP; m <<= 1) {  // stage h = m * DPL
            const bool upper = (lane & m) != 0;
#pragma unroll
            for (int i = 0; i < DPL; ++i) {
                const float p = __shfl_xor_sync(KV_FULL_MASK, x[i], m);
                x[i] = upper ? p - x[i] : x[i] + p;
            }
        }
#pragma unroll
        for (int i = 0; i < DPL; ++i) row[i] = x[i];
    }
    __syncwarp();
}
#endif

// -DKVKIT_DECODE_EARLY_ISSUE (kvkit/cuda/decode.py; A/B runs; default 1 but below; 0 is the
// build before): 1 issues the prologue's tile copies right after the pages are looked up,
// behind a CTA barrier of their own, instead of after the query rows and the family table.
// Why: a CTA's path to its first tile ran query arrival -> rows (TurboQuant: signs) -> table
// -> barrier -> copies -> copy latency; the copies do not read the rows (the float rows of
// QF_IN_STAGE live in the last stage, which the prologue does not copy), so their latency can
// run under the rows' work. Measured on the H200 (benchmarks/NOTES.md v26, call 5; graph us,
// 0 -> 1): turboquant_4bit_nc (1, 4096) 10.65 -> 10.34, (1, 32768) 24.17 -> 23.80, (8, 8192)
// 37.91 -> 37.37; 3bit_nc (1, 32768) 23.18 -> 22.66; NVFP4 (1, 4096) 9.59 -> 9.46, (8, 8192)
// 34.36 -> 34.13; fp8 / k8v4 and the large shapes level.
// A family may set KV_EARLY_ISSUE_DEFAULT (decode_turboquant.cu: 0 for the codebook presets at
// head_dim 64, whose tile-pair loops ptxas built up to 35 instructions longer with it).
#ifdef KVKIT_DECODE_EARLY_ISSUE
#define KVD_EARLY_ISSUE KVKIT_DECODE_EARLY_ISSUE
#elif defined(KV_EARLY_ISSUE_DEFAULT)
#define KVD_EARLY_ISSUE KV_EARLY_ISSUE_DEFAULT
#else
#define KVD_EARLY_ISSUE 1
#endif
// The prologue's copies: tiles 0 .. STAGES - 2 (tile pairs of slab launches: 0 .. STAGES - 3;
// their first pair issues tiles STAGES - 2 and STAGES - 1).
__device__ __forceinline__ void kv_issue_prologue_tiles(KvTilePipe& pipe, KV_PLANE_PARAM_DECL) {
#if KVD_TILE_PAIRS
    const int n_pro = pipe.slabs ? kvd::STAGES - 2 : kvd::STAGES - 1;
#else
    constexpr int n_pro = kvd::STAGES - 1;
#endif
#pragma unroll 1
    for (int j = 0; j < n_pro; ++j) pipe.issue(j, KV_PLANE_PARAMS);
}

// The stage-1 body on tensor cores (parameters: KV_STAGE1_BODY_PARAMS).
__device__ __forceinline__ void kv_stage1_body(KV_STAGE1_BODY_PARAMS) {
    using namespace kvm;
    using kvd::NP;
    using kvd::STAGE_BYTES;
    using kvd::STAGES;
    using kvd::WP0;
    using kvd::WP1;
    using kvd::WP2;
    using kvd::WP3;
    extern __shared__ __align__(16) unsigned char kv_smem[];
    float* qf_s = reinterpret_cast<float*>(kv_smem + OFF_QF);
    unsigned short* qh_s = reinterpret_cast<unsigned short*>(kv_smem + OFF_QH);
    unsigned short* ql_s = reinterpret_cast<unsigned short*>(kv_smem + OFF_QL);
    unsigned short* qm_s = reinterpret_cast<unsigned short*>(kv_smem + OFF_QM);
    (void)qm_s;
    float* rs_s = reinterpret_cast<float*>(kv_smem + OFF_RS);
    float* ml_s = reinterpret_cast<float*>(kv_smem + OFF_ML);
    int* tp_ring = reinterpret_cast<int*>(kv_smem + OFF_TP);
    [[maybe_unused]] unsigned* tab_s = reinterpret_cast<unsigned*>(kv_smem + OFF_TAB);
    unsigned char* stg = kv_smem + OFF_STG;
    [[maybe_unused]] unsigned short* vt_s = reinterpret_cast<unsigned short*>(kv_smem + OFF_VT);
    (void)ql_s;

    const int split = blockIdx.x;
    const int kvh = blockIdx.y;
    const int b = blockIdx.z;
    const int num_heads = gridDim.y * G;
    const int tid = threadIdx.x;
    const int lane = tid & (KV_WARP - 1);
    const int warp = tid / KV_WARP;
    const int g = lane >> 2;
    const int c = lane & 3;

    // The query first: its loads fly with the seq_len and block-table loads below
    // (KvQPrefetch); 16 rows, the padding rows R..15 zero.
    constexpr int QPT = 16 * D / THREADS;
    static_assert(QPT * THREADS == 16 * D, "whole query rows per pass");
    // Stage 2 (launched with programmatic serialization where it waits by griddepcontrol)
    // may be scheduled once every CTA has triggered: it waits for this grid's completion
    // itself. KVD_PDL_TRIGGER 0: here, at the start (call 7: the merge's CTAs then hold free
    // CTA slots through the whole of stage 1); 1: at the start of the CTA's last tile.
    if constexpr (KVD_PDL_TRIGGER == 0) kv_grid_dep_trigger();
    KvQPrefetch<QPT> qx;
    qx.load(q, b, kvh, num_heads);
    int seq_len;
    KvTilePipe pipe = kv_make_pipe(p0_vec, p1_vec, p2_vec, p3_vec, block_tables, max_blocks,
                                   seq_lens, num_blocks, block_size, window, error_flag,
                                   tp_ring, stg, &seq_len);
    const int n_tiles = pipe.n_tiles;
#if KVD_BULK_WARP_SLABS
    pipe.prepare_slabs(KV_PLANE_PARAMS);
#endif

    // Per-thread state of rows 8 nr + 2c + j: m, this thread's share of l and of
    // sum p * zero (KV_MMA_VCODES; both summed over the lanes sharing c at the end), and the
    // O^T accumulator of m-tile mi (dims 16 mi + g, + 8).
    float acc[NR][MT][4];
    float m_r[NR][2];
    float l_r[NR][2];
    [[maybe_unused]] float z_r[NR][2];
#pragma unroll
    for (int nr = 0; nr < NR; ++nr) {
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[nr][mi][i] = 0.f;
        }
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            m_r[nr][j] = KV_MMA_EXP_CLAMP ? -3.402823466e38f : kv_neg_inf();
            l_r[nr][j] = 0.f;
            z_r[nr][j] = 0.f;
        }
    }

    if (n_tiles > 0) {  // uniform over the CTA
        pipe.prologue_pages();
#if KVD_EARLY_ISSUE
        // The first tiles' copies before the query rows: a barrier publishes the pipe's
        // mbarriers and page ring, and the copies then fly while the rows are signed, rotated
        // and split (KVKIT_DECODE_EARLY_ISSUE, above kv_stage1_body).
        __syncthreads();
        kv_issue_prologue_tiles(pipe, KV_PLANE_PARAMS);
#endif
        // --- query rows (zero padding rows R..15), family table ----------------------------
#pragma unroll
        for (int k = 0; k < QPT; ++k) {
            const int idx = tid + k * THREADS;
#if KV_ROTATE_Q
            // (Padding rows stay +0, not 0 times a sign.)
            qf_s[idx] = idx < R * D
                            ? kv_family_q_signed(qx.value(k, q, b, kvh, num_heads), idx % D)
                            : 0.f;
#else
            qf_s[idx] = qx.value(k, q, b, kvh, num_heads);
#endif
        }
        float kfac = 1.f;
#if KV_MMA_TABLE_WORDS > 0
        kfac = kv_mma_init_table(tab_s, tid, THREADS);
#endif
        __syncthreads();
#if !KVD_EARLY_ISSUE
        kv_issue_prologue_tiles(pipe, KV_PLANE_PARAMS);
#endif
#if KV_ROTATE_Q
        kv_fwht_rows_warp(qf_s, warp, lane);
#endif
        // Row exponents: warp w scales rows w, w + 4, ...; max |q| to [2^14, 2^15). Only the
        // rows the mma loads: 8 NR (the ldmatrix rows of the row tiles), with packed columns
        // rows 0..3 (their second parts fill 4..7). At G = 4 that is one row a warp instead of
        // four: each a warp max (five dependent shuffles) in every CTA's prologue, which a B = 1
        // step pays once per split.
        constexpr int Q_ROWS = KV_MMA_PACK ? 4 : 8 * NR;
        static_assert(R <= Q_ROWS && Q_ROWS <= 16, "the query rows the mma loads");
        for (int r = warp; r < Q_ROWS; r += NWM) {
            float mx = 0.f;
            for (int d = lane; d < D; d += KV_WARP) mx = fmaxf(mx, fabsf(qf_s[r * D + d]));
            mx = kv_warp_max(mx);
            int e = 0;
#if KV_MMA_QSPLIT
            if (mx > 0.f) e = 14 - kv_ilog2(mx);
            e = e < -100 ? -100 : (e > 100 ? 100 : e);
#endif
            // Applied in two steps, so neither power of two leaves the float range.
            const float up = kv_pow2(e / 2) ;
            const float up2 = kv_pow2(e - e / 2);
            for (int d = 2 * lane; d < KQ; d += 2 * KV_WARP) {
                const float x0 = qf_s[r * D + kv_mma_qdim(d)] * up * up2;
                const float x1 = qf_s[r * D + kv_mma_qdim(d + 1)] * up * up2;
                unsigned hi, lo;
#if KV_MMA_BF16
                unsigned t3[3];
                kv_split3_bf16x2(x0, x1, t3);
                hi = t3[0];
                lo = t3[2];
                *reinterpret_cast<unsigned*>(qm_s + r * QSTR + d) = t3[1];
#else
                kv_split_f16x2(x0, x1, &hi, &lo);
#endif
#if KV_MMA_PACK
                // Columns 0..3 the rows' hi parts, 4..7 their lo parts (without QSPLIT the
                // hi parts again); rows 4.. are padding, which columns 4..7 replace.
                if (r < 4) {
                    *reinterpret_cast<unsigned*>(qh_s + r * QSTR + d) = hi;
                    *reinterpret_cast<unsigned*>(qh_s + (r + 4) * QSTR + d) =
                        KV_MMA_QSPLIT ? lo : hi;
                }
#else
                *reinterpret_cast<unsigned*>(qh_s + r * QSTR + d) = hi;
#if KV_MMA_QSPLIT
                *reinterpret_cast<unsigned*>(ql_s + r * QSTR + d) = lo;
#else
                (void)lo;  // exact fp16 queries: lo is 0 and has no buffer
#endif
#endif
            }
            // Logits in base 2 (times log2(e)): the online softmax runs on exp2.
            if (lane == 0) rs_s[r] = scale * kfac * KV_MMA_KF / (up * up2) * KV_LOG2E;
        }
        // The float query rows in the last stage are done with; the first tile loop
        // iteration copies tile STAGES - 1 over them by the copy engine.
        if constexpr (QF_IN_STAGE) pipe.fence_for_bulk();
        __syncthreads();

        // Loop-invariant per-thread values: this thread's rows 8 nr + 2c + j (the score C
        // columns; also its softmax rows and its PV accumulator columns).
        float rsc[NR][2];
        [[maybe_unused]] int pos[NR][2];
        const int big = 0x3FFFFFFF;
#pragma unroll
        for (int nr = 0; nr < NR; ++nr) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
#if KV_MMA_PACK
                const int r = 2 * (c & 1) + j;  // lanes c >= 2 run rows 0..3 again
#else
                const int r = 8 * nr + 2 * c + j;
#endif
                rsc[nr][j] = rs_s[r];
                pos[nr][j] = r < R ? seq_len - QL + r / G : big;
            }
        }
#if KV_MMA_PACK && !KV_MMA_PV_BF16
        // Packed fp16 P parts (KV_MMA_PACK_F16): this lane's part of kv_split_f16x2_packed,
        // hi in the B columns of lanes c < 2 (rows 0..3), lo in those of lanes c >= 2.
        const float pk_negm = c < 2 ? -0.f : -1.f;
#endif
#if KVD_TILE_PAIRS
        // Tile pairs: the rows' causal positions are worked out where the masks are (tiles
        // off the fast path), from an opaque copy of seq_len, so that they are not held over
        // the loops: the pair body's two tiles of raw words leave no registers for them at
        // 128 (sm_90, TurboQuant at 8 rows spilled one; the masks run on one tile per split).
        auto row_pos = [&](int nr, int j) {
            int sl;
            asm volatile("mov.b32 %0, %1;" : "=r"(sl) : "r"(seq_len));
#if KV_MMA_PACK
            const int r = 2 * (c & 1) + j;
#else
            const int r = 8 * nr + 2 * c + j;
#endif
            return r < R ? sl - QL + r / G : big;
        };
#endif
        // Q as B operands, ldmatrix.x4 over two k-steps: lane l gives row 8 nr + (l & 7),
        // dims 16 ks + 8 (l >> 3): matrices b0, b1 of ks and b0, b1 of ks + 1.
        const unsigned qh_addr = kv_smem_addr(qh_s + (lane & 7) * QSTR + 8 * (lane >> 3));
        const unsigned ql_addr = kv_smem_addr(ql_s + (lane & 7) * QSTR + 8 * (lane >> 3));
        const unsigned qm_addr = kv_smem_addr(qm_s + (lane & 7) * QSTR + 8 * (lane >> 3));
        (void)ql_addr;
        (void)qm_addr;
        const int tw0 = warp * WT;

#if KVD_TILE_PAIRS
#include "common/decode_mma_pairs.cuh"
#pragma unroll 1
        for (int i = i_rest; i < n_tiles; ++i) {
#else
#pragma unroll 1
        for (int i = 0; i < n_tiles; ++i) {
#endif
            if (KVD_PDL_TRIGGER == 1 && i == n_tiles - 1) kv_grid_dep_trigger();
            pipe.wait<STAGES - 2>(i);
            pipe.tile_sync();  // the CTA barrier; the warp's own in warp pipes (KVD_WARP_PIPE)
            pipe.issue(i + STAGES - 1, KV_PLANE_PARAMS);
            pipe.advance_pages(i);
            const int t0 = pipe.first_token(i);
            const int n_tile = pipe.tile_tokens(i);
#if KVD_PAGE_WIN
            // Warp pipes: slab launches have no ring; whether the warp has a page in the tile
            // (KvTilePipe::warp_has_page) stands for the ring's tp[t] >= 0 (page_ok; the same
            // values for the warp's tokens t). The ring slot only where the ring is read.
            // (Only the V_REGS masks below read pages; kv_v_token_masks / kv_v_operand_tile
            // read the ring.)
            static_assert(KV_MMA_V_REGS, "warp pipes: the V_REGS core only");
            const bool whp = pipe.warp_has_page();
#else
            const int* tp = pipe.pages(i);
#endif
            const unsigned char* s = pipe.stage(i);
            auto rows_of = [&](int t, const unsigned char** rw) { pipe.rows(s, t, rw); };
            // This thread's score tokens tw0 + g (tt = 0) and tw0 + g + 8 (tt = 1) (in the
            // order kv_mma_tok).
            const unsigned char* kr[2][4];
            rows_of(tw0 + kv_mma_tok(g), kr[0]);
            rows_of(tw0 + kv_mma_tok(g + 8), kr[1]);

            // (a) S^T = K Q^T: M = the warp's 16 tokens, N = 8 rows per row tile, K = dims.
            // Independent accumulators per product kind (hi x hi, q lo x k hi, q hi x k lo):
            // three 8-deep mma chains instead of one 24-deep one, and the small lo products
            // are not added into the large hi sum by the tensor cores' truncating adds; the
            // three meet in IEEE float32 after the k-loop.
            float sc[NR][4];
            [[maybe_unused]] float sq[NR][4];
            [[maybe_unused]] float sk[NR][4];
#pragma unroll
            for (int nr = 0; nr < NR; ++nr) {
#pragma unroll
                for (int i = 0; i < 4; ++i) sc[nr][i] = sq[nr][i] = sk[nr][i] = 0.f;
            }
#if KV_MMA_K_DIRECT
            // fp16 keys from the staged rows: matrices (tokens 0-7 | 8-15) x (dims 0-7 | 8-15)
            // = a0, a1, a2, a3.
            const unsigned k_addr = kv_smem_addr(
                s + (tw0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * pipe.rs[0] + 16 * (lane >> 4));
#elif KV_MMA_K_REGS
            unsigned kraw[2][KV_MMA_KRAW];
            kv_mma_kload(kr[0], c, kraw[0]);
            kv_mma_kload(kr[1], c, kraw[1]);
#endif
#if KV_MMA_NANTILE_K
            // One NaN-code test of the warp's key bytes (warp-uniform): tiles without one
            // take kv_mma_kstep_finite (same operand bits, no NaN patch). Keys of invalid
            // tokens are tested too (their scores become -inf either way, conservative).
            unsigned knan = 0u;
#pragma unroll
            for (int tt = 0; tt < 2; ++tt) {
#pragma unroll
                for (int i = 0; i < KV_MMA_KRAW; ++i) knan = kv_dc_e4m3_nan_acc(knan, kraw[tt][i]);
            }
            const bool kfinite = !__any_sync(KV_FULL_MASK, kv_dc_e4m3_nan_found(knan));
#endif
            // The k-loop, once per key conversion (finite: KV_MMA_NANTILE_K's fast one).
#if KV_MMA_NANTILE_K
            auto score_loop = [&](bool finite) {
#else
            {
                // Without the switch: a plain block, the same code as before the lambdas.
                constexpr bool finite = false;
                (void)finite;
#endif
#pragma unroll
            for (int ks = 0; ks < KS; ks += 2) {
                unsigned qh[NR][4];
                unsigned ql[NR][4];
                unsigned qm[NR][4];
#pragma unroll
                for (int nr = 0; nr < NR; ++nr) {
                    kv_ldsm_x4(qh[nr], qh_addr + nr * 16 * QSTR + ks * 32);
#if KV_MMA_BF16
                    if constexpr (KV_MMA_BF16_QPARTS >= 2)
                        kv_ldsm_x4(qm[nr], qm_addr + nr * 16 * QSTR + ks * 32);
                    if constexpr (KV_MMA_BF16_QPARTS >= 3)
                        kv_ldsm_x4(ql[nr], ql_addr + nr * 16 * QSTR + ks * 32);
#elif KV_MMA_QSPLIT && !KV_MMA_PACK
                    kv_ldsm_x4(ql[nr], ql_addr + nr * 16 * QSTR + ks * 32);
#endif
                }
                (void)qm;
#pragma unroll
                for (int u = 0; u < 2; ++u) {
                    unsigned ah[4];
#if KV_MMA_K_DIRECT
                    kv_ldsm_x4(ah, k_addr + (ks + u) * 32);
#elif KV_MMA_K_REGS
                    kv_mma_kstep_sel(finite, kraw[0], ks + u, tab_s, &ah[0], &ah[2]);
                    kv_mma_kstep_sel(finite, kraw[1], ks + u, tab_s, &ah[1], &ah[3]);
#else
                    kv_mma_k4(kr[0], ks + u, c, &ah[0], &ah[2]);
                    kv_mma_k4(kr[1], ks + u, c, &ah[1], &ah[3]);
#endif
#pragma unroll
                    for (int nr = 0; nr < NR; ++nr) {
#if KV_MMA_BF16
                        // hi, mid, lo query parts into sc, sk, sq (summed in that order).
                        kv_mma_bf16(sc[nr], ah, qh[nr][2 * u], qh[nr][2 * u + 1]);
                        if constexpr (KV_MMA_BF16_QPARTS >= 2)
                            kv_mma_bf16(sk[nr], ah, qm[nr][2 * u], qm[nr][2 * u + 1]);
                        if constexpr (KV_MMA_BF16_QPARTS >= 3)
                            kv_mma_bf16(sq[nr], ah, ql[nr][2 * u], ql[nr][2 * u + 1]);
#elif !KV_MMA_QSPLIT && KV_MMA_K_DIRECT
                        // fp16 keys (latency-bound, 8-12 warps per SM): odd k-steps into sq,
                        // two 4-deep mma chains side by side instead of one 8-deep one.
                        kv_mma_f16(u ? sq[nr] : sc[nr], ah, qh[nr][2 * u], qh[nr][2 * u + 1]);
#else
                        kv_mma_f16(sc[nr], ah, qh[nr][2 * u], qh[nr][2 * u + 1]);
#if KV_MMA_QSPLIT && !KV_MMA_PACK
                        kv_mma_f16(sq[nr], ah, ql[nr][2 * u], ql[nr][2 * u + 1]);
#endif
#endif
                    }
                }
                (void)ql;
            }
#if KV_MMA_NANTILE_K
            };
            if (kfinite)
                score_loop(true);
            else
                score_loop(false);
#else
            }
#endif
#pragma unroll
            for (int nr = 0; nr < NR; ++nr) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
#if KV_MMA_BF16
                    sc[nr][i] = (sc[nr][i] + sk[nr][i]) + sq[nr][i];
#elif KV_MMA_PACK
                    // The q lo chain sits in lane c ^ 2 (columns r + 4); the same add.
                    if constexpr (KV_MMA_QSPLIT)
                        sc[nr][i] += __shfl_xor_sync(KV_FULL_MASK, sc[nr][i], 2);
#elif KV_MMA_QSPLIT || KV_MMA_K_DIRECT
                    sc[nr][i] += sq[nr][i];  // the q lo chain, or fp16 keys' odd k-steps
#endif
                }
            }

            // (b) masks, soft-cap, online softmax over the thread's 2 tokens, then over the 8
            // lanes that share c (the warp's 16 tokens).
            // The masks (the split's range, pages, causal offsets, window) are all true for
            // every token of most tiles: a full tile (t0 + TILE <= t_hi) that ends at or before
            // the first query's causal position (pos >= seq_len - QL for every row; q_len 1
            // implies it, as t_hi <= seq_len) and, with a window, starts inside the last row's
            // window (tok > seq_len - 1 - window), and whose 16 tokens of this warp all have a
            // page. Only other tiles compute the masks (a warp-uniform branch); masking turns
            // scores into -inf after the same float32 operations, so the tiles the fast path
            // takes get the same bits either way. (Padding rows r >= R, which a window hides
            // and the fast path does not, fill only their own mma columns and softmax state and
            // are never written out; a rescale they trigger multiplies the real rows by 1.)
            const bool full = !KVD_MASK_ALL && t0 + TILE <= pipe.t_hi &&
                              (QL == 1 || t0 + (TILE - 1) <= seq_len - QL) &&
                              (window <= 0 || t0 >= seq_len - window) &&
#if KVD_PAGE_WIN
                              // (One page for the warp's 16 tokens, all in the tile here.)
                              (pipe.slabs ? whp
                                          : __all_sync(KV_FULL_MASK,
                                                       pipe.pages(i)[tw0 + (lane & (WT - 1))] >= 0));
#else
                              __all_sync(KV_FULL_MASK, tp[tw0 + (lane & (WT - 1))] >= 0);
#endif
            float km[2];
#pragma unroll
            for (int tt = 0; tt < 2; ++tt) {
#if KV_HAS_KMUL
                km[tt] = kv_family_kmul(kr[tt]);
#else
                km[tt] = 1.f;
#endif
            }
            float p[NR][2][2];  // [nr][j][tt]: logits, then weights
#pragma unroll
            for (int nr = 0; nr < NR; ++nr) {
#pragma unroll
                for (int j = 0; j < 2; ++j) {
#pragma unroll
                    for (int tt = 0; tt < 2; ++tt) {
                        float x = sc[nr][2 * tt + j] * km[tt] * rsc[nr][j];
                        if (KV_SOFTCAP && softcap > 0.f) x = (softcap * KV_LOG2E) * tanhf(x * KV_LN2 / softcap);
                        p[nr][j][tt] = x;
                    }
                }
            }
            bool ok[2] = {true, true};
            if (!full) {
#pragma unroll
                for (int tt = 0; tt < 2; ++tt) {
                    const int t = tw0 + kv_mma_tok(g + 8 * tt);
#if KVD_PAGE_WIN
                    ok[tt] = t < n_tile && pipe.page_ok(i, whp, t);
#else
                    ok[tt] = t < n_tile && tp[t] >= 0;
#endif
                }
#pragma unroll
                for (int nr = 0; nr < NR; ++nr) {
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
#pragma unroll
                        for (int tt = 0; tt < 2; ++tt) {
                            const int tok = t0 + tw0 + kv_mma_tok(g + 8 * tt);
#if KVD_TILE_PAIRS
                            const int pj = row_pos(nr, j);
                            const bool vis = ok[tt] && tok <= pj &&
                                             (window <= 0 || tok > pj - window);
#else
                            const bool vis = ok[tt] && tok <= pos[nr][j] &&
                                             (window <= 0 || tok > pos[nr][j] - window);
#endif
                            if (!vis) p[nr][j][tt] = kv_neg_inf();
                        }
                    }
                }
            }
            float alpha[NR][2];
            kv_mma_softmax_step<2>(p, m_r, l_r, acc, alpha);

            // (c) O^T += V^T P^T: M = 16 dims per m-tile, N = 8 rows, K = the warp's 16
            // tokens. P^T's B fragments are the transposes (movmatrix) of the thread's
            // (token g | g + 8) x (rows 2c, 2c + 1) pairs.
#if KV_MMA_PV_BF16 || KV_MMA_VCODES_F16
            // P (times scale_t for value codes; bf16 values: unscaled, bf16 has float32's
            // range) as three bf16 parts (packed columns: two mmas carry them, KV_MMA_PACK).
            // KV_MMA_VCODES_F16: W s_r as fp16 hi + lo (packed: one mma).
#if KV_MMA_VCODES_F16
            constexpr int NPART = KV_MMA_PACK ? 1 : 2;
#else
            constexpr int NPART = KV_MMA_PACK ? 2 : 3;
#endif
            float vs[2] = {1.f, 1.f};
#if KV_MMA_VCODES
#pragma unroll
            for (int tt = 0; tt < 2; ++tt) {
                float sc_t = 0.f, z_t = 0.f;
                if (ok[tt]) kv_mma_vtok(kr[tt], &sc_t, &z_t);
                vs[tt] = sc_t;
#pragma unroll
                for (int nr = 0; nr < NR; ++nr) {
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        if (tt == 0) z_r[nr][j] *= alpha[nr][j];
                        z_r[nr][j] = fmaf(p[nr][j][tt], z_t, z_r[nr][j]);
                    }
                }
            }
#endif
            unsigned bp[NR][NPART][2];
#if KV_MMA_VCODES_F16
            float w16i[NR][2];
#pragma unroll
            for (int nr = 0; nr < NR; ++nr) {
                float w[2][2], s16[2];
#pragma unroll
                for (int j = 0; j < 2; ++j) {
#pragma unroll
                    for (int tt = 0; tt < 2; ++tt) w[j][tt] = p[nr][j][tt] * vs[tt];
                }
                kv_w16_pow2<2>(w, s16, w16i[nr]);
#pragma unroll
                for (int tt = 0; tt < 2; ++tt) {
#if KV_MMA_PACK
                    bp[nr][0][tt] = kv_movmatrix_trans(
                        kv_split_f16x2_packed(w[0][tt] * s16[0], w[1][tt] * s16[1], pk_negm));
#else
                    unsigned hi, lo;
                    kv_split_f16x2(w[0][tt] * s16[0], w[1][tt] * s16[1], &hi, &lo);
                    bp[nr][0][tt] = kv_movmatrix_trans(hi);
                    bp[nr][1][tt] = kv_movmatrix_trans(lo);
#endif
                }
            }
#else
#pragma unroll
            for (int nr = 0; nr < NR; ++nr) {
#pragma unroll
                for (int tt = 0; tt < 2; ++tt) {
                    unsigned t3[3];
                    kv_split3_bf16x2(p[nr][0][tt] * vs[tt], p[nr][1][tt] * vs[tt], t3);
#if KV_MMA_PACK
                    // Columns 0..3 (lanes c < 2) hi, then lo; columns 4..7 (lanes c >= 2,
                    // the same rows) mid, then nothing.
                    bp[nr][0][tt] = kv_movmatrix_trans(c < 2 ? t3[0] : t3[1]);
                    bp[nr][1][tt] = kv_movmatrix_trans(c < 2 ? t3[2] : 0u);
#else
#pragma unroll
                    for (int k = 0; k < 3; ++k) bp[nr][k][tt] = kv_movmatrix_trans(t3[k]);
#endif
                }
            }
#endif
#else
            // Packed columns (KV_MMA_PACK_F16): one part per lane, one mma per m-tile; else
            // P's hi and lo parts, two mmas.
            constexpr int NPART = KV_MMA_PACK ? 1 : 2;
            unsigned bp[NR][NPART][2];
#pragma unroll
            for (int nr = 0; nr < NR; ++nr) {
#pragma unroll
                for (int tt = 0; tt < 2; ++tt) {
#if KV_MMA_PACK
                    bp[nr][0][tt] = kv_movmatrix_trans(kv_split_f16x2_packed(
                        p[nr][0][tt] * P_SCALE, p[nr][1][tt] * P_SCALE, pk_negm));
#else
                    unsigned hi, lo;
                    kv_split_f16x2(p[nr][0][tt] * P_SCALE, p[nr][1][tt] * P_SCALE, &hi, &lo);
                    bp[nr][0][tt] = kv_movmatrix_trans(hi);
                    bp[nr][1][tt] = kv_movmatrix_trans(lo);
#endif
                }
            }
#endif
#if KV_MMA_V_REGS
            // V^T's A fragments from registers: tokens 2c, 2c + 1 (a0, a1) and 2c + 8, 2c + 9
            // (a2, a3) of the warp's 16, dims VPL g + 2 mi (rows g) and + 1 (rows g + 8).
            unsigned vraw[4][KV_MMA_VRAW];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const unsigned char* rv[4];
                rows_of(tw0 + kv_mma_tok(2 * c + (k & 1) + 8 * (k >> 1)), rv);
                kv_mma_vload(rv, g, vraw[k]);
            }
#if !KV_MMA_VCODES
            // Values may be NaN in invalid tokens' rows (codes never are), which an mma would
            // spread: off the fast path, an invalid token's raw words become 0, which unpack to
            // +0 operands (the V_REGS contract above), as masking the operands gave. (Operand
            // masks under a warp-uniform flag were predicated instructions, 4 per m-tile, that
            // every tile issued; these are 4 KV_MMA_VRAW moves behind the tile's !full branch.)
            if (!full) {
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const int t = tw0 + kv_mma_tok(2 * c + (k & 1) + 8 * (k >> 1));
#if KVD_PAGE_WIN
                    if (!(t < n_tile && pipe.page_ok(i, whp, t))) {
#else
                    if (!(t < n_tile && tp[t] >= 0)) {
#endif
#pragma unroll
                        for (int i = 0; i < KV_MMA_VRAW; ++i) vraw[k][i] = 0u;
                    }
                }
            }
#endif
            // The m-tile loop, once per value conversion (finite: KV_MMA_NANTILE_V's).
#if KV_MMA_NANTILE_V
            auto pv_loop = [&](bool finite) {
#else
            {
                // Without the switch: a plain block, the same code as before the lambdas.
                constexpr bool finite = false;
                (void)finite;
#endif
#pragma unroll
                for (int mi = 0; mi < MT; ++mi) {
                    unsigned av[4];
                    kv_mma_vpair_sel(finite, vraw[0], vraw[1], mi, &av[0], &av[1]);
                    kv_mma_vpair_sel(finite, vraw[2], vraw[3], mi, &av[2], &av[3]);
#if KV_MMA_VCODES_F16
                    kv_pv_mtile<NPART>(&acc[0][mi], av, bp, MT, w16i);
#else
                    kv_pv_mtile<NPART>(&acc[0][mi], av, bp, MT);
#endif
                }
#if KV_MMA_NANTILE_V
            };
            // As for the keys: one NaN-code test of the value bytes the warp converts (after
            // the zeroing above, so invalid tokens' bytes do not count).
            unsigned vnan = 0u;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
#pragma unroll
                for (int i = 0; i < KV_MMA_VRAW; ++i) vnan = kv_dc_e4m3_nan_acc(vnan, vraw[k][i]);
            }
            if (!__any_sync(KV_FULL_MASK, kv_dc_e4m3_nan_found(vnan)))
                pv_loop(true);
            else
                pv_loop(false);
#else
            }
#endif
#else
            const unsigned vaddr = kv_v_operand_tile(pipe, s, tw0, lane, n_tile, tp, vt_s, warp);
#if KV_MMA_V_DIRECT
            // As for V_REGS: the masks only where the warp has invalid tokens (all-ones masks
            // change no bits).
            unsigned vm[2];
            bool v_mask = false;
            if (!full) {
                kv_v_token_masks(tw0, c, n_tile, tp, vm);
                v_mask = __any_sync(KV_FULL_MASK, (vm[0] & vm[1]) != 0xFFFFFFFFu);
            }
#endif
#pragma unroll
            for (int mi = 0; mi < MT; ++mi) {
                unsigned av[4];
                kv_ldsm_x4_trans(av, vaddr + mi * 32);
#if KV_MMA_V_DIRECT
                if (v_mask) kv_mask_v_operand(av, vm);
#endif
#if KV_MMA_VCODES_F16
                kv_pv_mtile<NPART>(&acc[0][mi], av, bp, MT, w16i);
#else
                kv_pv_mtile<NPART>(&acc[0][mi], av, bp, MT);
#endif
            }
#endif  // KV_MMA_V_REGS
        }
        kv_cp_async_wait<0>();
        pipe.retire_bulk();
    }

    // --- the four warp states meet in shared memory --------------------------------------
    // Row sums over the 8 lanes that share c (the warp's 16 tokens).
#pragma unroll
    for (int nr = 0; nr < NR; ++nr) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
            for (int off = 4; off < KV_WARP; off <<= 1) {
                l_r[nr][j] += __shfl_xor_sync(KV_FULL_MASK, l_r[nr][j], off);
#if KV_MMA_VCODES
                z_r[nr][j] += __shfl_xor_sync(KV_FULL_MASK, z_r[nr][j], off);
#endif
            }
        }
    }
#if KV_MMA_PACK
    // Lanes c >= 2 hold the mid-part (fp16 P: lo-part) sums of rows 0..3 (packed columns):
    // into lanes c < 2.
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[0][mi][i] += __shfl_xor_sync(KV_FULL_MASK, acc[0][mi][i], 2);
    }
#endif
    __syncthreads();  // every warp is done with the staging (reused below)
    float* red = reinterpret_cast<float*>(stg);
#if KV_MMA_VCODES
    constexpr float AF = 1.f;
#elif KV_MMA_BF16
    constexpr float AF = KV_MMA_VF;  // P was not scaled
#else
    constexpr float AF = KV_MMA_VF / P_SCALE;
#endif
#pragma unroll
    for (int nr = 0; nr < NR; ++nr) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int r = 8 * nr + 2 * c + j;
            if (r < R) {
                if (g == 0) {
#if KV_MMA_EXP_CLAMP
                    // An empty row (l = 0: no visible key; a visible one adds exp2(0) = 1)
                    // leaves with m = -inf, the empty state (its m is still -FLT_MAX).
                    ml_s[(warp * 16 + r) * 2] = l_r[nr][j] == 0.f ? kv_neg_inf() : m_r[nr][j];
#else
                    ml_s[(warp * 16 + r) * 2] = m_r[nr][j];
#endif
                    ml_s[(warp * 16 + r) * 2 + 1] = l_r[nr][j];
                }
#if KV_MMA_VCODES
                const float zz = z_r[nr][j];
#else
                const float zz = 0.f;
#endif
#if KV_MMA_V_REGS && defined(KV_MMA_VDIM)
                // The family's own output dims per m-tile (decode_nvfp4.cu at head_dim 96).
                float* dst = red + (warp * R + r) * D;
#pragma unroll
                for (int mi = 0; mi < MT; ++mi)
                    *reinterpret_cast<float2*>(dst + kv_mma_vdim(g, mi)) =
                        make_float2(acc[nr][mi][j] * AF + zz, acc[nr][mi][2 + j] * AF + zz);
#elif KV_MMA_V_REGS
                float2* dst = reinterpret_cast<float2*>(red + (warp * R + r) * D + VPL * g);
#pragma unroll
                for (int mi = 0; mi < MT; ++mi)
                    dst[mi] = make_float2(acc[nr][mi][j] * AF + zz, acc[nr][mi][2 + j] * AF + zz);
#else
                float* dst = red + (warp * R + r) * D + g;
#pragma unroll
                for (int mi = 0; mi < MT; ++mi) {
                    dst[16 * mi] = acc[nr][mi][j] * AF + zz;
                    dst[16 * mi + 8] = acc[nr][mi][2 + j] * AF + zz;
                }
#endif
            }
        }
    }
    __syncthreads();

    constexpr int D4 = D / 4;
    for (int item = tid; item < R * D4; item += THREADS) {
        const int r = item / D4;
        const int dq = item - r * D4;
        float mw[NWM];
        float mt = kv_neg_inf();
#pragma unroll
        for (int w = 0; w < NWM; ++w) {
            mw[w] = ml_s[(w * 16 + r) * 2];
            mt = fmaxf(mt, mw[w]);
        }
        float lt = 0.f;
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int w = 0; w < NWM; ++w) {
            // The warps' m are base-2 logits.
            const float wt = mw[w] == kv_neg_inf() ? 0.f : exp2f(mw[w] - mt);
            lt += wt * ml_s[(w * 16 + r) * 2 + 1];
            if (wt != 0.f) {
                const float4 x = reinterpret_cast<const float4*>(red + (w * R + r) * D)[dq];
                o.x += wt * x.x;
                o.y += wt * x.y;
                o.z += wt * x.z;
                o.w += wt * x.w;
            }
        }
        o.x *= v_out_scale;
        o.y *= v_out_scale;
        o.z *= v_out_scale;
        o.w *= v_out_scale;
        const int i = r / G;
        const int gg = r - i * G;
        const long long row = ((long long)b * QL + i) * num_heads + (long long)kvh * G + gg;
        mt *= KV_LN2;  // the partial state's m (and lse) in natural-log units, as stage 2 reads
        if (o_out == nullptr) {
            reinterpret_cast<float4*>(acc_part + (row * split_stride + split) * D)[dq] = o;
            if (dq == 0) {
                m_part[row * split_stride + split] = mt;
                l_part[row * split_stride + split] = lt;
            }
        } else {
            const bool empty = mt == kv_neg_inf();
            float4 y = make_float4(0.f, 0.f, 0.f, 0.f);
            if (!empty) {
                y.x = o.x / lt;
                y.y = o.y / lt;
                y.z = o.z / lt;
                y.w = o.w / lt;
            }
            reinterpret_cast<float4*>(o_out + row * D)[dq] = y;
            if (dq == 0) lse_out[row] = empty ? kv_neg_inf() : mt + logf(lt);
        }
    }
}
