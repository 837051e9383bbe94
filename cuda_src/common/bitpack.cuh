// bitpack.cuh: LSB-first streams of b-bit codes (kvkit/formats/bitpack.py).
//
// Element i of a stream occupies bits [i*b, i*b + b); bit k of the stream is bit (k % 8) of
// byte k / 8. For b = 4, element 2j is the low nibble of byte j; for b = 3, eight elements fill
// three bytes.
#pragma once

// Element i of the b-bit stream starting at p.
template <int BITS>
__device__ __forceinline__ unsigned int kv_get_code(const unsigned char* p, int i) {
    int bit = i * BITS;
    int byte = bit >> 3;
    int shift = bit & 7;
    unsigned int word = p[byte];
    if (shift + BITS > 8) word |= (unsigned int)p[byte + 1] << 8;
    return (word >> shift) & ((1u << BITS) - 1u);
}

// Byte j of the stream of n codes (one code per byte in `codes`, each < 2^BITS); bits past
// element n - 1 are zero.
template <int BITS>
__device__ __forceinline__ unsigned int kv_pack_byte(const unsigned char* codes, int j, int n) {
    int bit0 = j * 8;
    int first = bit0 / BITS;
    int last = (bit0 + 7) / BITS;
    if (last > n - 1) last = n - 1;
    unsigned int acc = 0;
    for (int i = first; i <= last; ++i) {
        int shift = i * BITS - bit0;  // in (-BITS, 8)
        unsigned int c = codes[i];
        acc |= shift >= 0 ? (c << shift) : (c >> -shift);
    }
    return acc & 0xFFu;
}

// Bytes of a stream of n b-bit codes: ceil(n * b / 8).
__host__ __device__ constexpr int kv_packed_bytes(int n, int bits) { return (n * bits + 7) / 8; }
