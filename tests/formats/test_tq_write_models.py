"""The TurboQuant write kernel's arithmetic shortcuts give the spec's codes (DESIGN.md 4, 7).

* Key bucketing by a cell table (cuda_src/write_turboquant.cu, TQ_BKT; model
  kvkit.formats.arch_models.BucketTable): index == #{midpoints <= y} (ties up, NaN -> 0) and the
  centroid c[index], for every preset's codebook at D = 64, 128, 256, for user codebooks, on
  every float16 value, the midpoints and their float32 neighbours, specials and Hypothesis
  float32 patterns.
* V codes without the per-element division check, floored by an RD add
  (arch_models.tq_value_codes) == the spec's clamp(floor((v - lo) / scale + 0.5), 0, top).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kvkit import formats
from kvkit.formats import arch_models, codebook, codecs
from kvkit.formats.turboquant import V_SCALE_FLOOR

MSE = [n for n in formats.names() if n.startswith("turboquant") and not n.endswith("k8v4")]
ALL_F16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
SPECIALS = np.array(
    [
        np.nan,
        -np.nan,
        np.inf,
        -np.inf,
        0.0,
        -0.0,
        1.0,
        -1.0,
        3e38,
        -3e38,
        1e-45,
        -1e-45,
        1.0000001,
        -1.0000001,
    ],
    np.float32,
)


def spec_index(y: np.ndarray, mids: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return (np.asarray(y, np.float32)[:, None] >= mids[None, :]).sum(-1)


def near(mids: np.ndarray) -> np.ndarray:
    """Each midpoint, its float32 neighbours two steps either way, and its negation."""
    m = np.asarray(mids, np.float32)
    out = [m, -m]
    up, down = m, m
    for _ in range(2):
        up = np.nextafter(up, np.float32(np.inf))
        down = np.nextafter(down, np.float32(-np.inf))
        out += [up, down]
    return np.concatenate(out).astype(np.float32)


def check(table: arch_models.BucketTable, mids, cents, y) -> None:
    y = np.asarray(y, np.float32)
    idx, cent = table.index(y)
    want = spec_index(y, mids)
    bad = np.flatnonzero(idx != want)
    assert bad.size == 0, (y[bad[:5]], idx[bad[:5]], want[bad[:5]])
    np.testing.assert_array_equal(cent.view(np.uint32), cents[want].view(np.uint32))
    sq = np.where(
        idx == table.base[table.cell(y)], table.sq_lo[table.cell(y)], table.sq_hi[table.cell(y)]
    )
    c = cents[want]
    np.testing.assert_array_equal(sq.view(np.uint32), (c * c).astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("name", MSE)
def test_every_preset_has_a_cell_table_that_counts_as_the_spec(name, d):
    fmt = formats.get(name, d)
    table = arch_models.tq_bucket_table(fmt.midpoints, fmt.centroids)
    assert table is not None and table.cells <= arch_models.BKT_MAX_CELLS
    assert np.all(np.bincount(table.cell(fmt.midpoints)) <= 1)  # one midpoint per cell
    rng = np.random.default_rng(d)
    gauss = rng.normal(0.0, 1.0 / np.sqrt(d), 100_000).astype(np.float32)
    mids = table.mid[~np.isnan(table.mid)]
    y = np.concatenate([ALL_F16, SPECIALS, near(fmt.midpoints), gauss, mids])
    # the cells' own edges: rint's half-way points and their neighbours
    edges = ((np.arange(table.cells) - table.half + 0.5) / float(table.scale)).astype(np.float32)
    y = np.concatenate([y, near(edges)])
    check(table, fmt.midpoints, fmt.centroids, y)


@given(
    st.lists(st.floats(-2.0, 2.0, width=32), min_size=8, max_size=8, unique=True),
    st.lists(st.floats(width=32), min_size=1, max_size=64),
)
@example([-1e-30, -1e-38, 0.0, 1e-38, 1e-30, 0.5, 1.0, 2.0], [0.0, -0.0, 5e-39, float("nan")])
def test_user_codebooks(cents, ys):
    c = np.sort(np.asarray(cents, np.float32))
    if not np.all(np.diff(c) > 0):
        return
    mids = codebook.midpoints(c)
    if not np.all(np.diff(mids) > 0):  # rounding may merge midpoints of close centroids
        return
    table = arch_models.tq_bucket_table(mids, c)
    if table is None:  # too close for 256 cells: the kernel searches (no TQ_BKT)
        return
    y = np.concatenate([np.asarray(ys, np.float32), near(mids), SPECIALS])
    check(table, mids, c, y)


@given(st.lists(st.floats(width=32), min_size=1, max_size=32))
@example([0.0])
def test_bucket_table_on_hypothesis_floats(ys):
    for name in MSE:
        fmt = formats.get(name, 128)
        table = arch_models.tq_bucket_table(fmt.midpoints, fmt.centroids)
        check(table, fmt.midpoints, fmt.centroids, np.asarray(ys, np.float32))


def spec_value_codes(v: np.ndarray, bits: int) -> np.ndarray:
    top = np.float32((1 << bits) - 1)
    with np.errstate(all="ignore"):
        lo = np.fmin.reduce(v, axis=-1)
        hi = np.fmax.reduce(v, axis=-1)
        scale = np.fmax((hi - lo) / top, np.float32(V_SCALE_FLOOR))
        q = np.floor((v - lo[..., None]) / scale[..., None] + np.float32(0.5))
        q = np.where(q >= 0, q, np.float32(0))
        return np.minimum(q, top).astype(np.int64)


@pytest.mark.parametrize("bits", [3, 4])
def test_value_codes_on_rows_at_every_magnitude(bits):
    rng = np.random.default_rng(bits)
    for exp in range(-46, 39):
        with np.errstate(over="ignore"):  # the largest magnitudes overflow to +-inf: kept
            v = (rng.standard_normal((256, 32)) * np.float64(10.0) ** exp).astype(np.float32)
        v[rng.random(v.shape) < 0.03] = 0.0
        v[rng.random(v.shape) < 0.01] = np.nan
        v[:8, :] = v[:8, :1]  # constant rows (scale = the floor)
        v[8:16] *= np.float32(1e-3)
        got = arch_models.tq_value_codes(v, bits, V_SCALE_FLOOR)
        np.testing.assert_array_equal(got, spec_value_codes(v, bits))


@given(st.lists(st.floats(width=32), min_size=2, max_size=32), st.sampled_from([3, 4]))
@example([1e-45, 0.0, 2e-45, 1.5e-8], 4)
@example([float("-inf"), float("-inf")], 3)
@example([3e38, -3e38, 0.0], 4)
def test_value_codes_on_hypothesis_rows(vals, bits):
    v = np.asarray(vals, np.float32)[None, :]
    np.testing.assert_array_equal(
        arch_models.tq_value_codes(v, bits, V_SCALE_FLOOR), spec_value_codes(v, bits)
    )


def test_scaled_decoders_equal_the_spec_on_every_code():
    """The NVFP4 writer's decoders (fp8.cuh kv_e4m3_decode_pos, fp4.cuh kv_e2m1_value_scaled)."""
    codes = np.arange(0x80, dtype=np.uint8)
    want = codecs.e4m3_decode_array(codes).astype(np.float32)
    got = arch_models.e4m3_decode_scaled(codes)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    codes = np.arange(16, dtype=np.uint8)
    want = np.array([codecs.e2m1_decode(int(c)) for c in codes], np.float32)
    got = arch_models.e2m1_value_scaled(codes)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def _sweep() -> np.ndarray:
    hi = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    lo = np.array([0, 1, 0x0FFF, 0x1000, 0x1001, 0x3FFF, 0x4000, 0x4001, 0x7FFF, 0x8000, 0xFFFF],
                  np.uint32)  # fmt: skip
    return np.concatenate([(hi[:, None] | lo[None, :]).ravel().view(np.float32), ALL_F16])


def test_e2m1_nonan_model_equals_the_spec_off_nan():
    """kv_e2m1_mag_sw_nonan (NVFP4 writer, finite blocks): every non-NaN input of the sweep
    (all upper halves with edge lower halves: E2M1's rounding boundaries fall there)."""
    x = _sweep()
    x = x[~np.isnan(x)]
    np.testing.assert_array_equal(arch_models.e2m1_software_nonan(x), codecs.e2m1_encode_array(x))


@given(st.integers(0, 0xFFFFFFFF))
def test_e2m1_nonan_model_on_hypothesis_patterns(bits):
    x = np.array([bits], np.uint32).view(np.float32)
    if np.isnan(x[0]):
        return
    np.testing.assert_array_equal(arch_models.e2m1_software_nonan(x), codecs.e2m1_encode_array(x))
