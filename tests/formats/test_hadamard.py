"""Rotation and reductions: against explicit matrices and float64 sums."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import njit

from kvkit.formats import hadamard

fwht_jit = njit(hadamard.fwht_inplace)
sumsq_jit = njit(hadamard.sum_squares)


def sylvester(d: int) -> np.ndarray:
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h


@pytest.mark.parametrize("d", [64, 128, 256])
def test_fwht_equals_the_sylvester_matrix_product(d):
    x = np.random.default_rng(d).standard_normal((20, d)).astype(np.float32)
    ref = x.astype(np.float64) @ sylvester(d).T
    got = hadamard.fwht_array(x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4 * np.abs(ref).max())
    for row in range(3):
        y = x[row].copy()
        fwht_jit(y)
        np.testing.assert_array_equal(y, got[row])


@pytest.mark.parametrize("d", [64, 128, 256])
def test_signed_rotation_is_orthogonal(d):
    s = hadamard.rotation_signs(d, "signed_hadamard")
    assert set(np.unique(s)) == {-1.0, 1.0}
    r = sylvester(d) * s[None, :] / np.sqrt(d)
    np.testing.assert_allclose(r @ r.T, np.eye(d), atol=1e-12)


def test_signs_are_pinned_by_the_documented_seed():
    # The signs are part of the format's bytes; a change would silently break old caches.
    # These are splitmix64 outputs for SIGN_SEED, recomputed here independently.
    mask = (1 << 64) - 1

    def mix(z):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    expect = [
        -1.0 if mix((0x6B766B6974 + (i + 1) * 0x9E3779B97F4A7C15) & mask) >> 63 else 1.0
        for i in range(256)
    ]
    np.testing.assert_array_equal(hadamard.rotation_signs(256, "signed_hadamard"), expect)
    np.testing.assert_array_equal(hadamard.rotation_signs(128, "hadamard"), np.ones(128))
    # Roughly balanced, as a random sign vector should be.
    assert abs(hadamard.rotation_signs(256, "signed_hadamard").sum()) < 48


@given(st.sampled_from([32, 64, 128, 256]), st.integers(0, 2**32 - 1), st.floats(1e-3, 1e4))
def test_sum_squares_scalar_and_array_forms_agree_and_are_accurate(d, seed, mag):
    x = (np.random.default_rng(seed).standard_normal(d) * mag).astype(np.float32)
    got = hadamard.sum_squares_array(x[None])[0]
    assert sumsq_jit(x, np.zeros(32, np.float32)) == got
    ref = float((x.astype(np.float64) ** 2).sum())
    assert abs(float(got) - ref) <= 1e-6 * ref


def test_sum_squares_order_is_the_lane_butterfly():
    # An input where float32 association matters, so the documented tree must be what runs.
    # D=64: lane l holds x[2l], x[2l+1]. Squares 2^24 (lane 0), 1 (lane 1), 1 (lane 3).
    x = np.zeros(64, np.float32)
    x[0], x[2], x[6] = np.float32(2.0**12), np.float32(1.0), np.float32(1.0)
    # Butterfly: at off=2 lanes 1 and 3 meet (1 + 1 = 2), at off=1 that 2 joins 2^24 exactly.
    # A left-to-right sum would give (2^24 + 1) + 1 = 2^24 (each 1 lost to round-to-even).
    got = hadamard.sum_squares_array(x[None])[0]
    assert got == np.float32(2.0**24 + 2.0)
    assert sumsq_jit(x, np.zeros(32, np.float32)) == got
    sequential = np.float32(0)
    for v in x:
        sequential = np.float32(sequential + v * v)
    assert sequential == np.float32(2.0**24)
