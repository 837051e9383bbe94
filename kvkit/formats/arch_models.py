"""CPU models of each CUDA arch path's conversion arithmetic (DESIGN.md section 7).

The CUDA kernels convert floats to E4M3, E2M1 and fp16 along one of two paths, chosen by
``cuda_src/common/arch.cuh``:

* software (every target; the only one below sm_89 for E4M3 and below sm_100a for E2M1):
  integer arithmetic on the float32 bit pattern (``cuda_src/common/fp8.cuh``, ``fp4.cuh``,
  ``fp16.cuh``); modelled here operation for operation on uint32 arrays;
* hardware (``cvt.rn.satfinite.e4m3x2.f32`` on sm_89+, ``cvt.rn.satfinite.e2m1x2.f32`` on
  sm_100a / sm_120a, ``cvt.rn.f16.f32``): the instruction rounds to nearest even and saturates
  to the largest finite value; kvkit applies it to |x| with NaN replaced (0 for E4M3, 6 for
  E2M1) and sets the sign and NaN codes with integer code afterwards, so the instruction's own
  choices for -0 and NaN never reach the bytes. The model is that wrapper around the
  instruction's documented rounding rule.

Hypothesis (tests/formats/test_arch_models.py) checks that every model gives the spec's bits
(``kvkit.formats.codecs``), so a rewrite of a software path can be checked without a GPU;
on a GPU the real kernels are compared with the Numba backend natively and through the
sm_80 / sm_89 PTX overrides.
"""

from __future__ import annotations

import numpy as np

from . import codecs

_U32 = np.uint32


def _bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.int64)


# --- the integer helpers of fp16.cuh, on int64 arrays holding uint32 values -------------------


def rshift_rne(m: np.ndarray, s: np.ndarray) -> np.ndarray:
    """m >> s rounded to nearest, ties to even (kv_rshift_rne), for 0 <= s (s >= 32 -> 0)."""
    m = np.asarray(m, np.int64)
    s = np.broadcast_to(np.asarray(s, np.int64), m.shape)
    out = m.copy()
    pos = (s > 0) & (s < 32)
    sp = np.where(pos, s, 1)
    q = m >> sp
    rem = m & ((np.int64(1) << sp) - 1)
    half = np.int64(1) << (sp - 1)
    up = (rem > half) | ((rem == half) & ((q & 1) == 1))
    out = np.where(pos, q + up, out)
    return np.where(s >= 32, 0, out)


def round_off_bits(a: np.ndarray, s: int) -> np.ndarray:
    """Float32 magnitude bits a with the low s mantissa bits rounded off, RNE
    (kv_round_off_bits); a carry into the exponent is the correct rounded result."""
    a = np.asarray(a, np.int64)
    return (a + ((1 << (s - 1)) - 1) + ((a >> s) & 1)) >> s


def scaled_rint(a: np.ndarray, k: int) -> np.ndarray:
    """rint(|x| * 2^k) from the magnitude bits a (kv_scaled_rint), for |x| * 2^k < 2^24."""
    a = np.asarray(a, np.int64)
    e = a >> 23
    m = a & 0x7FFFFF
    denormal = e == 0
    e = np.where(denormal, 1, e)
    m = np.where(denormal, m, m | 0x800000)
    return rshift_rne(m, 150 - k - e)


# --- software paths ---------------------------------------------------------------------------


def e4m3_software(x: np.ndarray) -> np.ndarray:
    """kv_e4m3_encode on targets without KVKIT_HW_FP8 (sm_80, sm_86): float32 -> uint8."""
    u = _bits(x)
    a = u & 0x7FFFFFFF
    nan = a > 0x7F800000
    mag = np.where(
        a >= 0x43E00000,  # >= 448: satfinite
        0x7E,
        np.where(a >= 0x3C800000, round_off_bits(a, 20) - (120 << 3), scaled_rint(a, 9)),
    )
    code = mag | ((u >> 24) & 0x80)
    return np.where(nan, 0x7F, code).astype(np.uint8)


#: kv_e2m1_mag_sw's thresholds: (float32 bits of the midpoint, counted only when exceeded).
_E2M1_MIDPOINT_BITS = (
    (0x3E800000, True),  # 0.25
    (0x3F400000, False),  # 0.75
    (0x3FA00000, True),  # 1.25
    (0x3FE00000, False),  # 1.75
    (0x40200000, True),  # 2.5
    (0x40600000, False),  # 3.5
    (0x40A00000, True),  # 5.0
)


def e2m1_software(x: np.ndarray) -> np.ndarray:
    """kv_e2m1_encode on targets without KVKIT_HW_FP4: float32 -> code 0..15 (uint8)."""
    u = _bits(x)
    a = u & 0x7FFFFFFF
    nan = a > 0x7F800000
    # The number of E2M1 midpoints below |x| (bit patterns): > where the lower neighbour's
    # code is even, >= where the upper one's is.
    mag = sum(
        (a > t if strict else a >= t).astype(np.uint32)
        for t, strict in _E2M1_MIDPOINT_BITS
    )
    code = mag | ((u >> 28) & 0x8)
    return np.where(nan, 0x7, code).astype(np.uint8)


def f16_software(x: np.ndarray, saturate: bool = False) -> np.ndarray:
    """kv_f16_bits_sw: float32 -> IEEE binary16 bits (uint16); NaN keeps sign and payload
    (NumPy's rule) unless saturating, where every NaN is 0x7E00."""
    u = _bits(x)
    sign = (u >> 16) & 0x8000
    a = u & 0x7FFFFFFF
    nan = a > 0x7F800000
    if saturate:
        a = np.where(~nan & (a > 0x477FE000), 0x477FE000, a)  # 65504
    finite = np.where(
        a >= 0x477FF000,  # >= 65520 rounds to inf
        0x7C00,
        np.where(a >= 0x38800000, round_off_bits(a, 13) - (112 << 10), scaled_rint(a, 24)),
    )
    if saturate:
        nan_bits = np.full_like(a, 0x7E00)
    else:
        h = 0x7C00 | ((a & 0x7FFFFF) >> 13)
        nan_bits = sign | np.where(h == 0x7C00, 0x7C01, h)
    return np.where(nan, nan_bits, sign | finite).astype(np.uint16)


# --- hardware paths (instruction rounding rule + kvkit's sign / NaN wrapper) ------------------


def _rne_satfinite(mag: np.ndarray, quantum_of, top: float) -> np.ndarray:
    """What a cvt.rn.satfinite does to a non-negative, non-NaN float: RNE to the target grid
    (quantum_of(mag) per binade), values beyond the largest finite one saturate."""
    mag = np.asarray(mag, np.float64)
    q = quantum_of(mag)
    return np.minimum(np.rint(mag / q) * q, top)


def e4m3_hardware(x: np.ndarray) -> np.ndarray:
    """kv_e4m3_encode with KVKIT_HW_FP8 (sm_89+): cvt on |x| (NaN -> 0), then sign / NaN."""
    x = np.asarray(x, np.float32)
    nan = np.isnan(x)
    mag = np.where(nan, np.float32(0), np.abs(x))

    def quantum(m):
        _, e = np.frexp(np.maximum(m, codecs.E4M3_MIN_NORMAL))
        return np.ldexp(1.0, e - 1 - codecs.E4M3_MANT_BITS)

    rounded = _rne_satfinite(mag, quantum, codecs.E4M3_MAX)
    code = _grid_code(rounded, codecs.E4M3_VALUES[:0x7F])
    code = code | np.where(np.signbit(x), 0x80, 0)
    return np.where(nan, 0x7F, code).astype(np.uint8)


def e2m1_hardware(x: np.ndarray) -> np.ndarray:
    """kv_e2m1_encode with KVKIT_HW_FP4 (sm_100a / sm_120a): cvt on |x| (NaN -> 6), sign
    ORed in afterwards (none for NaN)."""
    x = np.asarray(x, np.float32)
    nan = np.isnan(x)
    mag = np.where(nan, np.float32(codecs.E2M1_MAX), np.abs(x))
    rounded = _rne_satfinite(
        mag, lambda m: np.where(m < 2, 0.5, np.where(m < 4, 1.0, 2.0)), codecs.E2M1_MAX
    )
    code = _grid_code(rounded, np.asarray(codecs.E2M1_MAGNITUDES))
    code = code | np.where(np.signbit(x) & ~nan, 0x8, 0)
    return code.astype(np.uint8)


def _grid_code(values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Index of each value in an ascending grid of non-negative representable values."""
    idx = np.searchsorted(np.asarray(grid, np.float64), values)
    if not np.array_equal(np.asarray(grid, np.float64)[idx], values):
        raise AssertionError("rounded value not on the target grid")
    return idx.astype(np.int64)


def f16_hardware(x: np.ndarray, saturate: bool = False) -> np.ndarray:
    """kv_f16_bits_hw: cvt.rn.f16.f32 (IEEE RNE, overflow to inf) on non-NaN inputs, clamped
    to +-65504 first when saturating; NaN goes through the software rule."""
    x = np.asarray(x, np.float32)
    nan = np.isnan(x)
    y = np.where(nan, np.float32(0), x)
    if saturate:
        y = np.clip(y, -codecs.F16_MAX, codecs.F16_MAX)
    with np.errstate(over="ignore"):
        hw = y.astype(np.float16).view(np.uint16)
    return np.where(nan, f16_software(x, saturate), hw).astype(np.uint16)


#: Every modelled path: name -> (model, spec function), both float32 array -> code array.
PATHS = {
    "e4m3_software": (e4m3_software, codecs.e4m3_encode_array),
    "e4m3_hardware": (e4m3_hardware, codecs.e4m3_encode_array),
    "e2m1_software": (e2m1_software, codecs.e2m1_encode_array),
    "e2m1_hardware": (e2m1_hardware, codecs.e2m1_encode_array),
}
