// decode_mma_pairs.cuh: the tile-pair loop of the tensor-core stage 1 (KVD_TILE_PAIRS,
// decode_core.cuh), included inside kv_stage1_body (decode_mma.cuh) just before its
// single-tile loop, in the scope of that loop (pipe, the query addresses, rsc / pos, the
// softmax state). It defines i_rest, the first tile the single-tile loop takes.
//
// Slab launches of warp pipes take tiles i, i + 1 per iteration: both waited, both tiles'
// scores (the query fragments loaded once for both), one online-softmax step over the warp's
// 32 tokens (one max, one rescale test, one l update), both tiles' P parts into one fresh PV
// accumulator per m-tile (kv_pv_mtile2: one IEEE add per 32 tokens), and one loop / PDL test.
// Per tile, as in the single-tile body: the masks (split range, page, causal offsets, window)
// and the fully-visible fast path. An odd last tile, and every tile of launches without
// slabs, is the single-tile loop's.
//
// Pipeline (STAGES = 4; 6 under KVKIT_DECODE_CP_ASYNC_V2=4, decode_core.cuh): the prologue
// issued tiles 0 .. STAGES - 3; the pair at i issues tiles i + STAGES - 2 and i + STAGES - 1
// into the stages of tiles i - 2 and i - 1 (read by the pair before, which the warp barrier
// orders before the copies), so tiles i .. i + STAGES - 1 are issued when the pair computes:
// every tile is waited by the pair or the single tile that reads it (none past n_tiles is
// issued: issue() copies nothing there).
// Page windows (advance_pages): with an even STAGES both issues of a pair lie in one 32-tile
// window (i + STAGES - 2 is even), and the refill before tile 32 w happens after the pair
// whose second issue is tile 32 w - 1 (advance_pages(i): j = i + STAGES).
//
// Numerics: float32 as in the single-tile body (DESIGN.md section 4), in another order: one
// softmax rescale point per 32 tokens, l += (p0 + p1) + (p2 + p3), and the fresh PV
// accumulator takes four (six for bf16 parts) mma products per lane before its one add
// (KV_MMA_VCODES_F16: the rows' powers of two per pair, over both tiles' tokens).
static_assert((KVD_WARP_PIPE || KVD_CP_RINGLESS) && KV_MMA_V_REGS && KV_MMA_K_REGS &&
                  !KV_MMA_K_DIRECT && !KV_MMA_BF16 && !KV_MMA_NANTILE_K && !KV_MMA_NANTILE_V,
              "tile pairs: page windows with register keys and values only");
static_assert(STAGES == 4 || (KVD_CP_PAIRS && STAGES == 6),
              "tile pairs: 4 stages (cp.async: 4 or 6), an even count (decode_core.cuh)");
int i_rest = 0;
if (pipe.slabs) {
#if KVD_PAIR_ADDR && defined(KV_MMA_LANE_SLOT)
    // Lane offsets of one-row slots (decode_core.cuh KVD_PAIR_ADDR; TurboQuant's codebook
    // presets, KV_MMA_LANE_SLOT): the one plane's row holds everything a lane reads, so three
    // byte offsets in a stage, worked out once and held (opaque copies): lkb, the score token
    // kv_mma_tok(g)'s row (its key factor, and the PV step's value scale and zero); lkl, that
    // row plus the key lane term kv_mma_klane (the code run kv_mma_kload reads with c = 0);
    // lvl, the PV token kv_mma_tok(2 c)'s row plus the value lane term kv_mma_vlane (what
    // kv_mma_vload_at reads). The other tokens are whole rows on, constants: tok(i) of the form
    // a(c) + B e + K f (i = 2 c + e + 8 f; decode_mma.cuh KV_MMA_TOKEN_A, or tokens in order:
    // B = 1, K = 8), so tok(g + 8) = tok(g) + K and tok(2 c + e + 8 f) = tok(2 c) + B e + K f.
    static_assert(KV_NPLANES == 1 && kvd::GP0 == 0, "slot lane offsets: one plane, no gaps");
    static_assert(KV_HAS_KMUL && KV_MMA_VCODES, "slot lane offsets: TurboQuant's hooks' rows");
    static_assert(!KV_MMA_TOKEN_SWAP, "slot lane offsets: a token order linear in e, f");
    constexpr int SR0 = KV_P0_BYTES % 16 == 0 ? kvd::WP0 : KV_P0_BYTES;
#if defined(KV_MMA_TOKEN_A)
    constexpr int TB = KV_MMA_TOKEN_B, TK = KV_MMA_TOKEN_K;
#else
    constexpr int TB = 1, TK = 8;
#endif
    // lkb is held halved (rows 2-byte aligned, TQ_SLOT_BYTES even): s + 2 lkb tells the
    // compiler so, and the 2-byte fields (key norm, value scale and zero, read bytewise by
    // kv_dc_f16_at) stay one 2-byte load each (an opaque lkb took two byte loads and a PRMT:
    // +24 per pair); the doubling folds into the address add (LEA).
    static_assert(SR0 % 2 == 0, "slot lane offsets: 2-byte aligned rows");
    unsigned lkb, lkl, lvl;
    {
        const int tk = tw0 + kv_mma_tok(g);
        const int tv = tw0 + kv_mma_tok(2 * c);
        asm volatile("mov.b32 %0, %3;\n\tmov.b32 %1, %4;\n\tmov.b32 %2, %5;"
                     : "=r"(lkb), "=r"(lkl), "=r"(lvl)
                     : "r"(tk * (SR0 / 2)), "r"(tk * SR0 + kv_mma_klane(0, c)),
                       "r"(tv * SR0 + kv_mma_vlane(0, g)));
    }
#if defined(KV_MMA_KLOAD_AL)
    // (KV_MMA_KLOAD_AL) The code run's alignment, held: a lane's runs (tokens tok(g) and
    // tok(g) + TK, both tiles) share lkl's address mod 4 (stages and TK rows whole words
    // apart, the stage 16-byte aligned), so lkl is held rounded down to a word with the
    // funnel shift 8 (lkl mod 4) beside it, not worked out again per run (kv_tq_load_words'
    // a = p & 3, p - a and 8 a: three instructions a run, four runs a pair).
    // (Not where TK rows are 2 mod 4 bytes: 4bit_nc's KVKIT_DECODE_TQ_TOKEN_ORDER=2 at 256.)
    constexpr bool KAL = kvd::STAGE_BYTES % 4 == 0 && (TK * SR0) % 4 == 0;
    unsigned ksh = 0u;
    if constexpr (KAL) {
        asm volatile("and.b32 %1, %0, 3;\n\tshl.b32 %1, %1, 3;\n\tand.b32 %0, %0, -4;"
                     : "+r"(lkl), "=r"(ksh));
    }
#if defined(KV_MMA_KLOAD_AL2)
    // (KV_MMA_KLOAD_AL2: 3bit_nc's KVKIT_DECODE_TQ3_ORDER64, decode_turboquant.cu) TK rows 2
    // mod 4 bytes apart: lkl mod 4 is 0 or 2 (even rows, lane terms and stage offsets), so the
    // TK row's run starts 2 or 4 bytes past the word TK SR0 - 2 bytes after lkl rounded down;
    // that word and the shift 8 (lkl mod 4) + 16 (ksh2, a clamped funnel shift: 32 takes the
    // next word) are held too, and both runs load as KAL's do.
    constexpr bool KAL2 = kvd::STAGE_BYTES % 4 == 0 && (TK * SR0) % 4 == 2;
    static_assert(KAL2, "held K-row runs: TK rows 2 mod 4 bytes apart, whole-word stages");
    unsigned ksh2 = 0u;
    asm volatile("and.b32 %1, %0, 3;\n\tshl.b32 %1, %1, 3;\n\tand.b32 %0, %0, -4;\n\t"
                 "add.u32 %2, %1, 16;"
                 : "+r"(lkl), "=r"(ksh), "=r"(ksh2));
    constexpr int KTT = TK * SR0 - 2;  // the TK row's held word, from lkl
#else
    constexpr int KTT = TK * SR0;
#endif
#else
    constexpr int KTT = TK * SR0;
#endif
    constexpr int LC = 0;  // the key lane term is in lkl: the hook's c
#if defined(KV_MMA_VLOAD_AT4)
    // (KV_MMA_VLOAD_AT4, below) Where lvl's row part (tw0 + tok(2 c)) SR0 is a whole number of
    // words for every lane (tw0 = 16 w; tok(2 c) = 2 c in order, a(c) with KV_MMA_TOKEN_A:
    // not k3v4_nc's order at D = 64, a(c) = 0, 1, 4, 5 on 62-byte rows) and so are the stages'
    // offsets, a PV row's address mod 4 is its constant row part's.
#if defined(KV_MMA_TOKEN_A)
    constexpr bool VAL4 = kvd::STAGE_BYTES % 4 == 0 &&
                          (SR0 % 4 == 0 || (KV_MMA_TOKEN_A & 0x1111u) == 0);
#else
    constexpr bool VAL4 = kvd::STAGE_BYTES % 4 == 0;
#endif
#endif
#elif KVD_PAIR_ADDR
    // Lane offsets (decode_core.cuh KVD_PAIR_ADDR): the byte offsets in their plane's region
    // of a stage of the rows the hooks read, their lane terms (kv_mma_klane / kv_mma_vlane)
    // included, for the score token kv_mma_tok(g) (codes lk0, scales lk1; token g + 8 is 8
    // rows on) and the PV token kv_mma_tok(2 c) (lv2, lv3; 2 c + 1 is kv_mma_tok(2 c) ^ 1, and
    // with a power-of-two row stride above the lane term (codes 8 g < 64 at D = 128, scales
    // g < 8) its offset is that one ^ the stride; 2 c + 8, 2 c + 9 are 8 rows on). Opaque
    // copies: held over the loop, not rebuilt from the lane index every pair.
    static_assert(kvd::GP0 == 0 && kvd::GP1 == 0 && kvd::GP2 == 0 && kvd::GP3 == 0,
                  "pair lane offsets: rows without gaps (offsets linear in the token)");
    static_assert(!KV_HAS_KMUL && !KV_MMA_VCODES, "pair lane offsets: the NVFP4 hooks' rows only");
    // The staging row strides of slab launches (KvTilePipe::rows_slabs's).
    constexpr int SR0 = KV_P0_BYTES % 16 == 0 ? kvd::WP0 : KV_P0_BYTES;
    constexpr int SR1 = KV_P1_BYTES % 16 == 0 ? kvd::WP1 : KV_P1_BYTES;
    constexpr int SR2 = KV_P2_BYTES % 16 == 0 ? kvd::WP2 : KV_P2_BYTES;
    constexpr int SR3 = KV_P3_BYTES % 16 == 0 ? kvd::WP3 : KV_P3_BYTES;
#if KVD_CP_PAIRS
    // The cp.async staging's padded rows (48 / 80 bytes at D = 64 / 128) are no power of two,
    // so token 2 c + 1's row is lv + SR (natural token order: kv_mma_tok(2 c) = 2 c is even,
    // so kv_mma_tok(2 c + 1) is the next row), not lv ^ SR.
#if KV_MMA_TOKEN_SWAP || defined(KV_MMA_TOKEN_A)
#error "cp.async pair lane offsets: tokens in their natural order"
#endif
#else
    static_assert((SR2 & (SR2 - 1)) == 0 && (SR3 & (SR3 - 1)) == 0,
                  "pair lane offsets: value rows a power of two apart");
#endif
    unsigned lk0, lk1, lv2, lv3;
    {
        const int tk = tw0 + kv_mma_tok(g);
        const int tv = tw0 + kv_mma_tok(2 * c);
        asm volatile("mov.b32 %0, %4;\n\tmov.b32 %1, %5;\n\tmov.b32 %2, %6;\n\tmov.b32 %3, %7;"
                     : "=r"(lk0), "=r"(lk1), "=r"(lv2), "=r"(lv3)
                     : "r"(tk * SR0 + kv_mma_klane(0, c)), "r"(tk * SR1 + kv_mma_klane(1, c)),
                       "r"(tv * SR2 + kv_mma_vlane(2, g)),
                       "r"(tv * SR3 + kv_mma_vlane(3, g)));
    }
    constexpr int LC = 0;  // the lane terms are in the offsets: the hooks' c and g
#else
    const int LC = c;
#endif
#pragma unroll 1
    for (; i_rest + 1 < n_tiles; i_rest += 2) {
        const int ia = i_rest;  // tiles ia (h = 0) and ia + 1 (h = 1)
        // PDL: at the start of the pair that holds the last tile.
        if (KVD_PDL_TRIGGER == 1 && ia + 2 >= n_tiles) kv_grid_dep_trigger();
#if KVD_PAIR_ADDR && !KVD_CP_PAIRS
        pipe.wait_pair(ia);
        pipe.tile_sync();  // the warp's barrier: the pair before's reads before the refills
        pipe.issue_pair(ia + STAGES - 2, KV_PLANE_PARAMS);
#else
#if KVD_CP_PAIRS
        // cp.async (KVD_CP_PAIRS): one commit group per issued tile, counted per thread; the
        // groups of tiles 0 .. ia + STAGES - 3 are committed, so tiles ia and ia + 1 have
        // landed when at most STAGES - 4 groups (tiles ia + 2 .. ia + STAGES - 3: none at four
        // stages, one pair at six) are pending (this thread's copies; the __syncwarp of
        // tile_sync then orders every lane's copies of the warp's rows before the warp's
        // reads of them, as in the single-tile loop of =2).
        pipe.wait<STAGES - 4>(ia + 1);
#else
        pipe.wait<STAGES - 2>(ia);
        pipe.wait<STAGES - 2>(ia + 1);
#endif
        pipe.tile_sync();  // the warp's barrier: the pair before's reads before the refills
        pipe.issue(ia + STAGES - 2, KV_PLANE_PARAMS);
        pipe.issue(ia + STAGES - 1, KV_PLANE_PARAMS);
#endif
        pipe.advance_pages(ia);
        bool whp[2];
        int t0[2];
        int n_tile[2];
        const unsigned char* kr[2][2][4];  // [h][tt][plane]: score tokens g, g + 8
#if KVD_PAIR_ADDR && defined(KV_MMA_LANE_SLOT)
        const unsigned char* kl[2][2];  // [h][tt]: their code runs (lane offsets)
#endif
#if KVD_PAIR_TRIMS
        // (KVD_PAIR_TRIMS) Tile ia + 1's stage is the one after tile ia's (ia, STAGES even):
        // its rows are immediates from the same registers. stage(ia + 1) as its own
        // (ia + 1) % STAGES product left ptxas a second stage address and a second vector add
        // per row, per tile. The same addresses.
        const unsigned char* const sp = pipe.stage(ia);
#endif
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            whp[h] = pipe.warp_has_page_at(h);
            t0[h] = pipe.first_token(ia + h);
            n_tile[h] = pipe.tile_tokens(ia + h);
#if KVD_PAIR_TRIMS
            const unsigned char* s = sp + h * kvd::STAGE_BYTES;
#else
            const unsigned char* s = pipe.stage(ia + h);
#endif
#if KVD_PAIR_ADDR && defined(KV_MMA_LANE_SLOT)
#pragma unroll
            for (int tt = 0; tt < 2; ++tt) {
                kr[h][tt][0] = s + 2 * lkb + tt * TK * SR0;  // (the key factor's row)
                kl[h][tt] = s + lkl + tt * KTT;          // (the code run, lane term in)
                kr[h][tt][1] = kr[h][tt][2] = kr[h][tt][3] = s;  // (not read: one plane)
            }
#elif KVD_PAIR_ADDR
#pragma unroll
            for (int tt = 0; tt < 2; ++tt) {
                kr[h][tt][0] = s + lk0 + tt * 8 * SR0;
                kr[h][tt][1] = s + kvd::SO1 + lk1 + tt * 8 * SR1;
                kr[h][tt][2] = kr[h][tt][3] = s;  // (not read: KV_HAS_KMUL 0)
            }
#else
            pipe.rows_slabs(s, tw0 + kv_mma_tok(g), kr[h][0]);
            pipe.rows_slabs(s, tw0 + kv_mma_tok(g + 8), kr[h][1]);
#endif
        }

        // (a2) pair scores: S^T = K Q^T for both tiles; each query fragment loaded once.
        float sc[2][NR][4];
        [[maybe_unused]] float sq[2][NR][4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int nr = 0; nr < NR; ++nr) {
#pragma unroll
                for (int e = 0; e < 4; ++e) sc[h][nr][e] = sq[h][nr][e] = 0.f;
            }
        }
        unsigned kraw[2][2][KV_MMA_KRAW];
        float km[2][2];  // the per-token score factors, read with the keys (kr dies here)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#if KVD_PAIR_ADDR && defined(KV_MMA_LANE_SLOT) && defined(KV_MMA_KLOAD_AL)
#if defined(KV_MMA_KLOAD_AL2)
            kv_mma_kload_al(kl[h][0], ksh, kraw[h][0]);     // (kl rounded down to a word)
            kv_mma_kload_al<true>(kl[h][1], ksh2, kraw[h][1]);  // (the run 2 or 4 bytes on)
#else
            if constexpr (KAL) {
                kv_mma_kload_al(kl[h][0], ksh, kraw[h][0]);  // (kl rounded down to a word)
                kv_mma_kload_al(kl[h][1], ksh, kraw[h][1]);
            } else {
                kv_mma_kload(&kl[h][0], LC, kraw[h][0]);
                kv_mma_kload(&kl[h][1], LC, kraw[h][1]);
            }
#endif
#elif KVD_PAIR_ADDR && defined(KV_MMA_LANE_SLOT)
            kv_mma_kload(&kl[h][0], LC, kraw[h][0]);
            kv_mma_kload(&kl[h][1], LC, kraw[h][1]);
#else
            kv_mma_kload(kr[h][0], LC, kraw[h][0]);
            kv_mma_kload(kr[h][1], LC, kraw[h][1]);
#endif
#pragma unroll
            for (int tt = 0; tt < 2; ++tt) {
#if KV_HAS_KMUL
                km[h][tt] = kv_family_kmul(kr[h][tt]);
#else
                km[h][tt] = 1.f;
#endif
            }
        }
#if KV_HEAD_DIM > 128
        // D = 256 (KV_TILE_PAIRS_MAX_D): the same k-steps with compile-time indices
        // (kv_pair_scores, decode_mma.cuh), as #pragma unroll left this loop rolled for
        // 3-bit keys (their code offsets fold only once ks is a constant).
        static_assert(!(KV_MMA_QSPLIT && !KV_MMA_PACK), "D = 256 pairs: packed columns");
        kv_pair_scores<0>(kraw, tab_s, qh_addr, sc);
#else
#pragma unroll
        for (int ks = 0; ks < KS; ks += 2) {
            unsigned qh[NR][4];
            unsigned ql[NR][4];
#pragma unroll
            for (int nr = 0; nr < NR; ++nr) {
                kv_ldsm_x4(qh[nr], qh_addr + nr * 16 * QSTR + ks * 32);
#if KV_MMA_QSPLIT && !KV_MMA_PACK
                kv_ldsm_x4(ql[nr], ql_addr + nr * 16 * QSTR + ks * 32);
#endif
            }
            (void)ql;
#pragma unroll
            for (int u = 0; u < 2; ++u) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    unsigned ah[4];
                    kv_mma_kstep_sel(false, kraw[h][0], ks + u, tab_s, &ah[0], &ah[2]);
                    kv_mma_kstep_sel(false, kraw[h][1], ks + u, tab_s, &ah[1], &ah[3]);
#pragma unroll
                    for (int nr = 0; nr < NR; ++nr) {
                        kv_mma_f16(sc[h][nr], ah, qh[nr][2 * u], qh[nr][2 * u + 1]);
#if KV_MMA_QSPLIT && !KV_MMA_PACK
                        kv_mma_f16(sq[h][nr], ah, ql[nr][2 * u], ql[nr][2 * u + 1]);
#endif
                    }
                }
            }
        }
#endif
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int nr = 0; nr < NR; ++nr) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
#if KV_MMA_PACK
                    // The q lo chain sits in lane c ^ 2 (columns r + 4); the same add.
                    if constexpr (KV_MMA_QSPLIT)
                        sc[h][nr][e] += __shfl_xor_sync(KV_FULL_MASK, sc[h][nr][e], 2);
#elif KV_MMA_QSPLIT
                    sc[h][nr][e] += sq[h][nr][e];  // the q lo chain
#endif
                }
            }
        }

        // (b2) pair softmax: masks per tile as in the single-tile body (its comment (b)), then
        // one online-softmax step over the thread's 4 tokens and the 8 lanes sharing c.
#if KVD_PAIR_TRIMS
        auto tile_full = [&](int h) {
            return !KVD_MASK_ALL && t0[h] + TILE <= pipe.t_hi &&
                   (QL == 1 || t0[h] + (TILE - 1) <= seq_len - QL) &&
                   (window <= 0 || t0[h] >= seq_len - window) && whp[h];
        };
        // (KVD_PAIR_TRIMS) Both tiles fully visible, tested once (t0[1] = t0[0] + TILE: tile
        // 1's range and causal tests imply tile 0's, tile 0's window test tile 1's): then
        // full[0] and full[1] hold, and the per-tile mask blocks below (softmax masks, PV
        // operand zeroing), which run only for a tile that is not full, are skipped behind
        // this one branch instead of four. full[h] is still what those blocks test.
        const bool full2 = !KVD_MASK_ALL && t0[0] + 2 * TILE <= pipe.t_hi &&
                           (QL == 1 || t0[0] + (2 * TILE - 1) <= seq_len - QL) &&
                           (window <= 0 || t0[0] >= seq_len - window) && pipe.warp_has_pages_01();
        bool full[2];  // (worked out behind !full2 below, where the mask blocks test it)
#else
        bool full[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            full[h] = !KVD_MASK_ALL && t0[h] + TILE <= pipe.t_hi &&
                      (QL == 1 || t0[h] + (TILE - 1) <= seq_len - QL) &&
                      (window <= 0 || t0[h] >= seq_len - window) && whp[h];
        }
#endif
        float p[NR][2][4];  // [nr][j][2 h + tt]: logits, then weights
#pragma unroll
        for (int nr = 0; nr < NR; ++nr) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
#pragma unroll
                    for (int tt = 0; tt < 2; ++tt) {
                        float x = sc[h][nr][2 * tt + j] * km[h][tt] * rsc[nr][j];
                        if (KV_SOFTCAP && softcap > 0.f) x = (softcap * KV_LOG2E) * tanhf(x * KV_LN2 / softcap);
                        p[nr][j][2 * h + tt] = x;
                    }
                }
            }
        }
        bool ok[2][2] = {{true, true}, {true, true}};
#if KVD_PAIR_TRIMS
        // (KVD_PAIR_TRIMS) ok's four flags as bits of one word past the mask block (value
        // codes' scale and zero reads, kv_mma_vtok, below): as four bools merged from the two
        // sides of !full2, ptxas kept them as bytes (four moves, then a sign-extending PRMT
        // and a test each). Unused by NVFP4's loop (its PV block tests full[h] again).
        [[maybe_unused]] unsigned okm = 15u;
        if (!full2) {
#endif
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#if KVD_PAIR_TRIMS
            full[h] = tile_full(h);  // (only here and in the PV block's twin below)
#endif
            if (!full[h]) {
#pragma unroll
                for (int tt = 0; tt < 2; ++tt) {
                    const int t = tw0 + kv_mma_tok(g + 8 * tt);
                    ok[h][tt] = t < n_tile[h] && whp[h];
                }
#pragma unroll
                for (int nr = 0; nr < NR; ++nr) {
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
#pragma unroll
                        for (int tt = 0; tt < 2; ++tt) {
                            const int tok = t0[h] + tw0 + kv_mma_tok(g + 8 * tt);
                            const int pj = row_pos(nr, j);
                            const bool vis = ok[h][tt] && tok <= pj &&
                                             (window <= 0 || tok > pj - window);
                            if (!vis) p[nr][j][2 * h + tt] = kv_neg_inf();
                        }
                    }
                }
            }
        }
#if KVD_PAIR_TRIMS
        okm = (ok[0][0] ? 1u : 0u) | (ok[0][1] ? 2u : 0u) | (ok[1][0] ? 4u : 0u) |
              (ok[1][1] ? 8u : 0u);
        }
#endif
        float alpha[NR][2];
        kv_mma_softmax_step<4>(p, m_r, l_r, acc, alpha);

        // (c2) pair PV: O^T += V^T P^T for both tiles, one fresh accumulator per m-tile.
#if KV_MMA_PV_BF16 || KV_MMA_VCODES_F16
#if KV_MMA_VCODES_F16
        constexpr int NPART = KV_MMA_PACK ? 1 : 2;  // W s_r as fp16 hi + lo
#else
        constexpr int NPART = KV_MMA_PACK ? 2 : 3;
#endif
        float vs[2][2] = {{1.f, 1.f}, {1.f, 1.f}};
#if KV_MMA_VCODES
        // The tokens' value scale and zero from row pointers worked out again from an opaque
        // copy of the tile index: the score's pointers (kr) would otherwise be held through
        // the softmax (TurboQuant at 8 rows spilled on sm_90 with them).
        const unsigned char* kv[2][2][4];
        {
            int io;
            asm volatile("mov.b32 %0, %1;" : "=r"(io) : "r"(ia));
#pragma unroll
            for (int h = 0; h < 2; ++h) {
#if KVD_PAIR_TRIMS
                // (KVD_PAIR_TRIMS) As the scores' rows: one stage address, tile 1's rows as
                // immediates off it (io opaque still, so the rows are rebuilt, not held).
                const unsigned char* s = pipe.stage(io) + h * kvd::STAGE_BYTES;
#else
                const unsigned char* s = pipe.stage(io + h);
#endif
#if KVD_PAIR_ADDR && defined(KV_MMA_LANE_SLOT)
#pragma unroll
                for (int tt = 0; tt < 2; ++tt) {
                    kv[h][tt][0] = s + 2 * lkb + tt * TK * SR0;
                    kv[h][tt][1] = kv[h][tt][2] = kv[h][tt][3] = s;  // (not read: one plane)
                }
#else
                pipe.rows_slabs(s, tw0 + kv_mma_tok(g), kv[h][0]);
                pipe.rows_slabs(s, tw0 + kv_mma_tok(g + 8), kv[h][1]);
#endif
            }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int tt = 0; tt < 2; ++tt) {
                float sc_t = 0.f, z_t = 0.f;
#if KVD_PAIR_TRIMS
                const bool okt = (okm >> (2 * h + tt)) & 1u;
#else
                const bool okt = ok[h][tt];
#endif
                if (okt) kv_mma_vtok(kv[h][tt], &sc_t, &z_t);
                vs[h][tt] = sc_t;
#pragma unroll
                for (int nr = 0; nr < NR; ++nr) {
#pragma unroll
                    for (int j = 0; j < 2; ++j) {
                        if (h == 0 && tt == 0) z_r[nr][j] *= alpha[nr][j];
                        z_r[nr][j] = fmaf(p[nr][j][2 * h + tt], z_t, z_r[nr][j]);
                    }
                }
            }
        }
#endif
        unsigned bp[2][NR][NPART][2];
#if KV_MMA_VCODES_F16
        // (KV_MMA_VCODES_F16) One power of two per row for the pair's fresh accumulator (both
        // tiles' 32 tokens): W s_r as fp16 hi + lo.
        float w16i[NR][2];
#pragma unroll
        for (int nr = 0; nr < NR; ++nr) {
            float w[2][4], s16[2];
#pragma unroll
            for (int j = 0; j < 2; ++j) {
#pragma unroll
                for (int t = 0; t < 4; ++t) w[j][t] = p[nr][j][t] * vs[t >> 1][t & 1];
            }
            kv_w16_pow2<4>(w, s16, w16i[nr]);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
#pragma unroll
                for (int tt = 0; tt < 2; ++tt) {
                    const float x0 = w[0][2 * h + tt] * s16[0], x1 = w[1][2 * h + tt] * s16[1];
#if KV_MMA_PACK
                    bp[h][nr][0][tt] = kv_movmatrix_trans(kv_split_f16x2_packed(x0, x1, pk_negm));
#else
                    unsigned hi, lo;
                    kv_split_f16x2(x0, x1, &hi, &lo);
                    bp[h][nr][0][tt] = kv_movmatrix_trans(hi);
                    bp[h][nr][1][tt] = kv_movmatrix_trans(lo);
#endif
                }
            }
        }
#else
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int nr = 0; nr < NR; ++nr) {
#pragma unroll
                for (int tt = 0; tt < 2; ++tt) {
                    unsigned t3[3];
                    kv_split3_bf16x2(p[nr][0][2 * h + tt] * vs[h][tt],
                                     p[nr][1][2 * h + tt] * vs[h][tt], t3);
#if KV_MMA_PACK
                    bp[h][nr][0][tt] = kv_movmatrix_trans(c < 2 ? t3[0] : t3[1]);
                    bp[h][nr][1][tt] = kv_movmatrix_trans(c < 2 ? t3[2] : 0u);
#else
#pragma unroll
                    for (int k = 0; k < 3; ++k) bp[h][nr][k][tt] = kv_movmatrix_trans(t3[k]);
#endif
                }
            }
        }
#endif
#else
        // Packed columns (KV_MMA_PACK_F16): one part per lane, one mma per m-tile and tile;
        // else P's hi and lo parts, two mmas.
        constexpr int NPART = KV_MMA_PACK ? 1 : 2;
        unsigned bp[2][NR][NPART][2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int nr = 0; nr < NR; ++nr) {
#pragma unroll
                for (int tt = 0; tt < 2; ++tt) {
#if KV_MMA_PACK
                    bp[h][nr][0][tt] = kv_movmatrix_trans(
                        kv_split_f16x2_packed(p[nr][0][2 * h + tt] * P_SCALE,
                                              p[nr][1][2 * h + tt] * P_SCALE, pk_negm));
#else
                    unsigned hi, lo;
                    kv_split_f16x2(p[nr][0][2 * h + tt] * P_SCALE, p[nr][1][2 * h + tt] * P_SCALE,
                                   &hi, &lo);
                    bp[h][nr][0][tt] = kv_movmatrix_trans(hi);
                    bp[h][nr][1][tt] = kv_movmatrix_trans(lo);
#endif
                }
            }
        }
#endif
        // V^T's A fragments from registers, per tile as in the single-tile body.
        unsigned vraw[2][4][KV_MMA_VRAW];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#if KVD_PAIR_TRIMS
            const unsigned char* s = sp + h * kvd::STAGE_BYTES;  // (as the scores' rows)
#else
            const unsigned char* s = pipe.stage(ia + h);
#endif
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const unsigned char* rv[4];
#if KVD_PAIR_ADDR && defined(KV_MMA_LANE_SLOT)
                rv[0] = s + lvl + ((k & 1) * TB + (k >> 1) * TK) * SR0;
                rv[1] = rv[2] = rv[3] = s;  // (not read: one plane)
#if defined(KV_MMA_VLOAD_AT4)
                // (KV_MMA_VLOAD_AT4) The row's address mod 4, known here: the stage is 16-byte
                // aligned (bulk copies), STAGE_BYTES and lvl's row part (tw0 + tok(2 c)) SR0 are
                // whole words (VROW4 below), so it is the constant row part's mod 4; the family
                // loads by it (whole words where its run is aligned). The same bytes.
                // (k is a constant after the unrolling: one call remains.)
                if (!VAL4) {
                    kv_mma_vload_at(rv, g, vraw[h][k]);
                } else if (k == 0) {
                    kv_mma_vload_at4<0>(rv, g, vraw[h][k]);
                } else if (k == 1) {
                    kv_mma_vload_at4<(TB * SR0) % 4>(rv, g, vraw[h][k]);
                } else if (k == 2) {
                    kv_mma_vload_at4<(TK * SR0) % 4>(rv, g, vraw[h][k]);
                } else {
                    kv_mma_vload_at4<((TB + TK) * SR0) % 4>(rv, g, vraw[h][k]);
                }
#else
                kv_mma_vload_at(rv, g, vraw[h][k]);
#endif
#elif KVD_PAIR_ADDR
                rv[0] = rv[1] = s;  // (not read by kv_mma_vload)
#if KVD_CP_PAIRS
                // (Natural token order, rows not a power of two apart: the next row is + SR.)
                rv[2] = s + kvd::SO2 + lv2 + ((k & 1) + (k >> 1) * 8) * SR2;
                rv[3] = s + kvd::SO3 + lv3 + ((k & 1) + (k >> 1) * 8) * SR3;
#else
                rv[2] = s + kvd::SO2 + ((k & 1) ? lv2 ^ SR2 : lv2) + (k >> 1) * 8 * SR2;
                rv[3] = s + kvd::SO3 + ((k & 1) ? lv3 ^ SR3 : lv3) + (k >> 1) * 8 * SR3;
#endif
                kv_mma_vload(rv, 0, vraw[h][k]);
#else
                pipe.rows_slabs(s, tw0 + kv_mma_tok(2 * c + (k & 1) + 8 * (k >> 1)), rv);
                kv_mma_vload(rv, g, vraw[h][k]);
#endif
            }
#if !KV_MMA_VCODES
            // Invalid tokens' raw words to 0 (+0 operands; values may be NaN there).
#if KVD_PAIR_TRIMS
            if (!full2) {
            full[h] = tile_full(h);
#endif
            if (!full[h]) {
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const int t = tw0 + kv_mma_tok(2 * c + (k & 1) + 8 * (k >> 1));
                    if (!(t < n_tile[h] && whp[h])) {
#pragma unroll
                        for (int e = 0; e < KV_MMA_VRAW; ++e) vraw[h][k][e] = 0u;
                    }
                }
            }
#if KVD_PAIR_TRIMS
            }
#endif
#endif
        }
#pragma unroll
        for (int mi = 0; mi < MT; ++mi) {
            unsigned av[2][4];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                kv_mma_vpair_sel(false, vraw[h][0], vraw[h][1], mi, &av[h][0], &av[h][1]);
                kv_mma_vpair_sel(false, vraw[h][2], vraw[h][3], mi, &av[h][2], &av[h][3]);
            }
#if KV_MMA_VCODES_F16
            kv_pv_mtile2<NPART>(&acc[0][mi], av, bp, MT, w16i);
#else
            kv_pv_mtile2<NPART>(&acc[0][mi], av, bp, MT);
#endif
        }
        // (e2) pair end
    }
    // An odd tile count leaves the last tile to the single-tile loop, which issues tile
    // i_rest + STAGES - 1 and finds tile i_rest's page bit at STAGES - 1: the issue of tile
    // i_rest + STAGES - 2 (past the last tile: no copy, the bit shift only) keeps both.
    if (i_rest < n_tiles) pipe.issue(i_rest + STAGES - 2, KV_PLANE_PARAMS);
}
