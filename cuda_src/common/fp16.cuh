// fp16.cuh: float32 <-> IEEE binary16 / bfloat16 bits, the rules of kvkit/formats/codecs.py.
//
//   kv_f16_bits(x)      plain cast (NumPy astype(float16)): RNE, overflow -> +-inf; NaN keeps
//                       its sign and the top 10 payload bits (NumPy's rule: payload >> 13,
//                       made nonzero), so the bytes equal the CPU backend's for every input.
//   kv_f16_bits_sat(x)  codecs.f16_bits(x, saturate=True): |x| clamped to 65504 first;
//                       every NaN -> 0x7E00 (F16_NAN_BITS).
//   kv_f16_to_float(h)  exact widening; NaN keeps sign and payload (payload << 13), as NumPy.
//   kv_bf16_bits(x)     codecs.bf16_bits_array: RNE on the float32 pattern, NaN -> quiet NaN
//                       of the same sign ((u >> 16) | 0x40).
//   kv_bf16_to_float(b) exact (b << 16).
//   kv_input_to_float<DT>(p, i)  element i of a write input of dtype code DT
//                       (0 float32, 1 float16 bits, 2 bfloat16 bits), exactly widened.
//
// Hardware path (KVKIT_HW_F16): cvt.rn.f16.f32 / cvt.f32.f16 as inline PTX (immune to -ftz);
// NaN is patched around them, since the hardware writes a canonical NaN (0x7FFF / 0x7FFFFFFF)
// where the spec keeps the payload. The integer twins give the same bits for every input.
#pragma once
#include "common/arch.cuh"
#include "common/vload.cuh"

// m >> s rounded to nearest, ties to even (0 <= s <= 31; s == 0 returns m).
__device__ __forceinline__ unsigned int kv_rshift_rne(unsigned int m, int s) {
    if (s <= 0) return m;
    if (s >= 32) return 0u;
    unsigned int q = m >> s;
    unsigned int rem = m & ((1u << s) - 1u);
    unsigned int half = 1u << (s - 1);
    return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

// Float32 bits a (sign cleared, finite) with the low s mantissa bits rounded off, RNE.
// A carry into the exponent field is the correct rounded result.
__device__ __forceinline__ unsigned int kv_round_off_bits(unsigned int a, int s) {
    return (a + ((1u << (s - 1)) - 1u) + ((a >> s) & 1u)) >> s;
}

// rint(|x| * 2^k) for a float32 magnitude pattern a with |x| * 2^k < 2^24 (subnormal ranges
// of the narrow types). Integer only, so denormal inputs and -ftz never matter.
__device__ __forceinline__ unsigned int kv_scaled_rint(unsigned int a, int k) {
    int e = (int)(a >> 23);
    unsigned int m = a & 0x7FFFFFu;
    if (e == 0) {
        e = 1;  // float32 denormal: no implicit bit, exponent of the smallest normal
    } else {
        m |= 0x800000u;
    }
    // |x| = m * 2^(e - 150); |x| * 2^k = m * 2^(e - 150 + k)
    int s = 150 - k - e;
    return kv_rshift_rne(m, s);
}

__device__ __forceinline__ unsigned int kv_f16_bits_sw(float x, bool saturate) {
    unsigned int u = __float_as_uint(x);
    unsigned int sign = (u >> 16) & 0x8000u;
    unsigned int a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) {  // NaN
        if (saturate) return 0x7E00u;
        unsigned int h = 0x7C00u | ((a & 0x7FFFFFu) >> 13);
        if (h == 0x7C00u) h = 0x7C01u;
        return sign | h;
    }
    if (saturate && a > 0x477FE000u) a = 0x477FE000u;  // 65504
    if (a >= 0x477FF000u) return sign | 0x7C00u;        // >= 65520 rounds to inf
    if (a >= 0x38800000u) {                             // normal: >= 2^-14
        return sign | (kv_round_off_bits(a, 13) - (112u << 10));
    }
    return sign | kv_scaled_rint(a, 24);  // subnormal multiples of 2^-24 (1024 = min normal)
}

__device__ __forceinline__ unsigned int kv_f16_bits_hw(float x, bool saturate) {
    unsigned int u = __float_as_uint(x);
    unsigned int a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return kv_f16_bits_sw(x, saturate);  // NaN: spec payload rule
    if (saturate && a > 0x477FE000u) x = __uint_as_float((u & 0x80000000u) | 0x477FE000u);
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return (unsigned int)h;
}

__device__ __forceinline__ unsigned int kv_f16_bits(float x) {
#if KVKIT_HW_F16
    return kv_f16_bits_hw(x, false);
#else
    return kv_f16_bits_sw(x, false);
#endif
}

__device__ __forceinline__ unsigned int kv_f16_bits_sat(float x) {
#if KVKIT_HW_F16
    return kv_f16_bits_hw(x, true);
#else
    return kv_f16_bits_sw(x, true);
#endif
}

__device__ __forceinline__ float kv_f16_to_float_sw(unsigned int h) {
    unsigned int sign = (h & 0x8000u) << 16;
    unsigned int e = (h >> 10) & 0x1Fu;
    unsigned int m = h & 0x3FFu;
    if (e == 0x1Fu) return __uint_as_float(sign | 0x7F800000u | (m << 13));  // inf / NaN
    if (e != 0) return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
    if (m == 0) return __uint_as_float(sign);
    // subnormal m * 2^-24: normalize (m < 1024, so the leading bit is at 31 - clz)
    int lead = 31 - __clz((int)m);            // 0..9
    unsigned int mant = (m << (23 - lead)) & 0x7FFFFFu;
    unsigned int exp = (unsigned int)(lead - 24 + 127);
    return __uint_as_float(sign | (exp << 23) | mant);
}

__device__ __forceinline__ float kv_f16_to_float(unsigned int h) {
#if KVKIT_HW_F16
    if ((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0u) return kv_f16_to_float_sw(h);  // NaN
    float f;
    unsigned short hs = (unsigned short)h;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(hs));
    return f;
#else
    return kv_f16_to_float_sw(h);
#endif
}

__device__ __forceinline__ unsigned int kv_bf16_bits(float x) {
    unsigned int u = __float_as_uint(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return ((u >> 16) | 0x40u) & 0xFFFFu;
    return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

__device__ __forceinline__ float kv_bf16_to_float(unsigned int b) {
    return __uint_as_float((b & 0xFFFFu) << 16);
}

// Element i of a write input: DT 0 float32, 1 float16 bits, 2 bfloat16 bits (uint16).
template <int DT>
__device__ __forceinline__ float kv_input_to_float(const void* p, long long i) {
    if (DT == 0) return static_cast<const float*>(p)[i];
    unsigned int bits = static_cast<const unsigned short*>(p)[i];
    return DT == 1 ? kv_f16_to_float(bits) : kv_bf16_to_float(bits);
}

// 32-bit words holding N consecutive write-input elements of dtype code DT (one float each,
// or two 16-bit values each, element j in the low half of word j / 2 when j is even).
template <int DT, int N>
struct KvInputWords {
    static constexpr int n = DT == 0 ? N : (N + 1) / 2;
};

// The raw words of N consecutive write-input elements from element i: the widest vector loads
// that N and the address's alignment allow (16, 8 or 4 bytes), else one load per element.
// Split from the widening (kv_widen_input_words) so a kernel can issue all of its loads before
// it needs the values.
template <int DT, int N>
__device__ __forceinline__ void kv_load_input_words(const void* p, long long i, unsigned int (&w)[KvInputWords<DT, N>::n]) {
    if constexpr (DT == 0) {
        const float* s = static_cast<const float*>(p) + i;
        if (!kv_load_words_any<N>(s, w)) {
#pragma unroll
            for (int j = 0; j < N; ++j) w[j] = __float_as_uint(s[j]);
        }
    } else {
        const unsigned short* s = static_cast<const unsigned short*>(p) + i;
        bool loaded = false;
        if constexpr (N % 2 == 0) loaded = kv_load_words_any<N / 2>(s, w);
        if (!loaded) {
#pragma unroll
            for (int j = 0; j < N; ++j) {
                const unsigned int b = s[j];
                w[j / 2] = (j % 2) ? (w[j / 2] | (b << 16)) : b;
            }
        }
    }
}

// kv_load_input_words where the caller knows element i's address is ALIGN-byte aligned
// (ALIGN a power of two <= 16 dividing the N elements' size): no run-time alignment test.
template <int DT, int N, int ALIGN>
__device__ __forceinline__ void kv_load_input_words_aligned(const void* p, long long i,
                                                            unsigned int (&w)[KvInputWords<DT, N>::n]) {
    static_assert(DT == 0 || N % 2 == 0, "16-bit inputs: whole words");
    const unsigned char* a = static_cast<const unsigned char*>(p) + i * (DT == 0 ? 4 : 2);
    kv_load_words<KvInputWords<DT, N>::n, ALIGN>(a, w);
}

// The values of kv_load_input_words' words: kv_input_to_float's, element for element.
// NAN_PAYLOAD false: a NaN half may widen to any NaN (the bare hardware widening, no NaN test),
// for callers whose bytes depend only on NaN-ness (the NVFP4 writer: E2M1 has no NaN payload).
template <int DT, int N, bool NAN_PAYLOAD = true>
__device__ __forceinline__ void kv_widen_input_words(const unsigned int (&w)[KvInputWords<DT, N>::n], float (&x)[N]) {
    if constexpr (DT == 0) {
#pragma unroll
        for (int j = 0; j < N; ++j) x[j] = __uint_as_float(w[j]);
    } else {
#if KVKIT_HW_F16
        if constexpr (DT == 1 && !NAN_PAYLOAD) {
#pragma unroll
            for (int j = 0; j < N; ++j) {
                const unsigned short hs = (unsigned short)(w[j / 2] >> (16 * (j % 2)));
                asm("cvt.f32.f16 %0, %1;" : "=f"(x[j]) : "h"(hs));
            }
            return;
        }
        if constexpr (DT == 1) {
            // A NaN half is (h & 0x7FFF) > 0x7C00, i.e. (h & 0x7FFF) + 0x3FF sets bit 15 (no
            // carry leaves a half). Without one, every element takes the bare hardware
            // widening (exact); with one, the whole vector takes kv_f16_to_float (payload
            // rule). One test per vector instead of a NaN branch per element.
            unsigned int nan_bits = 0u;
#pragma unroll
            for (int j = 0; j < (N + 1) / 2; ++j) nan_bits |= (w[j] & 0x7FFF7FFFu) + 0x03FF03FFu;
            if ((nan_bits & 0x80008000u) == 0u) {
#pragma unroll
                for (int j = 0; j < N; ++j) {
                    const unsigned short hs = (unsigned short)(w[j / 2] >> (16 * (j % 2)));
                    asm("cvt.f32.f16 %0, %1;" : "=f"(x[j]) : "h"(hs));
                }
                return;
            }
        }
#endif
#pragma unroll
        for (int j = 0; j < N; ++j) {
            const unsigned int bits = (w[j / 2] >> (16 * (j % 2))) & 0xFFFFu;
            x[j] = DT == 1 ? kv_f16_to_float(bits) : kv_bf16_to_float(bits);
        }
    }
}

// N consecutive write-input elements from element i into x, DT as in kv_input_to_float (the
// loads of kv_load_input_words, the values of kv_input_to_float).
template <int DT, int N>
__device__ __forceinline__ void kv_load_inputs(const void* p, long long i, float (&x)[N]) {
    unsigned int w[KvInputWords<DT, N>::n];
    kv_load_input_words<DT, N>(p, i, w);
    kv_widen_input_words<DT, N>(w, x);
}
