"""The write kernels' division by a row-uniform divisor (cuda_src/common/divide.cuh) equals
IEEE float32 division bit for bit: the CPU model (kvkit.formats.arch_models.div_by_reciprocal)
runs the kernel's five-step sequence with exactly rounded fused multiply-adds, and wherever
the kernel keeps the fast quotient (ok) it must equal NumPy's float32 a / b (IEEE, denormals
kept, as the kernels are built without -ftz); elsewhere the kernel uses __fdiv_rn itself.

Inputs: random patterns over the whole ok range, quotients placed next to rounding midpoints
(the hard cases of correctly rounded division), significands at the ends of [1, 2), the ranges'
edges, signed zeros and denormal dividends, the TurboQuant key and value operands, and
Hypothesis-drawn float32 patterns.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

from kvkit.formats import arch_models

DIV_LO, DIV_HI = arch_models.DIV_LO, arch_models.DIV_HI
RNG_SEED = 20261130


def _f32(bits) -> np.ndarray:
    return np.asarray(bits, np.uint32).view(np.float32)


def _same_bits(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Equal float32 patterns, any NaN equal to any NaN."""
    g, w = np.asarray(got, np.float32), np.asarray(want, np.float32)
    return (g.view(np.uint32) == w.view(np.uint32)) | (np.isnan(g) & np.isnan(w))


def _check_fast_quotients(a, b) -> int:
    a = np.asarray(a, np.float32)
    b = np.broadcast_to(np.asarray(b, np.float32), a.shape)
    q, ok = arch_models.div_by_reciprocal(a, b)
    with np.errstate(all="ignore"):
        want = a / b
    bad = np.flatnonzero(ok & ~_same_bits(q, want))
    assert bad.size == 0, (
        f"{bad.size} fast quotients differ, first a={a.flat[bad[0]]!r} b={b.flat[bad[0]]!r} "
        f"got {q.flat[bad[0]]!r} want {want.flat[bad[0]]!r}"
    )
    return int(ok.sum())


def _rand_in_range(rng, n, lo_exp, hi_exp, sign=True):
    e = rng.integers(lo_exp + 127, hi_exp + 127, n, dtype=np.int64)
    m = rng.integers(0, 1 << 23, n, dtype=np.int64)
    s = rng.integers(0, 2, n, dtype=np.int64) if sign else np.zeros(n, np.int64)
    return _f32(((s << 31) | (e << 23) | m).astype(np.uint32))


def test_fma_model_rounds_once():
    rng = np.random.default_rng(RNG_SEED)
    n = 400
    a = _rand_in_range(rng, n, -60, 60)
    b = _rand_in_range(rng, n, -60, 60)
    c = np.where(rng.random(n) < 0.5, -(a * b), _rand_in_range(rng, n, -126, 60))
    c = (c * (1 + np.float32(2.0**-20) * rng.integers(-3, 4, n))).astype(np.float32)
    # products and addends in the denormal range too
    a[:50] = _rand_in_range(rng, 50, -70, -60)
    b[:50] = _rand_in_range(rng, 50, -70, -60)
    c[:50] = _f32(rng.integers(0, 1 << 23, 50).astype(np.uint32))
    got = arch_models.fma_f32(a, b, c)
    for x, y, z, g in zip(a, b, c, got):
        exact = Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))
        # float32 rounding of the exact value: through float64 only when float64 holds it
        lo = np.float32(float(exact))
        cands = [np.nextafter(lo, np.float32(-np.inf)), lo, np.nextafter(lo, np.float32(np.inf))]

        def key(f, exact=exact):
            return abs(Fraction(float(f)) - exact), int(np.float32(f).view(np.uint32)) & 1

        best = min(cands, key=key)
        assert g == best or (g == 0 and best == 0), (x, y, z, g, best)


def test_fast_quotient_is_ieee_over_the_ok_range():
    rng = np.random.default_rng(RNG_SEED)
    n = 2_000_000
    b = _rand_in_range(rng, n, -40, 40, sign=False)
    q = _rand_in_range(rng, n, -41, 41)
    a = (q * b).astype(np.float32)
    assert _check_fast_quotients(a, b) > n * 0.9


def test_fast_quotient_next_to_rounding_midpoints():
    # a / b just off the midpoint between two floats m and next(m): the cases where one
    # rounding too many would pick the wrong neighbour.
    rng = np.random.default_rng(RNG_SEED + 1)
    n = 1_000_000
    b = _rand_in_range(rng, n, -30, 30, sign=False)
    m = _rand_in_range(rng, n, -30, 30)
    mid = (m.astype(np.float64) + np.nextafter(m, np.float32(np.inf)).astype(np.float64)) / 2
    a0 = (mid * b).astype(np.float32)  # RN of b * midpoint
    for k in (-2, -1, 0, 1, 2):
        a = a0.view(np.uint32).astype(np.int64) + k
        _check_fast_quotients(_f32(a.astype(np.uint32)), b)


def test_fast_quotient_at_the_significand_extremes():
    # significands near 2 for both operands (q0 = RN(a RN(1/b)) is then up to 1.5 ulp off),
    # near 1, and mixed; every exponent offset across the ok range's edges.
    rng = np.random.default_rng(RNG_SEED + 2)
    top = np.arange((1 << 23) - 2048, 1 << 23, dtype=np.int64)
    bottom = np.arange(0, 2048, dtype=np.int64)
    mants = np.concatenate([top, bottom])
    for ea in (-41, -40, -39, -1, 0, 1, 39, 40):
        for eb in (-40, -39, 0, 39, 40):
            ma = rng.choice(mants, 20000)
            mb = rng.choice(mants, 20000)
            a = _f32((((ea + 127) << 23) | ma).astype(np.uint32))
            b = _f32((((eb + 127) << 23) | mb).astype(np.uint32))
            _check_fast_quotients(a, b)
            _check_fast_quotients(-a, b)


def test_zeros_denormals_and_specials_fall_back_or_match():
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754942e-38, -1.1754942e-38]
    specials = np.array(specials + [1.0, -1.0, 3.4028235e38], np.float32)
    edges = [np.nextafter(DIV_LO, np.float32(0)), np.nextafter(DIV_HI, np.float32(np.inf))]
    divisors = [DIV_LO, DIV_HI, 1.0, 1e-8, 11.313708, *edges, 0.0, np.inf, np.nan, 1e-45]
    divisors = np.array(divisors, np.float32)
    a, b = np.meshgrid(specials, divisors)
    q, ok = arch_models.div_by_reciprocal(a, b)
    _check_fast_quotients(a, b)
    # signed zeros take the fast path with the dividend's sign
    zero = ok & (a == 0)
    assert zero.any() and np.all(np.signbit(q[zero]) == np.signbit(a[zero]))
    # every divisor outside [2^-40, 2^40] and every non-finite dividend falls back
    assert not ok[(b < DIV_LO) | (b > DIV_HI) | np.isnan(b)].any()
    assert not ok[~np.isfinite(a)].any()
    # the combined rule (what a kernel stores) is IEEE division everywhere
    with np.errstate(all="ignore"):
        assert _same_bits(arch_models.div_rows(a, b), a / b).all()


def test_turboquant_operands_take_the_fast_path():
    # Key: y = t / den with |t| <= den; value: (v - lo) / scale with scale >= 1e-8. fp16
    # inputs (|x| <= 65504, quantum >= 2^-24) never leave the fast path except for t == 0 / v == lo,
    # which it handles exactly.
    rng = np.random.default_rng(RNG_SEED + 3)
    k = rng.standard_normal((4096, 128)).astype(np.float16).astype(np.float32)
    n = np.sqrt((k * k).sum(-1, dtype=np.float32)).astype(np.float32)
    den = (np.float32(np.sqrt(128)) * n).astype(np.float32)
    t = (k @ np.where(rng.random((128, 128)) < 0.5, -1, 1).astype(np.float32)).astype(np.float32)
    ok_k = _check_fast_quotients(t, den[:, None])
    assert ok_k == t.size
    v = (rng.standard_normal((4096, 128)) * 3).astype(np.float16).astype(np.float32)
    lo, hi = v.min(-1), v.max(-1)
    scale = np.maximum((hi - lo) / np.float32(15), np.float32(1e-8)).astype(np.float32)
    d = (v - lo[:, None]).astype(np.float32)
    assert _check_fast_quotients(d, scale[:, None]) == d.size


@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
@example(0x3F7FFFFF, 0x3FFFFFFF)  # both significands all ones
@example(0x80000000, 0x3F800000)  # -0 / 1 keeps the sign
@example(0x00000001, 0x2B800000)  # a denormal dividend over 2^-40: falls back
def test_division_rule_on_random_patterns(a_bits, b_bits):
    a, b = _f32([a_bits]), _f32([b_bits])
    with np.errstate(all="ignore"):
        assert _same_bits(arch_models.div_rows(a, b), a / b).all()
    _check_fast_quotients(a, np.abs(b))
