"""The NVFP4 writer's fast E2M1 path (cuda_src/common/fp4.cuh kv_e2m1_magic, write_nvfp4.cu
kv_nvfp4_fast_codes / kv_nvfp4_signs) against the spec's rounding, via its CPU models
(kvkit.formats.arch_models e2m1_magic, nvfp4_fast_words).

References: kvkit.formats.codecs (checked against ml_dtypes in test_codecs.py) and ml_dtypes'
float4_e2m1fn cast directly. The magic path holds for |x| < E2M1_MAGIC_LIMIT (the writer
checks RN(amax * inv) < 7 per block): checked on every float32 pattern near each rounding
threshold and binade edge, on every float16 value, and (slow) on every pattern below 7.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kvkit.formats import arch_models, codecs

LIMIT = arch_models.E2M1_MAGIC_LIMIT
VALUES = np.asarray(codecs.E2M1_MAGNITUDES, np.float32)
#: E2M1 midpoints (where ties are decided), binade edges of the magic (1, 2, 4), the limit,
#: the subnormal/normal float32 edge and zero.
EDGES = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.5, 1.0, 2.0, 4.0, 6.0, 7.0, 2.0**-126, 0.0]


def _ml_codes(x: np.ndarray) -> np.ndarray:
    """E2M1 codes by ml_dtypes' float4_e2m1fn cast (RNE, saturating to 6 below the limit)."""
    return np.asarray(x, np.float32).astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF


def _check(x: np.ndarray) -> None:
    x = np.asarray(x, np.float32)
    x = x[np.abs(x) < LIMIT]
    code, val = arch_models.e2m1_magic(x)
    want = codecs.e2m1_encode_array(x)
    bad = np.flatnonzero(code != want)
    assert bad.size == 0, f"{bad.size} mismatches, first x={x[bad[0]]!r}"
    np.testing.assert_array_equal(code, _ml_codes(x))
    np.testing.assert_array_equal(val.view(np.uint32), VALUES[code & 7].view(np.uint32))


def _windows(radius: int = 1 << 14) -> np.ndarray:
    offs = np.arange(-radius, radius + 1, dtype=np.int64)
    out = []
    for t in EDGES:
        b = int(np.float32(t).view(np.uint32)) + offs
        b = b[(b >= 0) & (b < 0x7F800000)].astype(np.uint32)
        out += [b, b | np.uint32(0x80000000)]
    return np.concatenate(out).view(np.float32)


def test_magic_equals_the_spec_near_every_threshold():
    _check(_windows())


def test_magic_equals_the_spec_on_every_f16_and_a_sweep():
    hi = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    lo = np.array([0, 1, 0x3FFF, 0x4000, 0x4001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    sweep = (hi[:, None] | lo[None, :]).ravel().view(np.float32)
    f16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    x = np.concatenate([sweep, f16])
    _check(x[~np.isnan(x)])


@given(st.integers(0, int(LIMIT.view(np.uint32)) - 1), st.booleans())
def test_magic_on_hypothesis_patterns(bits, neg):
    _check(np.array([bits | (0x80000000 if neg else 0)], np.uint32).view(np.float32))


@pytest.mark.slow
def test_magic_equals_the_spec_on_every_pattern_below_the_limit():
    """Exhaustive: all 2 * 0x40E00000 float32 patterns with |x| < 7 (about a minute)."""
    top, step = int(LIMIT.view(np.uint32)), 1 << 24
    for lo in range(0, top, step):
        b = np.arange(lo, min(top, lo + step), dtype=np.uint32)
        for sign in (0, 0x80000000):
            x = (b | np.uint32(sign)).view(np.float32)
            code, val = arch_models.e2m1_magic(x)
            np.testing.assert_array_equal(code, codecs.e2m1_encode_array(x))
            np.testing.assert_array_equal(val, VALUES[code & 7])


def _block_bytes(words: tuple[int, int]) -> np.ndarray:
    return np.array(words, np.uint32).view(np.uint8)


@pytest.mark.parametrize("dtype_code", [0, 1, 2])
@given(
    st.lists(st.integers(0, 0xFFFF), min_size=16, max_size=16),
    st.floats(0.0, 7.0, allow_nan=False, width=32),
)
@example(halves=[0x8000] * 16, target=0.0)  # all -0: every code 8
@example(halves=[0x3C00, 0xBC00] * 8, target=1.25)  # ties at 1.25
def test_fast_block_words_equal_the_spec_codes(dtype_code, halves, target):
    """The packed bytes of a fast block (magic codes, pair shift-adds, byte permutes, sign
    permutes from the raw words) equal the spec's e2m1 codes in NVFP4 nibble order."""
    h = np.asarray(halves, np.uint16)
    if dtype_code == 2:
        x = (h.astype(np.uint32) << 16).view(np.float32)
        raw = h[0::2].astype(np.uint32) | (h[1::2].astype(np.uint32) << 16)
    else:
        x = h.view(np.float16).astype(np.float32)
        raw = h[0::2].astype(np.uint32) | (h[1::2].astype(np.uint32) << 16)
        if dtype_code == 0:
            with np.errstate(all="ignore"):
                x = (x * np.float32(1.0 + 2.0**-20)).astype(np.float32)  # all float32 bits
            raw = x.view(np.uint32)
    if not np.all(np.isfinite(x)):
        return
    amax = np.float32(np.max(np.abs(x)))
    # inv maps amax to about the target (the writer's inv maps it near 6 or 4)
    inv = np.float32(np.float32(target) / amax) if amax > 0 else np.float32(target)
    if not np.float32(amax * inv) < LIMIT:
        return
    got = _block_bytes(arch_models.nvfp4_fast_words(x, raw, float(inv), dtype_code))
    q = codecs.e2m1_encode_array((x * inv).astype(np.float32)).astype(np.uint8)
    want = (q[0::2] | (q[1::2] << 4)).astype(np.uint8)
    np.testing.assert_array_equal(got, want)


def _sq_error(x, q_val, sfv, g):
    """The spec's 4over6 error sum in float32, in order (kvkit/cpu/write.py _nvfp4_sq_error)."""
    err = np.float32(0)
    for i in range(len(x)):
        d = np.float32(x[i] - np.float32(np.float32(q_val[i] * sfv) * g))
        err = np.float32(d * d) if i == 0 else np.float32(err + np.float32(d * d))
    return err


@given(
    st.lists(st.integers(0, 0xFFFF), min_size=16, max_size=16),
    st.sampled_from([4.0, 6.0]),
    st.floats(2.0**-30, 2.0**30, allow_nan=False, width=32),
)
@example(halves=[0x8000, 0x0000] * 8, target=6.0, g=1.0)  # signed zeros
def test_fast_error_from_magnitudes_equals_the_spec(halves, target, g):
    """kv_nvfp4_fast_codes<2>'s error (4over6): d_i from |x_i| and the magic's magnitude equals
    the spec's d_i from x_i and the signed E2M1 value up to sign, so the sums are identical."""
    x = np.asarray(halves, np.uint16).view(np.float16).astype(np.float32)
    if not np.all(np.isfinite(x)):
        return
    g = np.float32(g)
    amax = np.float32(np.max(np.abs(x)))
    with np.errstate(all="ignore"):
        sfc = codecs.e4m3_encode_array(np.array([amax / np.float32(np.float32(target) * g)]))[0]
        sfv = np.float32(codecs.e4m3_decode_array(np.array([sfc], np.uint8))[0])
        den = np.float32(sfv * g)
        inv = np.float32(1) / den if den != 0 else np.float32(0)
        m = (x * inv).astype(np.float32)
    if not (np.isfinite(inv) and np.float32(amax * inv) < LIMIT):
        return
    code, val = arch_models.e2m1_magic(m)
    signed = np.array([codecs.e2m1_decode(int(c)) for c in code], np.float32)
    with np.errstate(all="ignore"):
        fast = _sq_error(np.abs(x), val, sfv, g)
        spec = _sq_error(x, signed, sfv, g)
    assert fast.view(np.uint32) == spec.view(np.uint32) or (np.isnan(fast) and np.isnan(spec))
