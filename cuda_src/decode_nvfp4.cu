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

// nvdec2's tensor-core tile (KV_NVFP4_REV; env KVKIT_DECODE_NVFP4_REV, kvkit/cuda/decode.py):
//   1: (a) block scales as converted by the hardware (sm_89+), without the 2^6 multiply
//      (KV_NVFP4_SF_RAW, decode_codes.cuh KV_NVFP4_SF_MUL: operands value * 2^-14, same bits
//      downstream); (b) in the copy-engine builds (KV_NVFP4_BULK below) the value codes
//      staged as unpadded rows by one 1 KB copy instead of four 256-byte ones with gaps,
//      the warp's tokens taken in the order kv_mma_tok (decode_mma.cuh KV_MMA_TOKEN_SWAP)
//      that keeps the value loads at 2 wavefronts (below). (b) changes which lane sums which
//      token (softmax sums, mma k order): float32 rounding differences, not the same bits.
//   0: the session-10 tile.
// 1 is the default: executed-path walk in benchmarks/NOTES.md "nvdec2".
#if defined(KVKIT_DECODE_NVFP4_REV)
#define KV_NVFP4_REV KVKIT_DECODE_NVFP4_REV
#else
#define KV_NVFP4_REV 1
#endif
#define KV_NVFP4_SF_RAW KV_NVFP4_REV

#include "common/decode_codes.cuh"
#include "common/vload.cuh"

// Tile copies on sm_90+ (KV_NVFP4_BULK; env KVKIT_DECODE_NVFP4_BULK, kvkit/cuda/decode.py):
//   1: every plane by the copy engine, per warp and 16-token page run (decode_core.cuh
//      KV_BULK_WARP_SLABS): one copy of the key codes, four of the value codes, one per scale
//      plane, from warp-uniform addresses;
//   0: 16-byte cp.async pieces per thread into padded rows (the sm_80 path everywhere).
// The staging layout under 1 is chosen for the tensor-core reads at D = 128 (lane (g, c) =
// (lane / 4, lane % 4)), 4-byte banks:
//   keys, 16-byte loads (kv_mma_kload) of tokens g (and g + 8) at byte 16 c of unpadded
//     64-byte rows: a warp reads 8 whole rows = 512 contiguous bytes, 4 wavefronts (the
//     least); each quarter-warp (tokens 2q, 2q + 1) 128 contiguous bytes;
//   values, 8-byte loads (kv_mma_vload) of dims 16 g.. (byte 8 g) of tokens 2c + e, e in
//     {0, 1, 8, 9}: in unpadded rows tokens 2c are 128 bytes apart, all four c on the same 16
//     banks (2 g, 2 g + 1): 4 wavefronts where 2 suffice (nvfp4-bulk, session 8: 2-4%
//     slower). A gap of one row after every 4 rows puts row t at 64 (t + t / 4): tokens
//     e, e + 2 at bank offset 16 (e + 2 c) mod 32 = 0 or 16 and e + 4, e + 6 one 64-byte
//     step later (the gap): banks 2 g + {0, 1} for two c and 16 + 2 g + {0, 1} for the other
//     two, every bank twice: 2 wavefronts. The region is the padded rows' size (16 x 80).
//   Scales as before (unpadded 8-byte rows, byte loads).
// Not at other head dims (D = 64 under KV_NVFP4_SLABS_OTHER_D, below; D = 256: 16-byte
// loads), not on sm_80 / sm_86 / sm_89 (no copy engine), not for the CUDA-core core (G * q_len
// > 16); two row tiles too since session 13 (below).
// 1 is the default: executed-path walk (scripts/sass_path.py, sm_90, D = 128, G = 4, warps
// 2-3 / 0-1) 604 / 649 -> 577 / 625 warp instructions per warp-tile, the tile start 162 ->
// 142 (benchmarks/NOTES.md "nvstart"); -DKVKIT_DECODE_NVFP4_BULK=0 builds the cp.async path.
#if defined(KVKIT_DECODE_NVFP4_BULK)
#define KV_NVFP4_BULK KVKIT_DECODE_NVFP4_BULK
#else
#define KV_NVFP4_BULK 1
#endif
// Up to 16 query rows (two row tiles). Before warp pipes, one row tile only: at G = 16 the
// walk rose 735 -> 743 (the start fell by 6, the score and PV phases grew by 14). With warp
// pipes (session 13, call 6; graph ms, cp.async -> slabs, two runs each) Hq = 128: (32, 4096)
// 0.1139 / 0.1136 -> 0.1013 / 0.1012, (8, 8192) 0.0641 / 0.0635 -> 0.0574 / 0.0573.
// KVKIT_DECODE_NVFP4_SLAB_ROWS=8 (kvkit/cuda/decode.py; A/B runs) keeps one row tile.
#if defined(KVKIT_DECODE_NVFP4_SLAB_ROWS)
#define KV_NVFP4_SLAB_ROWS KVKIT_DECODE_NVFP4_SLAB_ROWS
#else
#define KV_NVFP4_SLAB_ROWS 16
#endif
#if KV_NVFP4_BULK && KVKIT_BULK_COPY && KV_HEAD_DIM == 128 && defined(KV_GROUP) && \
    defined(KV_Q_LEN) && KV_GROUP * KV_Q_LEN <= KV_NVFP4_SLAB_ROWS
static_assert(KV_PLANE_K_DATA_WIDTH == 64 && KV_PLANE_V_DATA_WIDTH == 64,
              "the bank arithmetic above is for 64-byte code rows");
#define KV_BULK_COPIES 1
#define KV_BULK_WARP_SLABS 1
#define KV_P0_SROW KV_P0_BYTES
#define KV_P2_SROW KV_P2_BYTES
#if KV_NVFP4_REV
// nvdec2: the value codes as unpadded rows too (one 1 KB copy per warp, not four 256-byte
// ones: ~15 uniform instructions less per warp-tile), and the warp's tokens in the order
// kv_mma_tok (i ^ ((i / 2) % 2)): the value loads' tokens kv_mma_tok(2 c + e) are 0, 3, 4, 7
// (e = 0), 1, 2, 5, 6 (e = 1), the same + 8 (e = 8, 9): at 64 (token), mod 128 they are 0,
// 64, 0, 64 (or 64, 0, 64, 0): lanes (g, c) on banks 2 g + {0, 1} for two c and 16 + 2 g +
// {0, 1} for the other two, every bank twice: 2 wavefronts, as the gaps gave. The key loads
// (tokens kv_mma_tok(g), a permutation of 0..7, then of 8..15) still read 8 whole rows, 512
// contiguous bytes: 4 wavefronts.
#define KV_MMA_TOKEN_SWAP 1
#else
#define KV_P2_SGAP KV_P2_BYTES
#endif
#endif

// Warp slabs (and with them warp pipes, decode_core.cuh KVD_WARP_PIPE) at head_dim 64
// (KV_NVFP4_SLABS_OTHER_D; env KVKIT_DECODE_NVFP4_SLABS_OTHER_D, kvkit/cuda/decode.py; A/B
// runs; default 2, unpadded value rows: measured on the H200 (session 14, call 1, graph ms,
// nvfp4, Hq 32, Hkv 8) against cp.async (0): (32, 4096) 0.0549 / 0.0544 -> 0.0524, (64, 8192)
// 0.1927 / 0.1923 -> 0.1894, (8, 8192) 0.0313 / 0.0311 -> 0.0293; 1 (row gaps) measured 0.0551,
// 0.1995, 0.0309, so its fewer bank conflicts cost more in copies than they saved; D = 256
// unchanged within 1%): the tensor-core launches on sm_90+ as at D = 128, with
// a staging layout for the bank pattern of the D = 64 reads and the tokens in their natural
// order (no KV_MMA_TOKEN_SWAP): the same operands in the same lanes and mma k slots as the
// cp.async build, so the same bits. Lane (g, c) = (lane / 4, lane % 4), 4-byte banks; a
// common shift of every address by a multiple of 16 bytes (region, stage and warp bases)
// rotates the banks and leaves the conflicts as they are, so offsets below are the warp's.
//   Keys (kv_mma_kload): 8-byte loads, token g (then g + 8) at byte 8 c of its 32-byte row.
//     Unpadded rows, one copy per warp: a half-warp (tokens 4 h .. 4 h + 3, all c) reads 128
//     contiguous bytes, every bank once: 2 wavefronts per load, the least for 256 bytes
//     (the cp.async build's 48-byte rows: half-warp 0 at 48 g mod 128 = 0, 48, 96, 16 puts
//     tokens 0 and 3 on banks 4-7, half-warp 1 tokens 4 and 7 on banks 20-23: 2 per half-warp,
//     4 per load, where the hardware splits 8-byte loads by half-warps).
//   Values (kv_mma_vload): 4-byte loads of byte 4 g of tokens 2 c + e (e in {0, 1, 8, 9}):
//     unpadded, tokens e, e + 2, e + 4, e + 6 sit at 32 e + 64 c, mod 128 two pairs on the same
//     8 banks: 2 wavefronts. A row's gap (32 bytes) after every 4 rows puts row t at
//     32 t + 32 (t / 4): tokens e, e + 2 at 32 e + {0, 64}, e + 4, e + 6 at 32 e + {160, 224},
//     mod 128 32 e + {0, 64, 32, 96} (e = 8, 9: + 64 more for both groups): the four tokens on
//     four different 8-bank quarters, lanes g on the 8 banks of each: 1 wavefront, as the
//     cp.async build's 48-byte rows give (tokens 2 c + e at 96 c + 48 e: banks
//     (12 e + g + 24 c) mod 32, c = 0..3 at 0, 24, 16, 8: all 32 distinct). The gap costs
//     three more copies per warp-tile (four 128-byte runs instead of one 512-byte one); the
//     region is 64 x 32 + 16 x 32 = 2560 bytes (padded rows: 64 x 48 = 3072). 2 (A/B) keeps
//     the value rows unpadded instead: one 512-byte copy, 2 wavefronts per value load (four
//     loads per warp-tile: 4 more wavefronts, against ~20 uniform instructions of the three
//     copies; static walk in benchmarks/NOTES.md "nv64").
//   Scales (4-byte rows, slab planes: unpadded in both builds): key scale byte c of token g
//     (32 consecutive bytes, 8 words), value scale byte g / 2 of tokens 2 c + e (4 words on 4
//     banks): 1 wavefront each, as before.
// D = 256 is not built (benchmarks/NOTES.md "nv64"): its 128-byte code rows put tokens 2 q and
// 2 q + 1 of a quarter-warp's 16-byte key loads on the same banks in any layout of unpadded
// rows with gaps per 4 rows (16-byte loads are split by quarter-warps), and the value loads'
// tokens e, e + 2 likewise; only per-row padding (one copy per row) or another token order
// (other float32 sums) avoids that.
#if defined(KVKIT_DECODE_NVFP4_SLABS_OTHER_D)
#define KV_NVFP4_SLABS_OTHER_D KVKIT_DECODE_NVFP4_SLABS_OTHER_D
#else
#define KV_NVFP4_SLABS_OTHER_D 2
#endif
#if KV_NVFP4_SLABS_OTHER_D && KV_NVFP4_BULK && KVKIT_BULK_COPY && KV_HEAD_DIM == 64 && \
    defined(KV_GROUP) && defined(KV_Q_LEN) && KV_GROUP * KV_Q_LEN <= KV_NVFP4_SLAB_ROWS
static_assert(KV_PLANE_K_DATA_WIDTH == 32 && KV_PLANE_V_DATA_WIDTH == 32 &&
                  KV_PLANE_K_SCALE_WIDTH == 4 && KV_PLANE_V_SCALE_WIDTH == 4,
              "the bank arithmetic above is for 32-byte code rows and 4-byte scale rows");
#define KV_BULK_COPIES 1
#define KV_BULK_WARP_SLABS 1
#define KV_P0_SROW KV_P0_BYTES
#define KV_P2_SROW KV_P2_BYTES
#if KV_NVFP4_SLABS_OTHER_D == 1
// One row's gap per 4 value rows (above).
#define KV_P2_SGAP KV_P2_BYTES
#elif KV_NVFP4_SLABS_OTHER_D != 2
#error "KVKIT_DECODE_NVFP4_SLABS_OTHER_D: 0, 1 or 2"
#endif
#endif

// E2M1 unpacking of the tensor-core register paths (kv_mma_kstep, kv_mma_vpair):
//   1: a code word's eight nibbles as four fp16x2 words at once (kv_dc_e2m1x8_f16x2: 11
//      instructions; V: one byte permute per four words of a token pair);
//   0: pair by pair (kv_nvfp4_pair_at / kv_dc_e2m1_pair_f16x2: 4 per word; V: one byte
//      permute per two words).
// Same operand bits either way. 1 is the default: executed-path walk (scripts/sass_path.py,
// sm_90, D = 128, G = 4) in benchmarks/NOTES.md "nvd"; -DKVKIT_DECODE_NVFP4_UNPACK=0
// (env KVKIT_DECODE_NVFP4_UNPACK=0, kvkit/cuda/decode.py) builds the other for A/B runs.
#if defined(KVKIT_DECODE_NVFP4_UNPACK)
#define KV_NVFP4_UNPACK KVKIT_DECODE_NVFP4_UNPACK
#else
#define KV_NVFP4_UNPACK 1
#endif

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
// (times KV_NVFP4_SF_MUL * 2^-14: 2^-8, or 2^-14 with KV_NVFP4_SF_RAW on sm_89+; see
// kv_dc_nvfp4x2_f16x2).
#define KV_MMA 1
#define KV_MMA_KF (16384.0f / KV_NVFP4_SF_MUL)
#define KV_MMA_VF (16384.0f / KV_NVFP4_SF_MUL)
// Elements 16 ks + 2c, +1 (code byte 8 ks + c) and 16 ks + 2c + 8, +9 (byte 8 ks + 4 + c):
// one 16-element block, one scale.
__device__ __forceinline__ void kv_mma_k4(const unsigned char* const* rows, int ks, int c,
                                          unsigned* h0, unsigned* h1) {
    static_assert(KV_NVFP4_BLOCK == 16, "one block scale per 16-dim k-step");
    const unsigned sf = kv_dc_nvfp4_sf_f16x2(rows[1][ks]);
    *h0 = kv_dc_nvfp4x2_f16x2(rows[0][8 * ks + c], sf);
    *h1 = kv_dc_nvfp4x2_f16x2(rows[0][8 * ks + 4 + c], sf);
}
// Register runs at head_dim 96 (KV_NVFP4_RUNS96; env KVKIT_DECODE_NV96, kvkit/cuda/decode.py;
// A/B runs): 1 gives D = 96 the register keys and values of the other tensor-core head dims
// (below), with the mma's K and M permuted so that every run lies in whole blocks or whole
// halves of blocks (a natural run of 24 keys would straddle a block boundary at run element 8
// or 16 depending on the lane, and 12 values at 4 or 8): key run c = block c (dims 16 c ..
// 16 c + 15, code bytes 8 c ..) then half c % 2 of block 4 + c / 2 (dims 64 + 8 c .., bytes 32 +
// 4 c ..); value run g = half g % 2 of block g / 2 (dims 8 g .., bytes 4 g ..) then quarter g % 4
// of block 4 + g / 4 (dims 64 + 4 g .., bytes 32 + 2 g ..). The query rows and the output dims
// follow (kv_mma_kdim, kv_mma_vdim): the same products, summed by the mma in another order
// (float32 rounding only). With it, D = 96 also takes the packed mma columns (KV_NV_PACK 1,
// below) and, on sm_90 / sm_100, the warp-local cp.async loop with its tile pairs
// (KV_CP_ON_BULK, below). 0: the build before (keys by kv_mma_k4 per k-step, values through the
// shared V tile, the CTA-barrier loop on sm_90), which ran D = 96 slower than the fp16 cache.
// Measured on the H200 (session 24, call 4; graph ms, Hq 32, Hkv 8, D = 96, two runs each;
// 0 / 1 alone / 1 with the packed columns and the warp-local loop, the default):
//   (32, 4096) 0.1142 / 0.1144 -> 0.0690 / 0.0685 -> 0.0579 / 0.0573
//   (8, 8192) 0.0617 / 0.0616 -> 0.0390 / 0.0386 -> 0.0338 / 0.0333
//   (1, 32768) 0.0349 / 0.0351 -> 0.0236 / 0.0235 -> 0.0215 / 0.0211
//   (64, 8192) 0.4274 / 0.4273 -> 0.2476 / 0.2475 -> 0.1999 / 0.1982
//   (16, 4096) Hq 64 0.0636 / 0.0635 -> 0.0407 / 0.0405 -> 0.0401 / 0.0402
// and through KVKIT_ARCH=sm_80 (0 / 1 / 1 with the packed columns): (32, 4096) 0.1306 / 0.0732
// / 0.0637, (8, 8192) 0.0703 / 0.0415 / 0.0370, (1, 32768) 0.0396 / 0.0252 / 0.0234.
#if defined(KVKIT_DECODE_NV96)
#define KV_NVFP4_RUNS96 (KV_HEAD_DIM == 96 && KVKIT_DECODE_NV96)
#else
#define KV_NVFP4_RUNS96 (KV_HEAD_DIM == 96)
#endif
// Keys straight into registers (decode_mma.cuh KV_MMA_K_REGS) where a lane's run of KPL =
// D / 4 elements covers whole blocks or lies in one (D = 32, 64, 128, 256; 96 as above): its
// KPL / 2 code bytes by aligned vector loads, its one, two or four scale bytes converted once
// per token (two per e4m3x2 conversion, one scale word per pair of blocks) instead of once per
// k-step. Run order: k-step ks takes code word ks / 2 and in it nibble pairs (2m, 2m + 4) and
// (2m + 1, 2m + 5), m = ks % 2: each pair sits in bits 4i and 16 + 4i of the word, where one
// shift-and-mask makes an fp16x2.
#if KV_HEAD_DIM == 32 || KV_HEAD_DIM == 64 || KV_HEAD_DIM == 128 || KV_HEAD_DIM == 256 || \
    KV_NVFP4_RUNS96
#define KV_MMA_K_REGS 1
#define KV_NVFP4_KPL (KV_HEAD_DIM / 4)
#define KV_NVFP4_KWORDS (KV_NVFP4_KPL / 8)
// Scale words per run (fp16x2, two blocks per word): the run's four blocks at D = 256.
#define KV_NVFP4_KSW (KV_HEAD_DIM == 256 ? 2 : 1)
#define KV_MMA_KRAW (KV_NVFP4_KWORDS + KV_NVFP4_KSW)
static_assert(KV_NVFP4_BLOCK == 16, "a run's blocks: 16 elements each");
__device__ __forceinline__ int kv_mma_kpos(int ks, int j) {
    return 8 * (ks >> 1) + 2 * (ks & 1) + 4 * (j & 1) + (j >> 1);
}
#if KV_NVFP4_RUNS96
// Run element e of lane c is dim kv_mma_kdim(c, e) (decode_mma.cuh KV_MMA_KDIM).
#define KV_MMA_KDIM 1
__device__ __forceinline__ int kv_mma_kdim(int c, int e) {
    return e < 16 ? 16 * c + e : 64 + 8 * c + (e - 16);
}
__device__ __forceinline__ void kv_mma_kload(const unsigned char* const* rows, int c,
                                             unsigned* raw) {
    // 48-byte code rows, 16-byte aligned in every staging mode; the 6-byte scale rows may be
    // staged unpadded (a page's scales as one run), so byte loads there.
    const uint2 w = *reinterpret_cast<const uint2*>(rows[0] + 8 * c);
    raw[0] = w.x;
    raw[1] = w.y;
    raw[2] = *reinterpret_cast<const unsigned*>(rows[0] + 32 + 4 * c);
    // Scale bytes c (words 0, 1: half 0) and 4 + c / 2 (word 2: half 1).
    raw[3] = kv_dc_nvfp4_sf2_f16x2(rows[1][c], rows[1][4 + (c >> 1)]);
}
#else
__device__ __forceinline__ void kv_mma_kload(const unsigned char* const* rows, int c,
                                             unsigned* raw) {
    // Data rows are 16-byte aligned (D / 2 is a multiple of 16 in every staging mode), so
    // the run's byte offset (KPL / 2) c fixes the alignment.
    constexpr int RB = KV_NVFP4_KPL / 2;
    kv_load_words<KV_NVFP4_KWORDS, (RB < 16 ? RB : 16)>(rows[0] + RB * c, raw);
    // Scale bytes of the run's first and last block (the same block below D = 128).
    const unsigned char* sf = rows[1] + (KV_NVFP4_KPL * c) / KV_NVFP4_BLOCK;
#if KV_HEAD_DIM == 256
    // The run's four blocks have their scales at byte 4 c of the scale row (16 bytes,
    // 16-byte aligned staging rows in every mode): one word, two conversions.
    static_assert(KV_NVFP4_KSW == 2, "four blocks per run");
    const unsigned w = *reinterpret_cast<const unsigned*>(sf);
    raw[KV_NVFP4_KWORDS] = kv_dc_nvfp4_sfw_f16x2(w);
    raw[KV_NVFP4_KWORDS + 1] = kv_dc_nvfp4_sfw_f16x2(w >> 16);
#elif KV_HEAD_DIM == 128
    // The run's two blocks: scale bytes 2 c, 2 c + 1, one 16-bit load (2-byte aligned).
    raw[KV_NVFP4_KWORDS] = kv_dc_nvfp4_sfw_f16x2(*reinterpret_cast<const unsigned short*>(sf));
#else
    const unsigned s0 = sf[0];
    raw[KV_NVFP4_KWORDS] = kv_dc_nvfp4_sf2_f16x2(s0, s0);
#endif
}
#endif
// Tile pairs' lane offsets (decode_core.cuh KVD_PAIR_ADDR): the byte offsets kv_mma_kload adds
// to row pointers 0 (codes) and 1 (scales) for lane column c, the same expressions as there;
// kv_mma_vlane below for kv_mma_vload. Not with row gaps (KV_P2_SGAP: the session-10 tile at
// D = 128, KVKIT_DECODE_NVFP4_SLABS_OTHER_D=1 at D = 64), where the pair loop's row offsets
// are not linear in the token; nor with head_dim 96's runs (KV_NVFP4_RUNS96: two chunks at
// offsets 8 c and 32 + 4 c, not one lane term).
#if !defined(KV_P2_SGAP) && !KV_NVFP4_RUNS96
#define KV_MMA_LANE_OFFS 1
#endif
__device__ __forceinline__ int kv_mma_klane(int p, int c) {
    return p == 0 ? (KV_NVFP4_KPL / 2) * c : (KV_NVFP4_KPL * c) / KV_NVFP4_BLOCK;
}
// e2m1 codes at bits S.. and 16 + S.. of x -> fp16x2 of e2m1 * 2^-14 (kv_dc_e2m1_pair_f16x2
// of x >> S, with the shifts folded).
template <int S>
__device__ __forceinline__ unsigned kv_nvfp4_pair_at(unsigned x) {
    const unsigned mag = S <= 9 ? (x << (9 - S)) : (x >> (S - 9));
    const unsigned sgn = S <= 12 ? (x << (12 - S)) : (x >> (S - 12));
    return (mag & 0x0E000E00u) | (sgn & 0x80008000u);
}
__device__ __forceinline__ void kv_mma_kstep(const unsigned* raw, int ks, const unsigned*,
                                             unsigned* h0, unsigned* h1) {
    const int w = ks >> 1;
    const unsigned x = raw[w];
    // The word's block scale in both halves: block (8 w) / 16 of the run, half hs of scale word
    // sw (the multiplies take the half by their operand selector: no byte permute).
#if KV_HEAD_DIM == 256
    // Four blocks, two scale words: block w / 2 is half (w / 2) % 2 of scale word w / 4.
    const unsigned sw = raw[KV_NVFP4_KWORDS + (w >> 2)];
    const bool hs = (w & 2) != 0;
#else
    const unsigned sw = raw[KV_NVFP4_KWORDS];
    const bool hs = (8 * w) / KV_NVFP4_BLOCK != 0;
#endif
    auto scaled = [sw, hs](unsigned a) {
        return hs ? kv_hmul2_bcast<1>(a, sw) : kv_hmul2_bcast<0>(a, sw);
    };
#if KV_NVFP4_UNPACK
    // The word's four pairs at once (the compiler shares them between k-steps 2 w, 2 w + 1).
    unsigned h[4];
    kv_dc_e2m1x8_f16x2(x, h);
    *h0 = scaled(h[2 * (ks & 1)]);
    *h1 = scaled(h[2 * (ks & 1) + 1]);
#else
    if (ks & 1) {
        *h0 = scaled(kv_nvfp4_pair_at<8>(x));
        *h1 = scaled(kv_nvfp4_pair_at<12>(x));
    } else {
        *h0 = scaled(kv_nvfp4_pair_at<0>(x));
        *h1 = scaled(kv_nvfp4_pair_at<4>(x));
    }
#endif
}
#endif
// V elements d8..d8+7: 4 code bytes (4-byte aligned in the 16-byte aligned data rows), one
// block scale.
__device__ __forceinline__ uint4 kv_mma_v8(const unsigned char* const* rows, int d8) {
    const unsigned w = *reinterpret_cast<const unsigned*>(rows[2] + (d8 >> 1));
    const unsigned sf = kv_dc_nvfp4_sf_f16x2(rows[3][d8 / KV_NVFP4_BLOCK]);
    return make_uint4(kv_dc_nvfp4x2_f16x2(w & 0xFFu, sf), kv_dc_nvfp4x2_f16x2((w >> 8) & 0xFFu, sf),
                      kv_dc_nvfp4x2_f16x2((w >> 16) & 0xFFu, sf), kv_dc_nvfp4x2_f16x2(w >> 24, sf));
}

// V straight into registers (decode_mma.cuh KV_MMA_V_REGS) where a lane group's VPL = D / 8
// dims share one block scale (D = 32, 64, 128) or are two whole blocks (D = 256): VPL / 2
// code bytes (aligned to VPL / 2 in the 16-byte aligned data rows) and the scale byte(s)
// (raw[KV_MMA_VRAW - 1]).
#if KV_NVFP4_RUNS96
// (KV_NVFP4_RUNS96 above) Lane group g's pairs j = 0..3 are dims 8 g + 2 j, + 1 (block g / 2),
// j = 4, 5 dims 64 + 4 g + 2 (j - 4), + 1 (block 4 + g / 4): raw[0] the 4 code bytes at 4 g,
// raw[1] the 2 at 32 + 2 g (low half), raw[2] the two scale bytes (bits 0..7 block g / 2,
// 8..15 block 4 + g / 4).
#define KV_MMA_V_REGS 1
#define KV_MMA_VRAW 3
#define KV_MMA_VDIM 1
__device__ __forceinline__ int kv_mma_vdim(int g, int j) {
    return j < 4 ? 8 * g + 2 * j : 64 + 4 * g + 2 * (j - 4);
}
__device__ __forceinline__ void kv_mma_vload(const unsigned char* const* rows, int g,
                                             unsigned* raw) {
    raw[0] = *reinterpret_cast<const unsigned*>(rows[2] + 4 * g);
    raw[1] = *reinterpret_cast<const unsigned short*>(rows[2] + 32 + 2 * g);
    // (Scale rows possibly unpadded, 6 bytes apart: byte loads, one byte permute.)
    raw[2] = __byte_perm(rows[3][g >> 1], rows[3][4 + (g >> 2)], 0x0040);
}
// (kv_mma_vpair below: raw[1] has code bytes 0 and 1 only, read by pairs j = 4, 5.)
#elif KV_HEAD_DIM == 32 || KV_HEAD_DIM == 64 || KV_HEAD_DIM == 128 || KV_HEAD_DIM == 256
#define KV_MMA_V_REGS 1
#define KV_MMA_VRAW (KV_HEAD_DIM == 256 ? 5 : 3)
__device__ __forceinline__ void kv_mma_vload(const unsigned char* const* rows, int g,
                                             unsigned* raw) {
    constexpr int VPL = KV_HEAD_DIM / 8;
    static_assert(KV_NVFP4_BLOCK % VPL == 0 || VPL == 2 * KV_NVFP4_BLOCK,
                  "one block scale, or two whole blocks, per lane group");
    const unsigned char* p = rows[2] + (VPL / 2) * g;
#if KV_HEAD_DIM == 256
    // 16 code bytes (16-byte aligned), the two scale bytes at byte 2 g of the 16-byte aligned
    // scale row.
    const uint4 w = *reinterpret_cast<const uint4*>(p);
    raw[0] = w.x;
    raw[1] = w.y;
    raw[2] = w.z;
    raw[3] = w.w;
    raw[4] = *reinterpret_cast<const unsigned short*>(rows[3] + 2 * g);
#else
    if constexpr (VPL == 16) {
        const uint2 w = *reinterpret_cast<const uint2*>(p);
        raw[0] = w.x;
        raw[1] = w.y;
    } else if constexpr (VPL == 8) {
        raw[0] = *reinterpret_cast<const unsigned*>(p);
        raw[1] = 0u;
    } else {
        raw[0] = *reinterpret_cast<const unsigned short*>(p);
        raw[1] = 0u;
    }
    raw[2] = rows[3][(VPL * g) / KV_NVFP4_BLOCK];
#endif
}
// The byte offsets kv_mma_vload adds to row pointers 2 (codes) and 3 (scales) for lane group
// g (tile pairs' lane offsets, kv_mma_klane above).
__device__ __forceinline__ int kv_mma_vlane(int p, int g) {
    constexpr int VPL = KV_HEAD_DIM / 8;
#if KV_HEAD_DIM == 256
    return p == 2 ? (VPL / 2) * g : 2 * g;
#else
    return p == 2 ? (VPL / 2) * g : (VPL * g) / KV_NVFP4_BLOCK;
#endif
}
#endif
#if KV_MMA_V_REGS
// Elements 2j, 2j + 1 of the lane's run for tokens a (low halves) and b (high halves), as
// kv_mma_v8 (value * 2^-8).
__device__ __forceinline__ void kv_mma_vpair(const unsigned* ra, const unsigned* rb, int j,
                                             unsigned* w0, unsigned* w1) {
#if KV_NVFP4_UNPACK
    // Code bytes 2 q, 2 q + 1 (q = (j / 2) % 2) of word j / 4 of both tokens: nibble k of e is
    // token a's run dim 2 (j & ~1) + k (low half), nibble k + 4 token b's, so kv_dc_e2m1x8_f16x2
    // gives the pairs of j and j + 1 (shared by the compiler).
    const unsigned e = __byte_perm(ra[j >> 2], rb[j >> 2], (j & 2) ? 0x7632 : 0x5410);
#else
    const int o = j & 3;
    const unsigned e = __byte_perm(ra[j >> 2], rb[j >> 2], o | ((4 + o) << 8));
#endif
#if KV_HEAD_DIM == 256 || KV_NVFP4_RUNS96
    // Dims 2 j, 2 j + 1 lie in the run's block j / 8 (D = 256) or j / 4 (D = 96: blocks g / 2
    // and 4 + g / 4, kv_mma_vload): scale byte b of the last raw word.
    const int b = KV_HEAD_DIM == 256 ? j >> 3 : j >> 2;
    const unsigned sf = kv_dc_nvfp4_sfw_f16x2(
        __byte_perm(ra[KV_MMA_VRAW - 1], rb[KV_MMA_VRAW - 1], b | ((4 + b) << 4)));
#else
    const unsigned sf = kv_dc_nvfp4_sf2_f16x2(ra[2], rb[2]);
#endif
#if KV_NVFP4_UNPACK
    unsigned h[4];
    kv_dc_e2m1x8_f16x2(e, h);
    *w0 = kv_hmul2(h[2 * (j & 1)], sf);
    *w1 = kv_hmul2(h[2 * (j & 1) + 1], sf);
#else
    *w0 = kv_hmul2(kv_dc_e2m1_pair_f16x2(e), sf);
    *w1 = kv_hmul2(kv_dc_e2m1_pair_f16x2(e >> 4), sf);
#endif
}
#endif

// Packed mma columns and the unguarded softmax (env KVKIT_DECODE_NV_PACK=0 / 1 / 2,
// kvkit/cuda/decode.py; A/B runs; 0 is the build before; benchmarks/NOTES.md "nv17"):
//   1: packed columns (decode_mma.cuh KV_MMA_PACK, KV_MMA_PACK_F16): at G * q_len <= 4 the
//      score and PV mmas' N columns 4..7 are padding. The score's columns 4..7 hold rows
//      0..3's queries again (fp16 queries: no lo part; bf16 / float32 ones: their lo part,
//      joined by one shuffle as TurboQuant's), so lanes c >= 2 hold the same scores and
//      weights as lanes c < 2; their PV B columns carry P's fp16 lo part where lanes c < 2
//      carry hi: one mma per m-tile and tile instead of two (at D = 128, 16 of 32 PV mmas per
//      pair and 4 of 8 movmatrix), the lo sums joined after the tile loop. Float32 rounding
//      only (the hi and lo products were one tensor-core chain per pair before, now one
//      each): within DECODE_GPU_RTOL of float64, not the same bits. Every arch (the
//      single-tile loop too); not at G * q_len > 4. Plus 2's softmax.
//   2: the online softmax without kv_online_step's empty-row guard (KV_MMA_EXP_CLAMP: the
//      running max starts at -FLT_MAX): the same bits as 0 wherever a row's logits are not
//      all NaN (a row whose visible logits are all NaN so far: NaN there, 0 weights before).
// Static walk (scripts/sass_path.py, sm_90, D = 128, G = 4, per tile pair): 892 (0) -> 854 (1).
// Default 1 from head_dim 128 and at 96 (KV_NVFP4_RUNS96, measured there), 2 below. Measured
// on the H200 (session 16, call 4; graph ms,
// 0 / 0 -> 1 / 1): (64, 8192) 0.1963 / 0.1963 -> 0.1892 / 0.1911, D = 256 (32, 4096) 0.1240 /
// 0.1245 -> 0.1221 / 0.1208, (1, 131072) and (8, 8192) within +-1%; but D = 64 (32, 4096)
// 0.0391 / 0.0393 -> 0.0458 / 0.0461 (+17%; 2 there: 0.0387). The same at nvfp4_4over6.
#if defined(KVKIT_DECODE_NV_PACK)
#define KV_NV_PACK KVKIT_DECODE_NV_PACK
#elif KV_HEAD_DIM >= 128 || KV_NVFP4_RUNS96
#define KV_NV_PACK 1
#else
#define KV_NV_PACK 2
#endif
#if KV_NV_PACK < 0 || KV_NV_PACK > 2
#error "KVKIT_DECODE_NV_PACK: 0, 1 or 2"
#endif
#define KV_MMA_PACK_OK (KV_NV_PACK == 1)
#define KV_MMA_PACK_F16 1
#define KV_MMA_EXP_CLAMP (KV_NV_PACK >= 1)
// The tile pairs on the cp.async path (KVKIT_DECODE_CP_ASYNC_V2=3 / 4, decode_core.cuh), the
// default here. Session 17, H200 through KVKIT_ARCH=sm_80, graph ms 2 -> 3 (two runs): D = 64
// (32, 4096) 0.0570 / 0.0565 -> 0.0483 / 0.0486; (64, 8192) 0.2508 / 0.2527 -> 0.2298 /
// 0.2240; (1, 131072) 0.0720 / 0.0721 -> 0.0649 / 0.0651; (8, 8192) even (16 tiles a split:
// the split-length rule's single tiles). 4 (six stages at D = 64) was no better than 3. The
// pair build's stages take more shared memory (D = 128 4 x 1: 54,896 bytes a CTA, 29,792 at
// 2), so the launcher keeps 2 on GPUs where that holds fewer CTAs per SM (kvkit/cuda/decode.py
// _stage1_default: an A100's 164 KB, sm_86 / sm_89's 100 KB).
// At head_dim 128 the pairs' stages fit four CTAs an SM only with the packed columns
// (KV_NV_PACK 1: the A/B builds 0 / 2 build 3 as 2).
#define KV_CP_PAIRS_OK (KV_HEAD_DIM <= 64 || KV_NV_PACK == 1)
#define KV_CP_ASYNC_V2_DEFAULT 3
// Tile pairs up to 16 query rows on the warp pipes (decode_core.cuh KVKIT_DECODE_PAIRS16).
#define KV_PAIRS16_OK 1
// -DKVKIT_DECODE_CP_ON_BULK (kvkit/cuda/decode.py; A/B runs): 1 runs the launches this file
// copies by cp.async on bulk-copy targets (head_dim 256 and the others but 64 / 128) through
// the warp-local cp.async loop with its page windows and, up to 4 query rows, its tile pairs
// (decode_core.cuh KV_CP_ON_BULK; pairs to head_dim 256); 0 the CTA-barrier loop, the build
// before. Default: 1 at head_dim 256, 96 (with KV_NVFP4_RUNS96, above) and 32 on sm_90 /
// sm_100 (measured), 0 elsewhere (other head dims build the same code either way but 64 / 128,
// which have copy-engine tiles). Measured on the H200 (session 23, call 8; graph ms at D = 256,
// 0 -> 1, two runs each): (32, 4096) 0.1189 / 0.1192 -> 0.0956 / 0.0959, (8, 8192) 0.0622 /
// 0.0626 -> 0.0551 / 0.0549, (64, 8192) 0.4578 / 0.4645 -> 0.4160 / 0.4201, (1, 32768) 0.0372 /
// 0.0378 -> 0.0344 / 0.0347, G = 8 (16, 4096) 0.0705 / 0.0705 -> 0.0670 / 0.0668. At D = 32
// (session 24, call 2): (32, 4096) 0.0462 / 0.0463 -> 0.0377 / 0.0377, (8, 8192) 0.0252 / 0.0253
// -> 0.0214 / 0.0213, (1, 32768) 0.0167 / 0.0167 -> 0.0141 / 0.0141, (64, 8192) 0.1688 / 0.1687
// -> 0.1239 / 0.1240. Another float32 order (the pairs' softmax steps; the single-tile loop of
// non-slab launches too): not bit for bit with 0.
#if defined(KVKIT_DECODE_CP_ON_BULK)
#define KV_CP_ON_BULK KVKIT_DECODE_CP_ON_BULK
#else
#define KV_CP_ON_BULK                                                                     \
    ((KV_HEAD_DIM == 256 || KV_HEAD_DIM == 32 || KV_NVFP4_RUNS96) && KVKIT_BULK_COPY && \
     KVKIT_ARCH < 1200)
#endif
// -DKVKIT_DECODE_NV96_PAIRS8 (kvkit/cuda/decode.py; A/B runs; default 1): 1 gives head_dim
// 96's register runs the cp.async path's tile pairs up to 8 query rows (decode_core.cuh
// KV_CP_PAIRS8_MAX_D): its 8 KB stages (48-byte code rows, 16-byte scale rows) leave four CTAs
// per SM with 5-8 rows' query buffers (119-125 registers, no spills on sm_80 / sm_90 /
// sm_100a, float32, float16 and bfloat16 queries); 0 up to 4 (the build before), as at D =
// 128. Measured on the H200 (session 24, call 6; graph ms at G = 8, Hq 64, Hkv 8, D = 96, 0 ->
// 1, two runs each): (16, 4096) 0.0398 / 0.0397 -> 0.0360 / 0.0359, (8, 8192) 0.0402 / 0.0403
// -> 0.0365 / 0.0364, (32, 4096) 0.0701 / 0.0699 -> 0.0623 / 0.0620, (1, 32768) 0.0247 /
// 0.0247 -> 0.0230 / 0.0230; through KVKIT_ARCH=sm_80 -7 to -11% likewise.
#ifndef KVKIT_DECODE_NV96_PAIRS8
#define KVKIT_DECODE_NV96_PAIRS8 1
#endif
#if KV_NVFP4_RUNS96 && KVKIT_DECODE_NV96_PAIRS8
#define KV_CP_PAIRS8_MAX_D 96
#endif
#if KV_CP_ON_BULK
#define KV_TILE_PAIRS_MAX_D 256
#endif

#include "common/decode_core.cuh"

KV_DEFINE_STAGE1_KERNEL(kv_decode_nvfp4_stage1)
