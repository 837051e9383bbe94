// decode_codes.cuh: decode-direction element codecs for the decode kernels (exact, no rounding).
//
// The encoders (with the rounding rules of kvkit/formats/codecs.py) live in fp8.cuh / fp4.cuh /
// fp16.cuh. Decoding a code is exact in float32, so these helpers build the float32 bit
// pattern with integer code (no table in local or constant memory, where per-lane indices
// would serialize) and cannot disagree with the spec's tables:
//   E2M1: sign in bit 3, magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}; code 8 is -0.
//   E4M3 (e4m3fn): bias 7, subnormals m * 2^-9, 0x7F / 0xFF are NaN.
//   fp16: IEEE binary16 via cvt.f32.f16 (exact on every target; subnormals kept).
//   bf16: the upper 16 bits of a float32.
#pragma once

#include "common/arch.cuh"

__device__ __forceinline__ float kv_dc_e2m1(unsigned code) {
    const unsigned m = code & 7u;
    // m >= 2: exponent field (m >> 1) >= 1, value 2^((m>>1)-1) * (1 + (m&1)/2), i.e. float32
    // bits ((m >> 1) + 126) << 23 | (m & 1) << 22 == (m << 22) + (126 << 23).
    // m == 1: 0.5 (0x3F000000); m == 0: 0.
    unsigned u = (m >= 2u) ? ((m << 22) + (126u << 23)) : (m ? 0x3F000000u : 0u);
    return __uint_as_float(u | ((code & 8u) << 28));
}

__device__ __forceinline__ float kv_dc_e4m3(unsigned b) {
    const unsigned sign = (b & 0x80u) << 24;
    const unsigned e = (b >> 3) & 0xFu;
    const unsigned m = b & 7u;
    if (e == 0u) {
        // Subnormal: m * 2^-9, exact in float32 (m < 8).
        return __uint_as_float(__float_as_uint((float)m * 0.001953125f) | sign);
    }
    if (e == 15u && m == 7u) return __uint_as_float(0x7FC00000u | sign);  // NaN
    // Normal: 2^(e-7) * (1 + m/8): float32 exponent field e - 7 + 127.
    return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
}

__device__ __forceinline__ float kv_dc_f16(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ float kv_dc_bf16(unsigned short h) {
    return __uint_as_float(((unsigned)h) << 16);
}

// Element i of an LSB-first stream of BITS-bit codes starting at p (bits [i*BITS, i*BITS+BITS)).
// Reads p[byte + 1] whenever the code straddles a byte boundary; callers keep the stream
// inside a readable row (the decode staging rows are padded to 16 bytes).
template <int BITS>
__device__ __forceinline__ unsigned kv_dc_get_code(const unsigned char* p, int i) {
    const int bit = i * BITS;
    const int byte = bit >> 3;
    const int shift = bit & 7;
    unsigned word = p[byte];
    if (shift + BITS > 8) word |= ((unsigned)p[byte + 1]) << 8;
    return (word >> shift) & ((1u << BITS) - 1u);
}

// Little-endian fp16 at an arbitrary byte address.
__device__ __forceinline__ float kv_dc_f16_at(const unsigned char* p) {
    return kv_dc_f16((unsigned short)(p[0] | (p[1] << 8)));
}

// Codes d..d+3 (d % 4 == 0) of an LSB-first BITS-bit stream at p, packed LSB-first into one
// word (code i at bits [i*BITS, i*BITS+BITS)). Reads exactly the bytes that hold them (for
// odd BITS the quad starts at bit 0 or 4 of a byte); 4-bit quads are one 2-byte load (p is
// 2-byte aligned: TurboQuant slots and value offsets are even).
template <int BITS>
__device__ __forceinline__ unsigned kv_dc_codes4(const unsigned char* p, int d) {
    static_assert(BITS >= 1 && BITS <= 8, "1..8-bit codes");
    const int bit = d * BITS;
    const int byte = bit >> 3;
    if constexpr (BITS == 4) {
        return *reinterpret_cast<const unsigned short*>(p + byte);
    } else {
        constexpr int NB = (((BITS & 1) ? 4 : 0) + 4 * BITS + 7) / 8;
        unsigned long long w = 0ull;
#pragma unroll
        for (int i = 0; i < NB; ++i) w |= ((unsigned long long)p[byte + i]) << (8 * i);
        const unsigned x = (unsigned)(w >> (bit & 7));
        if constexpr (4 * BITS >= 32)
            return x;
        else
            return x & ((1u << (4 * BITS)) - 1u);
    }
}

// ---- fp16 tensor-core operands (decode_mma.cuh) -----------------------------------------
// Every value below is exact in fp16, so an fp16 mma with float32 accumulation adds nothing
// but float32 rounding (DESIGN.md section 4). Scaled variants say their power-of-two factor.


// Two E4M3 bytes (element 2j in the low byte) -> fp16x2 (element 2j in the low half), each
// half = e4m3 * KV_E4M3_F16_FACTOR^-1. Hardware: cvt.rn.f16x2.e4m3x2 (sm_89+), exact, factor
// 1. Software: the E4M3 exponent/mantissa fields dropped into an fp16's (bias 15 vs 7, so the
// half is e4m3 * 2^-8, subnormals included), NaN (|b| = 0x7F) patched to an fp16 NaN.
#if KVKIT_HW_FP8
#define KV_E4M3_F16_FACTOR 1.0f
#else
#define KV_E4M3_F16_FACTOR 256.0f
#endif
__device__ __forceinline__ unsigned kv_dc_e4m3x2_f16x2(unsigned two) {
#if KVKIT_HW_FP8
    unsigned h;
    const unsigned short s = (unsigned short)two;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(s));
    return h;
#else
    const unsigned u = __byte_perm(two, 0u, 0x1404);  // b0 -> bits 8..15, b1 -> bits 24..31
    const unsigned mag = (u >> 1) & 0x3F803F80u;
    // The NaN code's magnitude 0x3F80 (1.875) is the only one above the largest finite
    // 448 * 2^-8 = 1.75 (0x3F00): one packed half compare finds both halves' NaNs, whose
    // exponent field is then filled (0x7F80 | sign, a quiet NaN).
    unsigned nan;
    asm("set.gt.u32.f16x2 %0, %1, %2;" : "=r"(nan) : "r"(mag), "r"(0x3F003F00u));
    return (u & 0x80008000u) | mag | (nan & 0x7E007E00u);
#endif
}

// One E2M1 byte (element 2j in the low nibble) -> fp16x2, each half = e2m1 * 2^-14: the
// sign to bit 15, the 3-bit exponent/mantissa field to bits 9..11 (E2M1's subnormal 0.5 is
// then fp16's subnormal 2^-15, every normal code lands on its fp16 exponent - 14).
// Two E2M1 codes in bits 0..3 and 16..19 of u (other bits ignored) -> fp16x2, as below.
__device__ __forceinline__ unsigned kv_dc_e2m1_pair_f16x2(unsigned u) {
    return ((u & 0x00070007u) << 9) | ((u & 0x00080008u) << 12);
}
__device__ __forceinline__ unsigned kv_dc_e2m1x2_f16x2(unsigned byte) {
    return kv_dc_e2m1_pair_f16x2((byte & 0xFu) | ((byte & 0xF0u) << 12));
}

// (a & M) | (b & ~M): one LOP3 with M as its immediate. Inline PTX, so that the compiler does
// not fold a later mask into it (it would split the select back into two masked shifts).
template <unsigned M>
__device__ __forceinline__ unsigned kv_bitsel(unsigned a, unsigned b) {
    unsigned r;
    // LUT over (a, b, M) = (0xF0, 0xCC, 0xAA): (0xF0 & 0xAA) | (0xCC & 0x55) = 0xE4.
    asm("lop3.b32 %0, %1, %2, %3, 0xE4;" : "=r"(r) : "r"(a), "r"(b), "n"(M));
    return r;
}
// Software E4M3 path only (KVKIT_HW_FP8 0): a per-tile NaN-free fast path for the decode
// kernels (decode_mma.cuh KV_MMA_NANTILE_K / _V). kv_dc_e4m3x2_f16x2's compare and NaN patch
// are two of its six instructions per pair; a tile whose bytes hold no NaN code needs
// neither, and one test per word plus one vote per warp and tile is cheaper than the patch.
// KV_E4M3_NANTILE: 1 (the default there; -DKVKIT_DECODE_FP8_NANTILE=0 for A/B runs) turns
// it on; always 0 where the conversion is the hardware's (it has no patch to save).
#if KVKIT_HW_FP8
#define KV_E4M3_NANTILE 0
#elif defined(KVKIT_DECODE_FP8_NANTILE)
#define KV_E4M3_NANTILE KVKIT_DECODE_FP8_NANTILE
#else
#define KV_E4M3_NANTILE 1
#endif
// acc with bit 7 of some byte set when word w has a NaN code (0x7F / 0xFF) in some byte; fold
// every word in, then kv_dc_e4m3_nan_found(acc). Adding 1 to each byte flips its bit 7 iff
// the carry reaches bit 7: its low 7 bits are all ones (a NaN code), or they are 0x7E with a
// carry in, which only a NaN code 0xFF below starts; so no NaN code, no flip, and the lowest
// NaN code always flips (no carry into it). Two instructions: the add and one LOP3.
__device__ __forceinline__ unsigned kv_dc_e4m3_nan_acc(unsigned acc, unsigned w) {
    return acc | ((w + 0x01010101u) ^ w);
}
__device__ __forceinline__ bool kv_dc_e4m3_nan_found(unsigned acc) {
    return (acc & 0x80808080u) != 0u;
}
// Four E4M3 bytes w -> fp16x2 of bytes 0, 1 (*lo) and 2, 3 (*hi): kv_dc_e4m3x2_f16x2's bits
// for every byte but the NaN codes (those come out finite, 0x3F80 | sign: callers test
// first). A half is sign << 15 | (b & 0x7F) << 7: high byte sign | (b >> 1 & 0x3F), low
// byte (b & 1) << 7. Word-wide, h holds every byte's high byte (sign from w, the rest from
// w >> 1, whose bit 6, the sign again, the final mask drops) and w << 7 every byte's low
// byte (bit 7; the bits below, from the byte before, are dropped too); two byte permutes
// interleave them: 7 instructions per word where the pair conversion takes 12.
__device__ __forceinline__ void kv_dc_e4m3x4_f16x2_finite(unsigned w, unsigned* lo,
                                                          unsigned* hi) {
    const unsigned h = kv_bitsel<0x80808080u>(w, w >> 1);
    const unsigned l = w << 7;
    *lo = __byte_perm(l, h, 0x5140) & 0xBF80BF80u;
    *hi = __byte_perm(l, h, 0x7362) & 0xBF80BF80u;
}

// The eight E2M1 codes (nibbles n0..n7, n0 in bits 0..3) of x -> four fp16x2 words, out[k] =
// kv_dc_e2m1_pair_f16x2 of nibbles k (low half) and k + 4 (high half), each e2m1 * 2^-14.
// kv_dc_e2m1_pair_f16x2 per word takes two shifts and two masks (the sign moves 12 bits, the
// magnitude 9) and also needs the pair's nibbles moved to bits 0 and 16 first: ~4.5
// instructions per word. Here one bit-select per four nibbles builds a word that holds each
// of them as an fp16 high byte, sign at bit 7 and magnitude at bits 1..3 of a byte, so each
// word is then one mask, or one shift and one mask (11 instructions for the four words):
//   odd nibbles (sign bit 8 i + 7 stays, magnitude bits 8 i + 4.. move down 3):
//     wo = sel(0x80808080: x, else x >> 3): byte i holds nibble 2 i + 1;
//     out[3] = wo & 0x8E008E00 (bytes 1, 3), out[1] = (wo << 8) & 0x8E008E00 (bytes 0, 2);
//   even nibbles (sign bit 8 i + 3 up 4, magnitude bits 8 i.. up 1):
//     we = sel(0x80808080: x << 4, else x << 1): byte i holds nibble 2 i;
//     out[2] = we & 0x8E008E00, out[0] = (we << 8) & 0x8E008E00.
// Bits the final mask drops may hold anything. CPU model:
// tests/cuda/test_nvfp4_unpack_model.py (every code in every position, against the spec).
__device__ __forceinline__ void kv_dc_e2m1x8_f16x2(unsigned x, unsigned* out) {
    const unsigned wo = kv_bitsel<0x80808080u>(x, x >> 3);
    const unsigned we = kv_bitsel<0x80808080u>(x << 4, x << 1);
    out[0] = (we << 8) & 0x8E008E00u;
    out[1] = (wo << 8) & 0x8E008E00u;
    out[2] = we & 0x8E008E00u;
    out[3] = wo & 0x8E008E00u;
}

__device__ __forceinline__ unsigned kv_hmul2(unsigned a, unsigned b) {
    unsigned d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// a times half H (0: low, 1: high) of b in both halves. Written as the pack of that half
// twice, which ptxas folds into the multiply's operand selector (HMUL2 ... R.H0_H0 / .H1_H1)
// where a byte permute would be one more instruction.
template <int H>
__device__ __forceinline__ unsigned kv_hmul2_bcast(unsigned a, unsigned b) {
    unsigned d;
    if constexpr (H == 0)
        asm("{ .reg .b16 l, h; .reg .b32 t; mov.b32 {l, h}, %2; mov.b32 t, {l, l};\n\t"
            "mul.rn.f16x2 %0, %1, t; }" : "=r"(d) : "r"(a), "r"(b));
    else
        asm("{ .reg .b16 l, h; .reg .b32 t; mov.b32 {l, h}, %2; mov.b32 t, {h, h};\n\t"
            "mul.rn.f16x2 %0, %1, t; }" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// NVFP4 elements 2j, 2j+1 (one code byte) times their E4M3 block scale, as fp16x2 of
// value * KV_NVFP4_SF_MUL * 2^-14 (below): e2m1 * 2^-14 times sf * KV_NVFP4_SF_MUL (sf * 2^6
// <= 448 * 64 fits fp16; the product has at most 6 significant bits and is a multiple of
// 2^-24, so the fp16 multiply is exact).
__device__ __forceinline__ unsigned kv_dc_nvfp4x2_f16x2(unsigned code_byte, unsigned sf_x2) {
    return kv_hmul2(kv_dc_e2m1x2_f16x2(code_byte), sf_x2);
}
// The block scale operand of kv_dc_nvfp4x2_f16x2: sf_lo * KV_NVFP4_SF_MUL and sf_hi *
// KV_NVFP4_SF_MUL (two scale bytes); _f16x2: the same scale in both halves.
// _sfw: the two scale bytes as bits 0..15 of `two` (sf_lo in bits 0..7; bits 16..31 are
// ignored), as one 16-bit load or one byte permute gives them.
// KV_NVFP4_SF_MUL is 2^6 (e2m1 * 2^-14 times it is value * 2^-8), or 1 where the E4M3
// conversion is the hardware's (exact, factor 1) and the entry sets KV_NVFP4_SF_RAW
// (decode_nvfp4.cu): the operand is then value * 2^-14, still exact in fp16 (e2m1 * 2^-14 is
// a multiple of 2^-15 with 2 significant bits, sf a multiple of 2^-9 with 4, so the product
// is a multiple of 2^-24, fp16's subnormal step, with at most 6 significant bits, and below
// 6 * 448 * 2^-14), and the conversion needs no multiply (one HMUL2 fewer per scale word).
// The power of two is exact everywhere downstream (KV_MMA_KF / VF undo it in float32).
#if defined(KV_NVFP4_SF_RAW) && KV_NVFP4_SF_RAW && KVKIT_HW_FP8
#define KV_NVFP4_SF_MUL 1.0f
#else
#define KV_NVFP4_SF_MUL 64.0f
#endif
__device__ __forceinline__ unsigned kv_dc_nvfp4_sfw_f16x2(unsigned two) {
    const unsigned h = kv_dc_e4m3x2_f16x2(two);
    if constexpr (KV_NVFP4_SF_MUL == 1.0f) {
        return h;
    } else {
        // times 2^6 * KV_E4M3_F16_FACTOR: fp16 2^6 = 0x5400, 2^14 = 0x7400.
        return kv_hmul2(h, KV_E4M3_F16_FACTOR == 1.0f ? 0x54005400u : 0x74007400u);
    }
}
// sf_lo, sf_hi: bytes in bits 0..7 (one byte permute joins them; a shift and an OR took two).
__device__ __forceinline__ unsigned kv_dc_nvfp4_sf2_f16x2(unsigned sf_lo, unsigned sf_hi) {
    return kv_dc_nvfp4_sfw_f16x2(__byte_perm(sf_lo, sf_hi, 0x0040));
}
__device__ __forceinline__ unsigned kv_dc_nvfp4_sf_f16x2(unsigned sf) {
    return kv_dc_nvfp4_sf2_f16x2(sf, sf);
}

// (lo element, hi element) -> fp16x2 (lo in bits 0..15), round to nearest.
__device__ __forceinline__ unsigned kv_pack_f16x2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float kv_f16_lo(unsigned h2) {
    return kv_dc_f16((unsigned short)(h2 & 0xFFFFu));
}
__device__ __forceinline__ float kv_f16_hi(unsigned h2) {
    return kv_dc_f16((unsigned short)(h2 >> 16));
}

// x = hi + lo (two fp16x2 words) for the pair (x0, x1).
__device__ __forceinline__ void kv_split_f16x2(float x0, float x1, unsigned* hi, unsigned* lo) {
    const unsigned h = kv_pack_f16x2(x0, x1);
    *hi = h;
    *lo = kv_pack_f16x2(x0 - kv_f16_lo(h), x1 - kv_f16_hi(h));
}
// One part of kv_split_f16x2 per lane, chosen by negm (a lane constant): -1 gives lo (x - hi,
// the same single rounding as the subtraction there), -0 gives hi (x + -0 * hi == x for the
// finite, non-negative x of softmax weights, whose pack is hi again). An FFMA where the
// subtraction was, instead of both parts and a select (decode_mma.cuh KV_MMA_PACK_F16).
__device__ __forceinline__ unsigned kv_split_f16x2_packed(float x0, float x1, float negm) {
    const unsigned h = kv_pack_f16x2(x0, x1);
    return kv_pack_f16x2(fmaf(kv_f16_lo(h), negm, x0), fmaf(kv_f16_hi(h), negm, x1));
}

// 2^e as a float (|e| <= 126).
__device__ __forceinline__ float kv_pow2(int e) { return __int_as_float((e + 127) << 23); }

// floor(log2(x)) for a finite x > 0 (subnormals report -127).
__device__ __forceinline__ int kv_ilog2(float x) {
    return (int)((__float_as_uint(x) >> 23) & 0xFFu) - 127;
}

// (x & m) | k as one LOP3 with m and k in registers (hoisted out of loops); with both as
// immediates the compiler emits two.
__device__ __forceinline__ unsigned kv_and_or(unsigned x, unsigned m, unsigned k) {
    unsigned r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(x), "r"(m), "r"(k));
    return r;
}

// bf16 bits of -n for an integer 1 <= n < 256 (exact: 8 significant bits).
__host__ __device__ constexpr int kv_ilog2_c(unsigned n) { return n <= 1 ? 0 : 1 + kv_ilog2_c(n >> 1); }
__host__ __device__ constexpr unsigned kv_bf16_neg_int(unsigned n) {
    return 0x8000u | ((127u + kv_ilog2_c(n)) << 7) | ((n << (7 - kv_ilog2_c(n))) & 0x7Fu);
}

// fp16 bits of -n for an integer 1 <= n < 2048 (exact: 11 significant bits).
__host__ __device__ constexpr unsigned kv_f16_neg_int(unsigned n) {
    return 0x8000u | ((15u + kv_ilog2_c(n)) << 10) | ((n << (10 - kv_ilog2_c(n))) & 0x3FFu);
}

// The codes in the fields MM << S of x (c0 from bits S.., c1 from bits 16 + S..) -> bf16x2
// (F16: fp16x2) of c - OFF, exactly. MM << S selects codes inside each half's mantissa (bf16:
// 7 bits, so OFF < 128; fp16: 10): 2^MB + c 2^S has c 2^S in its mantissa (bf16 0x4300 |
// c << S, fp16 0x6400 | c << S), and x 2^-S - (2^(MB-S) + OFF) by one fma.rn (sm_80+) is
// exact (S = 0 for the low code of a pair, S = bits for the high one, which saves the shift
// down; fp16's wider mantissa takes a 4-bit pair's high code where it sits, S = 4).
template <bool F16, unsigned OFF, unsigned MM, int S>
__device__ __forceinline__ unsigned kv_codes_x2_masked(unsigned x) {
    constexpr int MB = F16 ? 10 : 7;  // mantissa bits
    static_assert(((MM << S) & (F16 ? 0xFC00FC00u : 0xFF80FF80u)) == 0u,
                  "codes inside the mantissa of each half");
    x = kv_and_or(x, MM << S, F16 ? 0x64006400u : 0x43004300u);
    constexpr unsigned MUL = (F16 ? 0x3C00u : 0x3F80u) - (S << MB);  // 2^-S
    constexpr unsigned C = F16 ? kv_f16_neg_int((1u << (MB - S)) + OFF)
                               : kv_bf16_neg_int((1u << (MB - S)) + OFF);
    unsigned r;
    if constexpr (F16) {
        asm("fma.rn.f16x2 %0, %1, %2, %3;"
            : "=r"(r)
            : "r"(x), "r"(MUL | (MUL << 16)), "r"(C | (C << 16)));
    } else {
        asm("fma.rn.bf16x2 %0, %1, %2, %3;"
            : "=r"(r)
            : "r"(x), "r"(MUL | (MUL << 16)), "r"(C | (C << 16)));
    }
    return r;
}
template <unsigned OFF, unsigned MM, int S = 0>
__device__ __forceinline__ unsigned kv_codes_bf16x2_masked(unsigned x) {
    return kv_codes_x2_masked<false, OFF, MM, S>(x);
}
// The fp16 twin: TurboQuant's fp16 PV (decode_turboquant.cu KV_TQ_PV16).
template <unsigned OFF, unsigned MM, int S = 0>
__device__ __forceinline__ unsigned kv_codes_f16x2_masked(unsigned x) {
    return kv_codes_x2_masked<true, OFF, MM, S>(x);
}
