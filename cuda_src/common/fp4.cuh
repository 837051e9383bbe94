// fp4.cuh: E2M1 (FP4) codes with the rules of kvkit/formats/codecs.py.
//
//   kv_e2m1_encode(x) -> code 0..15   RNE on the magnitude, saturating to 6 (also +-inf);
//                                     sign in bit 3 (kept for -0 and negative underflow);
//                                     NaN -> 0x7 (+6: E2M1 has no NaN).
//   kv_e2m1x2_encode(lo, hi) -> byte  lo in the low nibble, hi in the high nibble (the NVFP4
//                                     order: element 2j low, 2j+1 high).
//   kv_e2m1_value(code) -> float      exact value; code 8 is -0.0.
//
// Hardware path (KVKIT_HW_FP4, sm_100a / sm_120a only): cvt.rn.satfinite.e2m1x2.f32 d, a, b
// with a .b8 destination (a = element 1 = high nibble). It is applied to |x| with NaN
// replaced by 6.0, and the sign bits are ORed in afterwards, so its sign-of-zero and NaN
// behaviour never reach the bytes. The software twin is integer arithmetic.
#pragma once
#include "common/arch.cuh"
#include "common/fp16.cuh"

// RNE of a magnitude to {0, .5, 1, 1.5, 2, 3, 4, 6} (codes 0..7), branch-free:
//   |x| >= 1: E2M1 is a float with one mantissa bit there, so the float32 pattern rounded to
//             one mantissa bit (kv_round_off_bits, RNE; a carry into the exponent is right),
//             exponent field * 2 + mantissa bit, is the code + 252 (1.0: 127 * 2 = 254 -> 2);
//             saturated at 7 (also inf, and every NaN pattern, as the NaN rule wants: 7).
//   |x| < 1:  the halves 0, .5, 1 (codes 0, 1, 2): RN(|x| + 2^22) has ulp 0.5 at 2^22, so its
//             pattern minus 2^22's counts the halves with ties to even (denormals exact: the
//             write kernels keep them, -ftz=false).
// About ten instructions where the count of seven midpoint compares (and, before it, the
// branchy bit rounding: BRA / BSSY / BSYNC were 20% of the NVFP4 write's instructions on the
// H200) took about fifteen. kvkit/formats/arch_models.py e2m1_software is the same formula.
__device__ __forceinline__ unsigned int kv_e2m1_mag_sw(unsigned int a) {
    // a: |x| float32 bits (a NaN pattern gives 7)
    const unsigned int big = min(kv_round_off_bits(a, 22) - 252u, 7u);
    const unsigned int small = __float_as_uint(__fadd_rn(__uint_as_float(a), 4194304.0f)) - 0x4A800000u;
    return a >= 0x3F800000u ? big : small;
}

__device__ __forceinline__ unsigned int kv_e2m1x2_encode(float lo, float hi) {
    unsigned int ul = __float_as_uint(lo), uh = __float_as_uint(hi);
    unsigned int al = ul & 0x7FFFFFFFu, ah = uh & 0x7FFFFFFFu;
    bool nan_l = al > 0x7F800000u, nan_h = ah > 0x7F800000u;
    unsigned int sl = nan_l ? 0u : ((ul >> 28) & 0x8u);
    unsigned int sh = nan_h ? 0u : ((uh >> 28) & 0x8u);
#if KVKIT_HW_FP4
    float ml = nan_l ? 6.0f : __uint_as_float(al);
    float mh = nan_h ? 6.0f : __uint_as_float(ah);
    unsigned int r;
    asm("{\n\t.reg .b8 t;\n\t"
        "cvt.rn.satfinite.e2m1x2.f32 t, %1, %2;\n\t"
        "cvt.u32.u8 %0, t;\n\t}"
        : "=r"(r)
        : "f"(mh), "f"(ml));
    unsigned int cl = r & 0x7u, ch = (r >> 4) & 0x7u;
#else
    // A NaN pattern is above every midpoint: magnitude 7, as the NaN rule wants.
    unsigned int cl = kv_e2m1_mag_sw(al);
    unsigned int ch = kv_e2m1_mag_sw(ah);
#endif
    return (cl | sl) | ((ch | sh) << 4);
}

// kv_e2m1_mag_sw for a magnitude m = |x| that is not NaN, in float arithmetic: with
// P = 2^floor(log2(clamp(m, 1, 8))), RN(m + P 2^22) has ulp P / 2, so its pattern minus that of
// P 2^22 is m / (P / 2) rounded to nearest even; plus 2 log2(P) it is the code (P = 1: the
// halves 0..4; P = 2: 2 + {2, 3, 4}; P = 4: 4 + {2, 3, 4}; P = 8: >= 8), at most 7 (saturation,
// +inf too). About eight instructions where the integer rounding, the 2^22 path and their
// select took ten. CPU model: kvkit/formats/arch_models.py e2m1_software_nonan.
__device__ __forceinline__ unsigned int kv_e2m1_mag_sw_nonan(float m) {
    const unsigned int pb = __float_as_uint(fminf(fmaxf(m, 1.0f), 8.0f)) & 0x7F800000u;
    const float s = __fadd_rn(m, __uint_as_float(pb + (22u << 23)));
    return min(__float_as_uint(s) - pb - (22u << 23) + (pb >> 22) - 254u, 7u);
}

// kv_e2m1x2_encode for inputs known not to be NaN (the NVFP4 writer's blocks with a finite
// amax and a finite reciprocal): the same bits without the two NaN tests and sign selects.
__device__ __forceinline__ unsigned int kv_e2m1x2_encode_nonan(float lo, float hi) {
    unsigned int ul = __float_as_uint(lo), uh = __float_as_uint(hi);
    [[maybe_unused]] unsigned int al = ul & 0x7FFFFFFFu, ah = uh & 0x7FFFFFFFu;
#if KVKIT_HW_FP4
    unsigned int r;
    asm("{\n\t.reg .b8 t;\n\t"
        "cvt.rn.satfinite.e2m1x2.f32 t, %1, %2;\n\t"
        "cvt.u32.u8 %0, t;\n\t}"
        : "=r"(r)
        : "f"(__uint_as_float(ah)), "f"(__uint_as_float(al)));
    unsigned int cl = r & 0x7u, ch = (r >> 4) & 0x7u;
#else
    unsigned int cl = kv_e2m1_mag_sw_nonan(fabsf(lo));
    unsigned int ch = kv_e2m1_mag_sw_nonan(fabsf(hi));
#endif
    return (cl | ((ul >> 28) & 0x8u)) | ((ch | ((uh >> 28) & 0x8u)) << 4);
}

// The NVFP4 writer's software E2M1 rounding for a block whose products are all below 7 in
// magnitude and not NaN (it checks RN(amax * inv) < 7 once per block; RN is monotonic, so
// every |x_i * inv| is below that too). With e the exponent field of max(|m|, 1) (P =
// 2^(e - 127) in {1, 2, 4}), the magic M = ((e + 22) << 23) | (1 << 22) | 2 (e - 127) (one
// IMAD on e) lies in [P 2^22, P 2^23) with an even last bit, so s = RN(|m| + M) is M plus
// |m| / (P / 2) rounded to nearest even, k: the low byte of s is k + 2 (e - 127), the
// magnitude code (<= 7 below 7; bits 8..21 of s are zero), and s - M (exact) is the E2M1
// magnitude. Four instructions (FMNMX, SHF, IMAD, FADD) where kv_e2m1_mag_sw_nonan took nine;
// the sign is the caller's (bit 3 from the input's sign). CPU model and exhaustive check:
// kvkit/formats/arch_models.py e2m1_magic, tests/formats/test_e2m1_magic.py.
struct KvE2m1Magic {
    unsigned int s;  // bits of RN(|m| + M): code in the low byte
    float magic;     // M
};
__device__ __forceinline__ KvE2m1Magic kv_e2m1_magic(float m) {
    const unsigned int e = __float_as_uint(fmaxf(fabsf(m), 1.0f)) >> 23;
    KvE2m1Magic r;
    r.magic = __uint_as_float(e * 0x800002u + 0x0B3FFF02u);  // (e + 22) << 23 | 1 << 22 | 2 (e - 127)
    r.s = __float_as_uint(__fadd_rn(fabsf(m), r.magic));
    return r;
}

__device__ __forceinline__ unsigned int kv_e2m1_encode(float x) {
#if KVKIT_HW_FP4
    return kv_e2m1x2_encode(x, 0.0f) & 0xFu;
#else
    unsigned int u = __float_as_uint(x);
    unsigned int a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return 0x7u;
    return kv_e2m1_mag_sw(a) | ((u >> 28) & 0x8u);
#endif
}

__device__ __forceinline__ float kv_e2m1_value(unsigned int code) {
    // Twice the magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6} are the nibbles of 0xC8643210.
    unsigned int twice = (0xC8643210u >> ((code & 0x7u) * 4u)) & 0xFu;
    float mag = __fmul_rn(__uint2float_rn(twice), 0.5f);  // exact
    return __uint_as_float(__float_as_uint(mag) | ((code & 0x8u) << 28));
}

// kv_e2m1_value by scaling (the NVFP4 writer's 4over6 error): the magnitude code c shifted
// into a float32's exponent and mantissa fields, (c << 22), is 2^(e-127) (1 + m/2) with
// e = c >> 1, or the subnormal 2^-127 for c = 1; times 2^126 (exact: subnormals kept) that
// is E2M1's 2^(e-1) (1 + m/2), or 0.5, or 0; the sign bit rides along. CPU model:
// kvkit/formats/arch_models.py e2m1_value_scaled.
__device__ __forceinline__ float kv_e2m1_value_scaled(unsigned int code) {
    const unsigned int raw = ((code & 0x7u) << 22) | ((code & 0x8u) << 28);
    return __fmul_rn(__uint_as_float(raw), 8.507059173023461586e37f);  // 2^126
}
