"""The fp8 writer's fast chunk (cuda_src/write_dense.cu kv_fp8_fast_words, under
KVKIT_WRITE_DENSE_VARIANT=1) gives the spec's bytes: for every finite float16 input and layer
scales in [2^-16, 2^16] (divide.cuh KV_DIV_F16_LO / HI), the model
kvkit.formats.arch_models.fp8_fast_chunk (the kernel's five-step quotient of |a| with NO
per-element range check, the magnitude code on |q|, the sign bit from the input half) equals
codecs.e4m3_encode_array(a / b) with IEEE float32 division (NumPy), on both arch paths
(hardware cvt model, sm_80 software model). The premise of the unchecked quotient, divide.cuh's
element condition, is checked too: the range argument in divide.cuh says it holds for every
such (a, b).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvkit.formats import arch_models, codecs

LO, HI = 2.0**-16, 2.0**16


def _finite_halves() -> np.ndarray:
    """Every finite float16 pattern (both signs, zeros and subnormals), even count."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    h = h[(h & 0x7FFF) < 0x7C00]
    return h if h.size % 2 == 0 else h[:-1]


HALVES = _finite_halves()


def _check(b: float, hardware: bool) -> None:
    b = np.float32(b)
    a = HALVES.view(np.float16).astype(np.float32)
    with np.errstate(all="ignore"):
        want = codecs.e4m3_encode_array(a / b)
    got = arch_models.fp8_fast_chunk(HALVES, float(b), hardware)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, (
        f"b={b!r}: {bad.size} bytes differ, first a={a[bad[0]]!r} got {got[bad[0]]:#x} "
        f"want {want[bad[0]]:#x}"
    )
    _, ok = arch_models.div_by_reciprocal(np.abs(a), b)
    assert ok.all(), f"b={b!r}: divide.cuh's element condition fails for some finite half"


EDGES = [
    LO,
    HI,
    np.nextafter(np.float32(LO), np.float32(1)),
    np.nextafter(np.float32(HI), np.float32(0)),
    1.0,
    1.0 / 448.0,
    3.0,
    0.1,
    np.nextafter(np.float32(1), np.float32(2)),
    np.nextafter(np.float32(1), np.float32(0)),
]


@pytest.mark.parametrize("hardware", [True, False])
@pytest.mark.parametrize("b", EDGES)
def test_fast_chunk_edges(b, hardware):
    _check(b, hardware)


@settings(max_examples=40, deadline=None)
@given(
    st.floats(min_value=LO, max_value=HI, width=32, allow_nan=False, allow_infinity=False),
    st.booleans(),
)
@example(b=0.0078125, hardware=True)  # a power of two: exact reciprocal
def test_fast_chunk_drawn_scales(b, hardware):
    _check(b, hardware)


def test_fast_chunk_signs_come_from_the_input_halves():
    """-0 and negatives that round to zero keep the sign bit (0x80), as the spec says."""
    h = np.array([0x8000, 0x8001, 0x0000, 0x0001], np.uint16)  # -0, -2^-24, +0, +2^-24
    assert list(arch_models.fp8_fast_chunk(h, 1.0, True)) == [0x80, 0x80, 0x00, 0x00]
