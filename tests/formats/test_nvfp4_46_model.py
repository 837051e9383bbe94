"""4over6's fast decision (KVKIT_WRITE_NVFP4_46_VARIANT=1; cuda_src/write_nvfp4.cu
kv_nvfp4_fast_codes<2, true> and kv_nvfp4_46_sure) against the spec's choice (DESIGN.md 3, 4).

The kernel's fast block approximates each candidate's squared error by fused multiply-adds and
lets those errors decide only where they differ by more than the proven bound on their
distance from the spec's errors; elsewhere (and for equal sf codes) it takes the spec's errors
or the tie rule. The model is kvkit.formats.arch_models nvfp4_46_candidates / nvfp4_46_sure /
nvfp4_46_fast_choice (the spec's arithmetic from kvkit.formats.nvfp4 and codecs, whose E2M1 and
E4M3 rounding test_codecs.py checks against ml_dtypes); checked here on Gaussian-like blocks at
several layer scales, on the blocks nearest to a tie and their ulp neighbours, on exact ties and
edge scales, and on Hypothesis blocks.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kvkit.formats import arch_models, nvfp4

f32 = np.float32
U = 2.0**-24
#: Layer scales: 1, the bench's calibrated scale for N(0, 1) data, odd ones, extremes that keep
#: every block scale in range or push it out (then the model must say "not sure" or not fast).
GS = [1.0, 5.0 / (6 * 448), 0.37, 3.0, 1e-3, 2.0**-30, 2.0**-60, 2.0**40, 1e30, 1e-38]


def _check(blk: np.ndarray, g: float) -> dict[str, np.ndarray]:
    """Where the kernel's fast block runs, its choice is the spec's; the sure blocks satisfy
    the proof's per-candidate bound |E - e| < 2^-14 den^2."""
    blk = np.asarray(blk, f32).reshape(-1, nvfp4.BLOCK)
    c = arch_models.nvfp4_46_candidates(blk, g)
    four, sure = arch_models.nvfp4_46_fast_choice(c)
    fast = c["fast"]
    bad = fast & (four != c["spec_four"])
    assert not bad.any(), (blk[bad][:2], g)
    # The spec writer's own choice (its sf codes) is the model's spec_four.
    _, sf = nvfp4.encode_blocks(blk.reshape(-1), g, True)
    np.testing.assert_array_equal(sf, np.where(c["spec_four"], c["sfc4"], c["sfc6"]))
    inr = (
        fast
        & (c["den6"] >= arch_models.NVFP4_46_DEN_LO)
        & (c["den4"] <= arch_models.NVFP4_46_DEN_HI)
    )
    assert (c["den4"][inr] >= c["den6"][inr]).all()  # sf is monotonic in amax / (target g)
    for t in "64":
        den = c["den" + t][inr].astype(np.float64)
        dist = np.abs(c["E" + t][inr].astype(np.float64) - c["e" + t][inr])
        assert (dist < 2.0**-14 * den * den).all(), t  # the proof: <= 961.4 u S^2
    return dict(c, four=four, sure=sure)


def _gaussian(n: int, seed: int, dtype=np.float16) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, nvfp4.BLOCK)).astype(np.float32)
    x *= np.exp(rng.normal(0.0, 1.0, (n, 1))).astype(np.float32)  # block-to-block spread
    return x.astype(dtype).astype(np.float32)


@pytest.mark.parametrize("g", GS)
def test_choice_on_gaussian_blocks(g):
    c = _check(_gaussian(100_000, 1), g)
    in_range = c["fast"] & (c["den6"] >= 1e-6) & (c["den4"] <= 1e6)
    if in_range.mean() > 0.9:  # ordinary scales: nearly every block decided by the fast errors
        assert c["sure"][in_range].mean() > 0.998


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_choice_on_bf16_like_and_float32_blocks(dtype):
    x = _gaussian(50_000, 2, dtype)
    if dtype is np.float32:  # bf16: the top 16 bits of float32
        _check((x.view(np.uint32) & np.uint32(0xFFFF0000)).view(f32), 1.0)
    _check(x, 0.0123)


def _near_ties(g: float, n: int = 400_000, keep: int = 300) -> np.ndarray:
    x = _gaussian(n, 3)
    c = arch_models.nvfp4_46_candidates(x, g)
    rel = np.abs(c["E4"].astype(np.float64) - c["E6"]) / (
        c["den6"].astype(np.float64) ** 2 + 1e-300
    )
    rel = np.where(c["fast"] & (c["sfc4"] != c["sfc6"]), rel, np.inf)
    return x[np.argsort(rel)[:keep]]


@pytest.mark.parametrize("g", [1.0, 5.0 / (6 * 448), 0.37])
def test_choice_on_the_nearest_ties_and_their_ulp_neighbours(g):
    """The blocks whose spec errors are closest (a relative gap down to ~1e-8), each element
    moved by -3..3 float32 ulps (one element at a time): the region where the fast errors
    cannot decide and the exact fallback (in the model: spec_four) must."""
    base = _near_ties(g)
    c = _check(base, g)
    assert (~c["sure"] & c["fast"]).any()  # the fallback is exercised
    bits = base.view(np.uint32)
    out = []
    for i in range(nvfp4.BLOCK):
        for k in (-3, -2, -1, 1, 2, 3):
            b = bits.copy()
            b[:, i] = (b[:, i].astype(np.int64) + k).astype(np.uint32)
            out.append(b.view(f32))
    _check(np.concatenate(out), g)


def test_exact_ties_and_equal_codes_keep_six():
    """Zero and tiny blocks (equal sf codes), a constant block, blocks on both grids."""
    blocks = [
        np.zeros(16),
        np.full(16, 1e-30),
        np.full(16, 2.0),
        np.array([0.0, -0.0] * 8),
        np.array([6.0, 4.0, 3.0, 2.0, 1.5, 1.0, 0.5, 0.0] * 2),
        np.array([6.0, -6.0] + [0.0] * 14),
        np.array([4.0, 3.0, 2.0, 1.0] * 4),
        np.array([2.0**-140] * 16),  # subnormal inputs
    ]
    for g in (1.0, 0.5, 5.0 / (6 * 448), 2.0**-40):
        c = _check(np.stack(blocks).astype(f32), g)
        tie = c["E4"] == c["E6"]
        assert not c["four"][tie & c["fast"]].any()


_F16 = st.floats(-65504.0, 65504.0, width=16, allow_nan=False)
_F32 = st.floats(-(2.0**100), 2.0**100, width=32, allow_nan=False, allow_subnormal=True)
_G = st.floats(2.0**-50, 2.0**50, width=32)


@given(st.lists(_F16, min_size=16, max_size=16), _G)
@example([0.0] * 15 + [1.0], 1.0)
@example([1.0, 0.75] * 8, 1.0)
def test_choice_hypothesis_f16(xs, g):
    _check(np.asarray(xs, f32), g)


@given(st.lists(_F32, min_size=16, max_size=16), _G)
def test_choice_hypothesis_f32(xs, g):
    _check(np.asarray(xs, f32), g)


def _rn32(q) -> float:
    """Exact rational q rounded to the nearest float32, ties to even (no double rounding)."""
    from fractions import Fraction

    a = np.float32(float(q))
    cands = [np.nextafter(a, f32(-np.inf)), a, np.nextafter(a, f32(np.inf))]
    best = min(
        cands, key=lambda c: (abs(Fraction(float(c)) - q), int(np.asarray(c).view(np.uint32)) & 1)
    )
    return float(best)


@pytest.mark.parametrize("g", [1.0, 0.37, 5.0 / (6 * 448)])
def test_model_errors_are_the_fused_order(g):
    """e is fmaf(d, d, e) over d = fmaf(-v, den, |x|), e_0 = RN(d_0^2): against exact
    rational arithmetic rounded once per step."""
    from fractions import Fraction

    x = _gaussian(4, 7)
    c = arch_models.nvfp4_46_candidates(x, g)
    for b in range(x.shape[0]):
        for t in "64":
            den = c["den" + t][b]
            inv = np.float32(1) / den
            q = np.abs((x[b] * inv).astype(f32))
            mag = np.asarray(nvfp4.codecs.E2M1_VALUES, f32)[nvfp4.codecs.e2m1_encode_array(q) & 7]
            e = Fraction(0)
            for i in range(16):
                d = Fraction(
                    _rn32(
                        Fraction(float(abs(x[b, i])))
                        - Fraction(float(mag[i])) * Fraction(float(den))
                    )
                )
                e = Fraction(_rn32(d * d + e))
            assert float(e) == float(c["e" + t][b]), (b, t)
