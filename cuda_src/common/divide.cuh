// divide.cuh: IEEE float32 division a / b (== __fdiv_rn(a, b), bit for bit) for many a and one
// b, with the reciprocal of b computed once. The write kernels divide every element of a row
// by a row-uniform divisor (the TurboQuant key's den, the value scale, a layer's FP8 k_scale);
// __fdiv_rn per element costs a reciprocal, a range check (FCHK) and a divergence guard each
// time. CPU model and checks: kvkit/formats/arch_models.py (div_by_reciprocal) and
// tests/formats/test_divide_model.py.
//
// Per element, with y = RN(1 / b) (__frcp_rn, once per row), every step one rounding:
//   q0 = RN(a y);  e0 = RN(q0 b - a);  q1 = RN(q0 - e0 y);  e1 = RN(q1 b - a);  q = RN(q1 - e1 y)
// Why q == RN(a / b), under the range conditions below (no result or remainder underflows or
// overflows; all values normal or exact zeros):
// 1. y = (1/b)(1 + d), |d| <= 2^-24, so q0 = (a/b)(1 + d)(1 + d') is within 2^-22.9 |a/b|.
// 2. e0 = -(a - b q0)(1 + d''), |d''| <= 2^-24 (a - b q0 is a multiple of 2^-127 here, so it is
//    exact if it falls below the normal range). q0 - e0 y = a/b + (a/b - q0)(d + d'' + d d''),
//    within 2^-45 |a/b| of a/b, far inside half an ulp: its rounding q1 is one of the two floats
//    around a/b (a faithful quotient).
// 3. Markstein's theorem (P. Markstein, IBM J. Res. Dev. 34(1), 1990; Muller et al., Handbook
//    of Floating-Point Arithmetic, "division with a fused multiply-add"): for y within half an
//    ulp of 1/b and a faithful q1, the remainder a - b q1 is exact (so -e1 is it) and
//    RN(q1 + (a - b q1) y) = RN(a/b).
// Signed zeros: a = +-0 gives q0 = +-0, e0 = e1 = +0 (opposite zeros summed), q = -0 y + q0 =
// q0: the sign of a, as __fdiv_rn (b > 0).
// Range conditions (else the caller falls back to __fdiv_rn; both are checked here):
//   row:     2^-40 <= b <= 2^40 (so b > 0, y normal; NaN fails)
//   element: a == 0, or 2^-40 <= |q0| <= 2^40 (NaN / inf fail). Then |a| is within
//            [2^-82, 2^82], every product and remainder has a quantum >= 2^-127 (>= the
//            denormal quantum 2^-149) and nothing overflows.
// The kernels are built without -ftz (kvkit/cuda/compiler.py EXACT_OPTIONS), which the
// exactness of the remainder in the subnormal range relies on.
#pragma once

#define KV_DIV_LO 9.094947017729282379e-13f  // 2^-40
#define KV_DIV_HI 1.099511627776e12f         // 2^40
// Divisors b in [2^-16, 2^16] keep the element condition for every finite float16 dividend:
// |a| is 0 or in [2^-24, 65504], y = RN(1/b) in [2^-16, 2^16] (RN is monotone and the ends are
// powers of two), so |q0| = RN(|a| y) is in [RN(2^-40), RN(65504 * 2^16)] within [2^-40, 2^40].
// (The fp8 write's fast chunk; CPU check tests/formats/test_fp8_fast_chunk.py.)
#define KV_DIV_F16_LO 1.52587890625e-05f  // 2^-16
#define KV_DIV_F16_HI 65536.0f            // 2^16

struct KvDivisor {
    float b;    // the divisor
    float y;    // RN(1 / b) where ok, else 1
    bool ok;    // b in [2^-40, 2^40]: kv_div_by may be used
};

__device__ __forceinline__ KvDivisor kv_divisor(float b) {
    KvDivisor d;
    d.b = b;
    d.ok = b >= KV_DIV_LO && b <= KV_DIV_HI;
    d.y = __frcp_rn(d.ok ? b : 1.0f);
    return d;
}

// RN(a / d.b) when d.ok and the element condition holds; ok &= the element condition.
__device__ __forceinline__ float kv_div_by(float a, const KvDivisor& d, bool& ok) {
    const float q0 = __fmul_rn(a, d.y);
    const float e0 = __fmaf_rn(q0, d.b, -a);
    const float q1 = __fmaf_rn(-e0, d.y, q0);
    const float e1 = __fmaf_rn(q1, d.b, -a);
    const float aq = fabsf(q0);
    ok = ok && ((aq >= KV_DIV_LO && aq <= KV_DIV_HI) || a == 0.0f);
    return __fmaf_rn(-e1, d.y, q1);
}

// kv_div_by without the element condition, for callers that keep only floor(RN(a / b) + 0.5)
// of a quotient known to be at most a few units (the TurboQuant V codes, a in [0, 15.01 b]),
// with kv_divisor(b).ok: where the condition would fail, |q0| < 2^-40, every intermediate
// stays below 2^-39 (absolute errors from subnormal rounding <= 2^-149 y <= 2^-109), so the
// result and RN(a / b) both round q + 0.5 to 0.5; NaN a gives NaN either way. CPU model:
// kvkit/formats/arch_models.py tq_value_codes.
__device__ __forceinline__ float kv_div_by_unchecked(float a, const KvDivisor& d) {
    const float q0 = __fmul_rn(a, d.y);
    const float e0 = __fmaf_rn(q0, d.b, -a);
    const float q1 = __fmaf_rn(-e0, d.y, q0);
    const float e1 = __fmaf_rn(q1, d.b, -a);
    return __fmaf_rn(-e1, d.y, q1);
}
