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
