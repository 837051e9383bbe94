// fp8.cuh: E4M3 (e4m3fn) encode / decode with the rules of kvkit/formats/codecs.py.
//
//   kv_e4m3_encode(x) -> byte   RNE on the magnitude (subnormal quantum 2^-9), saturating to
//                               +-448 (satfinite, also for +-inf), NaN -> 0x7F, sign kept for
//                               -0 and for negative values that round to zero (0x80).
//   kv_e4m3x2_encode(lo, hi)    two bytes at once (lo in bits 0..7, hi in bits 8..15).
//   kv_e4m3_decode(byte)        exact value; 0x7F and 0xFF both decode to the positive quiet
//                               NaN 0x7FC00000 (the CPU table's bits: codecs.e4m3_decode
//                               returns +nan before applying the sign).
//
// Hardware path (KVKIT_HW_FP8, sm_89+): cvt.rn.satfinite.e4m3x2.f32 d, a, b puts a in the
// upper byte and b in the lower. It is applied to |x| (NaN replaced by 0) and the sign and
// NaN are set afterwards, so the instruction's own sign-of-zero and NaN choices never reach
// the bytes. The software twin is integer arithmetic on the float32 pattern.
#pragma once
#include "common/arch.cuh"
#include "common/fp16.cuh"

__device__ __forceinline__ unsigned int kv_e4m3_mag_sw(unsigned int a) {
    // a: |x| float32 bits, not NaN
    if (a >= 0x43E00000u) return 0x7Eu;                                  // >= 448: satfinite
    if (a >= 0x3C800000u) return kv_round_off_bits(a, 20) - (120u << 3);  // normal, >= 2^-6
    return kv_scaled_rint(a, 9);  // subnormal multiples of 2^-9; 8 is the min normal's code
}

__device__ __forceinline__ unsigned int kv_e4m3x2_encode(float lo, float hi) {
    unsigned int ul = __float_as_uint(lo), uh = __float_as_uint(hi);
    unsigned int al = ul & 0x7FFFFFFFu, ah = uh & 0x7FFFFFFFu;
    bool nan_l = al > 0x7F800000u, nan_h = ah > 0x7F800000u;
#if KVKIT_HW_FP8
    unsigned short r;
    float ml = nan_l ? 0.0f : __uint_as_float(al);
    float mh = nan_h ? 0.0f : __uint_as_float(ah);
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(mh), "f"(ml));
    unsigned int cl = r & 0x7Fu, ch = (r >> 8) & 0x7Fu;
#else
    unsigned int cl = kv_e4m3_mag_sw(nan_l ? 0u : al);
    unsigned int ch = kv_e4m3_mag_sw(nan_h ? 0u : ah);
#endif
    cl = nan_l ? 0x7Fu : (cl | ((ul >> 24) & 0x80u));
    ch = nan_h ? 0x7Fu : (ch | ((uh >> 24) & 0x80u));
    return cl | (ch << 8);
}

// The magnitude codes of two non-negative, non-NaN floats (+inf allowed): lo's in bits 0..6,
// hi's in bits 8..14; bits 7 and 15 are unspecified (callers mask them; the hardware path is
// kv_e4m3x2_encode's instruction on the same kind of operands, whose bits it already uses).
__device__ __forceinline__ unsigned int kv_e4m3x2_mag(float lo, float hi) {
#if KVKIT_HW_FP8
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return kv_e4m3_mag_sw(__float_as_uint(lo)) | (kv_e4m3_mag_sw(__float_as_uint(hi)) << 8);
#endif
}

__device__ __forceinline__ unsigned int kv_e4m3_encode(float x) {
#if KVKIT_HW_FP8
    return kv_e4m3x2_encode(x, 0.0f) & 0xFFu;
#else
    unsigned int u = __float_as_uint(x);
    unsigned int a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return 0x7Fu;
    return kv_e4m3_mag_sw(a) | ((u >> 24) & 0x80u);
#endif
}

__device__ __forceinline__ float kv_e4m3_decode(unsigned int b) {
    unsigned int sign = (b & 0x80u) << 24;
    unsigned int e = (b >> 3) & 0xFu;
    unsigned int m = b & 0x7u;
    if ((b & 0x7Fu) == 0x7Fu) return __uint_as_float(0x7FC00000u);
    if (e != 0) return __uint_as_float(sign | ((e + 120u) << 23) | (m << 20));
    // subnormal m * 2^-9 (m <= 7): 2^-9 * (m / 2^lead) normalized, or a signed zero
    if (m == 0) return __uint_as_float(sign);
    int lead = 31 - __clz((int)m);  // 0..2
    unsigned int mant = (m << (23 - lead)) & 0x7FFFFFu;
    return __uint_as_float(sign | ((unsigned int)(lead - 9 + 127) << 23) | mant);
}

// kv_e4m3_decode for a non-negative code b <= 0x7F (an NVFP4 block scale, from a magnitude):
// the code shifted into a float32's exponent and mantissa fields is 2^(e-127) (1 + m/8), or
// the subnormal m 2^-129 when e = 0, and the product with 2^120 (exact: the write kernels keep
// subnormals) is e4m3's 2^(e-7) (1 + m/8), or m 2^-9. 0x7F: the same quiet NaN. CPU model
// kvkit/formats/arch_models.py e4m3_decode_scaled.
__device__ __forceinline__ float kv_e4m3_decode_pos(unsigned int b) {
    const float v = __fmul_rn(__uint_as_float(b << 20), 1.329227995784915873e36f);  // 2^120
    return b == 0x7Fu ? __uint_as_float(0x7FC00000u) : v;
}
