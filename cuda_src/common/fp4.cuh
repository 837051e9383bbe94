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

// RNE of a magnitude to {0, .5, 1, 1.5, 2, 3, 4, 6} (codes 0..7) as the number of midpoints
// below it, compared as float32 bit patterns (ordered like the values for a >= 0). A
// midpoint whose even neighbour (codes 0, 2, 4, 6) is the lower one counts once passed (>),
// one whose even neighbour is the upper one once reached (>=). Seven compares, no branches:
// the write kernels run this per element, and the branchy bit rounding it replaced put
// branches and divergence syncs (BRA, BSSY, BSYNC: 20% of the instructions) into the NVFP4
// write's profile on the H200. >= 6 and inf give 7 (saturation).
__device__ __forceinline__ unsigned int kv_e2m1_mag_sw(unsigned int a) {
    // a: |x| float32 bits (a NaN pattern gives 7)
    return (unsigned int)(a > 0x3E800000u)      // 0.25: 0 | 0.5
           + (unsigned int)(a >= 0x3F400000u)   // 0.75: 0.5 | 1
           + (unsigned int)(a > 0x3FA00000u)    // 1.25: 1 | 1.5
           + (unsigned int)(a >= 0x3FE00000u)   // 1.75: 1.5 | 2
           + (unsigned int)(a > 0x40200000u)    // 2.5: 2 | 3
           + (unsigned int)(a >= 0x40600000u)   // 3.5: 3 | 4
           + (unsigned int)(a > 0x40A00000u);   // 5: 4 | 6
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
