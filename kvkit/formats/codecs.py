"""Scalar and array codecs for the element types kvkit stores: E2M1, E4M3, fp16, bf16.

Every scalar function here is written in the subset of Python that Numba compiles, so the
CPU backend jits these very functions (DESIGN.md section 2: one spec, two backends). The
array functions are independent NumPy formulations of the same rules; tests hold the two
against each other and against ``ml_dtypes``.

Rounding rules (all round-to-nearest-even on the magnitude, sign kept, including -0):

* E2M1 (FP4): magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}, sign in bit 3, saturating to 6.
  NaN encodes as +6 (code 0x7): E2M1 has no NaN, and a NaN can only reach the encoder from a
  NaN input element, never from a block scale (amax ignores NaN).
* E4M3 (e4m3fn): bias 7, max 448, no infinity, 0x7F is NaN. Encoding saturates to +-448
  ("satfinite"); NaN encodes as 0x7F.
* fp16: IEEE binary16, RNE; ``f16_bits`` overflows to infinity like a plain cast,
  ``f16_bits(x, saturate=True)`` clamps to +-65504 first (TurboQuant scale, zero and norm).
* bf16: RNE on the float32 bit pattern, NaN kept quiet.

Denormals: all arithmetic here is IEEE with gradual underflow; the CUDA backend compiles its
write kernels without flush-to-zero so that it agrees (DESIGN.md section 4).
"""

from __future__ import annotations

import math

import numpy as np

# --- E2M1 -------------------------------------------------------------------------------------

#: Magnitude of each 3-bit E2M1 code (bit 3 of a nibble is the sign).
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0
E2M1_SIGN_BIT = 0x8
#: Value of all 16 nibbles, float32.
E2M1_VALUES = np.array(E2M1_MAGNITUDES + tuple(-m for m in E2M1_MAGNITUDES), dtype=np.float32)

# --- E4M3 -------------------------------------------------------------------------------------

E4M3_MAX = 448.0
E4M3_BIAS = 7
E4M3_MANT_BITS = 3
E4M3_NAN = 0x7F
E4M3_MAX_CODE = 0x7E
E4M3_SIGN_BIT = 0x80
E4M3_MIN_NORMAL = 2.0**-6
E4M3_SUBNORMAL_QUANTUM = 2.0**-9

# --- fp16 / bf16 ------------------------------------------------------------------------------

F16_MAX = 65504.0
F16_MIN_NORMAL = 2.0**-14
F16_SUBNORMAL_QUANTUM = 2.0**-24
#: Smallest magnitude that rounds to infinity under RNE (halfway between 65504 and 65536).
F16_OVERFLOW = 65520.0
F16_INF_BITS = 0x7C00
F16_NAN_BITS = 0x7E00
F16_SIGN_BIT = 0x8000


def e2m1_encode(x: float) -> int:
    """One float (exactly representable in float64) -> 4-bit E2M1 code, RNE, saturating."""
    if x != x:
        return 0x7
    # Scalar functions inline their helpers: Numba compiles these bodies, and a plain Python
    # helper they called would not be jitted with them.
    sign = E2M1_SIGN_BIT if math.copysign(1.0, x) < 0.0 else 0
    a = abs(x)
    if a >= E2M1_MAX:
        return sign | 0x7
    # Quantum of the binade the value falls in; dividing by a power of two is exact, so
    # rint() applies round-half-even to the true value.
    if a < 2.0:
        q = 0.5
    elif a < 4.0:
        q = 1.0
    else:
        q = 2.0
    r = np.rint(a / q) * q
    if r < 2.0:
        code = int(r * 2.0)
    elif r < 4.0:
        code = int(r) + 2
    elif r < 6.0:
        code = 6  # r == 4
    else:
        code = 7
    return sign | code


def e2m1_decode(code: int) -> float:
    """4-bit E2M1 code (0..15) -> float."""
    m = E2M1_MAGNITUDES[code & 0x7]
    return -m if code & E2M1_SIGN_BIT else m


def e4m3_encode(x: float) -> int:
    """One float -> E4M3 byte, RNE, saturating to +-448 (satfinite); NaN -> 0x7F."""
    if x != x:
        return E4M3_NAN
    sign = E4M3_SIGN_BIT if math.copysign(1.0, x) < 0.0 else 0
    a = abs(x)
    if a >= E4M3_MAX:
        return sign | E4M3_MAX_CODE
    if a < E4M3_MIN_NORMAL:
        # Subnormal: multiples of 2^-9; r == 8 is the smallest normal, whose bits are
        # exactly 8 as well, so the same expression encodes it.
        return sign | int(np.rint(a / E4M3_SUBNORMAL_QUANTUM))
    m, e = math.frexp(a)  # a = m * 2^e, m in [0.5, 1)
    q = math.ldexp(1.0, e - 1 - E4M3_MANT_BITS)
    r = np.rint(a / q) * q
    m, e = math.frexp(r)
    exp_field = e - 1 + E4M3_BIAS
    mant = int(math.ldexp(m, E4M3_MANT_BITS + 1)) - (1 << E4M3_MANT_BITS)
    return sign | (exp_field << E4M3_MANT_BITS) | mant


def e4m3_decode(b: int) -> float:
    """E4M3 byte -> float (0x7F / 0xFF decode as NaN)."""
    e = (b >> E4M3_MANT_BITS) & 0xF
    m = b & 0x7
    if e == 0xF and m == 0x7:
        return math.nan
    if e == 0:
        v = m * E4M3_SUBNORMAL_QUANTUM
    else:
        v = math.ldexp(8 + m, e - E4M3_BIAS - E4M3_MANT_BITS)
    return -v if b & E4M3_SIGN_BIT else v


def f16_bits(x: float, saturate: bool = False) -> int:
    """One float -> IEEE binary16 bits, RNE.

    Overflow gives +-inf like a plain cast; with ``saturate`` the magnitude is clamped to
    65504 first (TurboQuant's scale, zero and norm). NaN stays NaN either way.
    """
    if x != x:
        return F16_NAN_BITS
    sign = F16_SIGN_BIT if math.copysign(1.0, x) < 0.0 else 0
    a = abs(x)
    if saturate and a > F16_MAX:
        a = F16_MAX
    if a >= F16_OVERFLOW:
        return sign | F16_INF_BITS
    if a < F16_MIN_NORMAL:
        # Subnormal multiples of 2^-24; r == 1024 is the smallest normal (bits 0x400).
        return sign | int(np.rint(a / F16_SUBNORMAL_QUANTUM))
    m, e = math.frexp(a)
    q = math.ldexp(1.0, e - 1 - 10)
    r = np.rint(a / q) * q
    m, e = math.frexp(r)
    if e - 1 + 15 >= 31:
        return sign | F16_INF_BITS
    return sign | ((e - 1 + 15) << 10) | (int(math.ldexp(m, 11)) - 1024)


def f16_value(b: int) -> float:
    """IEEE binary16 bits -> float."""
    e = (b >> 10) & 0x1F
    m = b & 0x3FF
    if e == 0x1F:
        v = math.inf if m == 0 else math.nan
    elif e == 0:
        v = m * F16_SUBNORMAL_QUANTUM
    else:
        v = math.ldexp(1024 + m, e - 25)
    return -v if b & F16_SIGN_BIT else v


# --- array forms (NumPy) ----------------------------------------------------------------------


def e2m1_encode_array(x: np.ndarray) -> np.ndarray:
    """float32 array -> uint8 array of 4-bit codes (one code per byte), same rules."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(invalid="ignore"):  # signalling NaN inputs are legal here
        a = np.abs(x).astype(np.float64)
    q = np.where(a < 2.0, 0.5, np.where(a < 4.0, 1.0, 2.0))
    r = np.minimum(np.rint(a / q) * q, E2M1_MAX)
    r = np.where(np.isnan(a), E2M1_MAX, r)
    code = np.searchsorted(np.asarray(E2M1_MAGNITUDES), r).astype(np.uint8)
    neg = np.signbit(x) & ~np.isnan(x)
    return code | np.where(neg, E2M1_SIGN_BIT, 0).astype(np.uint8)


def e4m3_encode_array(x: np.ndarray) -> np.ndarray:
    """float32 array -> uint8 E4M3 bytes, RNE, satfinite, NaN -> 0x7F."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(invalid="ignore"):  # signalling NaN inputs are legal here
        a = np.abs(x).astype(np.float64)
    nan = np.isnan(a)
    a = np.where(nan, 0.0, np.minimum(a, E4M3_MAX))
    _, e = np.frexp(np.maximum(a, E4M3_MIN_NORMAL))
    q = np.ldexp(1.0, e - 1 - E4M3_MANT_BITS)
    r = np.rint(a / q) * q
    sub = r < E4M3_MIN_NORMAL
    m, e = np.frexp(np.where(sub, 1.0, r))
    normal_code = ((e - 1 + E4M3_BIAS) << E4M3_MANT_BITS) + (np.ldexp(m, 4).astype(np.int64) - 8)
    sub_code = np.rint(r / E4M3_SUBNORMAL_QUANTUM).astype(np.int64)
    code = np.where(sub, sub_code, normal_code).astype(np.uint8)
    code |= np.where(np.signbit(x), E4M3_SIGN_BIT, 0).astype(np.uint8)
    return np.where(nan, np.uint8(E4M3_NAN), code).astype(np.uint8)


def e4m3_decode_array(b: np.ndarray) -> np.ndarray:
    """uint8 E4M3 bytes -> float32 values (table lookup)."""
    return E4M3_VALUES[np.asarray(b, dtype=np.uint8)]


def f16_sat_array(x: np.ndarray) -> np.ndarray:
    """float32 array -> float16 array, clamped to +-65504 first (NaN kept)."""
    x = np.asarray(x, dtype=np.float32)
    return np.clip(x, -F16_MAX, F16_MAX).astype(np.float16)


def bf16_bits_array(x: np.ndarray) -> np.ndarray:
    """float32 array -> uint16 bfloat16 bits, RNE; NaN -> quiet NaN of the same sign."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    quiet = ((u >> np.uint32(16)) | np.uint32(0x40)).astype(np.uint32)
    return np.where(nan, quiet, rounded).astype(np.uint16)


def bf16_values_array(bits: np.ndarray) -> np.ndarray:
    """uint16 bfloat16 bits -> float32 values (exact)."""
    b = np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)
    return b.view(np.float32)


#: Value of every E4M3 byte, float32 (0x7F and 0xFF are NaN).
E4M3_VALUES = np.array([e4m3_decode(i) for i in range(256)], dtype=np.float32)
