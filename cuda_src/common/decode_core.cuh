// decode_core.cuh: the format-independent body of split-K decode stage 1 (DESIGN.md section 5).
//
// One CTA per (split, kv_head, batch) = (blockIdx.x, blockIdx.y, blockIdx.z) serves all
// G = KV_GROUP query heads and all KV_Q_LEN queries of its KV head: R = G * q_len rows. The
// CTA walks the tokens of its page-aligned split (kvkit.splits.page_range, paged.cuh) in
// tiles of KVD_TILE tokens through a STAGES-deep cp.async pipeline (the raw bytes of tile
// i + STAGES - 1 are in flight while tile i is computed; the block-table entries of a tile
// are read one tile earlier still, into a register, so no thread waits on them). Per tile:
//   (a) scores: thread (token t, part k) dequantizes quads k, k + KSPLIT, ... of token t's
//       key straight from the staged raw bytes (family hook kv_family_k4) and dots them with
//       every query row (q in shared memory, broadcast reads); the KSPLIT partial dots meet
//       by shuffles. Each key element is dequantized once per 16 rows, read once.
//   (b) softmax: warp w owns rows w, w + 8, ...: masks (causal offsets, window, bad pages),
//       soft-cap, online-softmax update (m, l in registers of the owning warp), p to shared.
//   (c) PV: thread (4 columns, row group, token group) dequantizes its value quads once
//       (kv_family_v4) and accumulates p * v for its rows in float32 registers; the token
//       groups are summed once at the end of the split (shared memory), not per tile.
// Global scales are folded into the softmax scale for K and into v_out_scale for V.
// At the end the CTA writes its partial state (m, l, acc * v_out_scale) to the partial
// buffers, whose split axis has stride split_stride (>= the grid's split count: a planned
// step's buffers are sized once); or, when the launcher passes o_out / lse_out (one split, no
// sinks), the final o = acc * v_out_scale / l and lse = m + log(l) with stage 2's exact
// arithmetic. An empty split (or a bad seq_len: flag bit 4) is (m = -inf, l = 0, acc = 0).
//
// Plane copies (per plane, chosen once per CTA from the host's load-width code): rows whose
// width is a multiple of 16 with 16-byte aligned rows: 16-byte cp.async per row chunk into
// padded staging rows (an odd number of 16-byte units, so the 8 tokens of a quarter-warp hit
// different banks); token-contiguous planes of other widths (TurboQuant slots, NVFP4
// scales) with a 16-byte aligned (page, head) slab: 16-byte cp.async of whole runs of
// min(block_size, TILE) tokens into unpadded rows (the mma core with pages of >= 16 tokens:
// one warp per 16 tokens, KvIssueAt); anything else (strided or unaligned views):
// synchronous loads of the widest width the alignment allows. Launches whose planes all copy
// asynchronously with 32-bit offsets ("fast") copy rows without a page as zeros (src-size 0)
// rather than branching around them.
//
// An entry defines, before including this file:
//   KV_NPLANES (1..4); KV_Pi_BYTES (row width in bytes of plane i) and KV_Pi_ELEM (bytes per
//   element: plane strides arrive in elements) for i < KV_NPLANES;
//   KV_HAS_KMUL (1: kv_family_kmul(rows) gives a per-token factor of the key, e.g. the
//   TurboQuant norm); KV_ROTATE_Q (1: kv_family_q_signed(x, d), s_d x, and an FWHT of the
//   query rows, the TurboQuant rotation without its 1 / sqrt(D), which the host folds into
//   scale);
//   KV_FAMILY_TABLE_FLOATS and kv_family_init_table(float*, tid) (a shared table, e.g. the
//   codebook); kv_family_k4(rows, d, table) / kv_family_v4(rows, d, table): elements
//   d..d+3 (d % 4 == 0) of a token's K / V from its staged rows (rows[i] = staging row of
//   plane i: 16-byte aligned in the row modes, only element-aligned in the slab mode).
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


// Tensor-core core (decode_mma.cuh) when the family provides its hooks (KV_MMA) and the rows
// and head_dim fit it; -DKVKIT_DECODE_SIMT=1 forces the CUDA-core core (A/B measurements).
// D = 256 takes one row tile only (G * q_len <= 8): its 64 accumulator floats per thread fit
// beside the rest at <= 255 registers, two row tiles (128 floats) would spill.
#if defined(KV_MMA) && KV_MMA && KV_HEAD_DIM % 32 == 0 && \
    (((KV_GROUP * KV_Q_LEN) <= 16 && KV_HEAD_DIM <= 128) || \
     ((KV_GROUP * KV_Q_LEN) <= 8 && KV_HEAD_DIM == 256)) && \
    !(defined(KVKIT_DECODE_SIMT) && KVKIT_DECODE_SIMT)
#define KVD_USE_MMA 1
#else
#define KVD_USE_MMA 0
#endif

// Register budget: ptxas left alone caps 256-thread kernels at 64 registers and spills; two
// CTAs per SM (128 registers) hold the accumulators of R * D <= 2048 without spills, larger
// row counts get the full 255 (one CTA per SM; their shared memory allows no more anyway).
// The mma core keeps D / 8 accumulator floats per thread and row tile of 8 query rows: four
// 128-thread CTAs per SM (<= 128 registers) with one row tile, two with two; D = 256 (one
// row tile, 64 floats, like two row tiles at D = 128) two.
// KV_SOFTCAP (kvkit/cuda/decode.py _stage1_for): 1 (the default) builds the soft-cap's tanh
// into the score loops; 0 leaves it out, for decodes without a soft-cap (the launcher never
// runs a 0 build with softcap > 0). The tanh, inlined once per score a thread holds (8 in
// NVFP4's tile-pair loop at D = 128, ~280 instructions), sat in the hot loops' code although
// never run there: Nsight Compute put 21% of NVFP4's stall samples at (64, 8192) on
// instruction fetch (no_inst), with the pair loop spanning 1725 instructions for ~854 run.
#ifndef KV_SOFTCAP
#define KV_SOFTCAP 1
#endif
// The tensor-core core's CTAs per SM: four with one row tile up to head_dim 128, else two.
#define KVD_MMA_MIN_BLOCKS ((KV_GROUP * KV_Q_LEN) <= 8 && KV_HEAD_DIM <= 128 ? 4 : 2)
#if defined(KVKIT_DECODE_MIN_BLOCKS)
// The launcher's override (KVKIT_DECODE_MIN_BLOCKS, kvkit/cuda/decode.py; A/B runs).
#define KVD_MIN_BLOCKS KVKIT_DECODE_MIN_BLOCKS
#elif KVD_USE_MMA && defined(KV_PAIRS_MIN_BLOCKS)
// A family's CTAs per SM for launches that run its tile pairs (KVD_TILE_PAIRS below; this
// macro is read in C++ expressions only, after it): TurboQuant's codebook presets at 5-8 rows,
// head_dim 128 (decode_turboquant.cu KVKIT_DECODE_TQ_PAIRS8). Other launches of the build
// (targets without pairs) keep the core's count.
#define KVD_MIN_BLOCKS (KVD_TILE_PAIRS ? KV_PAIRS_MIN_BLOCKS : KVD_MMA_MIN_BLOCKS)
#elif KVD_USE_MMA
#define KVD_MIN_BLOCKS KVD_MMA_MIN_BLOCKS
#else
#define KVD_MIN_BLOCKS ((KV_GROUP * KV_Q_LEN * KV_HEAD_DIM) <= 2048 ? 2 : 1)
#endif

// Where stage 1 lets a programmatically launched stage 2 be scheduled (kv_grid_dep_trigger):
// 0 at the start of every CTA, 1 at the start of its last tile (default; the launcher's
// KVKIT_DECODE_PDL_TRIGGER, kvkit/cuda/decode.py, for A/B runs). CTAs without tiles trigger
// by exiting.
#ifndef KVD_PDL_TRIGGER
#define KVD_PDL_TRIGGER 1
#endif

// Bulk copies (the copy engine, sm_90+) for fast launches of families that ask for them
// (KV_BULK_COPIES): one copy per staged row (row planes) or per page run (slab planes). The
// copy instruction takes uniform operands, so per-thread copies become an elected-lane loop
// of ~7 warp instructions per copy: cheap for slab runs (a few per tile), dear for row
// planes (one per token row) in the issue-bound kernels, so fp16 / bf16 (latency-bound)
// ask for it and the others keep the 16-byte cp.async pieces.
#ifndef KV_BULK_COPIES
#define KV_BULK_COPIES 0
#endif
// KV_BULK_WARP_SLABS (a family's choice, with KV_BULK_COPIES): fast launches whose planes are
// all token-contiguous slabs and whose pages hold whole 16-token runs copy every plane per
// warp as slabs of its 16 tokens (KvTilePipe::issue_bulk_slabs: a handful of copies per warp
// and tile from warp-uniform addresses), into the staging layout the family sets by
// KV_Pi_SROW / KV_Pi_SGAP below. It needs the tensor-core core's tiles (one warp per 16
// tokens); the CUDA-core core of such a family keeps the cp.async copies.
#ifndef KV_BULK_WARP_SLABS
#define KV_BULK_WARP_SLABS 0
#endif
// KV_BULK_SIMT_RUNS (with KV_BULK_WARP_SLABS): the family's CUDA-core launches keep bulk
// copies per page run instead of falling back to cp.async.
#ifndef KV_BULK_SIMT_RUNS
#define KV_BULK_SIMT_RUNS 0
#endif
#define KVD_BULK \
    (KVKIT_BULK_COPY && KV_BULK_COPIES && (!KV_BULK_WARP_SLABS || KVD_USE_MMA || KV_BULK_SIMT_RUNS))
#define KVD_BULK_WARP_SLABS (KVD_BULK && KV_BULK_WARP_SLABS && KVD_USE_MMA)
// Warp-independent tile pipelines for warp-slab launches (KVKIT_DECODE_WARP_PIPE=1, env
// KVKIT_DECODE_WARP_PIPE, kvkit/cuda/decode.py; A/B builds). A slab warp copies, waits on and
// reads only its own 16 tokens of every tile (its slab of each plane), so the only data the
// warps of the tile loop shared were the page ring (filled by threads < TILE for all) and the
// stage barriers (one arrival per warp). Here each warp has STAGES barriers of its own (one
// arrival: its elected lane's arrive.expect_tx), reads one block-table entry per tile for its
// 16 tokens (one page) into registers, 32 tiles at a time (KvTilePipe::warp_page; no ring),
// and the tile loop's CTA barrier becomes __syncwarp (KvTilePipe::tile_sync): warps drift
// apart (one copies while another waits or computes) and meet only at the end of the split.
// Launches that are not slabs (pages of < 16 tokens, strided planes) keep the CTA barrier,
// the shared barriers and the ring. On by default: measured on the H200 (session 13, call 1;
// graph ms, CTA barrier -> warp pipes) NVFP4 (64, 8192) 0.2435 -> 0.2274, (1, 131072) 0.0698
// -> 0.0658, (8, 8192) 0.0394 -> 0.0381, (1, 32768) 0.0244 -> 0.0236; =0 keeps the CTA barrier.
#if defined(KVKIT_DECODE_WARP_PIPE)
#define KVD_WARP_PIPE_ON KVKIT_DECODE_WARP_PIPE
#else
#define KVD_WARP_PIPE_ON 1
#endif
#define KVD_WARP_PIPE (KVD_BULK_WARP_SLABS && KVD_WARP_PIPE_ON)
// Warp-local tile loop of the cp.async path (KVKIT_DECODE_CP_ASYNC_V2=0 .. 4, env
// KVKIT_DECODE_CP_ASYNC_V2, kvkit/cuda/decode.py; A/B builds; default below): the targets
// without bulk copies (KVKIT_BULK_COPY 0: sm_80 / sm_86 / sm_89, and the compute_80 PTX the driver
// JITs for newer GPUs under KVKIT_ARCH=sm_80) keep the single-tile loop with a CTA barrier
// per tile, the loop the warp pipes above took off the bulk builds. In the tensor-core core
// the cp.async copies of a fast launch with pages of >= 16 tokens are already the warp's
// own: row planes by thread (row_t = tid / TPT, TPT = 2: warp w's rows 16 w .. 16 w + 15, row
// runs too), slab planes by warp sub-runs (16 w ..), and the core reads only its warp's 16
// tokens of the stage and of the page ring (tw0 = 16 w; kv_v_operand_tile's V tile is per
// warp). Only the ring was shared: threads < TILE (warps 0 and 1) filled all 64 entries.
// Here warp w's lanes 0..15 fill its own 16 (KVD_RING_T / KVD_RING_FILL: the same entries
// loaded, checked and flagged, by other threads), so such launches need no CTA barrier per
// tile: cp.async.wait_group is per thread, and __syncwarp orders the warp's lanes' copies,
// ring stores and stage reads as the CTA barrier did for the CTA (KvTilePipe::tile_sync;
// `local`). The same copies of the same bytes and the same float operations: the same bits.
// Other launches (strided or unaligned planes, pages of < 16 tokens) keep the CTA barrier.
// Not on bulk-copy targets (sm_90+ PTX is the build without it).
// Default 2, the page windows below (same bits). Session 17, H200 through KVKIT_ARCH=sm_80,
// graph ms 0 -> 2: NVFP4 D = 64 (32, 4096) 0.0576 -> 0.0564, (64, 8192) 0.2806 -> 0.2524,
// (1, 131072) 0.0783 -> 0.0720; 4bit_nc (64, 8192) 0.3238 -> 0.3015, D = 64 0.0651 -> 0.0625;
// k8v4 (64, 8192) 0.2795 -> 0.2618; 1 (the page ring per warp) was slower than 0. A family may
// set its own (KV_CP_ASYNC_V2_DEFAULT before this file: fp8 keeps 0, NVFP4 takes 3).
// KV_CP_ON_BULK (a family's choice; NVFP4's from KVKIT_DECODE_CP_ON_BULK, decode_nvfp4.cu): the
// warp-local cp.async loop below (and its page windows and pairs) also on bulk-copy targets,
// for builds that copy no tile by the copy engine there (KVD_BULK 0: NVFP4 at head_dim 256,
// which ran the CTA-barrier loop on sm_90); else (0) as before.
#if defined(KV_CP_ON_BULK) && KV_CP_ON_BULK
#define KVD_CP_ON_BULK (!KVD_BULK)
#else
#define KVD_CP_ON_BULK 0
#endif
#if defined(KVKIT_DECODE_CP_ASYNC_V2)
#define KVD_CP_WARP_PIPE_ON KVKIT_DECODE_CP_ASYNC_V2
#elif defined(KV_CP_ASYNC_V2_DEFAULT)
#define KVD_CP_WARP_PIPE_ON KV_CP_ASYNC_V2_DEFAULT
#else
#define KVD_CP_WARP_PIPE_ON 2
#endif
// 2 reads pages through the V_REGS core's page masks only (decode_mma.cuh); other cores (NVFP4
// at head_dim 96, fp16 / bf16) keep the CTA barrier build (0), which measured faster than 1.
// (KVD_V_REGS: fixed here, as a family defines KV_MMA_V_REGS before this file or never; the
// macro also reaches C++ expressions, KVD_LOOP_FLAGS, where an undefined name does not compile.)
#if defined(KV_MMA_V_REGS) && KV_MMA_V_REGS
#define KVD_V_REGS 1
#else
#define KVD_V_REGS 0
#endif
#define KVD_CP_WARP_PIPE                                                                       \
    (KVD_CP_WARP_PIPE_ON && (!KVKIT_BULK_COPY || KVD_CP_ON_BULK) && KVD_USE_MMA &&             \
     (KVD_CP_WARP_PIPE_ON == 1 || KVD_V_REGS))
// KVKIT_DECODE_CP_ASYNC_V2=2: that, and no page ring in `slabs` launches (local, pages of a
// power of two >= 16 tokens: warp w's 16 tokens of a tile lie in one page): the warp pipes'
// page windows (window_entry / warp_page / pg_bits below) on the cp.async path, one checked
// block-table entry per warp and tile in registers where 16 lanes filled ring entries.
// =3: that, and the tile-pair loop (decode_mma_pairs.cuh, KVD_TILE_PAIRS below) on those
// page windows: the warp pipes' pair loop with cp.async issue and group waits. =4: =3 with
// six stages instead of four at head_dim 64 (kvd::STAGES below), the same bits as =3.
#define KVD_CP_RINGLESS (KVD_CP_WARP_PIPE && KVD_CP_WARP_PIPE_ON >= 2)
// The page windows: the warp pipes' (bulk) or the cp.async path's (KVD_CP_RINGLESS).
#define KVD_PAGE_WIN (KVD_WARP_PIPE || KVD_CP_RINGLESS)
// The page ring's filling threads and each one's tile token (see KVD_CP_WARP_PIPE).
#if KVD_CP_WARP_PIPE
#define KVD_RING_FILL ((threadIdx.x & 31u) < 16u)
#define KVD_RING_T ((int)(16u * (threadIdx.x / 32u) + (threadIdx.x & 15u)))
#else
#define KVD_RING_FILL (threadIdx.x < kvd::TILE)
#define KVD_RING_T threadIdx.x
#endif
// Tile pairs (default 1; KVKIT_DECODE_TILE_PAIRS=0 / 1, kvkit/cuda/decode.py, for A/B builds):
// the warp pipes' tile loop (decode_mma.cuh) takes tiles i, i + 1 per iteration in
// slab launches: one online-softmax update and one fresh-accumulator add per m-tile for the
// warp's 32 tokens instead of two of each, and one loop / PDL / wait bookkeeping per pair.
// The stage-1 kernels are issue-bound (~0.7 warp instructions per scheduler cycle on the H200):
// per 16-token warp-tile ~125 instructions are bookkeeping and ~73 softmax, which a pair
// shares. Only where the registers allow it: one row tile (G * q_len <= 8; the 128-register
// cap of four CTAs per SM) and head_dim <= 128 (two tiles' raw key and value words beside the
// D / 2 accumulator floats). Launches that are not slabs keep the single-tile loop.
// Not on sm_120 (KVKIT_ARCH >= 1200): its ~100 KB of shared memory per SM holds two CTAs of
// four stages (47-55 KB) where it holds three of the single-tile build's (26-48 KB), and its
// ptxas spilled 12-200 bytes at 128 registers with pairs (sm_90 and sm_100a: none).
// Measured on the H200 (session 14, call 3; graph ms, 0 -> 1, two runs each; Hq 32, Hkv 8):
// NVFP4 (64, 8192) 0.2322 / 0.2317 -> 0.2149 / 0.2237, (1, 131072) 0.0650 / 0.0658 -> 0.0625 /
// 0.0625, (32, 4096) -4%, (8, 8192) -0.5%, D = 64 (32, 4096) 0.0523 -> 0.0442, but (1, 32768)
// 0.0227 -> 0.0235 (+3.5%); TurboQuant 4bit / 3bit / k3v4 -7 to -11% at every shape ((64,
// 8192) 4bit 0.2925 / 0.3003 -> 0.2596 / 0.2705).
// KV_TILE_PAIRS_ROWS (a family's choice, default 8): the most query rows (G * q_len) with
// pairs, where four stages keep a CTA within a quarter of an SM's shared memory (four CTAs per
// SM; decode_mma.cuh checks it).
#if defined(KVKIT_DECODE_TILE_PAIRS)
#define KVD_TILE_PAIRS_ON KVKIT_DECODE_TILE_PAIRS
#else
#define KVD_TILE_PAIRS_ON 1
#endif
#ifndef KV_TILE_PAIRS_ROWS
#define KV_TILE_PAIRS_ROWS 8
#endif
// -DKVKIT_DECODE_PAIRS16 (kvkit/cuda/decode.py; A/B runs; default 1 where a family opts in,
// KV_PAIRS16_OK: NVFP4 and TurboQuant's codebook presets): 1 takes the warp pipes' tile pairs
// up to 16 query rows (two row tiles, at the two CTAs per SM of their single tiles: the
// 255-register cap; 238-254 registers on sm_90 / sm_100a at head_dim 128, 153-200 at 64, no
// spills) in the launches of a family whose pairs reach 8 rows; 0 up to 8 (the build before).
// Measured on the H200 (session 23, call 5; graph ms at G = 16 (Hq 128, Hkv 8), 0 -> 1, two
// runs each): (32, 4096) NVFP4 0.0952 / 0.0953 -> 0.0728 / 0.0727, 4bit_nc 0.1370 / 0.1370 ->
// 0.1038 / 0.1034, 3bit_nc and k3v4_nc -23 to -25%; (8, 8192) -17 to -22%; (64, 8192) -19 to
// -25%; (1, 32768) -13 to -18%; head_dim 64 (32, 4096) NVFP4 -15%, TurboQuant -29 to -31%.
#ifndef KV_PAIRS16_OK
#define KV_PAIRS16_OK 0
#endif
#if defined(KVKIT_DECODE_PAIRS16)
#define KVD_PAIRS16_ON KVKIT_DECODE_PAIRS16
#else
#define KVD_PAIRS16_ON KV_PAIRS16_OK
#endif
#if KVD_PAIRS16_ON && KV_TILE_PAIRS_ROWS == 8
#define KVD_PIPE_PAIRS_ROWS 16
#else
#define KVD_PIPE_PAIRS_ROWS KV_TILE_PAIRS_ROWS
#endif
// KV_TILE_PAIRS_MAX_D (a family's choice, default 128): the largest head_dim with pairs. At
// D = 256 (one row tile, two CTAs per SM at <= 255 registers) four stages fit in shared memory
// beside the rest; decode_mma.cuh checks that KVD_MIN_BLOCKS CTAs still fit an SM.
#ifndef KV_TILE_PAIRS_MAX_D
#define KV_TILE_PAIRS_MAX_D 128
#endif
// The cp.async path's pair loop (KVKIT_DECODE_CP_ASYNC_V2=3, NVFP4's default there,
// decode_nvfp4.cu; the sm_90 pair loop had taken NVFP4 D = 64 from 0.0523 to 0.0442 ms): the
// page windows of =2 (a warp's 16 tokens per tile in one page
// entry, pg_bits per issue) are all the pair loop reads of the warp pipes besides their
// barriers, which cp.async's per-thread group waits replace (decode_mma_pairs.cuh). It
// follows KVKIT_DECODE_TILE_PAIRS too, so the launcher's short-split rule
// (kvkit/cuda/split_builds.py) and =0 A/B runs reach it.
// (NVFP4's alone, KV_CP_PAIRS_OK: its lane offsets are the ones written for the cp.async
// layout's padded rows; other families build 3 and 4 as 2.)
#ifndef KV_CP_PAIRS_OK
#define KV_CP_PAIRS_OK 0
#endif
#define KVD_CP_PAIRS_ON (KVD_CP_RINGLESS && KVD_CP_WARP_PIPE_ON >= 3 && KV_CP_PAIRS_OK)
// Its staging rows are padded (NVFP4 D = 128: 80-byte code rows and 16-byte scale rows,
// 12,288 bytes a stage where the bulk layout takes 10,528), so at D > 64 four stages leave
// four CTAs per SM (the 128-register cap's; decode_mma.cuh checks 228 KB / 4) only up to 4
// query rows (54,896 bytes a CTA at 4 x 1): at 8 rows the fp32 / bf16 queries' lo parts
// pushed it over and the assert failed. Up to 8 at D = 64 (38,768 bytes at 8 x 1, fp32), and
// up to KV_CP_PAIRS8_MAX_D (a family's choice, default 64; NVFP4's 96 under
// KVKIT_DECODE_NV96_PAIRS8, decode_nvfp4.cu).
#ifndef KV_CP_PAIRS8_MAX_D
#define KV_CP_PAIRS8_MAX_D 64
#endif
#define KVD_CP_PAIRS_ROWS \
    (KV_HEAD_DIM > KV_CP_PAIRS8_MAX_D && KV_TILE_PAIRS_ROWS > 4 ? 4 : KV_TILE_PAIRS_ROWS)
#define KVD_TILE_PAIRS                                                                      \
    (((KVD_WARP_PIPE && KV_GROUP * KV_Q_LEN <= KVD_PIPE_PAIRS_ROWS) ||                       \
      (KVD_CP_PAIRS_ON && KV_GROUP * KV_Q_LEN <= KVD_CP_PAIRS_ROWS)) &&                       \
     KVD_TILE_PAIRS_ON && KV_HEAD_DIM <= KV_TILE_PAIRS_MAX_D && KVKIT_ARCH < 1200)
// The pair loop on the cp.async path (no bulk copies: group waits, padded staging rows).
#define KVD_CP_PAIRS (KVD_TILE_PAIRS && !KVD_WARP_PIPE)
// Tile pairs' lane offsets (default 1; KVKIT_DECODE_PAIR_ADDR=0 / 1, kvkit/cuda/decode.py,
// for A/B builds; 0 is the build before): the pair loop (decode_mma_pairs.cuh) reads its key
// and value rows at per-lane byte offsets worked out once before the loop (opaque, so held
// in registers, not rebuilt from the lane index every pair), the lane terms the family's
// hooks would add (kv_mma_klane / kv_mma_vlane) folded in and the hooks called with c = g = 0.
// The static walk (scripts/sass_path.py, sm_90, NVFP4, D = 128, G = 4) spent ~110 warp
// instructions per pair on those addresses (the token order kv_mma_tok, the row strides and
// the lane terms, per tile and per token), at the 128-register cap where the compiler did
// not hold them: benchmarks/NOTES.md "n15". The same loads of the same bytes: the same bits.
// Only for families that give the lane terms (KV_MMA_LANE_OFFS: NVFP4 without row gaps; the
// TurboQuant codebook-key presets, whose one slot row holds keys, norm, values, scale, zero).
// Measured on the H200 (session 15, call 2; NVFP4 graph ms, 0 / 0 -> 1 / 1): (64, 8192)
// 0.2157 / 0.2149 -> 0.2084 / 0.2044, (1, 131072) 0.0638 / 0.0631 -> 0.0612 / 0.0614, (8, 8192)
// 0.0378 / 0.0375 -> 0.0366 / 0.0364, D = 64 (32, 4096) 0.0443 / 0.0447 -> 0.0427 / 0.0422.
// The default is the family's (KV_PAIR_ADDR_DEFAULT, 1 unless it says otherwise): TurboQuant's
// lane offsets (decode_turboquant.cu, benchmarks/NOTES.md "pa15") are on but for 3bit_nc at
// head_dim 256, where they measured 1% slower.
#ifndef KV_PAIR_ADDR_DEFAULT
#define KV_PAIR_ADDR_DEFAULT 1
#endif
#if defined(KVKIT_DECODE_PAIR_ADDR)
#define KVD_PAIR_ADDR_ON KVKIT_DECODE_PAIR_ADDR
#else
#define KVD_PAIR_ADDR_ON KV_PAIR_ADDR_DEFAULT
#endif
#if defined(KV_MMA_LANE_OFFS) && KVD_PAIR_ADDR_ON
#define KVD_PAIR_ADDR KVD_TILE_PAIRS
#else
#define KVD_PAIR_ADDR 0
#endif
// NVFP4 pair issue trims (KVKIT_DECODE_NV_ISSUE=0 / 1, kvkit/cuda/decode.py, for A/B builds):
// on top of KVD_PAIR_ADDR, instruction cuts in the pair loop that keep every load, copy and
// float operation (decode_mma_pairs.cuh and KvTilePipe::issue_pair say which): the same bits.
// Pair addresses without one-row slots are NVFP4's alone; TurboQuant's pair loop has its own
// switch (below). Default 1: measured on the H200 (session 16, call 1; graph ms, 0 / 0 -> 1 /
// 1): (64, 8192) 0.2030 / 0.2042 -> 0.1943 / 0.1931, D = 64 (32, 4096) 0.0423 / 0.0420 ->
// 0.0394 / 0.0397; (1, 131072), (8, 8192) and 8-16 tiles per split within run-to-run spread.
// benchmarks/NOTES.md "nv16" has the static counts.
#if defined(KVKIT_DECODE_NV_ISSUE)
#define KVD_NV_ISSUE_ON KVKIT_DECODE_NV_ISSUE
#else
#define KVD_NV_ISSUE_ON 1
#endif
// TurboQuant pair issue trims (KVKIT_DECODE_TQ_ISSUE=0 / 1, kvkit/cuda/decode.py, for A/B
// builds): the same cuts in the codebook presets' pair loop (lane offsets of one-row slots,
// KV_MMA_LANE_SLOT); the same bits. Default 1: measured on the H200 (session 16, call 2; graph
// ms, 0 / 0 -> 1 / 1) 4bit_nc (64, 8192) 0.2477 / 0.2499 -> 0.2402 / 0.2398, (1, 131072) 0.0731
// / 0.0734 -> 0.0720 / 0.0713, D = 64 -4%, D = 256 -2%; 3bit_nc and k3v4_nc -2 to -4%, k3v4 at
// D = 256 -5.5%. benchmarks/NOTES.md "tq16" has the static counts.
#if defined(KVKIT_DECODE_TQ_ISSUE)
#define KVD_TQ_ISSUE_ON KVKIT_DECODE_TQ_ISSUE
#else
#define KVD_TQ_ISSUE_ON 1
#endif
// The pair loop's one condition for either family's trims (decode_mma_pairs.cuh,
// KvTilePipe::issue_pair): each family has its own switch, so that an A/B run of one leaves
// the other's builds as they were.
#if defined(KV_MMA_LANE_SLOT)
#define KVD_PAIR_TRIMS (KVD_PAIR_ADDR && KVD_TQ_ISSUE_ON)
#else
#define KVD_PAIR_TRIMS (KVD_PAIR_ADDR && KVD_NV_ISSUE_ON)
#endif
// Row planes of bulk launches copied per warp (kv_bulk_run) rather than per thread; the
// launcher can turn it off (KVKIT_DECODE_BULK_RUNS=0) to compare.
#ifndef KVD_BULK_WARP_RUNS_ON
#define KVD_BULK_WARP_RUNS_ON 1
#endif
#define KVD_BULK_WARP_RUNS (KVD_BULK && KVD_BULK_WARP_RUNS_ON)
// Row runs (the cp.async path of row planes, kv_issue_plane): the launcher turns them on per
// format (KVKIT_DECODE_ROW_RUNS, kvkit/cuda/decode.py); launches with bulk copies never
// take them, so those builds are the code without them.
#ifndef KVD_ROW_RUNS_ON
#define KVD_ROW_RUNS_ON 0
#endif
// Row runs of rows with an even count of 16-byte chunks that is not a power of two (head_dim
// 96: fp8's 96-byte rows, fp16 / bf16's 192-byte ones where the copy engine does not copy
// them), KVD_ROW_RUNS_EVEN (env KVKIT_DECODE_ROW_RUNS_EVEN=0 / 1, kvkit/cuda/decode.py, for
// A/B runs; default 1): 1 copies them as row runs too (kvd::run_plane), each lane's staging
// offsets worked out per copy (kv_issue_plane); 0 keeps their per-token copies (the build
// before). Measured on the H200 (session 24, call 9; graph ms at D = 96, Hq 32, Hkv 8, 0 -> 1,
// two runs each): fp8 (32, 4096) 0.0799 / 0.0799 -> 0.0629 / 0.0630, (8, 8192) 0.0457 /
// 0.0446 -> 0.0362 / 0.0363, (1, 32768) 0.0266 -> 0.0223 / 0.0224, (64, 8192) 0.2885 / 0.2898
// -> 0.2338 / 0.2256; through KVKIT_ARCH=sm_80 fp8 -12 to -14%, fp16 (32, 4096) 0.1566 ->
// 0.1128, (64, 8192) 0.5858 -> 0.4141.
#ifndef KVD_ROW_RUNS_EVEN
#define KVD_ROW_RUNS_EVEN 1
#endif

// Plane copy modes (kv_plane_mode).
#define KVD_MODE_ROW16 0
#define KVD_MODE_SLAB 1
#define KVD_MODE_SYNC 2
// Host load-width code: bits 0..4 the widest aligned width (16, 8, 4, 2, 1) of base and all
// strides (KVD_VEC_MASK); KVD_SLAB_BIT set when token rows are contiguous (token stride ==
// row width) and base, block and head strides are 16-byte aligned; KVD_OFF32_BIT set when
// the page stride in bytes and every byte offset inside a page (head, token, row byte) are
// below 2^31 (kvkit/cuda/decode.py _plane_args).
#define KVD_VEC_MASK 31
#define KVD_SLAB_BIT 32
#define KVD_OFF32_BIT 64

namespace kvd {

constexpr int D = KV_HEAD_DIM;
constexpr int D4 = D / 4;
// 256 threads = 8 warps: enough loads in flight to stream a page while keeping the
// per-thread accumulator (R * D / 256 floats) in registers for every G * q_len we accept.
// The mma core: 128 threads = 4 warps of 16 tokens per 64-token tile.
constexpr int THREADS = KVD_USE_MMA ? 128 : 256;
constexpr int NW = THREADS / KV_WARP;
// 64 tokens per tile: 4 threads per token in the score phase (every thread busy, 2 shuffle
// steps per dot) and 3 barriers per 64 tokens. D = 512 rows would make a stage of fp16
// staging 133 KB, so tiles of 32 tokens (8 threads per token) there.
constexpr int TILE = D <= 256 ? 64 : 32;
constexpr int KSPLIT = THREADS / TILE;  // threads per token in the score phase
constexpr int TPW = KV_WARP / KSPLIT;   // tokens per warp in the score phase
constexpr int KQ = D4 / KSPLIT;         // key quads per thread
constexpr int G = KV_GROUP;
constexpr int QL = KV_Q_LEN;
constexpr int R = G * QL;
// Score rows per pass over a key: 16 dot accumulators in registers; more rows re-read the
// key (only multi-query verify with G * q_len > 16 does).
constexpr int RS = R < 16 ? R : 16;
constexpr int RW = (R + NW - 1) / NW;  // softmax rows per warp
constexpr int TPL = TILE / KV_WARP;    // softmax tokens per lane
constexpr int NPV = THREADS / D4;      // PV thread slots per column quad
// Row groups of the PV phase: about 4 rows per thread (16 accumulator floats), the rest of
// the slots split the tile's tokens (token groups), so each value quad is dequantized by
// RG threads only (once for R <= 4).
constexpr int RG = ((R + 3) / 4) < NPV ? ((R + 3) / 4) : NPV;
constexpr int TGN = NPV / RG;            // token groups
constexpr int RPT = (R + RG - 1) / RG;   // PV rows per thread
// Per-tile partial sums of p * v in registers (phase (c)) while they fit beside acc.
constexpr bool TWO_LEVEL = RPT <= 8;
// Score / p rows padded by one float: PV threads of one warp may read two rows.
constexpr int PSTR = TILE + 1;

static_assert(D % 16 == 0, "head_dim must be a multiple of 16");
static_assert(D4 <= THREADS, "head_dim too large for one CTA");
static_assert(D4 % KSPLIT == 0, "key quads must split evenly over a token's threads");
static_assert(TILE % KV_WARP == 0 && TPW >= 1, "tile layout");
// The launcher rejects larger G * q_len with a ValueError (kvkit/cuda/decode.py).
static_assert(RW <= 16 && RPT <= 16, "G * q_len too large for the register accumulators");

__host__ __device__ constexpr int a16(int x) { return (x + 15) & ~15; }
// Staging row of a row-mode plane: whole 16-byte units, an odd count of them.
__host__ __device__ constexpr int wpad(int w) {
    return w == 0 ? 0 : (((a16(w) / 16) & 1) ? a16(w) : a16(w) + 16);
}
// A family may set a row plane's staging layout (KV_Pi_SROW: the row stride, a multiple of 16;
// KV_Pi_SGAP: bytes left empty after every 4 rows, a multiple of 16), for the bank pattern of
// its shared-memory reads (decode_nvfp4.cu: unpadded rows for 16-byte key loads, a row's gap
// per 4 value rows for the 8-byte value loads of four tokens); every copy mode then writes
// row t at srow(t) = t * SROW + (t / 4) * SGAP.
#ifndef KV_P0_SROW
#define KV_P0_SROW wpad(KV_P0_BYTES)
#endif
#ifndef KV_P1_SROW
#define KV_P1_SROW wpad(KV_P1_BYTES)
#endif
#ifndef KV_P2_SROW
#define KV_P2_SROW wpad(KV_P2_BYTES)
#endif
#ifndef KV_P3_SROW
#define KV_P3_SROW wpad(KV_P3_BYTES)
#endif
#ifndef KV_P0_SGAP
#define KV_P0_SGAP 0
#endif
#ifndef KV_P1_SGAP
#define KV_P1_SGAP 0
#endif
#ifndef KV_P2_SGAP
#define KV_P2_SGAP 0
#endif
#ifndef KV_P3_SGAP
#define KV_P3_SGAP 0
#endif
constexpr int WP0 = KV_P0_SROW;
constexpr int WP1 = KV_P1_SROW;
constexpr int WP2 = KV_P2_SROW;
constexpr int WP3 = KV_P3_SROW;
constexpr int GP0 = KV_P0_SGAP;
constexpr int GP1 = KV_P1_SGAP;
constexpr int GP2 = KV_P2_SGAP;
constexpr int GP3 = KV_P3_SGAP;
static_assert(WP0 % 16 == 0 && WP1 % 16 == 0 && WP2 % 16 == 0 && WP3 % 16 == 0 &&
                  WP0 >= KV_P0_BYTES && WP1 >= KV_P1_BYTES && WP2 >= KV_P2_BYTES &&
                  WP3 >= KV_P3_BYTES,
              "staging rows: whole 16-byte units, at least a row wide");
static_assert(GP0 % 16 == 0 && GP1 % 16 == 0 && GP2 % 16 == 0 && GP3 % 16 == 0 &&
                  (GP1 == 0 || KV_P1_BYTES % 16 == 0) && (GP3 == 0 || KV_P3_BYTES % 16 == 0) &&
                  (GP0 == 0 || KV_P0_BYTES % 16 == 0) && (GP2 == 0 || KV_P2_BYTES % 16 == 0),
              "row gaps: whole 16-byte units, row planes only (slab planes stay unpadded)");
// Staging offset of row t of a plane with row stride WP and gap GP per 4 rows.
__host__ __device__ constexpr int srow(int wp, int gp, int t) { return t * wp + (t >> 2) * gp; }
// Plane regions of a stage, in plane order.
constexpr int SO1 = srow(WP0, GP0, TILE);
constexpr int SO2 = SO1 + srow(WP1, GP1, TILE);
constexpr int SO3 = SO2 + srow(WP2, GP2, TILE);
constexpr int STAGE_BYTES = SO3 + srow(WP3, GP3, TILE);
// Copy threads per token of a tile. Row mode: thread (t, sub) copies chunks sub, sub + TPT,
// ... of token t's row: one address computation per token and tile, and each pair of
// neighbouring threads fills whole 32-byte sectors.
constexpr int TPT = THREADS / TILE;
// Warp sub-runs of the slab mode (KvIssueAt): one warp per 16 tokens of a tile.
constexpr bool SUB16 = (THREADS / KV_WARP) * 16 == TILE;
// Whether some plane can take the row mode (whole 16-byte units) / the slab mode (other
// widths; kv_plane_mode): the tile's pages for that mode are read only then.
constexpr bool ROW_PLANES = (KV_P0_BYTES > 0 && KV_P0_BYTES % 16 == 0) ||
                            (KV_P1_BYTES > 0 && KV_P1_BYTES % 16 == 0) ||
                            (KV_P2_BYTES > 0 && KV_P2_BYTES % 16 == 0) ||
                            (KV_P3_BYTES > 0 && KV_P3_BYTES % 16 == 0);
constexpr bool SLAB_PLANES = KV_P0_BYTES % 16 != 0 || KV_P1_BYTES % 16 != 0 ||
                             KV_P2_BYTES % 16 != 0 || KV_P3_BYTES % 16 != 0;
// Row runs: a row plane of W bytes whose NCH = W / 16 chunks are a power of two >= 2 (so a
// warp's 16 rows are NCH / 2 rounds of 32 chunks and lane l's chunks l + 32 k sit at the same
// row and chunk offsets from its first one in every round: compile-time steps), or any even
// count under KVD_ROW_RUNS_EVEN (NCH / 2 rounds still; the offsets per copy). Built only for
// the mma core (one warp per 16 tokens) without bulk copies and when some plane qualifies.
__host__ __device__ constexpr bool run_plane(int w) {
    return w > 0 && w % 16 == 0 && (w / 16) % 2 == 0 &&
           (KVD_ROW_RUNS_EVEN || ((w / 16) & (w / 16 - 1)) == 0);
}
// (An enum, not a constexpr bool: NVRTC emits a namespace-scope constexpr variable whose
// initializer calls a function as a PTX global, and the builds without row runs would differ
// from the code before them by that line.)
enum : bool {
    ROW_RUNS = KVD_ROW_RUNS_ON && !KVD_BULK && SUB16 && TPT * 16 == KV_WARP &&
               (run_plane(KV_P0_BYTES) || run_plane(KV_P1_BYTES) || run_plane(KV_P2_BYTES) ||
                run_plane(KV_P3_BYTES)) &&
               // the family's default staging rows (one unit of padding, no gaps: a family
               // layout, decode_nvfp4.cu's warp slabs, keeps the per-token copies)
               (!run_plane(KV_P0_BYTES) || (WP0 == KV_P0_BYTES + 16 && GP0 == 0)) &&
               (!run_plane(KV_P1_BYTES) || (WP1 == KV_P1_BYTES + 16 && GP1 == 0)) &&
               (!run_plane(KV_P2_BYTES) || (WP2 == KV_P2_BYTES + 16 && GP2 == 0)) &&
               (!run_plane(KV_P3_BYTES) || (WP3 == KV_P3_BYTES + 16 && GP3 == 0))
};
// Pipeline depth: as many stages as fit 72 KB (2..4). Two CTAs per SM then keep 35-70 KB of
// copies in flight per SM (Little's law at ~4.8 TB/s / 132 SMs x ~1 us needs ~36 KB) and
// their shared memory still fits an H200 SM (228 KB) for every D <= 128 format.
// The mma core (4 warps, up to four CTAs per SM) keeps a smaller budget: its CTAs are
// bound by instructions and latency, more of them per SM beat deeper pipelines.
#ifdef KVD_STAGE_BUDGET_KB
constexpr int STAGE_BUDGET = KVD_STAGE_BUDGET_KB * 1024;  // launcher override (sweeps)
#else
constexpr int STAGE_BUDGET = KVD_USE_MMA ? 28 * 1024 : 72 * 1024;
#endif
constexpr int STAGES_FIT = STAGE_BUDGET / STAGE_BYTES;
#if KVD_TILE_PAIRS
// Tile pairs: tiles i and i + 1 are both read until the pair's PV ends, so the pair's start
// can refill only the stages of the pair before (tiles i + STAGES - 2, i + STAGES - 1): four
// stages keep one pair in flight while one computes, as three stages keep two single tiles
// (the same bytes in flight), and an even count keeps a pair's two issues in one 32-tile page
// window (KvTilePipe::advance_pages). Four stages of NVFP4 / 4-bit TurboQuant at D = 128 are
// 36-38 KB, ~47 KB per CTA with the rest: four CTAs per SM still fit (228 KB).
#if KVD_CP_PAIRS && KVD_CP_WARP_PIPE_ON == 4 && KV_HEAD_DIM <= 64
// KVKIT_DECODE_CP_ASYNC_V2=4 (A/B): with four stages a cp.async pair waits with no group
// left pending (decode_mma_pairs.cuh), so a copy issued at pair i has one pair's compute (two
// tiles) to land, as in =2's single-tile loop (three stages at D = 64: two tiles); with six
// stages it has two pairs'. Six NVFP4 D = 64 stages (8,192 bytes each: 48-byte code rows,
// 16-byte scale rows) keep a CTA (53,376 bytes at 4 x 1, 55,680 at 8 x 1 with fp32 queries)
// under a quarter of the H200's 228 KB (four CTAs per SM; the A100's 164 KB would hold two);
// not at D = 128 (12,288 bytes a stage: 72 KB of stages).
constexpr int STAGES = 6;
#else
constexpr int STAGES = 4;
#endif
#else
constexpr int STAGES = STAGES_FIT < 2 ? 2 : (STAGES_FIT > 4 ? 4 : STAGES_FIT);
#endif
constexpr int NP = STAGES + 1;  // page-slot ring: tiles i .. i + STAGES
// The page ring, then one 8-byte mbarrier per stage (bulk copies, KVKIT_BULK_COPY); per warp
// and stage with KVD_WARP_PIPE (warp w's at 8 STAGES w).
// (No constexpr variable for the barrier count: NVRTC would emit it as a PTX global, and the
// builds without warp pipes would differ from the code before them by that line.)
constexpr int TP_BYTES = NP * TILE * 4 + 8 * STAGES * (KVD_WARP_PIPE ? NW : 1);
constexpr int RED_BYTES = TGN > 1 ? (TGN - 1) * R * D * 4 : 0;
constexpr int STG_BYTES = STAGES * STAGE_BYTES > RED_BYTES ? STAGES * STAGE_BYTES : RED_BYTES;

constexpr int OFF_Q = 0;
constexpr int OFF_P = OFF_Q + a16(R * D * 4);
constexpr int OFF_A = OFF_P + a16(R * PSTR * 4);
constexpr int OFF_ML = OFF_A + a16(R * 4);
constexpr int OFF_TP = OFF_ML + a16(2 * R * 4);
constexpr int OFF_TAB = OFF_TP + a16(TP_BYTES);
constexpr int OFF_STG = OFF_TAB + a16(KV_FAMILY_TABLE_FLOATS * 4);
constexpr int SMEM = OFF_STG + STG_BYTES;

}  // namespace kvd


// The bits of query element idx (float32 bits, or the 16 bits of fp16 / bf16), and their
// value: the load and the conversion apart, so that several loads can fly before the first
// conversion waits.
__device__ __forceinline__ unsigned kv_load_q_bits(const void* q, long long idx) {
#if KV_IN_DTYPE == 0
    return __float_as_uint(static_cast<const float*>(q)[idx]);
#else
    return static_cast<const unsigned short*>(q)[idx];
#endif
}
__device__ __forceinline__ float kv_q_bits_value(unsigned bits) {
#if KV_IN_DTYPE == 0
    return __uint_as_float(bits);
#elif KV_IN_DTYPE == 1
    return kv_dc_f16(bits);
#elif KV_IN_DTYPE == 2
    return kv_dc_bf16(bits);
#else
#error "KV_IN_DTYPE must be 0 (float32), 1 (float16) or 2 (bfloat16 bits)"
#endif
}

// This thread's query elements idx = threadIdx.x + k THREADS (k < N: row idx / D, dim
// idx % D; rows >= R are padding, 0). The first NQL of the real rows' elements (idx < R D)
// are loaded at once, without branches (a clamped index), before any is used; value(k)
// gives element k (loading the ones past NQL itself). Before, every element went from its
// load to shared memory before the next load issued: one memory round trip per element a
// thread loads (four at G = 4, D = 128), and behind the block-table loads. Now they fly
// with the seq_len and block-table loads (measured at B = 1 on the H200: the stage-1
// prologue was ~7 us of a step). NQL <= 16 bounds the registers (CUDA-core launches with
// up to 128 rows load the rest one by one, as before).
template <int N>
struct KvQPrefetch {
    static constexpr int NREAL = (kvd::R * kvd::D + kvd::THREADS - 1) / kvd::THREADS;
    static_assert(NREAL <= N, "the callers' N covers every real row");
    static constexpr int NQL = NREAL < 16 ? NREAL : 16;
    unsigned bits[NQL];

    static __device__ __forceinline__ long long src(int idx, int b, int kvh, int num_heads) {
        const int r = idx / kvd::D;
        const int d = idx - r * kvd::D;
        const int i = r / kvd::G;
        const int gg = r - i * kvd::G;
        return (((long long)b * kvd::QL + i) * num_heads + (long long)kvh * kvd::G + gg) *
                   kvd::D + d;
    }
    __device__ __forceinline__ void load(const void* q, int b, int kvh, int num_heads) {
#pragma unroll
        for (int k = 0; k < NQL; ++k) {
            const int idx = threadIdx.x + k * kvd::THREADS;
            const int safe = idx < kvd::R * kvd::D ? idx : kvd::R * kvd::D - 1;
            bits[k] = kv_load_q_bits(q, src(safe, b, kvh, num_heads));
        }
    }
    __device__ __forceinline__ float value(int k, const void* q, int b, int kvh,
                                           int num_heads) const {
        const int idx = threadIdx.x + k * kvd::THREADS;
        // (k >= NREAL: idx >= R D for every thread; the unrolled callers' k is a constant.)
        if (k >= NREAL || idx >= kvd::R * kvd::D) return 0.f;
        if (k < NQL) return kv_q_bits_value(bits[k]);
        return kv_q_bits_value(kv_load_q_bits(q, src(idx, b, kvh, num_heads)));
    }
};

__device__ __forceinline__ unsigned kv_smem_addr(const void* p) {
    unsigned r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
    return r;
}

// 16 bytes global -> shared without a register round trip (sm_80+; .cg: L2 only, the bytes
// are read once).
// dst: a shared-window address (kv_smem_addr).
__device__ __forceinline__ void kv_cp_async16(unsigned dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}

// The same, or 16 zero bytes and no read without a page (src-size 0): fast launches copy
// without a branch around each plane's copies, so a tile's copies stay one run of code (ptxas
// puts three no-op instructions before every run of copies that starts a block, and a
// branch costs BSSY / BSYNC / BRA). Callers pass an address inside the plane either way.
// valid: page >= 0, tested inside the asm (one compare; a bool made into 16 or 0 in C++
// costs four instructions).
__device__ __forceinline__ void kv_cp_async16_zfill(unsigned dst, const void* src, int page) {
    asm volatile(
        "{\n\t.reg .pred p;\n\t.reg .u32 n;\n\tsetp.ge.s32 p, %2, 0;\n\t"
        "selp.u32 n, 16, 0, p;\n\tcp.async.cg.shared.global [%0], [%1], 16, n;\n\t}" ::"r"(dst),
        "l"(src), "r"(page)
        : "memory");
}

__device__ __forceinline__ void kv_cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void kv_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#if KVD_BULK
// The copy engine (sm_90+): one instruction moves a whole row or page slab (16-byte aligned
// ends, a multiple of 16 bytes) global -> shared and counts its bytes down on the stage's
// mbarrier; no per-16-byte instructions and no load/store-unit wavefronts (a cp.async of
// 16-byte pieces took 24 wavefronts per instruction in fp16's profile, competing with the
// ldmatrix feeding the mma).
__device__ __forceinline__ void kv_bulk_copy(unsigned dst, const void* src, unsigned bytes,
                                             unsigned bar) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
        "[%3];" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar)
        : "memory");
}
// The same copy once per warp: every lane of a converged warp executes this with the same
// operands and the elected lane issues it. Warp-uniform operands (shuffled from one lane) let
// ptxas keep the addresses in uniform registers and issue UBLKCP straight from them: ~4 warp
// instructions per copy, against the elected-lane loop (ELECT, R2UR per operand, UBLKCP,
// PLOP3, BRA.U.ANY: ~8 per copy, and a stall on the previous copy's operands) that a copy per
// thread with per-thread operands compiles to.
__device__ __forceinline__ void kv_bulk_copy_warp(unsigned dst, const void* src, unsigned bytes,
                                                  unsigned bar) {
    asm volatile(
        "{\n\t.reg .pred p;\n\telect.sync _|p, 0xffffffff;\n\t"
        "@p cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
        "[%3];\n\t}" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar)
        : "memory");
}
__device__ __forceinline__ void kv_mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
// This thread's arrival on the stage's barrier, announcing the bytes its copies will bring.
__device__ __forceinline__ void kv_mbar_arrive_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
                 "r"(bytes)
                 : "memory");
}
// The end of the barrier's life (PTX ISA, mbarrier lifecycle: a barrier must be invalidated
// before its memory is used for anything else, and mbarrier.init on memory that still holds a
// valid barrier is undefined). On sm_90 this is SYNCS.CCTL.IV, an invalidation in the
// synchronization unit that keeps barrier state, i.e. real state that a CTA handing its
// shared memory back to the next CTA or kernel must not leave behind.
// The same arrival once per warp: every lane of a converged warp executes this with the same
// operands and the elected lane arrives (barriers initialised with one arrival per warp).
__device__ __forceinline__ void kv_mbar_arrive_tx_warp(unsigned bar, unsigned bytes) {
    asm volatile(
        "{\n\t.reg .pred p;\n\telect.sync _|p, 0xffffffff;\n\t"
        "@p mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n\t}" ::"r"(bar),
        "r"(bytes)
        : "memory");
}
__device__ __forceinline__ void kv_mbar_inval(unsigned bar) {
    asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void kv_mbar_wait(unsigned bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile(
            "{\n\t.reg .pred p;\n\t"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
            "selp.u32 %0, 1, 0, p;\n\t}"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
#endif

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

// Synchronous fallback: the tile's rows of one plane (W bytes per row) into staging rows of
// WP bytes, C bytes per load. Tokens without a valid page (tp[t] < 0) are not read.
template <int W, int WP, int GP, int C>
__device__ __forceinline__ void kv_copy_rows_sync(unsigned char* stage, const unsigned char* base,
                                                  long long sb, long long sh, long long st,
                                                  int elem, int kvh, const int* tp, int t0,
                                                  int n_tile, int block_size) {
    constexpr int NCH = W / C;
    const long long head_off = (long long)kvh * sh;
#pragma unroll 1
    for (int item = threadIdx.x; item < n_tile * NCH; item += kvd::THREADS) {
        const int t = item / NCH;
        const int ch = item - t * NCH;
        const int page = tp[t];
        if (page < 0) continue;
        const int off = (t0 + t) % block_size;
        const long long o = ((long long)page * sb + head_off + (long long)off * st) * elem;
        kv_copy_chunk<C>(stage + kvd::srow(WP, GP, t) + ch * C, base + o + ch * C);
    }
}

// Copy mode of one plane for this launch (uniform over the grid).
template <int W>
__device__ __forceinline__ int kv_plane_mode(int vec, int block_size) {
    if constexpr (W == 0) {
        return KVD_MODE_SYNC;
    } else {
        if (W % 16 == 0 && (vec & KVD_VEC_MASK) >= 16) return KVD_MODE_ROW16;
        // A width of whole 16-byte units with contiguous 16-byte aligned slabs has 16-byte
        // aligned rows, which the row mode above takes: only other widths reach the slab
        // mode (KvTilePipe::issue reads slab pages only for entries that have such planes).
        if constexpr (W % 16 != 0) {
            const int sc = block_size < kvd::TILE ? block_size : kvd::TILE;
            const bool runs = (kvd::TILE % block_size == 0) || (block_size % kvd::TILE == 0);
            if ((vec & KVD_SLAB_BIT) && runs && ((long long)sc * W) % 16 == 0)
                return KVD_MODE_SLAB;
        }
        return KVD_MODE_SYNC;
    }
}

// Whether a plane leaves a launch on the fast copy path: unused, or copied asynchronously
// (row or slab mode) with offsets the host found to fit 32 bits.
template <int W>
__device__ __forceinline__ bool kv_plane_fast(int mode, int vec) {
    return W == 0 || (mode != KVD_MODE_SYNC && (vec & KVD_OFF32_BIT) != 0);
}

// Whether a plane allows row runs in a fast launch: planes that do not take them (other
// widths) do not matter; those that do need token rows W bytes apart (KVD_SLAB_BIT).
template <int W>
__device__ __forceinline__ bool kv_plane_runs(int vec) {
    return !kvd::run_plane(W) || (vec & KVD_SLAB_BIT) != 0;
}

// This thread's share of one tile's copies, the same for every plane: KvTilePipe::issue
// works it out once per tile (the cp.async asm's memory clobber would make each plane read
// tp again, and per-plane code would redo the thread's offsets).
// Row mode: thread (row_t, sub) copies chunks sub, sub + TPT, ... of token row_t's row.
// Slab mode: runs of sc = min(block_size, TILE) tokens lie in one page (t0 is a multiple of
// sc from a page start) and are sc * W contiguous bytes (a multiple of 16). The tile's
// TILE / sc runs share the threads, slab_tpr = TPT * sc per run (sc is a power of two: the
// slab mode needs TILE % block_size == 0 when block_size < TILE); this thread serves the
// run starting at tile token slab_tok from piece slab_j0. Recomputed per tile rather than
// held: the kernels sit at their register cap.
// Warp sub-runs (kvd::SUB16 cores, fast launches with block_size >= 16): warp w copies the
// 16 tokens 16 w .. 16 w + 15 of the tile, which lie in one page (pages of >= 16 tokens,
// tiles and runs start on multiples of 16 from a page start) and are 16 W contiguous bytes,
// i.e. W pieces: lane l takes pieces l, l + 32, ...; slab_tok = 16 w, slab_j0 = l, and the
// offsets of its pieces are compile-time constants (512 k bytes), where the general mapping's
// stride (slab_tpr pieces) is known only at run time (a 64-bit add per piece).
struct KvIssueAt {
    int row_page;  // page of token row_t, -1 past the tile or without a page
    int row_off;   // row_t's token offset in its page
    int row_t;     // threadIdx.x / TPT
    int row_x;     // 16 * sub: the byte of the thread's first chunk in its row
    int slab_page; // page of the run this thread serves, or -1
    int slab_off;  // offset of the tile's runs in their page
    int slab_tok;  // tile token of the run's start
    int slab_j0;   // the thread's first piece of the run
    int slab_tpr;  // threads per run
    int sc;        // tokens per run
    int run_l;     // row runs: the lane (threadIdx.x % 32)
};

// Address of byte `extra` of the row of (page, head kvh, token offset off) of a plane.
template <bool OFF32>
__device__ __forceinline__ const unsigned char* kv_row_src(const unsigned char* base,
                                                           long long sb, long long sh,
                                                           long long st, int elem, int kvh,
                                                           int page, int off, int extra) {
    if constexpr (OFF32) {
        // The host checked that the page stride in bytes and every byte offset inside a page
        // stay below 2^31 (KVD_OFF32_BIT): in-page math in 32 bits and one 32 x 32 -> 64-bit
        // product for the page instead of 64-bit products of the 64-bit parameters. elem is
        // a compile-time constant, so the byte strides are uniform.
        const unsigned sbB = (unsigned)sb * (unsigned)elem;
        const unsigned in_page = (unsigned)kvh * ((unsigned)sh * (unsigned)elem) +
                                 (unsigned)off * ((unsigned)st * (unsigned)elem) +
                                 (unsigned)extra;
        // The page product gets its own mad.wide with base + in_page as the addend: left to
        // itself the compiler zero-extends in_page into a register pair first (one
        // instruction more per plane and tile, and more registers).
        unsigned long long a;
        asm("mad.wide.u32 %0, %1, %2, %3;"
            : "=l"(a)
            : "r"((unsigned)page), "r"(sbB), "l"(reinterpret_cast<unsigned long long>(base) +
                                                  in_page));
        return reinterpret_cast<const unsigned char*>(a);
    } else {
        return base + ((long long)page * sb + (long long)kvh * sh + (long long)off * st) * elem +
               extra;
    }
}

// Issue (or, in the fallback, perform) the copies of one plane for the tile starting at
// token t0 (n_tile tokens, pages tp[0..n_tile), this thread's share `at`) into stage (whose
// shared-window address is stage_sa). FAST: every plane of the launch copies asynchronously
// with 32-bit offsets (KvTilePipe::fast), so the width alone gives the mode (kv_plane_mode:
// whole 16-byte units take the row mode, other widths the slab mode) and no mode, offset
// width or fallback is decided per plane and tile. RUNS: the calling warp's 16 rows are one
// run (KvTilePipe::issue checked it), copied as row runs where the width allows.
template <int W, int WP, int GP, bool FAST, bool SUB = false, bool RUNS = false>
__device__ __forceinline__ void kv_issue_plane(unsigned char* stage, unsigned stage_sa,
                                               const unsigned char* base, long long sb,
                                               long long sh, long long st, int elem, int vec,
                                               int mode, int kvh, const KvIssueAt& at,
                                               const int* tp, int t0, int n_tile,
                                               int block_size) {
    if constexpr (W > 0) {
        const bool row = FAST ? W % 16 == 0 : mode == KVD_MODE_ROW16;
        const bool slab = FAST ? W % 16 != 0 : mode == KVD_MODE_SLAB;
        if (row) {
            // One address per token and tile (the thread's first chunk; the others are
            // immediate offsets of the copies), and each pair of neighbouring threads fills
            // whole 32-byte sectors.
            constexpr int NCH = W / 16;
            if constexpr (FAST && RUNS && kvd::run_plane(W)) {
                // Row runs: the warp's 16 rows (tile tokens t16 .. t16 + 15, in-page offsets
                // off16 .. off16 + 15 of one page) are 16 W contiguous bytes (token stride W:
                // the launch checked the planes' slab bits), so chunk i of the run is at byte
                // 16 i in the plane and lands in staging row t16 + i / NCH, chunk i % NCH.
                // Lane l copies i = l + 32 k (k < NCH / 2): each copy instruction moves 512
                // contiguous bytes (whole rows, 4 whole 128-byte lines), where the per-token
                // mapping below touches 16 rows of 32 bytes. Same count of copies per thread,
                // one address each for source and staging, compile-time steps. The run is
                // whole or empty (KvTilePipe::issue sends partial runs to the per-token
                // mapping), so the lane's own row's page is the run's page: zeros from page
                // 0's rows without one, as below.
                constexpr int RPI = NCH <= KV_WARP ? KV_WARP / NCH : 1;  // rows per round
                constexpr int CPR = NCH <= KV_WARP ? 1 : NCH / KV_WARP;  // rounds per row
                // The source address points BIAS bytes into the run when the last copy's
                // offset would pass the copy instruction's immediate range (LDGSTS: signed,
                // below 2 KB; a second 64-bit address costs two adds per plane).
                constexpr int LAST = (NCH / 2 - 1) * KV_WARP * 16;
                constexpr int BIAS = LAST > 2047 ? 2048 : 0;
                const bool v = at.row_page >= 0;
                // The run's first row: row_off and row_t agree modulo 16 (tiles start 16-token
                // aligned in pages of a multiple of 16 tokens), and the run starts at a
                // multiple of 16 in both. Lane l's chunk: byte 16 l of the run; in staging
                // row l / NCH, chunk l % NCH, i.e. byte 16 l + 16 (l / NCH) of the run's rows
                // (WP = W + 16: NCH is even, so the padded row is one unit longer).
                static_assert(WP == W + 16 && GP == 0, "row runs: staging rows one unit longer, no gaps");
                const unsigned l16 = 16u * (unsigned)at.run_l;
                const unsigned src_x = ((unsigned)at.row_off & ~15u) * W + l16 + BIAS;
                const unsigned char* src = kv_row_src<true>(base, sb, sh, 0, elem, kvh,
                                                            v ? at.row_page : 0, 0, (int)src_x);
                if constexpr ((NCH & (NCH - 1)) == 0) {
                    const unsigned dst = stage_sa + ((unsigned)at.row_t & ~15u) * WP + l16 +
                                         (NCH <= KV_WARP ? (l16 / NCH) & ~15u : 0u);
#pragma unroll
                    for (int k = 0; k < NCH / 2; ++k)
                        kv_cp_async16_zfill(dst + (k / CPR) * RPI * WP + (k % CPR) * KV_WARP * 16,
                                            src + k * KV_WARP * 16 - BIAS, at.row_page);
                } else {
                    // (KVD_ROW_RUNS_EVEN) Chunk i = l + 32 k of the run lands in staging row
                    // i / NCH, chunk i % NCH: byte 16 (i + i / NCH) of the run's rows (WP =
                    // W + 16), a lane-dependent step per k (NCH does not divide 32).
                    const unsigned dst = stage_sa + ((unsigned)at.row_t & ~15u) * WP;
#pragma unroll
                    for (int k = 0; k < NCH / 2; ++k) {
                        const unsigned i = (unsigned)at.run_l + 32u * (unsigned)k;
                        kv_cp_async16_zfill(dst + 16u * (i + i / NCH),
                                            src + k * KV_WARP * 16 - BIAS, at.row_page);
                    }
                }
            } else if constexpr (FAST && NCH % kvd::TPT == 0) {
                // Rows without a page (or past the tile) get zeros from page 0's row instead
                // of no copy (never read unmasked).
                const bool v = at.row_page >= 0;
                const unsigned char* src = kv_row_src<true>(base, sb, sh, st, elem, kvh,
                                                            v ? at.row_page : 0, at.row_off,
                                                            at.row_x);
                const unsigned dst = stage_sa + kvd::srow(WP, GP, at.row_t) + at.row_x;
#pragma unroll
                for (int k = 0; k < NCH / kvd::TPT; ++k)
                    kv_cp_async16_zfill(dst + k * kvd::TPT * 16, src + k * kvd::TPT * 16,
                                        at.row_page);
            } else if (at.row_page >= 0) {
                const unsigned char* src = kv_row_src<FAST>(base, sb, sh, st, elem, kvh,
                                                            at.row_page, at.row_off, at.row_x);
                const unsigned dst = stage_sa + kvd::srow(WP, GP, at.row_t) + at.row_x;
#pragma unroll
                for (int k = 0; k < (NCH + kvd::TPT - 1) / kvd::TPT; ++k) {
                    if (NCH % kvd::TPT == 0 || at.row_x / 16 + k * kvd::TPT < NCH)
                        kv_cp_async16(dst + k * kvd::TPT * 16, src + k * kvd::TPT * 16);
                }
            }
        } else if (slab && SUB) {
            // Warp sub-runs (fast launches, block_size >= 16): lane l's pieces l + 32 k of the
            // warp's W pieces, at constant offsets from one address.
            // Whole rounds of 32 pieces as the row mode above (zeros without a page); the
            // last, partial round only on its lanes (a zero fill past the sub-run would land
            // in the next warp's).
            static_assert(!SUB || (FAST && kvd::SUB16), "sub-runs need fast launches");
            const bool v = at.slab_page >= 0;
            const unsigned char* src = kv_row_src<true>(base, sb, sh, st, elem, kvh,
                                                        v ? at.slab_page : 0, at.slab_off,
                                                        at.slab_j0 * 16);
            const unsigned dst = stage_sa + at.slab_tok * W + at.slab_j0 * 16;
#pragma unroll
            for (int k = 0; k < W / KV_WARP; ++k)
                kv_cp_async16_zfill(dst + k * KV_WARP * 16, src + k * KV_WARP * 16,
                                    at.slab_page);
            if constexpr (W % KV_WARP != 0) {
                constexpr int K = W / KV_WARP;
                if (v && at.slab_j0 < W % KV_WARP)
                    kv_cp_async16(dst + K * KV_WARP * 16, src + K * KV_WARP * 16);
            }
        } else if (slab) {
            // One page lookup and one address per thread and tile, then 16-byte pieces at a
            // fixed stride.
            const int pieces = at.sc * W / 16;
            if (at.slab_page >= 0) {
                const unsigned char* src =
                    kv_row_src<FAST>(base, sb, sh, st, elem, kvh, at.slab_page, at.slab_off,
                                     at.slab_j0 * 16);
                const unsigned dst = stage_sa + at.slab_tok * W + at.slab_j0 * 16;
                // pieces / tpr = TILE * W / (16 * THREADS) whatever sc is: a trip count known
                // at compile time (a runtime one costs a division to unroll).
                constexpr int NPC = kvd::TILE * W / 16;
                static_assert((kvd::TILE * W) % 16 == 0, "whole pieces per tile");
#pragma unroll
                for (int k = 0; k < (NPC + kvd::THREADS - 1) / kvd::THREADS; ++k) {
                    if (NPC % kvd::THREADS == 0 || at.slab_j0 + k * at.slab_tpr < pieces)
                        kv_cp_async16(dst + k * at.slab_tpr * 16, src + k * at.slab_tpr * 16);
                }
            }
        } else if constexpr (!FAST) {
            const int v = vec & KVD_VEC_MASK;
            if constexpr (W % 16 == 0) {
                if (v >= 16) {
                    kv_copy_rows_sync<W, WP, GP, 16>(stage, base, sb, sh, st, elem, kvh, tp, t0,
                                                 n_tile, block_size);
                    return;
                }
            }
            if constexpr (W % 8 == 0) {
                if (v >= 8) {
                    kv_copy_rows_sync<W, WP, GP, 8>(stage, base, sb, sh, st, elem, kvh, tp, t0,
                                                n_tile, block_size);
                    return;
                }
            }
            if constexpr (W % 4 == 0) {
                if (v >= 4) {
                    kv_copy_rows_sync<W, WP, GP, 4>(stage, base, sb, sh, st, elem, kvh, tp, t0,
                                                n_tile, block_size);
                    return;
                }
            }
            if constexpr (W % 2 == 0) {
                if (v >= 2) {
                    kv_copy_rows_sync<W, WP, GP, 2>(stage, base, sb, sh, st, elem, kvh, tp, t0,
                                                n_tile, block_size);
                    return;
                }
            }
            kv_copy_rows_sync<W, WP, GP, 1>(stage, base, sb, sh, st, elem, kvh, tp, t0, n_tile,
                                        block_size);
        }
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

#if KVD_BULK
// Widths of a fast launch's row planes (whole 16-byte units) and slab planes (the others).
__host__ __device__ constexpr int kv_row_w(int w) { return w > 0 && w % 16 == 0 ? w : 0; }
__host__ __device__ constexpr int kv_slab_w(int w) { return w % 16 != 0 ? w : 0; }
// One plane's bulk copy of this thread (fast launches: the width gives the mode): its token's
// row (row_mine) into the padded staging row, or its run of sc tokens (slab_mine) into
// unpadded rows. Both ends are 16-byte aligned and the sizes multiples of 16 (the row and
// slab modes' conditions).
template <int W, int WP, int GP>
__device__ __forceinline__ void kv_bulk_plane(unsigned sa, const unsigned char* base,
                                              long long sb, long long sh, long long st,
                                              int elem, int kvh, const KvIssueAt& at,
                                              bool row_mine, bool slab_mine, unsigned bar) {
    if constexpr (W > 0 && W % 16 == 0) {
        if (row_mine)
            kv_bulk_copy(sa + kvd::srow(WP, GP, at.row_t),
                         kv_row_src<true>(base, sb, sh, st, elem, kvh, at.row_page, at.row_off, 0),
                         W, bar);
    } else if constexpr (W > 0) {
        if (slab_mine)
            kv_bulk_copy(sa + at.slab_tok * W,
                         kv_row_src<true>(base, sb, sh, st, elem, kvh, at.slab_page, at.slab_off,
                                          0),
                         at.sc * W, bar);
    }
}
#endif

#if KVD_BULK_WARP_RUNS
// Rows t16 .. t16 + cnt - 1 of a row plane (cnt <= 16, one page: in-page offsets off ..
// off + cnt - 1) by the calling warp: row r from the page's row off + r (the token stride
// apart) into staging row t16 + r (the padded stride WP apart). Every argument is
// warp-uniform; whole runs (cnt 16) are unrolled.
template <int W, int WP, int GP>
__device__ __forceinline__ void kv_bulk_run(unsigned sa, const unsigned char* base, long long sb,
                                            long long sh, long long st, int elem, int kvh,
                                            int page, int off, int t16, int cnt, unsigned bar) {
    if constexpr (W > 0 && W % 16 == 0) {
        const unsigned char* src = kv_row_src<true>(base, sb, sh, st, elem, kvh, page, off, 0);
        // t16 is a multiple of 4, so a gap follows every 4th row of the run.
        unsigned dst = sa + (unsigned)kvd::srow(WP, GP, t16);
        // The host's 32-bit offset check (KVD_OFF32_BIT) covers every in-page byte offset.
        const unsigned stB = (unsigned)st * (unsigned)elem;
        // Addresses stepped row by row (an add each) rather than r * stride per copy.
        if (cnt == 16) {
#pragma unroll
            for (int r = 0; r < 16; ++r) {
                kv_bulk_copy_warp(dst, src, W, bar);
                dst += WP + ((r & 3) == 3 ? GP : 0);
                src += stB;
            }
        } else {
#pragma unroll 1
            for (int r = 0; r < cnt; ++r) {
                kv_bulk_copy_warp(dst, src, W, bar);
                dst += WP + ((r & 3) == 3 ? GP : 0);
                src += stB;
            }
        }
    }
}
#endif

#if KVD_BULK_WARP_SLABS
// The calling warp's 16 tokens of one plane (t16 .. t16 + 15 of the tile, one page: in-page
// tokens off .. off + 15, 16 W contiguous bytes) by the copy engine: one copy into unpadded
// staging rows, or one per 4 rows where the family leaves a gap after every 4 rows (GP).
// Every argument is warp-uniform, so the copies issue from uniform registers
// (kv_bulk_copy_warp). Sizes and ends are multiples of 16: the slab bit's 16-byte aligned
// (page, head) slabs, off a multiple of 16, W % 4 == 0 where GP > 0 (row planes: W % 16 == 0).
// Page 0's address of the (head kvh, in-page token off) slab of a plane (KvTilePipe::sbase).
template <int W>
__device__ __forceinline__ unsigned long long kv_slab_base(const unsigned char* base, long long sh,
                                                           long long st, int elem, int kvh,
                                                           int off) {
    if constexpr (W == 0) {
        return 0ull;
    } else {
        return reinterpret_cast<unsigned long long>(kv_row_src<true>(base, 0, sh, st, elem, kvh,
                                                                     0, off, 0));
    }
}
template <bool OFFV, int W, int WP, int GP>
__device__ __forceinline__ void kv_bulk_slab(unsigned sa, unsigned long long sbase, long long sb,
                                             long long st, int elem, int page, int offv,
                                             int t16, unsigned bar) {
    if constexpr (W > 0) {
        // Slab planes (W % 16 != 0) are staged unpadded in fast launches (rs = W); row planes
        // must be unpadded rows here (KV_Pi_SROW = width).
        static_assert(W % 16 != 0 || WP == W, "warp slabs need unpadded staging rows");
        // The page's product by its own mad.wide with sbase (+ the tile's offset in pages
        // larger than a tile) as the addend (kv_row_src: offsets fit 32 bits).
        unsigned long long a;
        asm("mad.wide.u32 %0, %1, %2, %3;"
            : "=l"(a)
            : "r"((unsigned)page), "r"((unsigned)sb * (unsigned)elem),
              "l"(OFFV ? sbase + (unsigned)offv * ((unsigned)st * (unsigned)elem) : sbase));
        const unsigned char* src = reinterpret_cast<const unsigned char*>(a);
        const unsigned dst = sa + (unsigned)kvd::srow(W, GP, t16);
        if constexpr (GP == 0) {
            kv_bulk_copy_warp(dst, src, 16 * W, bar);
        } else {
#pragma unroll
            for (int k = 0; k < 4; ++k)
                kv_bulk_copy_warp(dst + k * (4 * W + GP), src + 4 * k * W, 4 * W, bar);
        }
    }
}
// Whether a plane allows warp slabs: unused, or token-contiguous with 16-byte aligned slabs.
template <int W>
__device__ __forceinline__ bool kv_plane_slabs(int vec) {
    return W == 0 || (vec & KVD_SLAB_BIT) != 0;
}
#endif

// The tile pipeline of one stage-1 CTA, shared by both bodies: the split's token range
// [t_lo, t_hi) (kvkit.splits.page_range, the window start rounded down to its page), the
// planes' copy modes and staging row strides, the page ring (tp_ring: NP slots of TILE page
// numbers, -1 for no page) and the cp.async stages. Tile j covers tokens t_lo + j * TILE ..
// Block-table entries of tile j + STAGES are read into registers (pf_e0 / pf_e1) two tiles
// before they are checked and stored, so no thread waits on them.
// The planes' pointers and strides stay kernel parameters (constant bank, no registers):
// issue() takes them again through KV_PLANE_PARAMS (the stage-1 bodies' parameter names).
#define KV_PLANE_PARAMS                                                                      \
    p0, p0_sb, p0_sh, p0_st, p0_vec, p1, p1_sb, p1_sh, p1_st, p1_vec, p2, p2_sb, p2_sh, p2_st, \
        p2_vec, p3, p3_sb, p3_sh, p3_st, p3_vec
#define KV_PLANE_PARAM_DECL                                                               \
    const unsigned char *p0, long long p0_sb, long long p0_sh, long long p0_st, int p0_vec, \
        const unsigned char *p1, long long p1_sb, long long p1_sh, long long p1_st,           \
        int p1_vec, const unsigned char *p2, long long p2_sb, long long p2_sh,                \
        long long p2_st, int p2_vec, const unsigned char *p3, long long p3_sb,                \
        long long p3_sh, long long p3_st, int p3_vec
struct KvTilePipe {
    int md[4];  // copy mode per plane (KVD_MODE_*)
    int rs[4];  // staging row stride per plane, bytes
    int row_off;   // row mode: this thread's token offset in its page, or -1 (per tile)
    bool fast;     // every plane copies asynchronously with 32-bit offsets (kv_plane_fast);
                   // on sm_90+ such launches copy by the copy engine (bulk)
#if KVD_BULK_WARP_SLABS
    bool slabs;    // fast, every plane a slab (kv_plane_slabs) and power-of-two pages of
                   // >= 16 tokens: each warp copies its 16 tokens' slabs (issue_bulk_slabs)
    // Per plane, the source address of this warp's 16 tokens in page 0 (the head's slab plus
    // the in-page token offset when pages hold whole tiles' parts): worked out once
    // (prepare_slabs), as the copy engine's uniform operands would otherwise be rebuilt from
    // the kernel parameters every tile (~11 uniform instructions per plane).
    unsigned long long sbase[4];
#if KVD_PAIR_TRIMS
    // (KVD_PAIR_TRIMS) The warp's first token in a tile, 16 w, shuffled from lane 0 once
    // (prepare_slabs; issue_pair shuffled it every pair), or -1 for pages of more than TILE
    // tokens, so that issue_pair's common-pair test is one OR of it and the two pages; and
    // the stages' shared-window address (issue_pair converted stg every pair).
    int t16w;
    unsigned stg_sa;
#endif
#endif
#if KVD_CP_WARP_PIPE
    bool local;    // fast and pages of >= 16 tokens: every warp's copies, ring entries and
                   // stage reads are its own (KVD_CP_WARP_PIPE), so no CTA barrier per tile
#endif
    bool runs;     // fast, pages of a multiple of 16 tokens and token-contiguous row planes:
                   // kvd::ROW_RUNS builds copy whole warp runs as row runs
#if KVD_BULK
    unsigned bar_sa;  // shared-window address of stage 0's mbarrier
#endif
    const int* bt;  // the sequence's block-table row
    int bt_sh;      // log2(block_size) for power-of-two pages, else -1
    int num_blocks;
    int block_size;
    int kvh;
    int* error_flag;
    int* tp_ring;
    unsigned char* stg;
    int t_lo;
    int t_hi;
    int n_tiles;
    int pf_e0;  // block-table entries of this thread's token in the next two tiles to store
    int pf_e1;
#if KVD_CP_RINGLESS
    bool slabs;    // local and power-of-two pages of >= 16 tokens: page windows, no ring
#endif
#if KVD_PAGE_WIN
    // Warp pipes' slab launches (pf_e0: the checked window, warp_page): the next window's
    // unchecked entries, and one page bit per issue (warp_has_page).
    int pf_raw;
    unsigned pg_bits;
#endif

    // Whether token t (t < TILE) of tile j is in the split: only those are looked up.
    __device__ __forceinline__ bool live(int j, int t) const {
        return j < n_tiles && t_lo + j * kvd::TILE + t < t_hi;
    }
    // Block-table entry of token t of tile j (0 when not live); the entry is checked by
    // store(). Page sizes are powers of two (kvkit.cache.BLOCK_SIZES): a shift, not an
    // integer division (~25 instructions), unless a caller built odd pages. The row pointer
    // and the shift are worked out once (kv_make_pipe), not per tile.
    __device__ __forceinline__ int entry(int j, int t) const {
        if (!live(j, t)) return 0;
        const int tok = t_lo + j * kvd::TILE + t;
        const int idx = bt_sh >= 0 ? tok >> bt_sh : tok / block_size;
        return bt[idx];
    }
    // Slot of tile j in the ring, entry e of this thread's token (threadIdx.x < TILE): -1 past
    // the tile or for a bad entry (flag bit 2).
    __device__ __forceinline__ void store(int j, int e) {
        const bool lv = live(j, KVD_RING_T);
        const bool ok = kv_page_ok(e, num_blocks);
        tp_ring[(j % kvd::NP) * kvd::TILE + KVD_RING_T] = lv && ok ? e : -1;
        if (lv && !ok) atomicOr(error_flag, KV_ERR_BLOCK_TABLE);
    }
#if KVD_PAGE_WIN
    // Warp pipes' slab launches keep no page ring: warp w's 16 tokens of a tile (16 w ..
    // 16 w + 15) lie in one page (pages of a multiple of 16 tokens, tiles start on a page
    // start), so the warp needs one block-table entry per tile, that of its first token; for
    // its tokens t the ring's tp[t] >= 0 reads "t < n_tile && the warp's page >= 0" (live(j, t)
    // is t < n_tile, and the entry is the same for the 16).
    // The issue side: window w = tiles 32 w .. 32 w + 31, lane k holding the checked page of
    // tile 32 w + k (-1: not live, or bad) in pf_e0, and the next window's unchecked entries
    // in pf_raw, loaded one window (32 tiles) before their check, so after the prologue no
    // lane waits on a block-table load. The tile's page is a shuffle (warp_page).
    // The compute side (tile i, STAGES - 1 tiles behind the issue, maybe in the window before)
    // needs only whether the warp has the page: pg_bits, one bit per issue, tile i's at bit
    // STAGES - 1 (warp_has_page).
    // Entries read: those of live tiles' first warp tokens only (entry()), a subset of the
    // ring's. A bad one flags bit 2 when its tile is live for the warp: exactly the bad pages
    // the ring flagged, as a page's live tokens in a warp's tile follow the warp's first token
    // of that tile (same page, smaller index), which is then live too.
    __device__ __forceinline__ int window_entry(int w) const {
        static_assert(KV_WARP == 32 && kvd::SUB16, "warp pipes: 32 tiles a window, 16 tokens a warp");
        return entry(32 * w + (int)(threadIdx.x & 31u), 16 * (int)(threadIdx.x / 32u));
    }
    __device__ __forceinline__ int window_check(int w, int e) const {
        const bool lv = live(32 * w + (int)(threadIdx.x & 31u), 16 * (int)(threadIdx.x / 32u));
        const bool ok = kv_page_ok(e, num_blocks);
        if (lv && !ok) atomicOr(error_flag, KV_ERR_BLOCK_TABLE);
        return lv && ok ? e : -1;
    }
    // The warp's page of tile j at its issue (warp-uniform; -1: not live for the warp, or bad:
    // what the ring's t16 < n ? tp[t16] : -1 gave).
    __device__ __forceinline__ int warp_page(int j) const {
        return __shfl_sync(0xffffffffu, pf_e0, j & 31);
    }
    // Whether the warp has a page in tile i, after the issue of tile i + STAGES - 1.
    __device__ __forceinline__ bool warp_has_page() const {
        return (pg_bits >> (kvd::STAGES - 1)) & 1u;
    }
#if KVD_TILE_PAIRS
    // Tile pairs: whether the warp has a page in tile i + k (k = 0, 1) after the pair's
    // issues of tiles i + STAGES - 2 and i + STAGES - 1 (tile i's bit at STAGES - 1 again).
    __device__ __forceinline__ bool warp_has_page_at(int k) const {
        return (pg_bits >> (kvd::STAGES - 1 - k)) & 1u;
    }
#if KVD_PAIR_TRIMS
    // warp_has_page_at(0) && warp_has_page_at(1) as one mask test (the pair loop's full2).
    __device__ __forceinline__ bool warp_has_pages_01() const {
        constexpr unsigned M = 3u << (kvd::STAGES - 2);
        return (pg_bits & M) == M;
    }
#endif
#endif
    // The ring's tp[t] >= 0 for warp token t of tile i (has: warp_has_page()).
    __device__ __forceinline__ bool page_ok(int i, bool has, int t) const {
        return slabs ? has : pages(i)[t] >= 0;
    }
#endif
    // Pages of tiles 0 .. STAGES - 1 and the prefetched entries of tiles STAGES, STAGES + 1:
    // every entry loaded before the first is stored (a load-store loop waited for each load
    // in turn: STAGES memory round trips on the way to the first tile).
    __device__ __forceinline__ void prologue_pages() {
#if KVD_PAGE_WIN
        if (slabs) {  // windows 0 (checked) and 1 (loaded), both loads in flight together
            const int e0 = window_entry(0);
            pf_raw = window_entry(1);
            pf_e0 = window_check(0, e0);
            return;
        }
#endif
        if (KVD_RING_FILL) {
            int e[kvd::STAGES];
#pragma unroll
            for (int j = 0; j < kvd::STAGES; ++j) e[j] = entry(j, KVD_RING_T);
            pf_e0 = entry(kvd::STAGES, KVD_RING_T);
            pf_e1 = entry(kvd::STAGES + 1, KVD_RING_T);
#pragma unroll
            for (int j = 0; j < kvd::STAGES; ++j) store(j, e[j]);
        }
    }
    // At tile i (after its barrier): the pages of tile i + STAGES into the slot of tile
    // i - 1, and the entry of tile i + STAGES + 2 into a register: loaded two tiles before
    // its use, as one tile of a short kernel (fp16: ~1 us) does not cover a block-table load
    // under full memory load.
    __device__ __forceinline__ void advance_pages(int i) {
#if KVD_PAGE_WIN
        if (slabs) {
            // Before the issue of tile 32 w (the next iteration's, when i + STAGES = 32 w):
            // window w checked, window w + 1 loaded.
            const int j = i + kvd::STAGES;
            if ((j & 31) == 0) {
                pf_e0 = window_check(j >> 5, pf_raw);
                pf_raw = window_entry((j >> 5) + 1);
            }
            return;
        }
#endif
        if (KVD_RING_FILL) {
            store(i + kvd::STAGES, pf_e0);
            pf_e0 = pf_e1;
            pf_e1 = entry(i + kvd::STAGES + 2, KVD_RING_T);
        }
    }
    __device__ __forceinline__ const int* pages(int j) const {
        return tp_ring + (j % kvd::NP) * kvd::TILE;
    }
    __device__ __forceinline__ unsigned char* stage(int j) const {
        return stg + (j % kvd::STAGES) * kvd::STAGE_BYTES;
    }
    __device__ __forceinline__ int first_token(int j) const { return t_lo + j * kvd::TILE; }
    __device__ __forceinline__ int tile_tokens(int j) const {
        return min(kvd::TILE, t_hi - first_token(j));
    }
    // Staged rows of tile-local token t, one per plane.
    __device__ __forceinline__ void rows(const unsigned char* s, int t,
                                         const unsigned char** rw) const {
        // (The gaps are compile-time, 0 unless the family sets them: no code then.)
        rw[0] = s + t * rs[0] + (t >> 2) * kvd::GP0;
        rw[1] = s + kvd::SO1 + t * rs[1] + (t >> 2) * kvd::GP1;
        rw[2] = s + kvd::SO2 + t * rs[2] + (t >> 2) * kvd::GP2;
        rw[3] = s + kvd::SO3 + t * rs[3] + (t >> 2) * kvd::GP3;
    }
#if KVD_TILE_PAIRS
    // rows() for slab launches (KvTilePipe::slabs): every plane is then fast, so its mode is
    // known at compile time (kv_plane_mode: row mode for widths of whole 16-byte units, slab
    // mode for the others) and so is its staging stride: the tile pairs' row addresses
    // without the runtime strides' multiplications.
    static __device__ __forceinline__ void rows_slabs(const unsigned char* s, int t,
                                                      const unsigned char** rw) {
        constexpr int R0 = KV_P0_BYTES % 16 == 0 ? kvd::WP0 : KV_P0_BYTES;
        constexpr int R1 = KV_P1_BYTES % 16 == 0 ? kvd::WP1 : KV_P1_BYTES;
        constexpr int R2 = KV_P2_BYTES % 16 == 0 ? kvd::WP2 : KV_P2_BYTES;
        constexpr int R3 = KV_P3_BYTES % 16 == 0 ? kvd::WP3 : KV_P3_BYTES;
        rw[0] = s + t * R0 + (t >> 2) * kvd::GP0;
        rw[1] = s + kvd::SO1 + t * R1 + (t >> 2) * kvd::GP1;
        rw[2] = s + kvd::SO2 + t * R2 + (t >> 2) * kvd::GP2;
        rw[3] = s + kvd::SO3 + t * R3 + (t >> 2) * kvd::GP3;
    }
#endif
    template <bool FAST, bool SUB = false, bool RUNS = false>
    __device__ __forceinline__ void planes(unsigned char* s, unsigned sa, const KvIssueAt& at,
                                           const int* tp, int t0, int n, int kvh, int bs,
                                           KV_PLANE_PARAM_DECL) {
        constexpr int SO1 = kvd::SO1;
        constexpr int SO2 = kvd::SO2;
        constexpr int SO3 = kvd::SO3;
        kv_issue_plane<KV_P0_BYTES, kvd::WP0, kvd::GP0, FAST, SUB, RUNS>(s, sa, p0, p0_sb, p0_sh, p0_st,
                                                         KV_P0_ELEM, p0_vec, md[0], kvh, at, tp,
                                                         t0, n, bs);
        kv_issue_plane<KV_P1_BYTES, kvd::WP1, kvd::GP1, FAST, SUB, RUNS>(s + SO1, sa + SO1, p1, p1_sb, p1_sh,
                                                         p1_st, KV_P1_ELEM, p1_vec, md[1], kvh,
                                                         at, tp, t0, n, bs);
        kv_issue_plane<KV_P2_BYTES, kvd::WP2, kvd::GP2, FAST, SUB, RUNS>(s + SO2, sa + SO2, p2, p2_sb, p2_sh,
                                                         p2_st, KV_P2_ELEM, p2_vec, md[2], kvh,
                                                         at, tp, t0, n, bs);
        kv_issue_plane<KV_P3_BYTES, kvd::WP3, kvd::GP3, FAST, SUB, RUNS>(s + SO3, sa + SO3, p3, p3_sb, p3_sh,
                                                         p3_st, KV_P3_ELEM, p3_vec, md[3], kvh,
                                                         at, tp, t0, n, bs);
    }
#if KVD_BULK_WARP_SLABS
    // sbase (after kv_make_pipe, before the first issue); 0 unless slabs.
    __device__ __forceinline__ void prepare_slabs(KV_PLANE_PARAM_DECL) {
        const int t16 = __shfl_sync(0xffffffffu, (int)(16 * (threadIdx.x / KV_WARP)), 0);
        const int off = block_size <= kvd::TILE ? (t16 & (block_size - 1)) : t16;
        sbase[0] = sbase[1] = sbase[2] = sbase[3] = 0;
#if KVD_PAIR_TRIMS
        t16w = block_size <= kvd::TILE ? t16 : -1;
        stg_sa = kv_smem_addr(stg);
#endif
        if (slabs) {
            sbase[0] = kv_slab_base<KV_P0_BYTES>(p0, p0_sh, p0_st, KV_P0_ELEM, kvh, off);
            sbase[1] = kv_slab_base<KV_P1_BYTES>(p1, p1_sh, p1_st, KV_P1_ELEM, kvh, off);
            sbase[2] = kv_slab_base<KV_P2_BYTES>(p2, p2_sh, p2_st, KV_P2_ELEM, kvh, off);
            sbase[3] = kv_slab_base<KV_P3_BYTES>(p3, p3_sh, p3_st, KV_P3_ELEM, kvh, off);
        }
        (void)p0_sb, (void)p1_sb, (void)p2_sb, (void)p3_sb;
        (void)p0_vec, (void)p1_vec, (void)p2_vec, (void)p3_vec;
    }
    // Tile j's copies when slabs: warp w copies tokens 16 w .. 16 w + 15, which lie in one page
    // (pages of a multiple of 16 tokens, tiles start on a page start: splits and window starts
    // are page-aligned), whole: past the sequence end the page's slots are copied too (they
    // are in the page; the masks drop them, as the cp.async sub-runs' do). t16, the page and
    // its offset are shuffled from lane 0, so the compiler keeps them (and the copies'
    // addresses) in uniform registers. A warp without a page copies nothing: its staging keeps
    // stale bytes, which only reach masked arithmetic (invalid tokens' V words are zeroed,
    // their logits replaced by -inf). Lane 0 announces the bytes; every thread arrives.
    __device__ __forceinline__ void issue_bulk_slabs(int j, unsigned sa, int t0, int n,
                                                     const int* tp, int kvh, int bs,
                                                     unsigned tid, KV_PLANE_PARAM_DECL) {
        static_assert(kvd::SUB16, "warp slabs: one warp per 16 tokens of a tile");
        constexpr unsigned TW = KV_P0_BYTES + KV_P1_BYTES + KV_P2_BYTES + KV_P3_BYTES;
        // Not issue()'s opaque per-tile copies of threadIdx.x, kvh and block_size: here what
        // derives from them is warp-uniform, and ptxas may keep it over the loop in uniform
        // registers (which the vector register budget does not pay for): t16, and per plane
        // the (head, in-page token) part of the source address when pages hold whole tiles'
        // parts (block_size <= TILE: a tile starts on a page start, so off = t16 % block_size
        // is the same for every tile).
        (void)tid;
        (void)kvh;
        (void)bs;
        const int t16 = __shfl_sync(0xffffffffu, (int)(16 * (threadIdx.x / KV_WARP)), 0);
#if KVD_WARP_PIPE
        // The warp's page from its registers (warp_page: -1 unless t16 < n and the entry is
        // good, as the ring's tp[t16] was); the ring is not written in slab launches.
        (void)tp;
        const int pg = warp_page(j);
        pg_bits |= pg >= 0 ? 1u : 0u;  // (issue() shifted it)
#else
        const int pg = __shfl_sync(0xffffffffu, t16 < n ? tp[t16] : -1, 0);
#endif
        const unsigned bar = bar_sa + 8u * (unsigned)(j % kvd::STAGES);
        kv_mbar_arrive_tx_warp(bar, pg >= 0 ? 16u * TW : 0u);
        if (pg >= 0) {
            // The stage was last read through the generic proxy (before this tile's barrier);
            // the copy engine writes through the async one. (Warp pipes: the warp's barrier,
            // tile_sync's __syncwarp, orders its lanes' reads before this fence, as the CTA
            // barrier orders the CTA's; the other warps never read this warp's slabs.)
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            // Pages of <= TILE tokens (the common case): sbase holds the in-page offset; the
            // others add the tile's offset in its page (a second copy of the code, so the
            // common one has no offset arithmetic per plane).
            if (block_size <= kvd::TILE)
                slab_copies<false>(sa, pg, 0, t16, bar, KV_PLANE_PARAMS);
            else
                slab_copies<true>(sa, pg, t0 & (block_size - 1), t16, bar, KV_PLANE_PARAMS);
        }
    }
#if KVD_PAIR_ADDR
    // issue(j); issue(j + 1) of the tile-pair loop (slab launches, KVD_PAIR_ADDR; j even, so
    // with 4 stages tile j + 1 has the next stage and barrier, and both lie in one page
    // window): the same arrivals, pages and copies, with t16, the stage address, the page-size
    // branch and the proxy fence once for both (the fence orders the lanes' earlier generic
    // reads, which tile_sync's __syncwarp put before it, before every copy after it).
    __device__ __forceinline__ void issue_pair(int j, KV_PLANE_PARAM_DECL) {
        static_assert(kvd::STAGES == 4, "issue_pair: stages of tiles j, j + 1 adjacent");
        constexpr unsigned TW = KV_P0_BYTES + KV_P1_BYTES + KV_P2_BYTES + KV_P3_BYTES;
        pg_bits <<= 2;
        if (j >= n_tiles) return;
        const bool two = j + 1 < n_tiles;
#if !KVD_PAIR_TRIMS
        const int t16 = __shfl_sync(0xffffffffu, (int)(16 * (threadIdx.x / KV_WARP)), 0);
#endif
        const int pg0 = warp_page(j);
        // (-1 past n_tiles: window_check's live() test; tile j + 1 is in tile j's window.)
        const int pg1 = warp_page(j + 1);
#if KVD_PAIR_TRIMS
        // (KVD_PAIR_TRIMS) The common pair: both pages good (so j + 1 < n_tiles: pg1 is -1
        // past n_tiles) in pages of <= TILE tokens (t16w >= 0). One test instead of the
        // general path's five (two, each page, either page, the page size), and the page bits
        // and the announced bytes as constants: the same arrivals, fence and copies in the
        // same order.
        if ((pg0 | pg1 | t16w) >= 0) {
            pg_bits |= 3u;
            const unsigned bar = bar_sa + 8u * (unsigned)(j % kvd::STAGES);
            kv_mbar_arrive_tx_warp(bar, 16u * TW);
            kv_mbar_arrive_tx_warp(bar + 8u, 16u * TW);
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            const unsigned sa = stg_sa + (unsigned)((j % kvd::STAGES) * kvd::STAGE_BYTES);
            slab_copies<false>(sa, pg0, 0, t16w, bar, KV_PLANE_PARAMS);
            slab_copies<false>(sa + kvd::STAGE_BYTES, pg1, 0, t16w, bar + 8u, KV_PLANE_PARAMS);
            return;
        }
        // (The other pairs: t16 as before.)
        const int t16 = __shfl_sync(0xffffffffu, (int)(16 * (threadIdx.x / KV_WARP)), 0);
#endif
        pg_bits |= (pg0 >= 0 ? 2u : 0u) | (pg1 >= 0 ? 1u : 0u);
        const unsigned bar = bar_sa + 8u * (unsigned)(j % kvd::STAGES);
        kv_mbar_arrive_tx_warp(bar, pg0 >= 0 ? 16u * TW : 0u);
        if (two) kv_mbar_arrive_tx_warp(bar + 8u, pg1 >= 0 ? 16u * TW : 0u);
        if (pg0 >= 0 || pg1 >= 0) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            const unsigned sa = kv_smem_addr(stg) + (unsigned)((j % kvd::STAGES) * kvd::STAGE_BYTES);
            constexpr unsigned SB = kvd::STAGE_BYTES;
            if (block_size <= kvd::TILE) {
                if (pg0 >= 0) slab_copies<false>(sa, pg0, 0, t16, bar, KV_PLANE_PARAMS);
                if (pg1 >= 0) slab_copies<false>(sa + SB, pg1, 0, t16, bar + 8u, KV_PLANE_PARAMS);
            } else {
                const int t0 = first_token(j);
                if (pg0 >= 0)
                    slab_copies<true>(sa, pg0, t0 & (block_size - 1), t16, bar, KV_PLANE_PARAMS);
                if (pg1 >= 0)
                    slab_copies<true>(sa + SB, pg1, (t0 + kvd::TILE) & (block_size - 1), t16,
                                      bar + 8u, KV_PLANE_PARAMS);
            }
        }
    }
    // wait<>(j); wait<>(j + 1) of the tile-pair loop (j even: adjacent barriers, one phase).
    __device__ __forceinline__ void wait_pair(int j) const {
        const unsigned bar = bar_sa + 8u * (unsigned)(j % kvd::STAGES);
        const unsigned par = (unsigned)(j / kvd::STAGES) & 1u;
        kv_mbar_wait(bar, par);
        kv_mbar_wait(bar + 8u, par);
    }
#endif
    template <bool OFFV>
    __device__ __forceinline__ void slab_copies(unsigned sa, int pg, int offv, int t16,
                                                unsigned bar, KV_PLANE_PARAM_DECL) const {
        {
            kv_bulk_slab<OFFV, KV_P0_BYTES, kvd::WP0, kvd::GP0>(sa, sbase[0], p0_sb, p0_st,
                KV_P0_ELEM, pg, offv, t16, bar);
            kv_bulk_slab<OFFV, KV_P1_BYTES, kvd::WP1, kvd::GP1>(sa + kvd::SO1, sbase[1], p1_sb, p1_st,
                KV_P1_ELEM, pg, offv, t16, bar);
            kv_bulk_slab<OFFV, KV_P2_BYTES, kvd::WP2, kvd::GP2>(sa + kvd::SO2, sbase[2], p2_sb, p2_st,
                KV_P2_ELEM, pg, offv, t16, bar);
            kv_bulk_slab<OFFV, KV_P3_BYTES, kvd::WP3, kvd::GP3>(sa + kvd::SO3, sbase[3], p3_sb, p3_st,
                KV_P3_ELEM, pg, offv, t16, bar);
        }
    }
#endif
#if KVD_BULK
    // Bulk copies of tile j (fast launches on sm_90+): row planes one copy per token row by
    // the thread with row_x 0, slab planes one copy per run by the run's first thread. Every
    // thread arrives on the stage's barrier once per tile, announcing its bytes before it
    // issues them (so the phase cannot complete before the copies land).
    __device__ __forceinline__ void issue_bulk(int j, unsigned sa, const KvIssueAt& at, int kvh,
                                               int n, int bs, unsigned tid,
                                               KV_PLANE_PARAM_DECL) {
        constexpr int RW = kv_row_w(KV_P0_BYTES) + kv_row_w(KV_P1_BYTES) +
                           kv_row_w(KV_P2_BYTES) + kv_row_w(KV_P3_BYTES);
        constexpr int SW = kv_slab_w(KV_P0_BYTES) + kv_slab_w(KV_P1_BYTES) +
                           kv_slab_w(KV_P2_BYTES) + kv_slab_w(KV_P3_BYTES);
#if KVD_BULK_WARP_RUNS
        // Row planes only (fp16 / bf16), one warp per 16 tokens of the tile, pages of a
        // multiple of 16 tokens: tiles start on a page boundary (splits are page-aligned), so
        // warp w's tokens 16 w .. 16 w + 15 are consecutive rows of one page, and the warp
        // copies them itself (kv_bulk_run) instead of each thread its token's rows.
        if constexpr (SW == 0 && kvd::SUB16 && kvd::TPT * 16 == KV_WARP) {
            if ((bs & 15) == 0) {
                issue_bulk_runs(j, sa, at, kvh, n, tid, KV_PLANE_PARAMS);
                return;
            }
        }
#endif
        (void)n;
        (void)bs;
        (void)tid;
        const bool row_mine = RW > 0 && at.row_x == 0 && at.row_page >= 0;
        const bool slab_mine = SW > 0 && at.slab_j0 == 0 && at.slab_page >= 0;
        const unsigned bar = bar_sa + 8u * (unsigned)(j % kvd::STAGES);
        kv_mbar_arrive_tx(bar, (row_mine ? RW : 0) + (slab_mine ? at.sc * SW : 0));
        if (row_mine || slab_mine) {
            // The stage was last read through the generic proxy (before this tile's barrier);
            // the copy engine writes through the async one.
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            constexpr int SO1 = kvd::SO1;
            constexpr int SO2 = kvd::SO2;
            constexpr int SO3 = kvd::SO3;
            kv_bulk_plane<KV_P0_BYTES, kvd::WP0, kvd::GP0>(sa, p0, p0_sb, p0_sh, p0_st, KV_P0_ELEM, kvh,
                                                 at, row_mine, slab_mine, bar);
            kv_bulk_plane<KV_P1_BYTES, kvd::WP1, kvd::GP1>(sa + SO1, p1, p1_sb, p1_sh, p1_st, KV_P1_ELEM,
                                                 kvh, at, row_mine, slab_mine, bar);
            kv_bulk_plane<KV_P2_BYTES, kvd::WP2, kvd::GP2>(sa + SO2, p2, p2_sb, p2_sh, p2_st, KV_P2_ELEM,
                                                 kvh, at, row_mine, slab_mine, bar);
            kv_bulk_plane<KV_P3_BYTES, kvd::WP3, kvd::GP3>(sa + SO3, p3, p3_sb, p3_sh, p3_st, KV_P3_ELEM,
                                                 kvh, at, row_mine, slab_mine, bar);
        }
    }
#if KVD_BULK_WARP_RUNS
    // issue_bulk's warp runs: lane 0 holds the warp's first token (row_t = 16 w: TPT threads
    // per token, 32 / TPT = 16 tokens per warp), so its page and in-page offset are the run's;
    // shuffled to the warp they are uniform to the compiler (uniform address registers).
    // Lane 0 announces the run's bytes (every thread still arrives once per tile); the warp
    // then issues cnt copies per row plane, the token stride apart in the plane and the
    // padded row stride apart in the stage.
    __device__ __forceinline__ void issue_bulk_runs(int j, unsigned sa, const KvIssueAt& at,
                                                    int kvh, int n, unsigned tid,
                                                    KV_PLANE_PARAM_DECL) {
        constexpr int RW = kv_row_w(KV_P0_BYTES) + kv_row_w(KV_P1_BYTES) +
                           kv_row_w(KV_P2_BYTES) + kv_row_w(KV_P3_BYTES);
        const int t16 = __shfl_sync(0xffffffffu, at.row_t, 0);
        const int pg = __shfl_sync(0xffffffffu, at.row_page, 0);
        const int off = __shfl_sync(0xffffffffu, at.row_off, 0);
        const int left = n - t16;
        const int cnt = pg < 0 || left <= 0 ? 0 : (left < 16 ? left : 16);
        const unsigned bar = bar_sa + 8u * (unsigned)(j % kvd::STAGES);
        kv_mbar_arrive_tx(bar, (tid & (KV_WARP - 1)) == 0 ? (unsigned)(cnt * RW) : 0u);
        if (cnt > 0) {
            // The stage was last read through the generic proxy (before this tile's barrier);
            // the copy engine writes through the async one.
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            constexpr int SO1 = kvd::SO1;
            constexpr int SO2 = kvd::SO2;
            constexpr int SO3 = kvd::SO3;
            kv_bulk_run<KV_P0_BYTES, kvd::WP0, kvd::GP0>(sa, p0, p0_sb, p0_sh, p0_st, KV_P0_ELEM, kvh, pg,
                                               off, t16, cnt, bar);
            kv_bulk_run<KV_P1_BYTES, kvd::WP1, kvd::GP1>(sa + SO1, p1, p1_sb, p1_sh, p1_st, KV_P1_ELEM, kvh,
                                               pg, off, t16, cnt, bar);
            kv_bulk_run<KV_P2_BYTES, kvd::WP2, kvd::GP2>(sa + SO2, p2, p2_sb, p2_sh, p2_st, KV_P2_ELEM, kvh,
                                               pg, off, t16, cnt, bar);
            kv_bulk_run<KV_P3_BYTES, kvd::WP3, kvd::GP3>(sa + SO3, p3, p3_sb, p3_sh, p3_st, KV_P3_ELEM, kvh,
                                               pg, off, t16, cnt, bar);
        }
    }
#endif
    // Tile j's bulk copies have landed (its stage's barrier finished phase j / STAGES).
    __device__ __forceinline__ void wait_bulk(int j) const {
        kv_mbar_wait(bar_sa + 8u * (unsigned)(j % kvd::STAGES), (unsigned)(j / kvd::STAGES) & 1u);
    }
#endif
    // After the tile loop of a CTA with tiles: the stages' barriers are invalidated
    // (kv_mbar_inval) before the CTA's shared memory goes to the next CTA or kernel. The
    // loop's last iteration put a CTA barrier after every thread's last wait, and no tile
    // past n_tiles arrives, so nothing touches them any more.
    __device__ __forceinline__ void retire_bulk() const {
#if KVD_WARP_PIPE
        if (slabs) {
            // Warp pipes: each warp's own barriers (bar_sa is the warp's), by its lane 0 once
            // every lane of the warp is past its last wait (__syncwarp orders them; no copy is
            // pending: the warp waited for each tile it issued, none past n_tiles). n_tiles is
            // the CTA's, so every warp made (kv_make_pipe) and retires its barriers.
            __syncwarp();
            if ((threadIdx.x & (KV_WARP - 1)) == 0) {
#if KVD_PAIR_ADDR
                // bar_sa worked out again (kv_make_pipe's), so that it need not outlive the
                // loop: with the pair loop's lane offsets ptxas spilled it there (sm_90).
                const unsigned b0 = kv_smem_addr(tp_ring + kvd::NP * kvd::TILE) +
                                    8u * kvd::STAGES * (threadIdx.x / KV_WARP);
#else
                const unsigned b0 = bar_sa;
#endif
#pragma unroll
                for (int j = 0; j < kvd::STAGES; ++j) kv_mbar_inval(b0 + 8u * j);
            }
            return;
        }
#endif
#if KVD_BULK
        if (fast && threadIdx.x == 0) {
#if KVD_PAIR_ADDR
            // (As above: kv_make_pipe's bar_sa of launches without slabs; ptxas spilled it at
            // G x q_len = 2 x 4 with bf16 queries, sm_90.)
            const unsigned b0 = kv_smem_addr(tp_ring + kvd::NP * kvd::TILE);
#else
            const unsigned b0 = bar_sa;
#endif
#pragma unroll
            for (int j = 0; j < kvd::STAGES; ++j) kv_mbar_inval(b0 + 8u * j);
        }
#endif
    }
    // Every thread, before the CTA barrier after which the copy engine writes memory this
    // thread wrote or read through the generic proxy (the query rows the mma core keeps in
    // the last stage): the writer's own proxy fence (PTX ISA, fence.proxy.async: it orders
    // the executing thread's accesses), as the issuing thread's fence covers only its own.
    __device__ __forceinline__ void fence_for_bulk() const {
#if KVD_BULK
        if (fast) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
    }
    // After tile i's wait: before its compute reads the stage and ring slot, and before the
    // issue that refills the stage tile i - 1 used. The CTA barrier, except in warp pipes
    // (KVD_WARP_PIPE, slab launches), where a warp's copies, pages and barriers are its own:
    // __syncwarp, which orders the lanes' generic reads of the stage of tile i - 1 before the
    // issuing lane's proxy fence and copies (issue_bulk_slabs), as the CTA barrier does for
    // the CTA (PTX ISA fence.proxy.async; the pattern of main's issue, one fence per copying
    // warp-tile, not one per lane and tile).
    __device__ __forceinline__ void tile_sync() const {
#if KVD_WARP_PIPE
        if (slabs) {
            __syncwarp();
            return;
        }
#endif
#if KVD_CP_WARP_PIPE
        if (local) {
            __syncwarp();
            return;
        }
#endif
        __syncthreads();
    }
    // Tile i's copies have landed (before the tile's barrier).
    template <int PENDING>
    __device__ __forceinline__ void wait(int i) const {
#if KVD_BULK
        if (fast) {
            wait_bulk(i);
            return;
        }
#endif
        (void)i;
        kv_cp_async_wait<PENDING>();
    }
    // The copies of tile j (one commit group per tile slot, empty or not: uniform counting).
    __device__ __forceinline__ void issue(int j, KV_PLANE_PARAM_DECL) {
#if KVD_PAGE_WIN
        pg_bits <<= 1;  // tile j's page bit (slab launches: issue_bulk_slabs sets it)
#endif
        if (j < n_tiles) {
            const int t0 = first_token(j);
            const int n = tile_tokens(j);
#if KVD_WARP_PIPE
            // (The ring slot after the slab branch, which does not read it.)
            const int* tp = nullptr;
#else
            const int* tp = pages(j);
#endif
            // Opaque per-tile copies of kvh, block_size and threadIdx.x: what derives from
            // them is the same for every tile, and the compiler would compute it (both copy
            // paths', per plane) once and hold it over the whole loop: registers the
            // tensor-core kernels (at 128) do not have, and an occupancy step for the others.
            // Per tile it costs an IMAD or two per plane.
            // (tid unsigned: the divisions by TPT stay shifts.)
            int kvh_t, bs;
            unsigned tid;
            asm volatile("mov.b32 %0, %3;\n\tmov.b32 %1, %4;\n\tmov.b32 %2, %5;"
                         : "=r"(kvh_t), "=r"(bs), "=r"(tid)
                         : "r"(kvh), "r"(block_size), "r"(threadIdx.x));
#if KVD_BULK_WARP_SLABS
            if (slabs) {
                // The stage's shared address from the staging base's (loop-invariant, one
                // uniform register) rather than through the generic pointer s: ~6 uniform
                // 64-bit instructions less per tile (NVFP4 walk, benchmarks/NOTES.md nvdec2).
                const unsigned sa = kv_smem_addr(stg) + (unsigned)((j % kvd::STAGES) * kvd::STAGE_BYTES);
                issue_bulk_slabs(j, sa, t0, n, tp, kvh_t, bs, tid, KV_PLANE_PARAMS);
                return;
            }
#endif
#if KVD_WARP_PIPE
            tp = pages(j);
#endif
            unsigned char* s = stage(j);
            KvIssueAt at;
            at.row_t = (int)(tid / kvd::TPT);
            at.row_x = (int)(16 * (tid % kvd::TPT));
            at.row_page = -1;
            at.row_off = 0;
#if KVD_CP_RINGLESS
            // Slab launches: the warp's page from its window (-1 unless its first token is in
            // the tile and the entry good, as the ring's tp[16 w] was); each token's entry is
            // that page when the token is in the tile (pages of >= 16 tokens, tiles on page
            // starts), which the row_t < n / slab_tok < n tests below add.
            int wpg = -1;
            if (slabs) {
                wpg = warp_page(j);
                pg_bits |= wpg >= 0 ? 1u : 0u;  // (shifted above)
            }
#endif
            if constexpr (kvd::ROW_PLANES) {
#if KVD_CP_RINGLESS
                at.row_page = at.row_t < n ? (slabs ? wpg : tp[at.row_t]) : -1;
#else
                at.row_page = at.row_t < n ? tp[at.row_t] : -1;
#endif
                at.row_off = row_off >= 0 ? row_off : (t0 + at.row_t) % bs;
            }
            // Slab planes of fast launches with pages of >= 16 tokens: warp sub-runs
            // (KvIssueAt). Their offset in the page: 16 w modulo the page when pages hold
            // whole tiles' parts (block_size divides TILE: a power of two), else the tile's
            // offset (a multiple of TILE) plus 16 w.
            constexpr bool SUB_OK = kvd::SUB16 && kvd::SLAB_PLANES && !KVD_BULK;
            const bool sub = SUB_OK && fast && bs >= 16;
            at.slab_page = -1;
            at.slab_off = 0;
            if (sub) {
                at.sc = 16;
                at.slab_tpr = KV_WARP;
                at.slab_tok = (int)(16 * (tid / KV_WARP));
                at.slab_j0 = (int)(tid % KV_WARP);
#if KVD_CP_RINGLESS
                at.slab_page = at.slab_tok < n ? (slabs ? wpg : tp[at.slab_tok]) : -1;
#else
                at.slab_page = at.slab_tok < n ? tp[at.slab_tok] : -1;
#endif
                at.slab_off = bs <= kvd::TILE ? (at.slab_tok & (bs - 1)) : t0 % bs + at.slab_tok;
            } else {
                at.sc = bs < kvd::TILE ? bs : kvd::TILE;
                at.slab_tpr = kvd::TPT * at.sc;
                at.slab_j0 = (int)(tid & (at.slab_tpr - 1));
                at.slab_tok = (int)((tid - at.slab_j0) / kvd::TPT);
                if constexpr (kvd::SLAB_PLANES) {
                    // The page's offset is 0 unless one page holds several tiles.
                    at.slab_page = at.slab_tok < n ? tp[at.slab_tok] : -1;
                    at.slab_off = bs <= kvd::TILE ? 0 : t0 % bs;
                }
            }
            // Shared-window addresses in 32 bits: one conversion per tile, not per copy.
            const unsigned sa = kv_smem_addr(s);
#if KVD_BULK
            if (fast) {
                issue_bulk(j, sa, at, kvh_t, n, bs, tid, KV_PLANE_PARAMS);
                return;
            }
#endif
            // One uniform branch per tile picks the planes' code.
            // Row runs for whole tiles: every warp's 16 rows (16 w ..) are in the tile, and
            // with pages of a multiple of 16 tokens and page-aligned tiles they are one page's
            // rows. Other tiles (a split's last; where the sequence end cuts a warp's rows)
            // keep the per-token copies, which zero-fill by row. (n % 16 == 0, or a per-warp
            // test, n <= 16 w || n >= 16 w + 16, would keep the row runs for more of them: one
            // or three instructions per tile more, for one tile per split.)
            constexpr bool RR = kvd::ROW_RUNS;
            at.run_l = (int)(tid % KV_WARP);
            if (RR && runs && n == kvd::TILE)
                planes<true, SUB_OK, RR>(s, sa, at, tp, t0, n, kvh_t, bs, KV_PLANE_PARAMS);
            else if (sub)
                planes<true, SUB_OK>(s, sa, at, tp, t0, n, kvh_t, bs, KV_PLANE_PARAMS);
            else if (fast)
                planes<true>(s, sa, at, tp, t0, n, kvh_t, bs, KV_PLANE_PARAMS);
            else
                planes<false>(s, sa, at, tp, t0, n, kvh_t, bs, KV_PLANE_PARAMS);
        }
        kv_cp_async_commit();
    }
};

// The split's (blockIdx.x of gridDim.x) tokens [t_lo, t_hi) of a sequence of seq_len tokens
// (kv_seq_len_ok): page-aligned, from the window's first page when there is a window; both 0
// for an empty split.
__device__ __forceinline__ void kv_split_tokens(int seq_len, int block_size, int window,
                                                int* t_lo, int* t_hi) {
    int first, end;
    kv_page_range(seq_len, block_size, gridDim.x, blockIdx.x, &first, &end);
    if (first >= end) return;
    // first < n_pages, so first * block_size < seq_len fits in int.
    int lo = first * block_size;
    const long long hi_ll = (long long)end * block_size;
    const int hi = hi_ll < seq_len ? (int)hi_ll : seq_len;
    if (window > 0) {
        // No query sees a token before (seq_len - q_len) - window + 1. Start at that token's
        // page, so tiles stay page-aligned (the masks drop the rest).
        const long long w_lo = (long long)seq_len - kvd::QL - window + 1;
        if (w_lo > lo) lo = (int)(w_lo - w_lo % block_size);
        if (lo > hi) lo = hi;
    }
    *t_lo = lo;
    *t_hi = hi;
}

// The pipeline of CTA (split, kvh, b) = blockIdx; sets flag bit 4 for a bad seq_len (split 0,
// thread 0) and returns seq_len (the masks need it).
__device__ __forceinline__ KvTilePipe kv_make_pipe(
    int p0_vec, int p1_vec, int p2_vec, int p3_vec, const int* block_tables, int max_blocks,
    const int* seq_lens, int num_blocks, int block_size, int window, int* error_flag,
    int* tp_ring, unsigned char* stg, int* seq_len_out) {
    KvTilePipe pp;
    const int split = blockIdx.x;
    const int b = blockIdx.z;
    pp.md[0] = kv_plane_mode<KV_P0_BYTES>(p0_vec, block_size);
    pp.md[1] = kv_plane_mode<KV_P1_BYTES>(p1_vec, block_size);
    pp.md[2] = kv_plane_mode<KV_P2_BYTES>(p2_vec, block_size);
    pp.md[3] = kv_plane_mode<KV_P3_BYTES>(p3_vec, block_size);
    pp.fast = kv_plane_fast<KV_P0_BYTES>(pp.md[0], p0_vec) &&
              kv_plane_fast<KV_P1_BYTES>(pp.md[1], p1_vec) &&
              kv_plane_fast<KV_P2_BYTES>(pp.md[2], p2_vec) &&
              kv_plane_fast<KV_P3_BYTES>(pp.md[3], p3_vec);
#if KVD_BULK_WARP_SLABS
    pp.slabs = pp.fast && (block_size & 15) == 0 && (block_size & (block_size - 1)) == 0 && kv_plane_slabs<KV_P0_BYTES>(p0_vec) &&
               kv_plane_slabs<KV_P1_BYTES>(p1_vec) && kv_plane_slabs<KV_P2_BYTES>(p2_vec) &&
               kv_plane_slabs<KV_P3_BYTES>(p3_vec);
#endif
#if KVD_CP_WARP_PIPE
    // (kv_issue_plane: row planes by row_t = tid / TPT, slab planes by warp sub-runs, which
    // KvTilePipe::issue takes exactly when fast && block_size >= 16.)
    static_assert(kvd::SUB16 && kvd::TPT * 16 == KV_WARP, "warp w's copies: tokens 16 w ..");
    pp.local = pp.fast && block_size >= 16;
#endif
#if KVD_CP_RINGLESS
    pp.slabs = pp.local && (block_size & 15) == 0 && (block_size & (block_size - 1)) == 0;
#endif
    // Row runs: every row plane token-contiguous (the slab bit; with 16-byte rows that is
    // what it adds) and pages of a multiple of 16 tokens.
    constexpr bool RR = kvd::ROW_RUNS;
    pp.runs = RR && pp.fast && (block_size & 15) == 0 &&
              kv_plane_runs<KV_P0_BYTES>(p0_vec) && kv_plane_runs<KV_P1_BYTES>(p1_vec) &&
              kv_plane_runs<KV_P2_BYTES>(p2_vec) && kv_plane_runs<KV_P3_BYTES>(p3_vec);
    pp.rs[0] = pp.md[0] == KVD_MODE_SLAB ? KV_P0_BYTES : kvd::WP0;
    pp.rs[1] = pp.md[1] == KVD_MODE_SLAB ? KV_P1_BYTES : kvd::WP1;
    pp.rs[2] = pp.md[2] == KVD_MODE_SLAB ? KV_P2_BYTES : kvd::WP2;
    pp.rs[3] = pp.md[3] == KVD_MODE_SLAB ? KV_P3_BYTES : kvd::WP3;
    // Tiles start on a page start when TILE is a multiple of block_size (t_lo is a page
    // start), so the row mode's token offsets are the same for every tile.
    pp.row_off = kvd::TILE % block_size == 0
                     ? (int)(threadIdx.x / (kvd::THREADS / kvd::TILE)) % block_size
                     : -1;
    pp.bt = block_tables + (long long)b * max_blocks;
    {
        const int sh = __ffs(block_size) - 1;
        pp.bt_sh = block_size == (1 << sh) ? sh : -1;
    }
    pp.num_blocks = num_blocks;
    pp.block_size = block_size;
    pp.kvh = blockIdx.y;
    pp.error_flag = error_flag;
    pp.tp_ring = tp_ring;
    pp.stg = stg;
    pp.pf_e0 = 0;
    pp.pf_e1 = 0;
#if KVD_PAGE_WIN
    pp.pf_raw = 0;
    pp.pg_bits = 0u;
#endif
#if KVD_BULK
    pp.bar_sa = kv_smem_addr(tp_ring + kvd::NP * kvd::TILE);
#endif

    const int seq_len = seq_lens[b];
    *seq_len_out = seq_len;
    const bool len_ok = kv_seq_len_ok(seq_len, kvd::QL, max_blocks, block_size);
    if (!len_ok && split == 0 && threadIdx.x == 0) atomicOr(error_flag, KV_ERR_SEQ_LEN);
    pp.t_lo = 0;
    pp.t_hi = 0;
    if (len_ok) kv_split_tokens(seq_len, block_size, window, &pp.t_lo, &pp.t_hi);
    pp.n_tiles = (pp.t_hi - pp.t_lo + kvd::TILE - 1) / kvd::TILE;
#if KVD_BULK
    // The stages' mbarriers sit after the page ring; every thread arrives once per tile. The
    // body's barrier before the first issue publishes the initialisation. Only CTAs that copy
    // tiles make them, so every barrier made is also invalidated (retire_bulk: a CTA without
    // tiles would otherwise leave valid barriers behind in the shared memory it hands back).
    if (pp.fast && pp.n_tiles > 0 && threadIdx.x == 0) {
        // Warp slabs: one arrival per warp (kv_mbar_arrive_tx_warp); else one per thread.
        // Warp pipes: STAGES barriers per warp, one arrival each (the warp's).
#if KVD_WARP_PIPE
        const unsigned arrivals = pp.slabs ? 1u : kvd::THREADS;
        const int nbar = pp.slabs ? kvd::NW * kvd::STAGES : kvd::STAGES;
#elif KVD_BULK_WARP_SLABS
        const unsigned arrivals = pp.slabs ? kvd::NW : kvd::THREADS;
        const int nbar = kvd::STAGES;
#else
        const unsigned arrivals = kvd::THREADS;
        const int nbar = kvd::STAGES;
#endif
        for (int j = 0; j < nbar; ++j) kv_mbar_init(pp.bar_sa + 8u * j, arrivals);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
#if KVD_WARP_PIPE
    {
        // This warp's barriers (shuffled from lane 0: warp-uniform to ptxas, so the barrier
        // addresses stay in uniform registers); every lane of every warp gets here.
        const unsigned wb =
            __shfl_sync(0xffffffffu, 8u * kvd::STAGES * (threadIdx.x / KV_WARP), 0);
        if (pp.slabs) pp.bar_sa += wb;
    }
#endif
#endif
    return pp;
}

#if KV_ROTATE_Q
// Unnormalized in-place FWHT (stages h = 1, 2, ..., D / 2) of the R query rows of D floats at
// rows (shared memory), by the CTA's threads, a barrier after each stage.
__device__ __forceinline__ void kv_fwht_rows(float* rows, int tid) {
    constexpr int D = kvd::D;
    for (int h = 1; h < D; h <<= 1) {
        for (int p = tid; p < kvd::R * (D / 2); p += kvd::THREADS) {
            const int r = p / (D / 2);
            const int j = p - r * (D / 2);
            const int i0 = ((j & ~(h - 1)) << 1) | (j & (h - 1));
            float* row = rows + r * D;
            const float a = row[i0];
            const float c = row[i0 + h];
            row[i0] = a + c;
            row[i0 + h] = a - c;
        }
        __syncthreads();
    }
}
#endif

// The parameters of kv_stage1_body (either core): those of KV_DEFINE_STAGE1_KERNEL, whose
// comments give their shapes.
#define KV_STAGE1_BODY_PARAMS                                                                  \
    const void *__restrict__ q, const unsigned char *__restrict__ p0, long long p0_sb,         \
        long long p0_sh, long long p0_st, int p0_vec, const unsigned char *__restrict__ p1,    \
        long long p1_sb, long long p1_sh, long long p1_st, int p1_vec,                         \
        const unsigned char *__restrict__ p2, long long p2_sb, long long p2_sh,                \
        long long p2_st, int p2_vec, const unsigned char *__restrict__ p3, long long p3_sb,    \
        long long p3_sh, long long p3_st, int p3_vec, const int *__restrict__ block_tables,    \
        int max_blocks, const int *__restrict__ seq_lens, int num_blocks, int block_size,      \
        int window, float scale, float softcap, float v_out_scale, int split_stride,           \
        float *__restrict__ m_part, float *__restrict__ l_part, float *__restrict__ acc_part,  \
        float *__restrict__ o_out, float *__restrict__ lse_out, int *__restrict__ error_flag

#if KVD_USE_MMA
#include "common/decode_mma.cuh"
#else
// The stage-1 body; every entry's extern "C" kernel forwards its parameters here.
__device__ __forceinline__ void kv_stage1_body(KV_STAGE1_BODY_PARAMS) {
    using namespace kvd;
    extern __shared__ __align__(16) unsigned char kv_smem[];
    float* q_s = reinterpret_cast<float*>(kv_smem + OFF_Q);
    const float4* q_s4 = reinterpret_cast<const float4*>(kv_smem + OFF_Q);
    float* p_s = reinterpret_cast<float*>(kv_smem + OFF_P);
    float* a_s = reinterpret_cast<float*>(kv_smem + OFF_A);
    float* ml_s = reinterpret_cast<float*>(kv_smem + OFF_ML);
    int* tp_ring = reinterpret_cast<int*>(kv_smem + OFF_TP);
    float* tab_s = reinterpret_cast<float*>(kv_smem + OFF_TAB);
    unsigned char* stg = kv_smem + OFF_STG;
    (void)tab_s;

    const int split = blockIdx.x;
    const int kvh = blockIdx.y;
    const int b = blockIdx.z;
    const int num_heads = gridDim.y * G;
    const int tid = threadIdx.x;
    const int lane = tid & (KV_WARP - 1);
    const int warp = tid / KV_WARP;

    // The query first: its loads fly with the seq_len and block-table loads below.
    constexpr int QPT = (R * D + THREADS - 1) / THREADS;
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
    // PV thread slot (phase (c)).
    const int pv_c = tid % D4;
    const int pv_slot = tid / D4;
    const int pv_rg = pv_slot % RG;
    const int pv_tg = pv_slot / RG;
    const bool pv_on = pv_slot < RG * TGN;

    if (n_tiles > 0) {  // uniform over the CTA
        // --- prologue: pages of tiles 0 .. STAGES - 1, copies of tiles 0 .. STAGES - 2 ----
        pipe.prologue_pages();
        // --- queries (and the TurboQuant rotation) --------------------------------------
#pragma unroll
        for (int k = 0; k < QPT; ++k) {
            const int idx = tid + k * THREADS;
            if (idx < R * D) {
#if KV_ROTATE_Q
                q_s[idx] = kv_family_q_signed(qx.value(k, q, b, kvh, num_heads), idx % D);
#else
                q_s[idx] = qx.value(k, q, b, kvh, num_heads);
#endif
            }
        }
#if KV_FAMILY_TABLE_FLOATS > 0
        kv_family_init_table(tab_s, tid);
#endif
        __syncthreads();
#pragma unroll 1
        for (int j = 0; j < STAGES - 1; ++j) pipe.issue(j, KV_PLANE_PARAMS);
#if KV_ROTATE_Q
        // The first tiles' copies are already in flight.
        kv_fwht_rows(q_s, tid);
#endif

        // Score-phase thread: token sc_t of the tile, key quads sc_k + KSPLIT * c.
        const int sc_t = warp * TPW + (lane % TPW);
        const int sc_k = lane / TPW;

#pragma unroll 1
        for (int i = 0; i < n_tiles; ++i) {
            if (KVD_PDL_TRIGGER == 1 && i == n_tiles - 1) kv_grid_dep_trigger();
            // Tile i's copies are complete (later tiles' groups may still fly); the barrier
            // also ends every read of iteration i - 1 (its stage, page slot, p_s, a_s).
            pipe.wait<STAGES - 2>(i);
            __syncthreads();
            pipe.issue(i + STAGES - 1, KV_PLANE_PARAMS);
            pipe.advance_pages(i);  // the slot of tile i - 1

            const int t0 = pipe.first_token(i);
            const int n_tile = pipe.tile_tokens(i);
            const int* tp = pipe.pages(i);
            const unsigned char* s = pipe.stage(i);

            // (a) scores: dot(q_r, k_t) (times the family's per-token factor) -> p_s
            {
                const unsigned char* rows[4];
                pipe.rows(s, sc_t, rows);
#if KV_HAS_KMUL
                const float kmul = kv_family_kmul(rows);
#endif
#pragma unroll 1
                for (int r0 = 0; r0 < R; r0 += RS) {
                    float dot[RS];
#pragma unroll
                    for (int j = 0; j < RS; ++j) dot[j] = 0.f;
#pragma unroll 2
                    for (int c = 0; c < KQ; ++c) {
                        const int e4 = sc_k + KSPLIT * c;
                        const float4 kk = kv_family_k4(rows, 4 * e4, tab_s);
#pragma unroll
                        for (int j = 0; j < RS; ++j) {
                            if (r0 + j < R) dot[j] = kv_dot4(q_s4[(r0 + j) * D4 + e4], kk, dot[j]);
                        }
                    }
#pragma unroll
                    for (int j = 0; j < RS; ++j) {
#pragma unroll
                        for (int off = TPW; off < KV_WARP; off <<= 1)
                            dot[j] += __shfl_xor_sync(KV_FULL_MASK, dot[j], off);
                    }
                    if (sc_k == 0) {
#pragma unroll
                        for (int j = 0; j < RS; ++j) {
                            if (r0 + j < R) {
#if KV_HAS_KMUL
                                p_s[(r0 + j) * PSTR + sc_t] = dot[j] * kmul;
#else
                                p_s[(r0 + j) * PSTR + sc_t] = dot[j];
#endif
                            }
                        }
                    }
                }
            }
            __syncthreads();

            // (b) masks and online softmax; warp w owns rows w, w + NW, ...
#pragma unroll
            for (int j = 0; j < RW; ++j) {
                const int r = warp + NW * j;
                if (r < R) {
                    const int pos = seq_len - QL + r / G;
                    float sv[TPL];
                    bool vis[TPL];
                    float mx = kv_neg_inf();
#pragma unroll
                    for (int u = 0; u < TPL; ++u) {
                        const int t = lane + KV_WARP * u;
                        const int tok = t0 + t;
                        vis[u] = t < n_tile && tp[t] >= 0 && tok <= pos &&
                                 (window <= 0 || tok > pos - window);
                        float sx = kv_neg_inf();
                        if (vis[u]) {
                            sx = p_s[r * PSTR + t] * scale;
                            if (KV_SOFTCAP && softcap > 0.f) sx = softcap * tanhf(sx / softcap);
                        }
                        sv[u] = sx;
                        mx = fmaxf(mx, sx);
                    }
                    const KvOnlineStep stp = kv_online_step(m_r[j], kv_warp_max(mx));
                    float psum = 0.f;
#pragma unroll
                    for (int u = 0; u < TPL; ++u) {
                        const float p = vis[u] ? kv_online_p(sv[u], stp) : 0.f;
                        p_s[r * PSTR + lane + KV_WARP * u] = p;
                        psum += p;
                    }
                    psum = kv_warp_sum(psum);
                    l_r[j] = l_r[j] * stp.alpha + psum;
                    m_r[j] = stp.m_new;
                    if (lane == 0) a_s[r] = stp.alpha;
                }
            }
            __syncthreads();

            // (c) acc = acc * alpha + sum_t p_t v_t over this thread's rows, 4 columns and
            // token group. The tile's sum is formed first and then added (two-level sums, as
            // the CPU path), so float32 error grows with the number of tiles, not of tokens;
            // row counts whose tile sums would not fit the registers accumulate directly.
            // Tokens without a valid page are skipped (their staging bytes are garbage).
            if (pv_on) {
                float4 part[TWO_LEVEL ? RPT : 1];
#pragma unroll
                for (int j = 0; j < (TWO_LEVEL ? RPT : 1); ++j)
                    part[j] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
                for (int j = 0; j < RPT; ++j) {
                    const int r = pv_rg + RG * j;
                    if (r < R) {
                        const float a = a_s[r];
                        acc[j].x *= a;
                        acc[j].y *= a;
                        acc[j].z *= a;
                        acc[j].w *= a;
                    }
                }
#pragma unroll 2
                for (int t = pv_tg; t < n_tile; t += TGN) {
                    if (tp[t] < 0) continue;
                    const unsigned char* rows[4];
                    pipe.rows(s, t, rows);
                    const float4 vv = kv_family_v4(rows, 4 * pv_c, tab_s);
#pragma unroll
                    for (int j = 0; j < RPT; ++j) {
                        const int r = pv_rg + RG * j;
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
        }
        // No copy may still target the staging that the token-group sums reuse below.
        kv_cp_async_wait<0>();
        pipe.retire_bulk();
    }

    // --- row totals of (m, l) to shared, token-group partial sums to the staging area ---
    if (lane == 0) {
#pragma unroll
        for (int j = 0; j < RW; ++j) {
            const int r = warp + NW * j;
            if (r < R) {
                ml_s[2 * r] = m_r[j];
                ml_s[2 * r + 1] = l_r[j];
            }
        }
    }
    float* red = reinterpret_cast<float*>(stg);
    __syncthreads();  // every read of the staging (phase (c)) is done; ml_s visible
    if constexpr (TGN > 1) {
        if (pv_on && pv_tg > 0) {
#pragma unroll
            for (int j = 0; j < RPT; ++j) {
                const int r = pv_rg + RG * j;
                if (r < R)
                    reinterpret_cast<float4*>(red + ((pv_tg - 1) * R + r) * D)[pv_c] = acc[j];
            }
        }
        __syncthreads();
    }

    // --- out: row (b, i, h); partial state at [((b * q_len + i) * Hq + h) * split_stride +
    // split], or (one split, no sinks) the final o / lse as stage 2 would compute them.
    if (o_out == nullptr && warp < R && lane == 0) {
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
    if (pv_on && pv_tg == 0) {
#pragma unroll
        for (int j = 0; j < RPT; ++j) {
            const int r = pv_rg + RG * j;
            if (r < R) {
                const int i = r / G;
                const int g = r - i * G;
                const long long row = ((long long)b * QL + i) * num_heads + (long long)kvh * G + g;
                float4 o = acc[j];
                if constexpr (TGN > 1) {
#pragma unroll 1
                    for (int u = 1; u < TGN; ++u) {
                        const float4 x =
                            reinterpret_cast<const float4*>(red + ((u - 1) * R + r) * D)[pv_c];
                        o.x += x.x;
                        o.y += x.y;
                        o.z += x.z;
                        o.w += x.w;
                    }
                }
                o.x *= v_out_scale;
                o.y *= v_out_scale;
                o.z *= v_out_scale;
                o.w *= v_out_scale;
                if (o_out == nullptr) {
                    reinterpret_cast<float4*>(acc_part + (row * split_stride + split) * D)[pv_c] =
                        o;
                } else {
                    // kv_decode_merge_splits with one split and no sink: weight exp(0) = 1,
                    // total = l, o = acc / l, lse = m + log(l); nothing visible: 0 / -inf.
                    const float m = ml_s[2 * r];
                    const float l = ml_s[2 * r + 1];
                    const bool empty = m == kv_neg_inf();
                    float4 y = make_float4(0.f, 0.f, 0.f, 0.f);
                    if (!empty) {
                        y.x = o.x / l;
                        y.y = o.y / l;
                        y.z = o.z / l;
                        y.w = o.w / l;
                    }
                    reinterpret_cast<float4*>(o_out + row * D)[pv_c] = y;
                    if (pv_c == 0) lse_out[row] = empty ? kv_neg_inf() : m + logf(l);
                }
            }
        }
    }
}
#endif  // KVD_USE_MMA

// Launch facts of this module's stage-1 kernel: dynamic shared bytes, threads per CTA, tokens
// per tile (the split heuristic's least split), and the tile loop it was built with (bits:
// 1 tile pairs, 2 the target has bulk copies, 4 warp slabs, 8 packed mma columns
// (decode_mma.cuh KV_MMA_PACK); kvkit/cuda/split_builds.py picks another build of the same
// kernel from them and the length of a split). The launcher reads them once per module
// (cupy RawModule.get_global), so host and device can never disagree.
#if KVD_USE_MMA && KV_MMA_PACK
#define KVD_LOOP_PACKED 8
#else
#define KVD_LOOP_PACKED 0
#endif
#define KVD_LOOP_FLAGS                                                                    \
    ((KVD_TILE_PAIRS ? 1 : 0) | (KVKIT_BULK_COPY ? 2 : 0) | (KVD_BULK_WARP_SLABS ? 4 : 0) | \
     KVD_LOOP_PACKED)
extern "C" {
#if KVD_USE_MMA
__device__ int kv_decode_launch[4] = {kvm::SMEM, kvd::THREADS, kvd::TILE, KVD_LOOP_FLAGS};
#else
__device__ int kv_decode_launch[4] = {kvd::SMEM, kvd::THREADS, kvd::TILE, KVD_LOOP_FLAGS};
#endif
}

// The stage-1 kernel of an entry: KV_DEFINE_STAGE1_KERNEL(name) after including this file.
// Launch: grid (num_splits, Hkv, B), kv_decode_launch[1] threads, kv_decode_launch[0] bytes
// of dynamic shared memory. Planes p0..p3 are the entry's, in the launcher's order (each
// entry's header names them and their widths): (num_blocks, Hkv, block_size, width), strides
// in elements, unused ones a never-read pointer with width 0. `scale` and `v_out_scale` are
// the softmax scale and the acc factor with the family's global scales folded in
// (kvkit/cuda/decode.py stage1_scales).
#define KV_DEFINE_STAGE1_KERNEL(NAME)                                                        \
    extern "C" __global__ __launch_bounds__(kvd::THREADS, KVD_MIN_BLOCKS) void NAME(         \
        const void* __restrict__ q, /* (B, q_len, Hq, D) KV_IN_DTYPE, C-contiguous */        \
        const unsigned char* __restrict__ p0, /* plane 0 (num_blocks, Hkv, bs, width) */     \
        long long p0_sb, long long p0_sh, long long p0_st, /* its strides, elements */       \
        int p0_vec, /* widest aligned load in bytes (16, 8, 4, 2, 1) | KVD_SLAB_BIT */       \
        const unsigned char* __restrict__ p1, /* plane 1, as plane 0 */                      \
        long long p1_sb, long long p1_sh, long long p1_st, int p1_vec,                       \
        const unsigned char* __restrict__ p2, /* plane 2, as plane 0 */                      \
        long long p2_sb, long long p2_sh, long long p2_st, int p2_vec,                       \
        const unsigned char* __restrict__ p3, /* plane 3, as plane 0 */                      \
        long long p3_sb, long long p3_sh, long long p3_st, int p3_vec,                       \
        const int* __restrict__ block_tables, /* (B, max_blocks) */                          \
        int max_blocks,                                                                      \
        const int* __restrict__ seq_lens, /* (B,) */                                         \
        int num_blocks, int block_size,                                                      \
        int window,        /* <= 0: no window */                                             \
        float scale,       /* softmax scale, the family's K scales folded in */              \
        float softcap,     /* <= 0: no soft-cap */                                           \
        float v_out_scale, /* the family's V scale (1 when it has none) */                   \
        int split_stride,  /* >= gridDim.x: the partials' split axis */                      \
        float* __restrict__ m_part,   /* (B, q_len, Hq, split_stride) */                     \
        float* __restrict__ l_part,   /* (B, q_len, Hq, split_stride) */                     \
        float* __restrict__ acc_part, /* (B, q_len, Hq, split_stride, D) */                  \
        float* __restrict__ o_out,    /* (B, q_len, Hq, D) final o, or null: partials only */ \
        float* __restrict__ lse_out,  /* (B, q_len, Hq) final lse, with o_out */             \
        int* __restrict__ error_flag) /* (1,) */                                             \
    {                                                                                        \
        kv_stage1_body(q, p0, p0_sb, p0_sh, p0_st, p0_vec, p1, p1_sb, p1_sh, p1_st, p1_vec,  \
                       p2, p2_sb, p2_sh, p2_st, p2_vec, p3, p3_sb, p3_sh, p3_st, p3_vec,     \
                       block_tables, max_blocks, seq_lens, num_blocks, block_size, window,   \
                       scale, softcap, v_out_scale, split_stride, m_part, l_part, acc_part,  \
                       o_out, lse_out, error_flag);                                          \
    }
