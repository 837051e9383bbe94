// probe_codes.cu: the tensor-core operand conversions of common/decode_codes.cuh, one input
// per thread, so the GPU tests (tests/cuda/test_decode_codes_gpu.py) can run every input of a
// conversion through the path the device takes (native, or a PTX override such as sm_80's
// software conversions) and compare the bits with ml_dtypes. Not used by the library.
#include "common/decode_codes.cuh"

// Two E4M3 codes -> fp16x2 (kv_dc_e4m3x2_f16x2); out[n] is KV_E4M3_F16_FACTOR's float bits.
extern "C" __global__ void kv_probe_e4m3x2_f16x2(
    const unsigned* __restrict__ two,  // (n,) uint32: code 2j in bits 0..7, 2j+1 in 8..15
    unsigned* __restrict__ out,        // (n + 1,) uint32: fp16x2 bits, then the factor
    int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = kv_dc_e4m3x2_f16x2(two[i]);
    if (i == 0) out[n] = __float_as_uint(KV_E4M3_F16_FACTOR);
}

// One E2M1 byte -> fp16x2 scaled by 2^-14 (kv_dc_e2m1x2_f16x2).
extern "C" __global__ void kv_probe_e2m1x2_f16x2(
    const unsigned* __restrict__ byte,  // (n,) uint32: element 2j in bits 0..3, 2j+1 in 4..7
    unsigned* __restrict__ out,         // (n,) uint32: fp16x2 bits
    int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = kv_dc_e2m1x2_f16x2(byte[i]);
}

// Eight E2M1 codes (one word) -> four fp16x2 words scaled by 2^-14 (kv_dc_e2m1x8_f16x2): out
// word 4 i + k holds nibbles k and k + 4 of word[i].
extern "C" __global__ void kv_probe_e2m1x8_f16x2(
    const unsigned* __restrict__ word,  // (n,) uint32: eight codes, nibble 0 in bits 0..3
    unsigned* __restrict__ out,         // (4 n,) uint32: fp16x2 bits
    int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned h[4];
        kv_dc_e2m1x8_f16x2(word[i], h);
        reinterpret_cast<uint4*>(out)[i] = make_uint4(h[0], h[1], h[2], h[3]);
    }
}

// Four E4M3 codes (one word) -> the NaN-free fast path's two fp16x2 words
// (kv_dc_e4m3x4_f16x2_finite, e4m3 * 2^-8 on every target: the software bits) and its NaN
// test of that one word (kv_dc_e4m3_nan_acc / _found: 1 when a byte is 0x7F or 0xFF).
extern "C" __global__ void kv_probe_e4m3x4_f16x2_finite(
    const unsigned* __restrict__ word,  // (n,) uint32: code 4j in bits 0..7, ...
    unsigned* __restrict__ out,         // (3 n,) uint32: bytes 0, 1 (lo), 2, 3 (hi), NaN flag
    int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned lo, hi;
        kv_dc_e4m3x4_f16x2_finite(word[i], &lo, &hi);
        out[3 * i] = lo;
        out[3 * i + 1] = hi;
        out[3 * i + 2] = kv_dc_e4m3_nan_found(kv_dc_e4m3_nan_acc(0u, word[i])) ? 1u : 0u;
    }
}
