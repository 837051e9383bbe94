// vlanes.cuh: the warp helpers of hadamard.cuh (and the write kernels' first-extreme combine)
// for R rows per warp, with their operation order unchanged.
//
// The spec's reductions and FWHT are written for one row per warp: 32 lanes, lane l holding
// elements [l E, l E + E). Here a warp serves R rows (R = 1, 2 or 4), L = 32 / R lanes each
// (row g on lanes [g L, g L + L)), and physical lane p of a row holds the spec's lanes
// ("virtual lanes") v = p + L r for r = 0..R-1, as x[r][0..E). A butterfly level of distance
// m between virtual lanes is then a shuffle with lane p ^ m when m < L (it stays in the row's
// L lanes) and a register exchange between r and r ^ (m / L) when m >= L. Levels run in the
// spec's order, and each pairwise result is computed from the same two operands (a + b ==
// b + a in IEEE arithmetic), so every value is the spec's, bit for bit.
#pragma once

#include "common/hadamard.cuh"

// kv_vlane_sum after its first step: acc[r] is virtual lane p + L r's sequential sum of its
// E values (sq[r][0] + sq[r][1] + ..., left to right); the row's sum on every lane.
template <int R>
__device__ __forceinline__ float kv_vlane_sum_lanes(float (&acc)[R]) {
    constexpr int L = 32 / R;
#pragma unroll
    for (int off = 16; off >= L; off >>= 1) {  // virtual distances 16, 8, ... >= L: registers
        const int d = off / L;
        float next[R];
#pragma unroll
        for (int r = 0; r < R; ++r) next[r] = __fadd_rn(acc[r], acc[r ^ d]);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = next[r];
    }
    float s = acc[0];  // all R are equal now
#pragma unroll
    for (int off = L / 2; off > 0; off >>= 1) s = __fadd_rn(s, __shfl_xor_sync(KV_FULL_WARP, s, off));
    return s;
}

// kv_warp_sum_squares for R rows, of squares already rounded (sq = RN(x * x)): the row's sum
// over all of its virtual lanes, on every lane, in kv_warp_sum_squares' order.
template <int R, int E>
__device__ __forceinline__ float kv_vlane_sum(const float (&sq)[R][E]) {
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        acc[r] = sq[r][0];
#pragma unroll
        for (int j = 1; j < E; ++j) acc[r] = __fadd_rn(acc[r], sq[r][j]);
    }
    return kv_vlane_sum_lanes<R>(acc);
}

// kv_warp_sum_squares for R rows: the row's sum over all of its virtual lanes, on every lane.
template <int R, int E>
__device__ __forceinline__ float kv_vlane_sum_squares(const float (&x)[R][E]) {
    float sq[R][E];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < E; ++j) sq[r][j] = __fmul_rn(x[r][j], x[r][j]);
    return kv_vlane_sum<R, E>(sq);
}

// kv_warp_fwht for R rows: stages h = 1, 2, ..., 32 E / 2 in increasing order.
template <int R, int E>
__device__ __forceinline__ void kv_vlane_fwht(float (&x)[R][E]) {
    constexpr int L = 32 / R;
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int h = 1; h < E; h <<= 1) {
#pragma unroll
            for (int i = 0; i < E; ++i) {
                if ((i & h) == 0) {
                    const float a = x[r][i], b = x[r][i + h];
                    x[r][i] = __fadd_rn(a, b);
                    x[r][i + h] = __fsub_rn(a, b);
                }
            }
        }
    }
    const int p = (threadIdx.x & 31) % L;
#pragma unroll
    for (int m = 1; m < 32; m <<= 1) {  // virtual lane distance m, h = m E
        if (m < L) {
            // The lower lane computes x + other, the upper other - x: both are one fmaf with
            // a +-1 multiplier, whose product is exact, so the single rounding is that of the
            // sum (signed zeros and NaN included). A select between an add and a subtract costs
            // two predicated adds per element.
            const float sgn = (p & m) == 0 ? 1.0f : -1.0f;
#pragma unroll
            for (int r = 0; r < R; ++r) {
#pragma unroll
                for (int j = 0; j < E; ++j) {
                    const float other = __shfl_xor_sync(KV_FULL_WARP, x[r][j], m);
                    x[r][j] = __fmaf_rn(x[r][j], sgn, other);
                }
            }
        } else {
            const int d = m / L;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if ((r & d) == 0) {
#pragma unroll
                    for (int j = 0; j < E; ++j) {
                        const float a = x[r][j], b = x[r ^ d][j];
                        x[r][j] = __fadd_rn(a, b);
                        x[r ^ d][j] = __fsub_rn(a, b);
                    }
                }
            }
        }
    }
}

// One level of the first-occurring NaN-ignoring min (MAXIMUM=false) or max: a is the lower-
// index segment's value, b the higher's; a NaN (no value yet) is the identity.
template <bool MAXIMUM>
__device__ __forceinline__ float kv_first_extreme2(float a, float b) {
    const bool take_b = (MAXIMUM ? (b > a) : (b < a)) || (a != a);
    return take_b ? b : a;
}

// The row's combine of per-virtual-lane values mine[r] (each the first-occurring extreme of
// that lane's elements), on every lane of the row. Distances 1, 2, 4, 8, 16 in increasing
// order, so each step joins two adjacent runs of virtual lanes, lower run first: that is the
// sequential scan of the CPU writer (ties keep the earlier element, e.g. -0 before +0). (The
// sums above keep the spec's decreasing order; a first-occurring extreme is not a sum.)
template <bool MAXIMUM, int R>
__device__ __forceinline__ float kv_vlane_first_extreme(const float (&mine)[R]) {
    constexpr int L = 32 / R;
    float m[R];
#pragma unroll
    for (int r = 0; r < R; ++r) m[r] = mine[r];
    const int p = (threadIdx.x & 31) % L;
#pragma unroll
    for (int off = 1; off < L; off <<= 1) {  // distances below L: shuffles, per r
        const bool lower = (p & off) == 0;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float other = __shfl_xor_sync(KV_FULL_WARP, m[r], off);
            m[r] = kv_first_extreme2<MAXIMUM>(lower ? m[r] : other, lower ? other : m[r]);
        }
    }
#pragma unroll
    for (int off = L; off < 32; off <<= 1) {  // distances L, 2L, ...: registers r ^ (off / L)
        const int d = off / L;
        float next[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const bool lower = (r & d) == 0;
            next[r] = kv_first_extreme2<MAXIMUM>(lower ? m[r] : m[r ^ d], lower ? m[r ^ d] : m[r]);
        }
#pragma unroll
        for (int r = 0; r < R; ++r) m[r] = next[r];
    }
    return m[0];
}
