// hadamard.cuh: warp-level helpers over one D-vector (kvkit/formats/hadamard.py).
//
// Layout: D = 32 * E; lane l of the (full, converged) warp holds elements [l*E, l*E + E) in
// x[0..E). Both helpers reproduce the spec's float32 operation order exactly:
//   kv_warp_sum_squares<E>(x): per lane acc = x0*x0, then acc + xj*xj for j = 1..E-1 (product
//     rounded, then added: __fmul_rn / __fadd_rn, never fused); then the xor butterfly with
//     offsets 16, 8, 4, 2, 1 (acc + partner's acc). Every lane returns the same value.
//   kv_warp_fwht<E>(x): unnormalized FWHT, stages h = 1, 2, ..., D/2 in increasing order;
//     each pair (i, i + h) with bit h of i clear becomes (a + b, a - b), a the lower-index
//     element. Stages h < E are in registers; stages h >= E exchange with lane l ^ (h / E).
// Self-contained (only warp intrinsics), so decode kernels can include it for query rotation.
#pragma once

#define KV_FULL_WARP 0xFFFFFFFFu

template <int E>
__device__ __forceinline__ float kv_warp_sum_squares(const float (&x)[E]) {
    float acc = __fmul_rn(x[0], x[0]);
#pragma unroll
    for (int j = 1; j < E; ++j) acc = __fadd_rn(acc, __fmul_rn(x[j], x[j]));
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        acc = __fadd_rn(acc, __shfl_xor_sync(KV_FULL_WARP, acc, off));
    }
    return acc;
}

template <int E>
__device__ __forceinline__ void kv_warp_fwht(float (&x)[E]) {
#pragma unroll
    for (int h = 1; h < E; h <<= 1) {
#pragma unroll
        for (int i = 0; i < E; ++i) {
            if ((i & h) == 0) {
                float a = x[i], b = x[i + h];
                x[i] = __fadd_rn(a, b);
                x[i + h] = __fsub_rn(a, b);
            }
        }
    }
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int m = 1; m < 32; m <<= 1) {  // lane distance m = h / E, h = E, 2E, ..., 16E = D/2
        const bool lower = (lane & m) == 0;
#pragma unroll
        for (int j = 0; j < E; ++j) {
            float other = __shfl_xor_sync(KV_FULL_WARP, x[j], m);
            // lower lane holds a (lower index): a + b; upper lane holds b: a - b
            x[j] = lower ? __fadd_rn(x[j], other) : __fsub_rn(other, x[j]);
        }
    }
}
