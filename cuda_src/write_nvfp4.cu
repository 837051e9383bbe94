// write_nvfp4.cu: NVFP4 quantize-on-write (kvkit/formats/nvfp4.py; CPU twin kvkit/cpu/write.py).
//
// Per 16-element block x (float32), in this order (no fused multiply-add anywhere):
//   amax = fmaxf-fold of |x_i| (NaN-ignoring)
//   sf   = e4m3_satfinite(amax / (6 * g));  den = e4m3(sf) * g;  inv = den != 0 ? 1 / den : 0
//   q_i  = e2m1_satfinite(x_i * inv)
// KV_NVFP4_FOUR_OVER_SIX=1 also forms the candidate with 4 in place of 6 and keeps it when its
// squared error sum_i d_i*d_i (d_i = x_i - (e2m1(q_i) * e4m3(sf)) * g, summed i = 0..15 in
// float32) is strictly lower. On the fast block (below) variant 1 decides by cheaper
// approximate errors wherever a proven margin allows and by the spec's errors elsewhere
// (kv_nvfp4_46_sure).
// Launch defines: KV_IN_DTYPE (0 float32, 1 float16, 2 bfloat16 bits), KV_SLOT_T, KV_NVFP4_BPT,
// KV_NVFP4_46_VARIANT (4over6 only).
//
// Fast block (software E2M1 targets, nearly every block): g > 0 and RN(amax * inv) < 7 for
// every candidate; then E2M1 codes by one magic add per element (fp4.cuh kv_e2m1_magic), packed
// by permutes, signs from the raw input words. Anything else (NaN / inf inputs, saturated or
// subnormal scales) takes the general encoders. Both give the spec's bytes (CPU models and
// tests: kvkit/formats/arch_models.py e2m1_magic / nvfp4_fast_words, tests/formats/
// test_e2m1_magic.py).
//
// Mapping: one thread per (token, head, KV_NVFP4_BPT consecutive 16-element blocks), K then V.
// Negative slot: skipped.
// Slot >= capacity: skipped, error_flag |= 1 (once per token).
#include "common/arch.cuh"
#include "common/fp16.cuh"
#include "common/fp8.cuh"
#include "common/fp4.cuh"
#include "common/paged.cuh"

#if !defined(KV_FORMAT_NVFP4) || !defined(KV_HEAD_DIM) || !defined(KV_NVFP4_BLOCK)
#error "write_nvfp4.cu needs the defines of an NVFP4 format (fmt.cuda_defines())"
#endif
#if KV_NVFP4_BLOCK != 16
#error "the kernel's register layout assumes 16-element scale blocks"
#endif

// __launch_bounds__(.., KV_WRITE_NVFP4_MIN_CTAS): nvfp4 takes 1 (no register cap: without the
// minimum-blocks hint ptxas for some targets (sm_86, sm_120a) capped registers for occupancy
// and spilled a few bytes; it takes 66..96 registers). nvfp4_4over6 takes 6: uncapped, ptxas
// spends 128 registers on the two fused fast candidates (16 warps per SM); capped at 80 (6
// CTAs, 24 warps per SM, the occupancy of the kernel before the fast path) no target spills
// and the fast path's sm_90 instruction count does not grow.
// 128 threads: small CTAs spread short writes (a few tokens) over more SMs.
// KV_WRITE_NVFP4_MIN_CTAS may come from the launcher (KVKIT_WRITE_NVFP4_MIN_CTAS, A/B sweeps).
#define KV_WRITE_NVFP4_THREADS 128
#ifndef KV_WRITE_NVFP4_MIN_CTAS
#if KV_NVFP4_FOUR_OVER_SIX
#define KV_WRITE_NVFP4_MIN_CTAS 6
#else
#define KV_WRITE_NVFP4_MIN_CTAS 1
#endif
#endif
#define KV_NVFP4_BLOCKS (KV_HEAD_DIM / KV_NVFP4_BLOCK)
// Blocks per thread (the launcher passes it: kvkit.cuda.write.nvfp4_blocks_per_thread): 2 where
// the block count is even, so the per-thread index math, slot load and plane addresses (about
// 170 of a thread's 548 instructions at sm_90 with one block each) serve four blocks (two of K,
// two of V) instead of two, and the stores are 16 + 2 bytes (926 instructions for four blocks:
// 463 a K/V pair instead of 548); else 1. Also 1 for 4over6 with float32 inputs: its 64 input
// words spill under the 80-register cap (72..84 bytes on every target).
#ifndef KV_NVFP4_BPT
#define KV_NVFP4_BPT (KV_NVFP4_BLOCKS % 2 == 0 && !(KV_NVFP4_FOUR_OVER_SIX && KV_IN_DTYPE == 0) ? 2 : 1)
#endif
#if KV_NVFP4_BPT != 1 && KV_NVFP4_BPT != 2 || KV_NVFP4_BLOCKS % KV_NVFP4_BPT != 0
#error "KV_NVFP4_BPT must be 1 or 2 and divide the block count"
#endif
#define KV_NVFP4_GROUPS (KV_NVFP4_BLOCKS / KV_NVFP4_BPT)
// 4over6's fast-block decision (kvkit.cuda.write.nvfp4_launch_defines passes it, from
// KVKIT_WRITE_NVFP4_46_VARIANT): 1 (default) the candidates' squared errors by two fused
// multiply-adds per element with the spec's errors only for blocks that kv_nvfp4_46_sure cannot
// decide; 0 the spec's error order for every block (session 10's kernel). The same bytes.
#ifndef KV_NVFP4_46_VARIANT
#define KV_NVFP4_46_VARIANT 1
#endif
#if KV_NVFP4_46_VARIANT != 0 && KV_NVFP4_46_VARIANT != 1
#error "KV_NVFP4_46_VARIANT must be 0 or 1"
#endif
// KV_WRITE_EARLY (kvkit.cuda.write.write_early_loads passes it, from KVKIT_WRITE_EARLY_LOADS):
// 1 issues the K / V loads beside the slot's load; 0 after the slot's test (the order before).
#ifndef KV_WRITE_EARLY
#define KV_WRITE_EARLY 1
#endif
#if KV_NVFP4_FOUR_OVER_SIX && KV_NVFP4_46_VARIANT == 1 && !defined(KV_NVFP4_46_MARGIN)
#error "4over6 variant 1 needs KV_NVFP4_46_MARGIN / _DEN_LO / _DEN_HI (fmt.cuda_defines())"
#endif

// One candidate's scale: sf code (returned), its value sfv, den = RN(sfv g) and inv = 1 / den
// (0 when den is 0; NaN den gives NaN, as the CPU).
__device__ __forceinline__ unsigned int kv_nvfp4_scale(float amax, float target, float g, float& sfv, float& den,
                                                       float& inv) {
    const unsigned int sfc = kv_e4m3_encode(__fdiv_rn(amax, __fmul_rn(target, g)));
    sfv = kv_e4m3_decode_pos(sfc);  // sfc <= 0x7F: amax >= 0 or NaN
    den = __fmul_rn(sfv, g);
    inv = 0.0f;
    if (den != 0.0f) inv = __frcp_rn(den);  // == __fdiv_rn(1, den)
    return sfc;
}

// kv_nvfp4_scale for the fast block test (g > 0, so q = amax / (target g) is >= +0 or NaN):
// with the hardware conversion the sf code is cvt(q) itself (no sign or NaN fix-ups: q >= +0,
// and a NaN q, from a NaN amax or g, fails the fast test through inv anyway; & 0x7F keeps any
// NaN code off the decode's shift), and sfv the shifted code scaled (the code is not 0x7F for a
// non-NaN q). The same sfc, sfv and inv as kv_nvfp4_scale for every non-NaN q >= +0.
__device__ __forceinline__ unsigned int kv_nvfp4_scale_fast(float amax, float target, float g, float& sfv,
                                                            float& den, float& inv) {
#if KVKIT_HW_FP8
    const float q = __fdiv_rn(amax, __fmul_rn(target, g));
    unsigned int r;  // byte 0: cvt(q); byte 1: cvt(0) = 0
    asm("{\n\t.reg .b16 t;\n\tcvt.rn.satfinite.e4m3x2.f32 t, %1, %2;\n\tcvt.u32.u16 %0, t;\n\t}" : "=r"(r) : "f"(0.0f), "f"(q));
    const unsigned int sfc = r & 0x7Fu;
    sfv = __fmul_rn(__uint_as_float(sfc << 20), 1.329227995784915873e36f);  // 2^120: kv_e4m3_decode_pos
    den = __fmul_rn(sfv, g);
    // A select, not a branch around the reciprocal: den is 0 only for a block far below g's
    // scale (sf code 0), where __frcp_rn's slow path runs once; 3 instructions a block saved.
    const float r0 = __frcp_rn(den);
    inv = den != 0.0f ? r0 : 0.0f;
    return sfc;
#else
    return kv_nvfp4_scale(amax, target, g, sfv, den, inv);
#endif
}

// One candidate's codes, packed as 8 bytes (w[0] bytes 0..3, w[1] bytes 4..7), by the general
// encoders. finite: amax is finite (so is every x_i). Then with a finite inv no product is NaN
// and the encoder without NaN handling gives the same bytes (a NaN or infinite amax is rare:
// the general encoder, per thread).
__device__ __forceinline__ void kv_nvfp4_codes(const float (&x)[16], bool finite, float inv, unsigned int (&w)[2]) {
    w[0] = 0u;
    w[1] = 0u;
    if (finite && fabsf(inv) < __uint_as_float(0x7F800000u)) {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            unsigned int b = kv_e2m1x2_encode_nonan(__fmul_rn(x[2 * j], inv), __fmul_rn(x[2 * j + 1], inv));
            w[j >> 2] |= b << (8 * (j & 3));
        }
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            unsigned int b = kv_e2m1x2_encode(__fmul_rn(x[2 * j], inv), __fmul_rn(x[2 * j + 1], inv));
            w[j >> 2] |= b << (8 * (j & 3));
        }
    }
}

// A candidate's squared error in the spec's order from its packed codes w; MAG: w holds
// magnitude codes (no sign bits) and d_i is taken from |x_i| (the same d_i * d_i).
template <bool MAG = false>
__device__ __forceinline__ float kv_nvfp4_sq_error(const float (&x)[16], const unsigned int (&w)[2], float sfv,
                                                   float g) {
    float err = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        unsigned int code = (w[i >> 3] >> (4 * (i & 7))) & 0xFu;
        float d = __fsub_rn(MAG ? fabsf(x[i]) : x[i], __fmul_rn(__fmul_rn(kv_e2m1_value_scaled(code), sfv), g));
        float dd = __fmul_rn(d, d);
        err = i == 0 ? dd : __fadd_rn(err, dd);
    }
    return err;
}

__device__ __forceinline__ unsigned int kv_prmt(unsigned int a, unsigned int b, unsigned int sel) {
    // prmt.b32 (default mode): a selector nibble with bit 3 set replicates the selected byte's
    // top bit over the result byte (__byte_perm ignores that bit).
    unsigned int d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

#if !KVKIT_HW_FP4
// The sign bits of elements 8h..8h+7 at the NVFP4 code positions (bit 3 of each nibble), from
// the raw input words: sign-replicating byte permutes gather the even elements' signs into
// the bytes of e and the odd ones' into o (0x00 / 0xFF bytes); byte j of the result takes bit 3
// from e and bit 7 from o. Six instructions for eight elements where a shift and a mask per
// element took sixteen. The sign of x * inv is that of x (inv is +0 or positive).
template <int DT>
__device__ __forceinline__ unsigned int kv_nvfp4_signs(const unsigned int (&w)[KvInputWords<DT, 16>::n], int h) {
    unsigned int e, o;
    if constexpr (DT == 0) {
        // float32 words: the sign is the top bit of byte 3 of word i (element i)
        const int b = 8 * h;
        const unsigned int e0 = kv_prmt(w[b + 0], w[b + 2], 0xFFFBu);  // [s0, s2, ..]
        const unsigned int e1 = kv_prmt(w[b + 4], w[b + 6], 0xFFFBu);  // [s4, s6, ..]
        const unsigned int o0 = kv_prmt(w[b + 1], w[b + 3], 0xFFFBu);  // [s1, s3, ..]
        const unsigned int o1 = kv_prmt(w[b + 5], w[b + 7], 0xFFFBu);  // [s5, s7, ..]
        e = kv_prmt(e0, e1, 0x5410u);
        o = kv_prmt(o0, o1, 0x5410u);
    } else {
        // 16-bit words: element 2j's sign tops byte 1 of word j, element 2j + 1's byte 3.
        const int b = 4 * h;
        const unsigned int a = kv_prmt(w[b + 0], w[b + 1], 0xFBD9u);  // [s0, s2, s1, s3]
        const unsigned int c = kv_prmt(w[b + 2], w[b + 3], 0xFBD9u);  // [s4, s6, s5, s7]
        e = kv_prmt(a, c, 0x5410u);                                    // [s0, s2, s4, s6]
        o = kv_prmt(a, c, 0x7632u);                                    // [s1, s3, s5, s7]
    }
    return ((e & 0x0F0F0F0Fu) | (o & 0xF0F0F0F0u)) & 0x88888888u;
}

// The fast candidates (every |x_i * inv[c]| < 7, none NaN: see kv_e2m1_magic): magnitude
// codes packed as 8 bytes per candidate (pairs by one shift-add each, bytes gathered by
// permutes: the code is the low byte of the magic sum). With C = 2 (4over6) also each
// candidate's squared error from |x_i| and the magnitude v_i (the spec's d_i up to sign: the
// code's sign is x_i's and IEEE arithmetic is symmetric under negation, so d_i * d_i is the
// same). APPROX = false: the spec's order, d_i = x_i - (v_i * sfv) * g, err = sum RN(d_i d_i).
// APPROX = true (KV_NVFP4_46_VARIANT 1): d_i = RN(|x_i| - v_i den) and err = RN(d_i d_i + err),
// two fused multiply-adds where the spec's order takes five instructions; not the spec's
// error, but within KV_NVFP4_46_MARGIN den^2 of it (kv_nvfp4_46_sure says why), which the
// caller's decision test allows for. Both candidates in one pass over the elements, so only
// the packed pairs stay live.
template <int C, bool APPROX>
__device__ __forceinline__ void kv_nvfp4_fast_codes(const float (&x)[16], const float (&inv)[C], const float (&sfv)[C],
                                                    const float (&den)[C], float g, unsigned int (&w)[C][2],
                                                    float (&err)[C]) {
    unsigned int pair[C][8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int c = 0; c < C; ++c) {
            unsigned int s[2];
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                const int i = 2 * j + t;
                const KvE2m1Magic r = kv_e2m1_magic(__fmul_rn(x[i], inv[c]));
                s[t] = r.s;
                if (C > 1) {
                    const float v = __fsub_rn(__uint_as_float(r.s), r.magic);  // exact: the magnitude
                    if (APPROX) {
                        const float d = __fmaf_rn(-v, den[c], fabsf(x[i]));
                        err[c] = i == 0 ? __fmul_rn(d, d) : __fmaf_rn(d, d, err[c]);
                    } else {
                        const float d = __fsub_rn(fabsf(x[i]), __fmul_rn(__fmul_rn(v, sfv[c]), g));
                        const float dd = __fmul_rn(d, d);
                        err[c] = i == 0 ? dd : __fadd_rn(err[c], dd);
                    }
                }
            }
            pair[c][j] = s[0] + (s[1] << 4);  // low byte: both codes (bits 8..21 of each s are zero)
        }
    }
#pragma unroll
    for (int c = 0; c < C; ++c) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const unsigned int lo = kv_prmt(pair[c][4 * h], pair[c][4 * h + 1], 0x0040u);
            const unsigned int hi = kv_prmt(pair[c][4 * h + 2], pair[c][4 * h + 3], 0x0040u);
            w[c][h] = kv_prmt(lo, hi, 0x5410u);
        }
    }
}

#if KV_NVFP4_FOUR_OVER_SIX && KV_NVFP4_46_VARIANT == 1
// Whether the approximate errors e4, e6 of kv_nvfp4_fast_codes<2, true> decide the 4over6
// choice as the spec's errors E4, E6 would: |RN(e6 - e4)| > m = RN(RN(den4^2 + den6^2)
// KV_NVFP4_46_MARGIN), with KV_NVFP4_46_DEN_LO <= den6 <= den4 <= KV_NVFP4_46_DEN_HI (den4 >=
// den6 always: sf is monotonic in amax / (target g)). Then sign(E6 - E4) = sign(e6 - e4), so
// E4 < E6 exactly when RN(e6 - e4) > 0, and E4 == E6 cannot be.
// Why, per candidate (S = sfv g exactly, u = 2^-24, |q_i| < 7 and |q_i - v_i| <= 1 on the fast
// path, |x_i| = |q_i| S (1 + 3.01 u) through inv = RN(1 / RN(S))): t_i = |x_i| - v_i S has
// |t_i| <= S (1 + 22 u); the spec's d_i = RN(|x_i| - RN(v_i S)) and the fused RN(|x_i| - v_i
// den) are both within 7.01 u S of t_i (|v_i S| <= 6 S, den = RN(S)), so each sum of squares
// is within 16 * 14.03 u S^2 = 224.5 u S^2 of sum t_i^2 <= 16.01 S^2; the spec's rounded sum
// (16 roundings per term at most: the square and 15 additions) and the fused one (16 fused
// roundings) are each within 16.0001 u * 16.01 S^2 = 256.2 u S^2 of their exact sums. So
// |E_c - e_c| <= 2 (224.5 + 256.2) u S_c^2 < 2^-14 den_c^2, and KV_NVFP4_46_MARGIN = 2^-13
// leaves a factor of two for the rounding of m and of e6 - e4. The den range keeps every
// product and sum normal or exact (den6 >= 2^-40: den_c^2 2^-13 >= 2^-93, subnormal rounding
// at most 64 * 2^-150 in all) and finite (den4 <= 2^50: errors below 2^105).
// Outside it, or near a tie (about 1 block in 10^5 on LLM-like data), the caller computes
// the spec's errors. CPU model and checks: kvkit/formats/arch_models.py nvfp4_46_fast_choice,
// tests/formats/test_nvfp4_46_model.py.
__device__ __forceinline__ bool kv_nvfp4_46_sure(float e6, float e4, float den6, float den4) {
    const float m = __fmul_rn(__fadd_rn(__fmul_rn(den4, den4), __fmul_rn(den6, den6)), KV_NVFP4_46_MARGIN);
    return fabsf(__fsub_rn(e6, e4)) > m && den6 >= KV_NVFP4_46_DEN_LO && den4 <= KV_NVFP4_46_DEN_HI;
}
#endif
#endif

template <int DT>
__device__ __forceinline__ unsigned int kv_nvfp4_encode_block(const float (&x)[16],
                                                              const unsigned int (&raw)[KvInputWords<DT, 16>::n], float g,
                                                              unsigned int (&w)[2]) {
    // amax with NaN propagating (max.NaN, the same cost): it equals the spec's NaN-ignoring fold
    // unless an input is NaN, and then it is NaN, which fails the fast test below.
    float amax = fabsf(x[0]);
#pragma unroll
    for (int i = 1; i < 16; ++i) asm("max.NaN.f32 %0, %1, %2;" : "=f"(amax) : "f"(amax), "f"(fabsf(x[i])));
    unsigned int sfc;
    bool done = false;
#if !KVKIT_HW_FP4
    {
        // Fast block: g > 0 (so amax / (target g) >= +0 or NaN) and RN(amax * inv) < 7, which
        // bounds every |x_i * inv| (RN is monotonic) and fails for a NaN or infinite amax, g or
        // inv. Otherwise (rare: saturated or subnormal scales, non-finite inputs) the general
        // path below recomputes everything.
        float sfv, den, inv;
        sfc = kv_nvfp4_scale_fast(amax, 6.0f, g, sfv, den, inv);
        bool fast = g > 0.0f && __fmul_rn(amax, inv) < 7.0f;
#if KV_NVFP4_FOUR_OVER_SIX
        float sfv4, den4, inv4;
        const unsigned int sfc4 = kv_nvfp4_scale_fast(amax, 4.0f, g, sfv4, den4, inv4);
        fast = fast && __fmul_rn(amax, inv4) < 7.0f;
#endif
        if (fast) {
#if KV_NVFP4_FOUR_OVER_SIX
            const float invs[2] = {inv, inv4}, sfvs[2] = {sfv, sfv4}, dens[2] = {den, den4};
            unsigned int wc[2][2];
            float err[2];
#if KV_NVFP4_46_VARIANT == 1
            kv_nvfp4_fast_codes<2, true>(x, invs, sfvs, dens, g, wc, err);
            // Equal sf codes: the same candidate twice (a tie: 6). Otherwise the approximate
            // errors decide unless kv_nvfp4_46_sure says they might not (rare): then the spec's
            // errors (from |x_i| and the magnitude codes: the same d_i * d_i, see
            // kv_nvfp4_fast_codes; ties keep 6).
            // Two spellings of the same decision: at the 80-register cap ptxas spills 4 bytes
            // (sm_80..sm_90) with the first for float32 inputs and with the second for 16-bit
            // ones, so each input type takes the one that builds clean.
            bool four;
            if constexpr (DT == 0) {
                four = sfc4 != sfc && err[1] < err[0];
                if (sfc4 != sfc && !kv_nvfp4_46_sure(err[0], err[1], den, den4))
                    four = kv_nvfp4_sq_error<true>(x, wc[1], sfv4, g) < kv_nvfp4_sq_error<true>(x, wc[0], sfv, g);
            } else {
                four = err[1] < err[0];
                if (sfc4 == sfc) {
                    four = false;
                } else if (!kv_nvfp4_46_sure(err[0], err[1], den, den4)) {
                    four = kv_nvfp4_sq_error<true>(x, wc[1], sfv4, g) < kv_nvfp4_sq_error<true>(x, wc[0], sfv, g);
                }
            }
#else
            kv_nvfp4_fast_codes<2, false>(x, invs, sfvs, dens, g, wc, err);
            const bool four = err[1] < err[0];  // ties keep 6
#endif
            sfc = four ? sfc4 : sfc;
            w[0] = four ? wc[1][0] : wc[0][0];
            w[1] = four ? wc[1][1] : wc[0][1];
#else
            const float invs[1] = {inv}, sfvs[1] = {sfv}, dens[1] = {den};
            unsigned int wc[1][2];
            float err[1];
            kv_nvfp4_fast_codes<1, false>(x, invs, sfvs, dens, g, wc, err);
            w[0] = wc[0][0];
            w[1] = wc[0][1];
#endif
            w[0] |= kv_nvfp4_signs<DT>(raw, 0);
            w[1] |= kv_nvfp4_signs<DT>(raw, 1);
            done = true;
        }
    }
#endif
    if (!done) {
        // The general path: finite means no NaN or inf input; otherwise the spec's NaN-ignoring
        // fold again.
        const bool finite = fabsf(amax) < __uint_as_float(0x7F800000u);
        if (!finite) {
            amax = fabsf(x[0]);
#pragma unroll
            for (int i = 1; i < 16; ++i) amax = fmaxf(amax, fabsf(x[i]));  // a NaN operand loses
        }
        float sfv, den, inv;
        sfc = kv_nvfp4_scale(amax, 6.0f, g, sfv, den, inv);
        kv_nvfp4_codes(x, finite, inv, w);
#if KV_NVFP4_FOUR_OVER_SIX
        float sfv4, den4, inv4;
        const unsigned int sfc4 = kv_nvfp4_scale(amax, 4.0f, g, sfv4, den4, inv4);
        unsigned int w4[2];
        kv_nvfp4_codes(x, finite, inv4, w4);
        if (kv_nvfp4_sq_error(x, w4, sfv4, g) < kv_nvfp4_sq_error(x, w, sfv, g)) {  // ties keep 6
            sfc = sfc4;
            w[0] = w4[0];
            w[1] = w4[1];
        }
#endif
    }
    return sfc;
}

// The codes (8 bytes a block) and sf codes of BPT consecutive blocks: the widest stores the
// addresses' alignment allows (data 16 or 8 bytes, sf 2 bytes), else bytes.
template <int BPT>
__device__ __forceinline__ void kv_nvfp4_store(const unsigned int (&w)[BPT][2], const unsigned int (&sfc)[BPT],
                                               unsigned char* data, unsigned char* sf) {
    const unsigned long long a = reinterpret_cast<unsigned long long>(data);
    if (BPT == 2 && (a & 15ull) == 0) {
        *reinterpret_cast<uint4*>(data) = make_uint4(w[0][0], w[0][1], w[BPT - 1][0], w[BPT - 1][1]);
    } else if ((a & 7ull) == 0) {
#pragma unroll
        for (int j = 0; j < BPT; ++j) reinterpret_cast<uint2*>(data)[j] = make_uint2(w[j][0], w[j][1]);
    } else {
#pragma unroll
        for (int j = 0; j < 8 * BPT; ++j) data[j] = (unsigned char)(w[j >> 3][(j >> 2) & 1] >> (8 * (j & 3)));
    }
    if (BPT == 2 && (reinterpret_cast<unsigned long long>(sf) & 1ull) == 0) {
        *reinterpret_cast<unsigned short*>(sf) = (unsigned short)(sfc[0] | (sfc[BPT - 1] << 8));
    } else {
#pragma unroll
        for (int j = 0; j < BPT; ++j) sf[j] = (unsigned char)sfc[j];
    }
}

extern "C" __global__ __launch_bounds__(KV_WRITE_NVFP4_THREADS, KV_WRITE_NVFP4_MIN_CTAS) void kvkit_write_nvfp4(
    const void* __restrict__ k,                  // (N, H, D) KV_IN_DTYPE, C-contiguous
    const void* __restrict__ v,                  // (N, H, D) KV_IN_DTYPE, C-contiguous
    const KV_SLOT_T* __restrict__ slot_mapping,  // (N,) slot = block * block_size + offset
    long long n_tokens,                          // N
    int n_heads,                                 // H
    long long capacity,                          // num_blocks * block_size
    int block_size,                              // tokens per page
    unsigned char* __restrict__ k_data,          // (num_blocks, H, block_size, D/2) via strides
    long long kd_stride_block,                   // bytes between pages
    long long kd_stride_head,                    // bytes between heads
    long long kd_stride_token,                   // bytes between tokens
    unsigned char* __restrict__ k_sf,            // (num_blocks, H, block_size, D/16) via strides
    long long ks_stride_block,                   // bytes
    long long ks_stride_head,                    // bytes
    long long ks_stride_token,                   // bytes
    unsigned char* __restrict__ v_data,          // (num_blocks, H, block_size, D/2) via strides
    long long vd_stride_block,                   // bytes
    long long vd_stride_head,                    // bytes
    long long vd_stride_token,                   // bytes
    unsigned char* __restrict__ v_sf,            // (num_blocks, H, block_size, D/16) via strides
    long long vs_stride_block,                   // bytes
    long long vs_stride_head,                    // bytes
    long long vs_stride_token,                   // bytes
    float k_scale,                               // () per-layer K global scale g
    float v_scale,                               // () per-layer V global scale g
    int* __restrict__ error_flag,                // (1,) bit 1: a slot >= capacity
    unsigned int heads_m, int heads_s1, int heads_s2,  // kv_udiv_magic numbers of n_heads
    unsigned int bs_m, int bs_s1, int bs_s2)           // ... and of block_size
{
    long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (gid >= n_tokens * n_heads * KV_NVFP4_GROUPS) return;
    const int b = (int)(gid % KV_NVFP4_GROUPS) * KV_NVFP4_BPT;  // first block of the thread's
    const long long row = gid / KV_NVFP4_GROUPS;                // token * H + head
    const bool narrow = kv_write_indices_narrow(n_tokens, n_heads, capacity);
    long long t, blk, off;
    int h;
    kv_row_token_head(row, KvUDiv{n_heads, heads_m, heads_s1, heads_s2}, narrow, &t, &h);
    const long long slot = (long long)slot_mapping[t];
    // K's and V's loads both before any arithmetic: one memory wait per thread, not two.
    constexpr int NW = KvInputWords<KV_IN_DTYPE, 16>::n;  // words of one block
    unsigned int kw[KV_NVFP4_BPT * NW], vw[KV_NVFP4_BPT * NW];
#if KV_WRITE_EARLY
    // ... and issued beside the slot's load (their addresses need the row only), where the
    // test of the slot kept them a memory round trip behind it; a padding row's loads are wasted.
    const long long src = row * KV_HEAD_DIM + b * KV_NVFP4_BLOCK;
    kv_load_input_words<KV_IN_DTYPE, 16 * KV_NVFP4_BPT>(k, src, kw);
    kv_load_input_words<KV_IN_DTYPE, 16 * KV_NVFP4_BPT>(v, src, vw);
#endif
    if (slot < 0) return;
    if (slot >= capacity) {
        if (h == 0 && b == 0) atomicOr(error_flag, 1);
        return;
    }
    kv_slot_page(slot, KvUDiv{block_size, bs_m, bs_s1, bs_s2}, narrow, &blk, &off);
#if !KV_WRITE_EARLY
    const long long src = row * KV_HEAD_DIM + b * KV_NVFP4_BLOCK;
    kv_load_input_words<KV_IN_DTYPE, 16 * KV_NVFP4_BPT>(k, src, kw);
    kv_load_input_words<KV_IN_DTYPE, 16 * KV_NVFP4_BPT>(v, src, vw);
#endif
    unsigned int w[KV_NVFP4_BPT][2], sfc[KV_NVFP4_BPT];
    float x[16];
#pragma unroll
    for (int j = 0; j < KV_NVFP4_BPT; ++j) {
        const unsigned int(&raw)[NW] = *reinterpret_cast<const unsigned int(*)[NW]>(&kw[j * NW]);
        // NaN payloads never reach an NVFP4 byte (E2M1 has no NaN): the bare widening.
        kv_widen_input_words<KV_IN_DTYPE, 16, false>(raw, x);
        sfc[j] = kv_nvfp4_encode_block<KV_IN_DTYPE>(x, raw, k_scale, w[j]);
    }
    kv_nvfp4_store<KV_NVFP4_BPT>(w, sfc, k_data + blk * kd_stride_block + h * kd_stride_head + off * kd_stride_token + b * 8,
                                 k_sf + blk * ks_stride_block + h * ks_stride_head + off * ks_stride_token + b);
#pragma unroll
    for (int j = 0; j < KV_NVFP4_BPT; ++j) {
        const unsigned int(&raw)[NW] = *reinterpret_cast<const unsigned int(*)[NW]>(&vw[j * NW]);
        kv_widen_input_words<KV_IN_DTYPE, 16, false>(raw, x);
        sfc[j] = kv_nvfp4_encode_block<KV_IN_DTYPE>(x, raw, v_scale, w[j]);
    }
    kv_nvfp4_store<KV_NVFP4_BPT>(w, sfc, v_data + blk * vd_stride_block + h * vd_stride_head + off * vd_stride_token + b * 8,
                                 v_sf + blk * vs_stride_block + h * vs_stride_head + off * vs_stride_token + b);
}
