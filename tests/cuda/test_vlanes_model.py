"""A lane-by-lane float32 model of cuda_src/common/vlanes.cuh (R rows per warp, the spec's 32
reduction lanes as virtual lanes p + L r) against the spec's single-row order in
kvkit.formats.hadamard and the sequential first-occurring NaN-ignoring min / max: the mapping
must give the same bits. The model transcribes the CUDA helpers' index arithmetic (shuffle
partner lane ^ m within the row's L lanes, register partner r ^ (m / L)); the GPU write tests
then check the kernel itself against the Numba backend.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kvkit.formats import hadamard

F32 = np.float32


def _lanes(rows: np.ndarray, r_count: int, e: int) -> np.ndarray:
    """x[lane, r, j] = element (p + L r) e + j of row lane // L, p = lane % L."""
    width = 32 // r_count
    x = np.empty((32, r_count, e), np.float32)
    for lane in range(32):
        g, p = divmod(lane, width)
        for r in range(r_count):
            v = p + width * r
            x[lane, r] = rows[g, v * e : v * e + e]
    return x


def _model_sum_squares(x: np.ndarray) -> np.ndarray:
    r_count, e = x.shape[1:]
    width = 32 // r_count
    acc = x[:, :, 0] * x[:, :, 0]
    for j in range(1, e):
        acc = acc + x[:, :, j] * x[:, :, j]
    off = 16
    while off >= width:  # register levels: partner r ^ (off / L)
        acc = acc + acc[:, np.arange(r_count) ^ (off // width)]
        off //= 2
    s = acc[:, 0]
    off = width // 2
    while off:  # shuffle levels: partner lane ^ off
        s = s + s[np.arange(32) ^ off]
        off //= 2
    return s


def _model_fwht(x: np.ndarray) -> np.ndarray:
    x = x.copy()
    r_count, e = x.shape[1:]
    width = 32 // r_count
    h = 1
    while h < e:
        for i in range(e):
            if i & h == 0:
                a, b = x[:, :, i].copy(), x[:, :, i + h].copy()
                x[:, :, i], x[:, :, i + h] = a + b, a - b
        h *= 2
    lanes = np.arange(32)
    m = 1
    while m < 32:
        if m < width:
            other = x[lanes ^ m]
            lower = ((lanes % width) & m) == 0
            x = np.where(lower[:, None, None], x + other, other - x)
        else:
            d = m // width
            for r in range(r_count):
                if r & d == 0:
                    a, b = x[:, r].copy(), x[:, r ^ d].copy()
                    x[:, r], x[:, r ^ d] = a + b, a - b
        m *= 2
    return x


def _first_extreme2(a, b, maximum):
    take_b = ((b > a) if maximum else (b < a)) or (a != a)
    return b if take_b else a


def _model_first_extreme(x: np.ndarray, maximum: bool) -> np.ndarray:
    """kv_vlane_first_extreme: per-lane scans, then distances 1, 2, 4, 8, 16 (shuffles below
    L, per r; registers r ^ (off / L) from L on)."""
    r_count, e = x.shape[1:]
    width = 32 // r_count
    m = np.empty((32, r_count), np.float32)
    for lane in range(32):
        for r in range(r_count):
            best = x[lane, r, 0]
            for j in range(1, e):
                best = _first_extreme2(best, x[lane, r, j], maximum)
            m[lane, r] = best
    off = 1
    while off < width:
        nxt = m.copy()
        for lane in range(32):
            lower = ((lane % width) & off) == 0
            for r in range(r_count):
                mine, other = m[lane, r], m[lane ^ off, r]
                nxt[lane, r] = _first_extreme2(*((mine, other) if lower else (other, mine)),
                                               maximum)  # fmt: skip
        m = nxt
        off *= 2
    while off < 32:
        d = off // width
        nxt = m.copy()
        for lane in range(32):
            for r in range(r_count):
                lo, hi = (r, r ^ d) if r & d == 0 else (r ^ d, r)
                nxt[lane, r] = _first_extreme2(m[lane, lo], m[lane, hi], maximum)
        m = nxt
        off *= 2
    return m[:, 0]


def _sequential_extreme(row: np.ndarray, maximum: bool) -> np.float32:
    """The CPU writer's scan: the first-occurring NaN-ignoring min / max."""
    best = row[0]
    for v in row[1:]:
        if ((v > best) if maximum else (v < best)) or best != best:
            best = v
    return best


def _bits(a) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


SPECIALS = [0.0, -0.0, np.nan, 1e-40, -1e-40, 3.0, -3.0]


@pytest.mark.parametrize("r_count", [1, 2, 4, 8])
@pytest.mark.parametrize("e", [1, 2, 4])
@given(data=st.data())
@example(data=None)  # the fixed wide-range draw below, whatever Hypothesis picks
def test_vlane_reductions_and_fwht_match_the_spec(r_count, e, data):
    d = 32 * e
    if data is None:
        rng = np.random.default_rng(r_count * 10 + e)
        rows = rng.standard_normal((r_count, d)) * 10 ** rng.uniform(-4, 4, (r_count, d))
        rows = rows.astype(np.float32)
    else:
        finite = st.floats(-1e6, 1e6, width=32, allow_subnormal=True)
        rows = data.draw(hnp.arrays(np.float32, (r_count, d), elements=finite))
    x = _lanes(rows, r_count, e)
    width = 32 // r_count
    sums = _model_sum_squares(x)
    out = _model_fwht(x)
    for g in range(r_count):
        want = hadamard.sum_squares_array(rows[g])
        got = sums[g * width : (g + 1) * width]
        assert np.all(_bits(got) == _bits(want))  # every lane of the row holds the sum
        back = np.empty(d, np.float32)
        for p in range(width):
            for r in range(r_count):
                v = p + width * r
                back[v * e : v * e + e] = out[g * width + p, r]
        assert np.array_equal(_bits(back), _bits(hadamard.fwht_array(rows[g])))


@pytest.mark.parametrize("r_count", [1, 2, 4, 8])
@given(e=st.sampled_from([1, 2, 4]), data=st.data())
@example(e=1, data=None)  # -0 on lane 1, +0 on lane 2: distances 16 .. 1 would give +0
def test_vlane_first_extreme_matches_the_sequential_scan(r_count, e, data):
    d = 32 * e
    if data is None:
        rows = np.ones((r_count, d), np.float32)
        rows[:, 1], rows[:, 2] = -0.0, 0.0
    else:
        values = st.sampled_from(SPECIALS) | st.floats(-10, 10, width=32)
        rows = data.draw(hnp.arrays(np.float32, (r_count, d), elements=values))
    x = _lanes(rows, r_count, e)
    width = 32 // r_count
    for maximum in (False, True):
        got = _model_first_extreme(x, maximum)
        for g in range(r_count):
            want = _sequential_extreme(rows[g], maximum)
            lane_vals = got[g * width : (g + 1) * width]
            assert np.all(_bits(lane_vals) == _bits(want)) or (
                np.isnan(want) and np.all(np.isnan(lane_vals))
            )
