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

import math

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


def e2m1_software(x: np.ndarray) -> np.ndarray:
    """kv_e2m1_encode on targets without KVKIT_HW_FP4: float32 -> code 0..15 (uint8).

    kv_e2m1_mag_sw: |x| >= 1 (and inf / NaN patterns): the pattern rounded to one mantissa
    bit (RNE) minus 252, at most 7; |x| < 1: the pattern of RN(|x| + 2^22) minus 2^22's.
    """
    u = _bits(x)
    a = u & 0x7FFFFFFF
    nan = a > 0x7F800000
    big = np.minimum(round_off_bits(a, 22) - 252, 7)
    with np.errstate(all="ignore"):
        mag_f = a.astype(np.uint32).view(np.float32)
        near = _bits((mag_f + np.float32(2.0**22)).astype(np.float32))
    small = near - 0x4A800000
    mag = np.where(a >= 0x3F800000, big, small)
    code = mag | ((u >> 28) & 0x8)
    return np.where(nan, 0x7, code).astype(np.uint8)


def e2m1_software_nonan(x: np.ndarray) -> np.ndarray:
    """kv_e2m1x2_encode_nonan's software path (kv_e2m1_mag_sw_nonan) for x that is not NaN:
    P = 2^floor(log2(clamp(|x|, 1, 8))); code = pattern(RN(|x| + P 2^22)) - pattern(P 2^22)
    + 2 log2(P), at most 7; the sign bit of x. (NaN inputs never reach it: 0x7 here.)"""
    u = _bits(x)
    a = u & 0x7FFFFFFF
    with np.errstate(all="ignore"):
        m = a.astype(np.uint32).view(np.float32)
        pb = _bits(np.minimum(np.maximum(m, np.float32(1)), np.float32(8))) & 0x7F800000
        magic = (pb + (22 << 23)).astype(np.uint32).view(np.float32)
        s = _bits((m + magic).astype(np.float32))
    mag = np.minimum(s - pb - (22 << 23) + (pb >> 22) - 254, 7)
    code = mag | ((u >> 28) & 0x8)
    return np.where(a > 0x7F800000, 0x7, code).astype(np.uint8)


#: kv_e2m1_magic's bound: the NVFP4 writer takes it for a block whose largest product
#: RN(amax * inv) is below this (every |x_i * inv| is then below it too: RN is monotonic).
E2M1_MAGIC_LIMIT = np.float32(7.0)


def e2m1_magic(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """kv_e2m1_magic (fp4.cuh, the NVFP4 writer's software path for |x| < E2M1_MAGIC_LIMIT,
    x not NaN): (code 0..15, magnitude value) of float32 x.

    e = exponent field of max(|x|, 1) (P = 2**(e - 127) in {1, 2, 4}); the magic
    M = float32 bits e * 0x800002 + 0x0B3FFF02 = ((e + 22) << 23) | (1 << 22) | 2 (e - 127) lies in
    [P 2**22, P 2**23), so its ulp is P / 2 and its last bit is even; s = RN(|x| + M) is M plus
    |x| / (P / 2) rounded to nearest even, whose low bits are then k + 2 (e - 127): the E2M1
    magnitude code (the low byte of s). s - M (exact) is the E2M1 magnitude itself. The sign
    bit of x is the code's bit 3 (the kernel takes it from the input words)."""
    u = _bits(x)
    a = (u & 0x7FFFFFFF).astype(np.uint32)
    m = a.view(np.float32)
    e = _bits(np.maximum(m, np.float32(1))) >> 23
    magic_bits = (e * 0x800002 + 0x0B3FFF02) & 0xFFFFFFFF
    magic = magic_bits.astype(np.uint32).view(np.float32)
    with np.errstate(all="ignore"):
        s = (m + magic).astype(np.float32)
        val = (s - magic).astype(np.float32)
    code = (_bits(s) & 0xFF) | ((u >> 28) & 0x8)
    return code.astype(np.uint8), val


def prmt(a: int, b: int, sel: int) -> int:
    """PTX prmt.b32 (default mode) on Python ints: byte n of the result is byte (sel nibble n
    & 7) of the 8 bytes b:a, or that byte's top bit replicated when the nibble's bit 3 is set."""
    src = (int(b) << 32) | int(a)
    out = 0
    for n in range(4):
        nib = (int(sel) >> (4 * n)) & 0xF
        byte = (src >> (8 * (nib & 7))) & 0xFF
        if nib & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * n)
    return out


def nvfp4_fast_words(
    x: np.ndarray, raw: np.ndarray, inv: float, dtype_code: int
) -> tuple[int, int]:
    """The NVFP4 writer's fast block (write_nvfp4.cu kv_nvfp4_fast_codes + kv_nvfp4_signs) for
    16 float32 values x whose products |x_i * inv| are below E2M1_MAGIC_LIMIT: the two packed
    code words, from the magic sums and the raw input words (dtype code 0: float32 bits, one per
    element; 1 / 2: 16-bit pairs, element 2j in the low half of word j)."""
    x = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        m = (x * np.float32(inv)).astype(np.float32)
    u = _bits(m) & 0x7FFFFFFF
    mag = u.astype(np.uint32).view(np.float32)
    e = _bits(np.maximum(mag, np.float32(1))) >> 23
    magic = ((e * 0x800002 + 0x0B3FFF02) & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
    s = [int(v) for v in _bits((mag + magic).astype(np.float32))]
    pair = [(s[2 * j] + (s[2 * j + 1] << 4)) & 0xFFFFFFFF for j in range(8)]
    w = [int(v) for v in np.asarray(raw, np.uint32)]
    out = []
    for h in range(2):
        p = pair[4 * h : 4 * h + 4]
        codes = prmt(prmt(p[0], p[1], 0x0040), prmt(p[2], p[3], 0x0040), 0x5410)
        if dtype_code == 0:
            b = 8 * h
            e0, e1 = prmt(w[b], w[b + 2], 0xFFFB), prmt(w[b + 4], w[b + 6], 0xFFFB)
            o0, o1 = prmt(w[b + 1], w[b + 3], 0xFFFB), prmt(w[b + 5], w[b + 7], 0xFFFB)
            ev, od = prmt(e0, e1, 0x5410), prmt(o0, o1, 0x5410)
        else:
            b = 4 * h
            a, c = prmt(w[b], w[b + 1], 0xFBD9), prmt(w[b + 2], w[b + 3], 0xFBD9)
            ev, od = prmt(a, c, 0x5410), prmt(a, c, 0x7632)
        signs = ((ev & 0x0F0F0F0F) | (od & 0xF0F0F0F0)) & 0x88888888
        out.append(codes | signs)
    return out[0], out[1]


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


# --- 4over6's fast decision (cuda_src/write_nvfp4.cu, KV_NVFP4_46_VARIANT 1) -----------------

#: kv_nvfp4_46_sure: the approximate errors decide when |RN(e6 - e4)| exceeds
#: RN(RN(den4^2 + den6^2) NVFP4_46_MARGIN) (the proof, in write_nvfp4.cu, bounds each
#: candidate's |E - e| by 2^-14 den^2; 2^-13 leaves a factor of two for the test's own
#: rounding) and the dens lie in [NVFP4_46_DEN_LO, NVFP4_46_DEN_HI] (no subnormal products
#: beyond 2^-144 in all, no overflow).
NVFP4_46_MARGIN = np.float32(2.0**-13)
NVFP4_46_DEN_LO = np.float32(2.0**-40)
NVFP4_46_DEN_HI = np.float32(2.0**50)


def nvfp4_46_candidates(blk: np.ndarray, g: float) -> dict[str, np.ndarray]:
    """Both 4over6 candidates of 16-element blocks blk (..., 16) float32 for a layer scale g > 0,
    by the spec's arithmetic (kvkit.formats.nvfp4), and what the kernel's fast block computes
    from them: keys ``fast`` (RN(amax inv_c) < E2M1_MAGIC_LIMIT for both candidates and amax
    finite: the fast block), ``sfc6`` / ``sfc4``, ``den6`` / ``den4`` (RN(sfv g)), ``E6`` / ``E4``
    (the spec's errors, block_sq_error), ``e6`` / ``e4`` (kv_nvfp4_fast_codes<2, true>:
    d_i = fmaf(-v_i, den, |x_i|), e = fmaf(d_i, d_i, e), e_0 = RN(d_0^2)) and ``spec_four``
    (E4 < E6)."""
    from .nvfp4 import ALT_TARGET, TARGET, block_sq_error

    blk = np.asarray(blk, np.float32)
    g32 = np.float32(g)
    out: dict[str, np.ndarray] = {}
    with np.errstate(all="ignore"):
        amax = np.fmax.reduce(np.abs(blk), axis=-1)
        fast = np.isfinite(amax)
        for tag, target in (("6", TARGET), ("4", ALT_TARGET)):
            sfc = codecs.e4m3_encode_array(amax / (np.float32(target) * g32))
            sfv = codecs.e4m3_decode_array(sfc)
            den = (sfv * g32).astype(np.float32)
            inv = np.divide(np.float32(1), den, out=np.zeros_like(den), where=den != 0)
            q = codecs.e2m1_encode_array(blk * inv[..., None])
            fast &= (amax * inv).astype(np.float32) < E2M1_MAGIC_LIMIT
            mag = codecs.E2M1_VALUES[q & 7]
            e = np.zeros(blk.shape[:-1], np.float32)
            for i in range(blk.shape[-1]):
                d = fma_f32(-mag[..., i], den, np.abs(blk[..., i]))
                e = (d * d).astype(np.float32) if i == 0 else fma_f32(d, d, e)
            out["sfc" + tag], out["den" + tag], out["e" + tag] = sfc, den, e
            out["E" + tag] = block_sq_error(blk, q, sfv, g32)
    out["fast"] = fast
    out["spec_four"] = out["E4"] < out["E6"]
    return out


def nvfp4_46_sure(e6, e4, den6, den4) -> np.ndarray:
    """kv_nvfp4_46_sure: where the approximate errors decide 4over6's choice."""
    with np.errstate(all="ignore"):
        den6, den4 = np.float32(den6), np.float32(den4)
        sq = ((den4 * den4).astype(np.float32) + (den6 * den6).astype(np.float32)).astype(
            np.float32
        )
        m = (sq * NVFP4_46_MARGIN).astype(np.float32)
        diff = (np.float32(e6) - np.float32(e4)).astype(np.float32)
        return (np.abs(diff) > m) & (den6 >= NVFP4_46_DEN_LO) & (den4 <= NVFP4_46_DEN_HI)


def nvfp4_46_fast_choice(c: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The fast block's 4over6 choice from nvfp4_46_candidates' dict: (four, sure). Equal sf
    codes keep 6 (the same candidate twice); else where ``sure`` the approximate errors decide
    (e4 < e6), elsewhere the kernel computes the spec's errors (spec_four)."""
    sure = nvfp4_46_sure(c["e6"], c["e4"], c["den6"], c["den4"])
    same = c["sfc6"] == c["sfc4"]
    four = np.where(same, False, np.where(sure, c["e4"] < c["e6"], c["spec_four"]))
    return four, sure & ~same


# --- division by a row-uniform divisor (cuda_src/common/divide.cuh) ---------------------------

#: kv_div_by's range limits (KV_DIV_LO / KV_DIV_HI): outside them the kernels use __fdiv_rn.
DIV_LO = np.float32(2.0**-40)
DIV_HI = np.float32(2.0**40)


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """fmaf(a, b, c) on float32 arrays with one rounding (denormals kept, as the write kernels).

    a * b is exact in float64 (24 + 24 bits); the sum is rounded to float64 with the error
    recovered by TwoSum, and an inexact sum is moved to an odd last bit (round to odd), so the
    final float32 rounding is that of the exact a * b + c (53 >= 24 + 2 bits).
    """
    p = np.asarray(a, np.float32).astype(np.float64) * np.asarray(b, np.float32)
    c = np.asarray(c, np.float32).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        s = p + c
        bb = s - p
        err = (p - (s - bb)) + (c - bb)
        finite = np.isfinite(s) & np.isfinite(err)
        bits = s.view(np.int64)
        even = (bits & 1) == 0
        fix = finite & (err != 0) & even
        toward = np.where(err > 0, np.inf, -np.inf)
        s = np.where(fix, np.nextafter(s, toward), s)
        return s.astype(np.float32)


def div_by_reciprocal(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """kv_divisor + kv_div_by: (the fast quotient, ok); where ok the kernels keep the fast
    quotient, elsewhere they take __fdiv_rn(a, b). b broadcasts against a (one per row)."""
    a = np.asarray(a, np.float32)
    b = np.broadcast_to(np.asarray(b, np.float32), a.shape)
    with np.errstate(all="ignore"):
        row_ok = (b >= DIV_LO) & (b <= DIV_HI)
        y = np.float32(1) / np.where(row_ok, b, np.float32(1))
        q0 = a * y
        e0 = fma_f32(q0, b, -a)
        q1 = fma_f32(-e0, y, q0)
        e1 = fma_f32(q1, b, -a)
        q = fma_f32(-e1, y, q1)
        aq = np.abs(q0)
    ok = row_ok & (((aq >= DIV_LO) & (aq <= DIV_HI)) | (a == 0))
    return q, ok


def div_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """What a write kernel gets for a / b: the fast quotient where ok, IEEE division elsewhere
    (the kernels fall back per lane, which gives the same values)."""
    q, ok = div_by_reciprocal(a, b)
    with np.errstate(all="ignore"):
        exact = np.asarray(a, np.float32) / np.asarray(b, np.float32)
    return np.where(ok, q, exact)


def tq_value_codes(v: np.ndarray, bits: int, floor_scale: float) -> np.ndarray:
    """The TurboQuant V codes of rows v (..., D) float32 as the D % 64 == 0 write kernel
    computes them: per row lo / hi / scale as the spec; where the row's scale is in
    kv_divisor's range, q = the fast quotient of (v - lo) / scale with NO per-element range
    check (kv_div_by_unchecked: only floor(q + 0.5) is kept, and where the check would fail,
    |q0| < 2**-40, both quotients round q + 0.5 to 0.5); elsewhere IEEE division. Then
    z = RN(q + 0.5) clamped to [0, top] NaN-ignoring (a NaN gives 0), and floor(z) by one add
    of 2**23 rounding down (exact: z < 2**23)."""
    v = np.asarray(v, np.float32)
    top = np.float32((1 << bits) - 1)
    with np.errstate(all="ignore"):
        lo = np.fmin.reduce(v, axis=-1)
        hi = np.fmax.reduce(v, axis=-1)
        scale = (hi - lo) / top
        scale = np.where(scale >= np.float32(floor_scale), scale, np.float32(floor_scale))
        scale = scale.astype(np.float32)
        a = (v - lo[..., None]).astype(np.float32)
        b = np.broadcast_to(scale[..., None], a.shape)
        fast, _ = div_by_reciprocal(a, b)
        row_ok = (b >= DIV_LO) & (b <= DIV_HI)
        q = np.where(row_ok, fast, a / b).astype(np.float32)
        z = (q + np.float32(0.5)).astype(np.float32)
        z = np.fmin(np.fmax(z, np.float32(0)), top)  # fmaxf / fminf: NaN -> 0
        return np.floor(z).astype(np.int64)


# --- decoding by scaling a shifted code (cuda_src/common/fp8.cuh, fp4.cuh) --------------------


def e4m3_decode_scaled(code: np.ndarray) -> np.ndarray:
    """kv_e4m3_decode_pos: float32 bits (code << 20) times 2**120 (subnormals kept), and the
    quiet NaN for 0x7F; codes 0..0x7F."""
    code = np.asarray(code, np.uint32)
    v = (code << np.uint32(20)).view(np.float32) * np.float32(2.0**120)
    return np.where(code == 0x7F, np.uint32(0x7FC00000).view(np.float32), v).astype(np.float32)


def e2m1_value_scaled(code: np.ndarray) -> np.ndarray:
    """kv_e2m1_value_scaled: float32 bits ((code & 7) << 22 | sign) times 2**126."""
    code = np.asarray(code, np.uint32)
    raw = ((code & np.uint32(7)) << np.uint32(22)) | ((code & np.uint32(8)) << np.uint32(28))
    return (raw.view(np.float32) * np.float32(2.0**126)).astype(np.float32)


# --- TurboQuant key bucketing by a cell table (cuda_src/write_turboquant.cu, TQ_BKT) ---------

#: 1.5 * 2**23: fmaf(yc, scale, BKT_MAGIC) has ulp 1 while |yc * scale| < 2**22, so its bit
#: pattern minus BKT_MAGIC's is yc * scale rounded to the nearest integer, ties to even.
BKT_MAGIC = np.float32(12582912.0)
BKT_MAGIC_BITS = 0x4B400000
#: Largest table the write kernel stages in shared memory (16 bytes a cell, 4 KB).
BKT_MAX_CELLS = 256


class BucketTable:
    """The cell table of the write kernel's key bucketing (``tq_bucket_table``).

    cell(y) = rint(clamp(y, -clamp, clamp) * scale) + half, rint ties to even (one fmaf with
    BKT_MAGIC on the GPU; scale and clamp are powers of two, so the product is exact), a
    non-decreasing function of y; a NaN y takes cell 0 (fmaxf(NaN, -clamp) = -clamp). Cell k
    holds: base[k], the number of midpoints whose cell is below k; mid[k], the one midpoint
    whose cell is k (NaN if none; the table exists only when no cell has two); cent_lo[k] =
    c[base[k]] and cent_hi[k] = c[base[k] + 1] (or c[base[k]] when mid[k] is NaN). The kernel's
    table holds their float32 squares (sq_lo, sq_hi): the centroids enter only the norm
    correction's sum of squares, whose products are these same roundings.

    Then #{midpoints <= y} = base[cell(y)] + (mid[cell(y)] <= y) for every float32 y: a
    midpoint m with cell(m) < cell(y) is < y (m >= y would give cell(m) >= cell(y)), one with
    cell(m) > cell(y) is > y, and at most one shares y's cell, compared explicitly (the spec's
    own comparison, so ties go up and NaN counts nothing: base[0] = 0).
    """

    def __init__(self, scale, clamp, base, mid, cent_lo, cent_hi):
        self.scale = np.float32(scale)
        self.clamp = np.float32(clamp)
        self.half = int(round(float(clamp) * float(scale)))
        self.base = np.asarray(base, np.int32)
        self.mid = np.asarray(mid, np.float32)
        self.cent_lo = np.asarray(cent_lo, np.float32)
        self.cent_hi = np.asarray(cent_hi, np.float32)

    @property
    def cells(self) -> int:
        return len(self.base)

    def cell(self, y: np.ndarray) -> np.ndarray:
        """The kernel's cell index of float32 y (int64)."""
        y = np.asarray(y, np.float32)
        yc = np.minimum(np.maximum(y, -self.clamp), self.clamp)  # NaN-propagating ...
        yc = np.where(np.isnan(y), -self.clamp, yc)  # ... so NaN -> -clamp as fmaxf does
        # yc * scale is exact (a power of two, far from over/underflow); np.rint is ties-to-even
        r = np.rint(yc.astype(np.float64) * float(self.scale))
        return r.astype(np.int64) + self.half

    @property
    def sq_lo(self) -> np.ndarray:
        return (self.cent_lo * self.cent_lo).astype(np.float32)

    @property
    def sq_hi(self) -> np.ndarray:
        return (self.cent_hi * self.cent_hi).astype(np.float32)

    def index(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(bucket index, its centroid) as the kernel computes them."""
        y = np.asarray(y, np.float32)
        k = self.cell(y)
        with np.errstate(invalid="ignore"):
            up = self.mid[k] <= y
        idx = self.base[k] + up.astype(np.int32)
        return idx, np.where(up, self.cent_hi[k], self.cent_lo[k])


def tq_bucket_table(midpoints, centroids, max_cells: int = BKT_MAX_CELLS) -> BucketTable | None:
    """The smallest cell table (power-of-two scale) with at most one midpoint per cell, or None
    when every such table exceeds max_cells (the kernel then searches the midpoints)."""
    mids = np.asarray(midpoints, np.float32)
    cents = np.asarray(centroids, np.float32)
    if len(mids) == 0 or not np.all(np.isfinite(mids)):
        return None
    top = float(np.max(np.abs(mids)))
    clamp = 2.0 ** math.ceil(math.log2(top)) if top > 0 else 1.0
    scale = 2.0 ** math.floor(-math.log2(clamp))  # clamp * scale == 1: three cells
    while 2 * int(clamp * scale) + 1 <= max_cells:
        half = int(clamp * scale)
        mids64 = np.clip(mids.astype(np.float64), -clamp, clamp)
        cells = np.rint(mids64 * scale).astype(np.int64) + half
        if len(np.unique(cells)) == len(cells):
            n = 2 * half + 1
            base = np.searchsorted(cells, np.arange(n), side="left").astype(np.int32)
            mid = np.full(n, np.nan, np.float32)
            mid[cells] = mids
            lo = cents[base]
            hi = np.where(np.isnan(mid), lo, cents[np.minimum(base + 1, len(cents) - 1)])
            return BucketTable(scale, clamp, base, mid, lo, hi)
        scale *= 2.0
    return None


def fp8_fast_chunk(halves: np.ndarray, b: float, hardware: bool) -> np.ndarray:
    """The fp8 writer's fast chunk (write_dense.cu kv_fp8_fast_words) for float16 inputs:
    halves (..., n) uint16 patterns, all finite, n even, element 2j in the low half of word j;
    b the layer scale in [2**-16, 2**16]. Per element: q = the five-step quotient of |a| by b
    (div_by_reciprocal, no range check), its magnitude code (hardware: e4m3_hardware, else
    e4m3_software, bit 7 masked), and the sign byte taken as prmt(w0, w1, 0x7531) does: byte
    2(i % 2) + 1 of word i // 2, i.e. the half's own bit 15. Returns (..., n) uint8."""
    h = np.asarray(halves, np.uint16)
    a = (h & 0x7FFF).view(np.float16).astype(np.float32)
    q, _ = div_by_reciprocal(a, np.float32(b))
    mag = (e4m3_hardware(q) if hardware else e4m3_software(q)) & 0x7F
    words = h[..., 0::2].astype(np.uint32) | (h[..., 1::2].astype(np.uint32) << 16)
    sel = np.stack([(words >> 8) & 0xFF, (words >> 24) & 0xFF], axis=-1).reshape(h.shape)
    return (mag | (sel & 0x80)).astype(np.uint8)


# --- TurboQuant near decisions (cuda_src/write_turboquant.cu, TQ_VARIANT 2) -------------------

#: A key element whose fast quotient yq lies within this of its cell's midpoint takes the exact
#: division (the kernel's TQ_NEAR_KEY). yq = RN(t * RN(1 / den)) against the spec's
#: y = RN(t / den): |yq - y| <= 3 * 2^-24 |t / den| + 2^-149 (three relative roundings, one
#: absolute where a product is subnormal), <= 2^-21 while |t / den| <= 2; the margin is 2x that.
TQ_NEAR_KEY = np.float32(2.0**-20)
#: Every midpoint must lie at least this far from its cell's edges for the near key decisions
#: (tq_near_table_ok): then a yq and a y in different cells (one edge between them, so
#: |y| <= clamp + 2^-21 <= 2) count the same midpoints. The presets' distances are >= 2^-13.
TQ_NEAR_EDGE = 2.0**-16
#: A value element whose fast z lies within this of an integer takes the exact division (the
#: kernel's TQ_NEAR_VALUE): |z - (w + 0.5)| < 2^-19 and |Z - (w + 0.5)| <= 2^-20 (below), so
#: 2^-18 would do; 2^-16 leaves 4x.
TQ_NEAR_VALUE = np.float32(2.0**-16)


def tq_near_table_ok(table: BucketTable) -> bool:
    """Whether the near key decisions may use ``table``: every midpoint at least TQ_NEAR_EDGE
    from the edges of its cell (reals (k - half -+ 0.5) / scale)."""
    mids = table.mid[~np.isnan(table.mid)].astype(np.float64)
    k = table.cell(mids.astype(np.float32)).astype(np.float64) - table.half
    lo = (k - 0.5) / float(table.scale)
    hi = (k + 0.5) / float(table.scale)
    return bool(np.all(np.minimum(mids - lo, hi - mids) >= TQ_NEAR_EDGE))


def tq_near_key_index(t: np.ndarray, den, table: BucketTable) -> tuple[np.ndarray, np.ndarray]:
    """The near key decision of write_turboquant.cu (TQ_VARIANT 2) for rotated elements t
    (float32, ...) and the row's den (float32, > 0; broadcasts): (index, ok). Where ok the
    kernel keeps index; elsewhere it divides exactly (the lane's elements all take
    the spec's y = RN(t / den)). The kernel's ok also needs den in [2^-40, 2^40]; so does this
    (the reciprocal is then normal, the error bound above holds).

    Why index is the spec's #{midpoints <= RN(t / den)} where ok: let y = RN(t / den) and
    yq = RN(t * RN(1 / den)) (float32, IEEE, subnormals kept). (a) If yq and y are in one cell,
    the count is base + (mid <= .) for both, and |RN(yq - mid)| > TQ_NEAR_KEY implies
    |yq - mid| > TQ_NEAR_KEY > |yq - y| (both near the midpoint, |y| < 1, so the error bound
    holds), so mid <= yq iff mid <= y. (b) If they are in different cells, an edge e lies
    between them with |e| <= clamp <= 1, so |yq - y| <= 2^-21 and every midpoint is more than
    TQ_NEAR_EDGE from e: none lies between yq and y, and the count over the cells below yq's
    plus yq's own comparison is the count for y. NaN t: yq and y are NaN, cell 0, index 0 for
    both, and no near test is true. Infinite t (den finite): yq = y = +-inf.
    """
    t = np.asarray(t, np.float32)
    den = np.broadcast_to(np.asarray(den, np.float32), t.shape)
    with np.errstate(all="ignore"):
        row_ok = (den >= DIV_LO) & (den <= DIV_HI)
        r = (np.float32(1) / np.where(row_ok, den, np.float32(1))).astype(np.float32)
        yq = (t * r).astype(np.float32)
        k = table.cell(yq)
        mid = table.mid[k]
        up = mid <= yq
        near = np.abs((yq - mid).astype(np.float32)) <= TQ_NEAR_KEY
    idx = table.base[k] + up.astype(np.int32)
    return idx.astype(np.int64), row_ok & ~near


def _tq_value_row_terms(v, bits: int, floor_scale: float, every_row: bool = False):
    """The spec's per-row value quantities as the near-value models compute them: top =
    2^bits - 1, the reciprocal r = RN(1 / scale) of the row's scale (1 for rows outside
    kv_divisor's range unless every_row), a = v - min per element, and row_ok (the row's scale
    inside that range)."""
    v = np.asarray(v, np.float32)
    top = np.float32((1 << bits) - 1)
    with np.errstate(all="ignore"):
        lo = np.fmin.reduce(v, axis=-1)
        hi = np.fmax.reduce(v, axis=-1)
        scale = ((hi - lo) / top).astype(np.float32)
        scale = np.where(scale >= np.float32(floor_scale), scale, np.float32(floor_scale))
        scale = scale.astype(np.float32)
        row_ok = (scale >= DIV_LO) & (scale <= DIV_HI)
        r = np.float32(1) / (scale if every_row else np.where(row_ok, scale, np.float32(1)))
        r = r.astype(np.float32)
        a = (v - lo[..., None]).astype(np.float32)
    return top, r, a, row_ok


def tq_near_value_codes(
    v: np.ndarray, bits: int, floor_scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """The near value decision of write_turboquant.cu (TQ_VARIANT 2) for rows v (..., D)
    float32: (codes, ok) per element; where ok the kernel keeps the code, elsewhere (and for
    every element of a row whose scale is out of [2^-40, 2^40]) it divides exactly.

    Per element, with a = RN(v - lo) (the spec's), r = RN(1 / scale), w = a / scale (real):
    z = RN(a r + 0.5) (one fma), f = RD(z + 2^23) = 2^23 + floor(z), code = floor(z) & top,
    d = z - (floor(z) + 0.5) (exact), ok = |d| < 0.5 - TQ_NEAR_VALUE. Why code is the spec's
    floor(Z), Z = RN(RN(w) + 0.5), where ok: 0 <= w <= 15 (1 + 2^-22) (a <= RN(hi - lo) and
    scale >= RN((hi - lo) / top) within one rounding), so |a r - w| <= w 2^-24 < 2^-19.9 and
    z is within 2^-19 of w + 0.5; RN(w) is within 2^-21 of w and Z within 2^-21 of RN(w) + 0.5
    (values below 16, ulp <= 2^-20). ok puts z in (k + 2^-16, k + 1 - 2^-16), k = floor(z), so
    w + 0.5 and then Z are inside (k, k + 1): floor(Z) = k, and no clamp applies (Z < 16).
    A NaN v gives a NaN d: not ok.
    """
    top, r, a, row_ok = _tq_value_row_terms(v, bits, floor_scale)
    with np.errstate(all="ignore"):
        z = fma_f32(a, np.broadcast_to(r[..., None], a.shape), np.float32(0.5))
        fl = np.floor(z.astype(np.float64))  # RD(z + 2^23) - 2^23: exact for 0 <= z < 2^23
        d = (z.astype(np.float64) - (fl + 0.5)).astype(np.float32)  # exact, as on the GPU
        ok = np.abs(d) < np.float32(0.5) - TQ_NEAR_VALUE
        codes = np.where(np.isnan(fl), 0, fl).astype(np.int64) & int(top)
    return codes, ok & row_ok[..., None]


# --- TurboQuant near decisions, variant 3 (cuda_src/write_turboquant.cu, TQ_VARIANT 3) --------


def tq_near_key_index_v3(
    t: np.ndarray, den, table: BucketTable
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Variant 3's near key decision (kv_tq_cell_v3 and the loop after it) for rotated elements
    t (float32) and the row's den (float32, broadcasts): (index, the centroid whose square
    enters cn, ok). Where ok the kernel keeps both; elsewhere the lane divides exactly.

    Per element, with r = RN(1 / den) and ra = r / (2 clamp) (exact, a power of two):
    u = sat(RN(t ra + 0.5)) (NaN -> 0), cell = rint(u * 2 half) (exact product, the magic's
    rounding, ties to even), d = RN(mid[cell] - t r) (one fma; +inf in cells without a
    midpoint), index = base[cell] + signbit(d), centroid c[index], ok = |d| > TQ_NEAR_KEY.

    Why index is the spec's #{midpoints <= y}, y = RN(t / den), where ok (den in [2^-40, 2^40],
    t finite: the kernel's near path sees no other t, since a NaN or infinite element, or a
    square that overflows, makes n and then den NaN or infinite). Let p = t r (real). Where
    |t / den| <= 2: |p - t / den| <= 2^-24 |t / den| (r within half an ulp of 1 / den) and
    |y - t / den| <= 2^-24 |t / den| + 2^-150, so |p - y| < 2^-22. The cell argument
    yc = (u - 1/2) 2 clamp lies within 2^-25 * 2 clamp <= 2^-24 of clamp(p) (the sum's
    rounding, |u| < 1), so within 2^-21 of clamp(y); beyond |t / den| > 2 both p and y are past
    the clamp on one side and yc is that end exactly. (a) yc and y in one cell: |d| > 2^-20
    means |mid - p| >= 2^-20 > |p - y| (RN is monotone and 2^-20 a float), so d, mid - p and
    mid - y have one sign, nonzero: signbit(d) = (mid < y) = (mid <= y). (b) different cells:
    an edge e lies between yc and clamp(y), |yc - clamp(y)| < 2^-21, and every midpoint is
    more than TQ_NEAR_EDGE = 2^-16 from e (tq_near_table_ok): the midpoints below e are < y and
    < p, those above are > y and > p, so base[cell] + (mid[cell] < p) counts the midpoints
    <= y. A zero d (mid = p exactly) is near. +inf in a gap cell: d = +inf, sign 0, not near.
    """
    t = np.asarray(t, np.float32)
    den = np.broadcast_to(np.asarray(den, np.float32), t.shape)
    with np.errstate(all="ignore"):
        row_ok = (den >= DIV_LO) & (den <= DIV_HI)
        r = (np.float32(1) / np.where(row_ok, den, np.float32(1))).astype(np.float32)
        ra = (r * np.float32(0.5 / float(table.clamp))).astype(np.float32)
        u = fma_f32(t, ra, np.float32(0.5))
        u = np.where(np.isnan(u), np.float32(0), np.clip(u, np.float32(0), np.float32(1)))
        cell = np.rint(u.astype(np.float64) * float(2 * table.half)).astype(np.int64)
        mid = np.where(np.isnan(table.mid), np.float32(np.inf), table.mid).astype(np.float32)[cell]
        d = fma_f32(-t, r, mid)
        neg = np.signbit(d)
        near = np.abs(d) <= TQ_NEAR_KEY  # as the kernel's test (no NaN d: mid +inf, t finite)
    idx = table.base[cell].astype(np.int64) + neg.astype(np.int64)
    cent = np.where(neg, table.cent_hi[cell], table.cent_lo[cell])
    return idx, cent, row_ok & ~near & np.isfinite(t)


#: The rint magic of variant 3's value codes (the cell table's: 1.5 * 2^23).
TQ_RINT_MAGIC = BKT_MAGIC
TQ_RINT_MAGIC_BITS = BKT_MAGIC_BITS


def tq_near_value_codes_v3(
    v: np.ndarray, bits: int, floor_scale: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Variant 3's near value decision for rows v (..., D) float32: (codes, g bit patterns,
    ok) per element. With a = RN(v - lo) (the spec's), r = RN(1 / scale): g = RN(a r + 1.5 * 2^23)
    (one fma: its low bits are k = rint(a r), ties to even, while 0 <= a r < 2^22),
    e = RN(a r - k) (one fma; k = g - 1.5 * 2^23 is exact), ok = |e| < 1/2 - TQ_NEAR_VALUE.

    Why k is the spec's floor(Z), Z = RN(RN(w) + 0.5), w = a / scale (real), where ok:
    0 <= w <= 15 (1 + 2^-22) (tq_near_value_codes), |a r - w| <= 2^-24 w < 2^-19.9, and
    |Z - (w + 1/2)| <= 2^-20 (two roundings of values below 16). e is within 2^-25 of
    a r - k (|e| < 1/2), so a r - k lies in (-1/2 + 2^-16 - 2^-25, 1/2 - 2^-16 + 2^-25) and
    w + 1/2 - k, then Z - k, in (2^-16 - 2^-19, 1 - 2^-16 + 2^-19) within (0, 1): floor(Z) = k,
    and 0 <= k <= top (a r < 15.5), so no clamp applies. A NaN element gives a NaN e: not ok.
    """
    top, r, a, row_ok = _tq_value_row_terms(v, bits, floor_scale)
    with np.errstate(all="ignore"):
        rr = np.broadcast_to(r[..., None], a.shape)
        g = fma_f32(a, rr, TQ_RINT_MAGIC)
        k = (g - TQ_RINT_MAGIC).astype(np.float32)
        e = fma_f32(a, rr, -k)
        ok = np.abs(e) < np.float32(0.5) - TQ_NEAR_VALUE
        gb = g.view(np.uint32).astype(np.int64)
        codes = gb - TQ_RINT_MAGIC_BITS
    return codes, gb.astype(np.uint32), ok & row_ok[..., None]


#: Variant 5's relative nudge of the value reciprocal (write_turboquant.cu: r1 = RN(r (1 + 2^-17)),
#: r2 = RN(r (1 - 2^-17))).
TQ_V5_NUDGE = np.float32(2.0**-17)


def tq_near_value_codes_v5(
    v: np.ndarray, bits: int, floor_scale: float, r_err: float = 0.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Variant 5's near value decision for rows v (..., D) float32: (codes, g1 bit patterns, ok)
    per element. With a = RN(v - lo) (the spec's), r a reciprocal of the row's scale within
    2^-22 (relative; the kernel's rcp.approx.ftz.f32 is within 1 ulp; the model takes
    RN(RN(1 / scale) (1 + r_err)), r_err = 0 or +-2^-22 for the extremes), r1 = RN(r (1 + 2^-17)),
    r2 = RN(r (1 - 2^-17)) (per row): g_i = RN(a r_i + 1.5 * 2^23) (one fma each: the low bits
    are rint(a r_i), ties to even, while 0 <= a r_i < 2^22), ok = (g1 == g2) (a float
    comparison: NaN is never equal), code = g1's bits - 1.5 * 2^23's bits. Every row (no range
    condition on the scale): scale >= floor_scale is normal, and 1 / scale >= 15 / 2^128 is too,
    or scale = +inf and r = 0 (every finite a gets code 0, the spec's w = 0; an infinite a gives
    NaN g's).

    Why the code is the spec's floor(Z), Z = RN(RN(w) + 0.5), w = a / scale (real), where ok:
    r2 < r < r1 (the nudges are 2^6 ulps of r and round to at most half an ulp), a >= 0 (v >= lo;
    a NaN fails; an infinite a with a finite scale gives g1 = g2 = inf, impossible: a <= RN(hi -
    lo), so an infinite a makes hi - lo and the scale infinite, r = 0, a r_i NaN), so
    a r2 <= a r <= a r1 and rint, being monotone, maps all of [a r2, a r1] to k = rint(a r1) =
    rint(a r2): [a r2, a r1] lies in [k - 1/2, k + 1/2], and a r is at least
    a min(r - r2, r1 - r) >= a r (2^-17 - 2^-24) / (1 + 2^-24) > 2^-17.02 a r from k +- 1/2.
    The spec strays less: |a r - w| <= 2^-22 w (r's error), RN(w) within 2^-24 w of w, and the
    add's rounding is at most half an ulp of Z <= 2 (w + 1/2); for w >= 1/4, Z <= 3 w (1 + 2^-23)
    and |Z - (w + 1/2)| < 2^-24 w + 2^-24 3.01 w, so |Z - (a r + 1/2)| < 2^-20.4 w < 2^-17.02 a r
    (a r >= w (1 - 2^-22)): Z - k lies strictly inside (0, 1), floor(Z) = k, and 0 <= k <= top
    (a r1 <= 15 (1 + 2^-22)^2 (1 + 2^-16.9) < 15.5; w <= 15 (1 + 2^-22) as in
    tq_near_value_codes), so no clamp applies. For w < 1/4: a r < 1/4 (1 + 2^-21), so k = 0, and
    Z <= RN(RN(w) + 0.5) < 1: floor(Z) = 0 = k (a = 0 included: g1 = g2 = 1.5 * 2^23, Z = 0.5).
    """
    _, r, a, _ = _tq_value_row_terms(v, bits, floor_scale, every_row=True)
    with np.errstate(all="ignore"):
        r = (r.astype(np.float64) * (1.0 + r_err)).astype(np.float32)
        r1 = (r * (np.float32(1) + TQ_V5_NUDGE)).astype(np.float32)
        r2 = (r * (np.float32(1) - TQ_V5_NUDGE)).astype(np.float32)
        g1 = fma_f32(a, np.broadcast_to(r1[..., None], a.shape), TQ_RINT_MAGIC)
        g2 = fma_f32(a, np.broadcast_to(r2[..., None], a.shape), TQ_RINT_MAGIC)
        ok = g1 == g2
        gb = g1.view(np.uint32).astype(np.int64)
        codes = gb - TQ_RINT_MAGIC_BITS
    return codes, gb.astype(np.uint32), ok


def tq_pack_magic_codes(g: np.ndarray, bits: int) -> np.ndarray:
    """Variant 3's packing of E magic bit patterns g (..., E) uint32 (g_j = 1.5 * 2^23's bits +
    k_j, k_j < 2^bits, E * bits <= 32) as the kernel computes it in 32-bit registers:
    sum_j (g_j << bits j) - sum_j (magic bits << bits j), mod 2^32 (kv_tq_magic_junk)."""
    g = np.asarray(g, np.uint64)
    e = g.shape[-1]
    mask = np.uint64(0xFFFFFFFF)
    acc = np.zeros(g.shape[:-1], np.uint64)
    junk = 0
    for j in range(e):
        acc = (acc + ((g[..., j] << np.uint64(bits * j)) & mask)) & mask
        junk = (junk + ((TQ_RINT_MAGIC_BITS << (bits * j)) & 0xFFFFFFFF)) & 0xFFFFFFFF
    return ((acc - np.uint64(junk)) & mask).astype(np.uint32)


def tq_sign_words(signs, lanes: int, rows: int, e: int, word_bits: int) -> np.ndarray:
    """write_turboquant.cu kv_tq_sign_words: c[r][w] (rows, words) uint32 with bit (pos - p) set
    where element (p + lanes r) e + w per + k has sign -1 (per = 32 // word_bits elements a
    word, pos = word_bits (k + 1) - 1: each element's sign bit in the input word)."""
    s = np.asarray(signs)
    per = 32 // word_bits
    words = e // per
    c = np.zeros((rows, words), np.uint64)
    for r in range(rows):
        for w in range(words):
            for p in range(lanes):
                for k in range(per):
                    i = (p + lanes * r) * e + w * per + k
                    if s[i] < 0:
                        c[r, w] |= np.uint64(1 << (word_bits * (k + 1) - 1 - p))
    return c.astype(np.uint32)


# --- TurboQuant code packing by windows, variant 4 (cuda_src/write_turboquant.cu) ------------


def tq_window_ok(pb: int, lanes: int) -> bool:
    """write_turboquant.cu kv_tq_window_ok: pieces of pb bits (a spec lane's e codes of b bits)
    in rows of ``lanes`` lanes can be stored by windows: pb < 32, a piece is not itself a whole
    number of 16-bit units (else it stores itself), lanes * pb % 16 == 0 (an L-lane run of
    pieces ends on a unit boundary), and every unit starting inside a piece (offset o from its
    start) ends within that piece and the next, inside 32 bits: o + 16 <= min(2 pb, 32)."""
    g = 1
    while (g * pb) % 16:
        g *= 2
    if pb >= 32 or g == 1 or (lanes * pb) % 16:
        return False
    for q in range(lanes):
        for s in range((q * pb + 15) // 16 * 16, (q + 1) * pb, 16):
            if s - q * pb + 16 > min(2 * pb, 32):
                return False
    return True


def tq_window_units(pieces: np.ndarray, pb: int, lanes: int, rng=None) -> dict[int, int]:
    """Variant 4's stores of one row's code stream (kv_tq_store_codes_window), as the kernel's
    lanes compute them: pieces (rows * lanes,) uint32, spec lane v = p + lanes * r holding the
    stream's bits [v pb, v pb + pb). Lane p of row piece r takes next = the piece of lane p + 1
    (__shfl_down_sync by 1; for p = lanes - 1 that is another row piece's or row's lane, random
    here since it must never matter), forms w = (own + next << pb) mod 2^32 >> o and stores
    unit k = (w >> 16 k) & 0xFFFF at stream byte first / 8 + lanes r pb / 8 + 2 k while
    first + 16 k < p pb + pb (first = p pb rounded up to 16, o = first - p pb). Returns
    {byte offset: 16-bit unit} and raises if two stores hit one unit."""
    rng = np.random.default_rng(0) if rng is None else rng
    pieces = np.asarray(pieces, np.uint64)
    rows = len(pieces) // lanes
    out: dict[int, int] = {}
    for r in range(rows):
        for p in range(lanes):
            own = int(pieces[p + lanes * r])
            nxt = int(pieces[p + 1 + lanes * r]) if p + 1 < lanes else int(rng.integers(0, 1 << 32))
            start = p * pb
            first = (start + 15) // 16 * 16
            w = ((own + (nxt << pb)) & 0xFFFFFFFF) >> (first - start)
            for k in range((pb + 15) // 16):
                if first + 16 * k < start + pb:
                    at = first // 8 + lanes * r * pb // 8 + 2 * k
                    if at in out:
                        raise AssertionError(f"unit at byte {at} stored twice")
                    out[at] = (w >> (16 * k)) & 0xFFFF
    return out
