"""Variant 3 of the TurboQuant write kernel (KVKIT_WRITE_TQ_VARIANT=3; cuda_src/write_turboquant.cu
kv_tq_cell_v3, the near loops under TQ_VARIANT >= 3, kv_tq_sign_words, kv_tq_magic_junk): its
arithmetic identities against the spec's formulas (DESIGN.md 4, 7).

The models are kvkit.formats.arch_models tq_near_key_index_v3 / tq_near_value_codes_v3 /
tq_pack_magic_codes / tq_sign_words (where the proofs are). Where a model's ``ok`` holds the
kernel keeps its fast code, elsewhere the lane divides exactly, so only ``ok`` elements need
checking, plus that ``ok`` holds almost everywhere on Gaussian-like rows.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kvkit import formats
from kvkit.formats import arch_models

from .test_tq_near_models import MSE, _near_midpoint_t, _spec_key_index, _tables

f32 = np.float32
DENS = [1.0, 11.313708, 0.0017, 3.7e5, 2.0**-40, 2.0**40, 1e-30, 1e30]


def _check_keys(t, den, mids, table, cents):
    idx, cent, ok = arch_models.tq_near_key_index_v3(t, den, table)
    want = _spec_key_index(t, den, mids)
    bad = ok & ((idx != want) | (cent != cents[np.clip(want, 0, len(cents) - 1)]))
    assert not bad.any(), (t[bad][:5], np.broadcast_to(den, t.shape)[bad][:5])
    return ok


def _fmt_arrays(preset):
    name, d = MSE[preset // 3], (64, 128, 256)[preset % 3]
    fmt = formats.get(name, d)
    table = arch_models.tq_bucket_table(fmt.midpoints, fmt.centroids)
    return np.asarray(fmt.midpoints, f32), table, np.asarray(fmt.centroids, f32)


def _cents(mids):
    for name in MSE:
        for d in (64, 128, 256):
            fmt = formats.get(name, d)
            if np.array_equal(np.asarray(fmt.midpoints, f32), np.asarray(mids, f32)):
                return np.asarray(fmt.centroids, f32)
    raise AssertionError("no preset with these midpoints")


@pytest.mark.parametrize("mids, table", _tables())
@pytest.mark.parametrize("den", DENS)
def test_v3_keys_on_and_around_every_midpoint(mids, table, den):
    mids = np.asarray(mids, f32)
    t = _near_midpoint_t(mids, den, 40)
    t = np.concatenate([t, -t, [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-45, -1e-45, 3e38, -3e38]])
    _check_keys(t.astype(f32), f32(den), mids, table, _cents(mids))


@pytest.mark.parametrize("mids, table", _tables())
@pytest.mark.parametrize("den", DENS)
def test_v3_keys_on_and_around_every_cell_edge(mids, table, den):
    """t whose quotients land on and +-40 ulps around every cell edge (k +- 1/2) / scale and the
    clamp: where the saturating fma's rounding may move an element to the next cell."""
    mids = np.asarray(mids, f32)
    h = table.half
    edges = (np.arange(-h, h + 1) + 0.5) / float(table.scale)
    edges = np.concatenate([edges, -edges, [float(table.clamp), -float(table.clamp), 1.0, -1.0]])
    t = _near_midpoint_t(edges.astype(f32), den, 40)
    _check_keys(np.concatenate([t, -t]).astype(f32), f32(den), mids, table, _cents(mids))


@pytest.mark.parametrize("mids, table", _tables())
def test_v3_keys_of_gaussian_rows_rarely_fall_back(mids, table):
    rng = np.random.default_rng(11)
    d = 128
    k = rng.standard_normal((4096, d)).astype(f32) * f32(rng.uniform(1e-3, 1e3))
    t = (k @ (np.sign(rng.standard_normal((d, d))) / 1.0)).astype(f32)
    n = np.sqrt((k.astype(np.float64) ** 2).sum(axis=1)).astype(f32)
    den = (f32(np.sqrt(d)) * n).astype(f32)
    ok = _check_keys(t, den[:, None], np.asarray(mids, f32), table, _cents(mids))
    assert ok.mean() > 0.999


@given(
    t=st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True),
    den=st.floats(width=32, min_value=2.0**-126, max_value=2.0**127, allow_subnormal=False),
    preset=st.sampled_from(range(len(MSE) * 3)),
)
@example(t=-1.4e-45, den=4.0, preset=0)
@example(t=0.0, den=1.0, preset=0)
@example(t=-0.0, den=1.0, preset=0)  # d = mid - (-0) r: the 0 midpoint is near, not counted
def test_v3_keys_hypothesis(t, den, preset):
    mids, table, cents = _fmt_arrays(preset)
    _check_keys(np.array([t], f32), f32(den), mids, table, cents)


@given(
    m=st.integers(0, 14),
    ulps=st.integers(-64, 64),
    den=st.floats(width=32, min_value=2.0**-40, max_value=2.0**40),
    preset=st.sampled_from(range(len(MSE) * 3)),
)
def test_v3_keys_hypothesis_near_midpoints(m, ulps, den, preset):
    mids, table, cents = _fmt_arrays(preset)
    y = (np.asarray(mids[m % len(mids)], f32).view(np.int32) + np.int32(ulps)).view(f32)
    t = f32(float(y) * float(den))
    _check_keys(np.array([t, -t], f32), f32(den), mids, table, cents)


@pytest.mark.parametrize(
    "bits, e", [(3, 2), (3, 4), (3, 8), (4, 2), (4, 4), (4, 8), (4, 1), (3, 1)]
)
def test_pack_magic_codes_equals_plain_packing(bits, e):
    """Every code at every position, and random pieces: the shifted sum of the fma patterns minus
    the magic's junk is the LSB-first packing of the codes."""
    rng = np.random.default_rng(bits * 16 + e)
    k = rng.integers(0, 1 << bits, size=(20000, e))
    k[: 1 << bits] = np.arange(1 << bits)[:, None]
    g = (k + arch_models.TQ_RINT_MAGIC_BITS).astype(np.uint32)
    assert np.all(g.view(f32) - arch_models.TQ_RINT_MAGIC == k)  # the pattern of magic + k
    want = np.zeros(len(k), np.uint64)
    for j in range(e):
        want |= k[:, j].astype(np.uint64) << np.uint64(bits * j)
    assert np.array_equal(arch_models.tq_pack_magic_codes(g, bits), want.astype(np.uint32))


@pytest.mark.parametrize("rows, e, word_bits", [(4, 4, 16), (4, 2, 16), (4, 8, 16), (2, 4, 16),
                                                (2, 8, 16), (8, 4, 16), (4, 4, 32), (2, 8, 32),
                                                (4, 2, 32), (1, 4, 32)])  # fmt: skip
def test_sign_words_give_every_lane_its_signs(rows, e, word_bits):
    """(c[r][w] << p) & (sign positions) is lane p's XOR mask for word w of row piece r."""
    lanes = 32 // rows
    d = 32 * e
    rng = np.random.default_rng(d + rows)
    signs = np.where(rng.random(d) < 0.5, -1, 1)
    c = arch_models.tq_sign_words(signs, lanes, rows, e, word_bits).astype(np.uint64)
    per = 32 // word_bits
    pos = 0x80000000 if per == 1 else 0x80008000
    for p in range(lanes):
        for r in range(rows):
            for w in range(e // per):
                got = int((c[r, w] << np.uint64(p)) & np.uint64(0xFFFFFFFF)) & pos
                want = 0
                for k in range(per):
                    if signs[(p + lanes * r) * e + w * per + k] < 0:
                        want |= 1 << (word_bits * (k + 1) - 1)
                assert got == want, (p, r, w)


def test_sign_flip_by_xor_is_negation_for_every_half():
    """s x with s = -1 is x with its sign bit flipped: for every float16 and bfloat16 pattern the
    widening of h ^ 0x8000 is the negated widening of h (a NaN stays a NaN)."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    for widen in (lambda b: b.view(np.float16).astype(f32),
                  lambda b: (b.astype(np.uint32) << np.uint32(16)).view(f32)):  # fmt: skip
        a, b = widen(h), widen(h ^ np.uint16(0x8000))
        nan = np.isnan(a)
        assert np.array_equal(np.isnan(b), nan)
        assert np.array_equal((-a[~nan]).view(np.uint32), b[~nan].view(np.uint32))


# --- variant 4: code packing by windows (arch_models.tq_window_units) ---------------------------


@pytest.mark.parametrize("bits, e, lanes", [(3, 4, 8), (3, 8, 8), (4, 2, 8), (3, 4, 16),
                                            (3, 8, 16), (4, 2, 16), (3, 2, 8), (4, 4, 8),
                                            (4, 8, 8), (3, 4, 4)])  # fmt: skip
def test_window_packing_equals_plain_packing(bits, e, lanes):
    """Where tq_window_ok holds (3-bit codes at D = 128 / 256, 4-bit at D = 64), the window
    stores of every lane cover the row's packed codes exactly once, unit for unit, for random
    codes and for every code value at every position; elsewhere the kernel keeps the group
    packing (the model is not used)."""
    from kvkit.formats import bitpack

    pb = bits * e
    ok = arch_models.tq_window_ok(pb, lanes)
    want_ok = (bits, e) in ((3, 4), (3, 8), (4, 2)) and (lanes * pb) % 16 == 0
    assert ok == want_ok, (bits, e, lanes)
    if not ok:
        return
    rows = 32 // lanes
    d = rows * lanes * e
    rng = np.random.default_rng(bits * 100 + e * 10 + lanes)
    tests = [rng.integers(0, 1 << bits, size=d) for _ in range(200)]
    tests += [np.full(d, c) for c in range(1 << bits)]
    tests += [np.where(np.arange(d) == i, (1 << bits) - 1, 0) for i in range(d)]
    for codes in tests:
        want = bitpack.pack_array(codes.astype(np.uint8), bits)
        assert len(want) % 2 == 0
        pieces = np.zeros(d // e, np.uint64)
        for v in range(d // e):
            for j in range(e):
                pieces[v] |= np.uint64(int(codes[v * e + j]) << (bits * j))
        units = arch_models.tq_window_units(pieces, pb, lanes, rng)
        assert sorted(units) == list(range(0, len(want), 2))
        got = np.zeros(len(want), np.uint8)
        for at, u in units.items():
            got[at], got[at + 1] = u & 0xFF, u >> 8
        assert np.array_equal(got, want)
