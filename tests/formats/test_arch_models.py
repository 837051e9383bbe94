"""Every arch path's conversion model gives the spec's bits (DESIGN.md section 7).

Inputs: every float16 value, a structured sweep of float32 bit patterns (every upper 16 bits
with edge low halves: the rounding boundaries of all three target types fall there), and
Hypothesis-drawn float32 bit patterns. References: kvkit.formats.codecs (itself checked
against ml_dtypes) and NumPy's float16 cast.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvkit.formats import arch_models, codecs

ALL_F16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
_HI = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
_LO = np.array([0, 1, 0x0FFF, 0x1000, 0x1001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
SWEEP = (_HI[:, None] | _LO[None, :]).ravel().view(np.float32)


def inputs():
    return np.concatenate([ALL_F16, SWEEP])


@pytest.mark.parametrize("path", sorted(arch_models.PATHS))
def test_model_equals_spec_on_the_sweep(path):
    model, spec = arch_models.PATHS[path]
    x = inputs()
    got, want = model(x), spec(x)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{path}: {bad.size} mismatches, first x={x[bad[0]]!r}"


@pytest.mark.parametrize("saturate", [False, True])
@pytest.mark.parametrize("model", [arch_models.f16_software, arch_models.f16_hardware])
def test_f16_models_equal_the_cast_and_the_nan_rule(model, saturate):
    x = inputs()
    got = model(x, saturate)
    nan = np.isnan(x)
    ref_in = np.clip(x, -codecs.F16_MAX, codecs.F16_MAX) if saturate else x
    with np.errstate(over="ignore", invalid="ignore"):
        ref = ref_in.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(got[~nan], ref[~nan])
    if saturate:
        assert np.all(got[nan] == codecs.F16_NAN_BITS)
    else:
        # NaN keeps its sign and the top payload bits, and stays a NaN.
        u = x[nan].view(np.uint32)
        assert np.all((got[nan] >> 15) == (u >> 31))
        assert np.all((got[nan] & 0x7C00) == 0x7C00) and np.all((got[nan] & 0x3FF) != 0)
        keep = ((u & 0x7FFFFF) >> 13) != 0
        np.testing.assert_array_equal(got[nan][keep] & 0x3FF, ((u & 0x7FFFFF) >> 13)[keep])


def test_scalar_spec_agrees_with_the_f16_software_model_when_saturating():
    x = inputs()[::97]
    got = arch_models.f16_software(x, saturate=True)
    want = np.array([codecs.f16_bits(float(v), True) for v in x], np.uint16)
    np.testing.assert_array_equal(got, want)


@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=64))
def test_models_on_random_float32_patterns(patterns):
    x = np.array(patterns, np.uint32).view(np.float32)
    for path, (model, spec) in arch_models.PATHS.items():
        np.testing.assert_array_equal(model(x), spec(x), err_msg=path)
    nan = np.isnan(x)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = x.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(arch_models.f16_software(x)[~nan], ref[~nan])


def test_helpers_round_half_to_even():
    m = np.array([0b1010, 0b1011, 0b1100, 0b1110, 0b0110, 5, 7], np.int64)
    np.testing.assert_array_equal(arch_models.rshift_rne(m, 2), [2, 3, 3, 4, 2, 1, 2])
    np.testing.assert_array_equal(arch_models.rshift_rne(m, 0), m)
    np.testing.assert_array_equal(arch_models.rshift_rne(m, 40), np.zeros_like(m))
