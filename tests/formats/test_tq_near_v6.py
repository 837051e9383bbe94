"""Variant 6 of the TurboQuant write kernel (KVKIT_WRITE_TQ_VARIANT=6; cuda_src/write_turboquant.cu
kv_tq_cell_v6, kv_tq_div_top and the fused key-norm squares): its arithmetic against the spec's
formulas (DESIGN.md 4, 7).

The models are kvkit.formats.arch_models tq_bucket_table_v6 / tq_near_key_index_v6 /
tq_div_top_v6 / tq_norm_fused_f16 (where the proofs are). The references are the spec's own
float32 formulas (kvkit.formats.turboquant encode_keys, IEEE division, the sequential sums),
computed here without the models.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvkit import formats
from kvkit.formats import arch_models, hadamard

from .test_tq_near_models import MSE, _near_midpoint_t, _spec_key_index

f32 = np.float32
DENS = [1.0, 11.313708, 0.0017, 3.7e5, 2.0**-40, 2.0**40]
R_ERRS = [0.0, 2.0**-22, -(2.0**-22)]  # rcp.approx within 2^-22 (the model's extremes)


def _presets():
    return [pytest.param(name, d, id=f"{name}-{d}") for name in MSE for d in (64, 128, 256)]


def _arrays(name, d):
    fmt = formats.get(name, d)
    table = arch_models.tq_bucket_table_v6(fmt.midpoints, fmt.centroids)
    return fmt, np.asarray(fmt.midpoints, f32), table, np.asarray(fmt.centroids, f32)


def _check_keys(t, den, mids, table, cents, r_err):
    idx, cent, ok, _ = arch_models.tq_near_key_index_v6(t, den, table, r_err)
    want = _spec_key_index(t, den, mids)
    bad = ok & ((idx != want) | (cent != cents[np.clip(want, 0, len(cents) - 1)]))
    assert not bad.any(), (t[bad][:5], np.broadcast_to(den, t.shape)[bad][:5])
    return ok


@pytest.mark.parametrize("name, d", _presets())
def test_v6_table_is_the_v3_table_widened(name, d):
    """Same scale, every midpoint in its own cell with the near margins, at most 256 cells (the
    kernel stages it in shared memory), and the cell rule's count equals the spec's for every
    float32 y on a fine grid of [-clamp, clamp] plus the midpoints and their neighbours."""
    fmt, mids, table, cents = _arrays(name, d)
    base = arch_models.tq_bucket_table(fmt.midpoints, fmt.centroids)
    assert table is not None and table.scale == base.scale and table.half == int(table.scale) + 1
    assert arch_models.tq_near_table_ok(table) and table.cells <= arch_models.BKT_MAX_CELLS
    assert float(table.clamp) * float(table.scale) == table.half
    y = np.linspace(-float(table.clamp), float(table.clamp), 200001).astype(f32)
    bits = mids.view(np.int32).astype(np.int64)
    near = ((bits[:, None] + np.arange(-3, 4)[None, :]) & 0xFFFFFFFF).astype(np.uint32).view(f32)
    y = np.concatenate([y, near.reshape(-1), mids])
    idx, cent = table.index(y)
    want = (mids[None, :] <= y[:, None]).sum(axis=1)
    assert np.array_equal(idx, want)
    assert np.array_equal(cent, cents[want])


@pytest.mark.parametrize("r_err", R_ERRS)
@pytest.mark.parametrize("den", DENS)
@pytest.mark.parametrize("name, d", _presets())
def test_v6_keys_on_and_around_every_midpoint_and_edge(name, d, den, r_err):
    fmt, mids, table, cents = _arrays(name, d)
    t = _near_midpoint_t(mids, den, 40)
    edges = (np.arange(-table.half, table.half + 1) + 0.5) / float(table.scale)
    ebits = edges.astype(f32).view(np.int32).astype(np.int64)
    ey = ((ebits[:, None] + np.arange(-40, 41)[None, :]) & 0xFFFFFFFF).astype(np.uint32).view(f32)
    ey = ey[np.abs(ey) <= f32(1.0)]
    t = np.concatenate([t, (ey.astype(np.float64) * den).astype(f32)])
    t = t[np.abs(t.astype(np.float64) / den) <= arch_models.TQ_V6_Y_BOUND]
    ok = _check_keys(t, f32(den), mids, table, cents, r_err)
    assert ok.mean() > 0.5


@pytest.mark.parametrize("r_err", R_ERRS)
@pytest.mark.parametrize("name, d", _presets())
def test_v6_keys_of_rows_through_the_spec(name, d, r_err):
    """Rows through the spec's own norm and FWHT (encode_keys' float32 steps): Gaussian rows of
    float16 / bfloat16 / float32 values at several magnitudes, a spiky row set, rows of one
    2^-32 element among others whose squares fall below the normal range, and the extreme rows
    k = s * (a row of H_D) (t one-hot with |t / den| = 1 up to rounding): the lemma's bound
    holds, every cell is inside the table, the ok elements' indices are the spec's, and ok
    holds almost everywhere on Gaussian rows."""
    fmt, mids, table, cents = _arrays(name, d)
    rng = np.random.default_rng(d + len(mids))
    rows = []
    for mag in (1.0, 1e-3, 1e3, 2.0**-35):
        g = rng.standard_normal((64, d)) * mag
        rows += [g.astype(np.float16).astype(f32), g.astype(f32)]
        b = g.astype(f32).view(np.uint32) & 0xFFFF0000  # bfloat16 values
        rows.append(b.view(f32))
    spiky = rng.standard_normal((64, d)).astype(f32)
    spiky[:, 3] *= 1e4
    rows.append(spiky)
    tiny = (rng.standard_normal((64, d)) * 2.0**-70).astype(f32)  # squares below 2^-126
    tiny[:, 5] = f32(2.0**-32)
    rows.append(tiny)
    h = np.asarray(hadamard.fwht_array(np.eye(d, dtype=f32)), f32)  # rows of H_D (+-1)
    for mag in (1.0, 3.0, 2.0**-30):
        rows.append((h * fmt.signs * f32(mag)).astype(f32))
    k = np.concatenate([r for r in rows if np.isfinite(r).all()]).astype(f32)
    with np.errstate(all="ignore"):
        n = np.sqrt(hadamard.sum_squares_array(k))
        t = hadamard.fwht_array(k * fmt.signs)
        den = (fmt.sqrt_d * n).astype(f32)
    keep = (den >= arch_models.DIV_LO) & (den <= arch_models.DIV_HI)
    assert keep.mean() > 0.7  # (float16 rows of 2^-35 values are zeros: den = 0)
    t, den = t[keep], den[keep]
    ratio = np.abs(t.astype(np.float64)) / den[:, None].astype(np.float64)
    assert ratio.max() <= arch_models.TQ_V6_Y_BOUND
    assert ratio.max() >= 1.0 - 2.0**-10  # the Hadamard rows reach the bound's neighbourhood
    _, _, ok, cell = arch_models.tq_near_key_index_v6(t, den[:, None], table, r_err)
    assert ((cell >= 0) & (cell < table.cells)).all()
    ok = _check_keys(t, den[:, None], mids, table, cents, r_err)
    # ok almost everywhere on the Gaussian float16 rows (the first 64); the structured rows'
    # exact zeros sit on the midpoint 0 and take the exact path, as in every variant
    assert ok[:64].mean() > 0.999


@settings(max_examples=300, deadline=None)
@given(
    y=st.floats(-1.0, 1.0, width=32),
    den=st.floats(2.0**-40, 2.0**40, width=32),
    preset=st.integers(0, 3 * len(MSE) - 1),
    r_err=st.sampled_from(R_ERRS),
)
def test_v6_keys_hypothesis(y, den, preset, r_err):
    name, d = MSE[preset // 3], (64, 128, 256)[preset % 3]
    _, mids, table, cents = _arrays(name, d)
    t = np.asarray([f32(np.float64(y) * den)], f32)
    t = t[np.abs(t.astype(np.float64) / den) <= arch_models.TQ_V6_Y_BOUND]
    _check_keys(t, f32(den), mids, table, cents, r_err)


@pytest.mark.parametrize("bits", [3, 4])
def test_v6_div_top_every_significand(bits):
    """RN(w / top) for every float32 significand (w in [1, 2); a normal quotient's significand
    depends only on w's), at a few exponents, and on random normal / subnormal / special w."""
    top = f32((1 << bits) - 1)
    m = np.arange(1 << 23, dtype=np.uint32)
    for e in (127, 127 - 20, 127 + 17, 1, 254):
        w = (m | np.uint32(e << 23)).view(f32)
        with np.errstate(all="ignore"):
            want = (w / top).astype(f32)
        got = arch_models.tq_div_top_v6(w, bits)
        normal = np.abs(want) >= np.finfo(f32).tiny
        assert np.array_equal(got.view(np.uint32)[normal], want.view(np.uint32)[normal]), e
    rng = np.random.default_rng(bits)
    w = rng.integers(0, 0x7F800000, 1 << 20, dtype=np.uint32).view(f32)
    w = np.concatenate([w, np.asarray([0.0, np.inf, np.nan, 1e-8 * 15, 131008.0], f32)])
    with np.errstate(all="ignore"):
        want = (w / top).astype(f32)
    got = arch_models.tq_div_top_v6(w, bits)
    floor = f32(formats.turboquant.V_SCALE_FLOOR)
    # below the normal range only the comparison with the 1e-8 floor matters
    same = np.where(
        np.abs(want) >= np.finfo(f32).tiny,
        (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want)),
        (got < floor) == (want < floor),
    )
    assert same.all()


def test_v6_norm_squares_of_every_half_are_exact():
    """Every float16 value's square is a float32 exactly, so fma(x, x, acc) = RN(acc + RN(x x))
    for any acc: checked for every half pattern, then the fused sums against the spec's
    sequential ones on random accumulators and rows."""
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    x = h[np.isfinite(h)].astype(f32)
    sq64 = x.astype(np.float64) ** 2
    assert np.array_equal(sq64.astype(f32).astype(np.float64), sq64)
    rng = np.random.default_rng(7)
    acc = np.abs(rng.standard_normal(x.shape) * 10.0 ** rng.integers(-8, 9, x.shape)).astype(f32)
    with np.errstate(all="ignore"):
        want = (acc + (x * x).astype(f32)).astype(f32)
    assert np.array_equal(arch_models.fma_f32(x, x, acc), want)
    rows = rng.standard_normal((4096, 8)) * 10.0 ** rng.integers(-4, 4, (4096, 1))
    rows = rows.astype(np.float16).astype(f32)
    want = (rows[:, 0] * rows[:, 0]).astype(f32)
    for j in range(1, rows.shape[1]):
        want = (want + (rows[:, j] * rows[:, j]).astype(f32)).astype(f32)
    assert np.array_equal(arch_models.tq_norm_fused_f16(rows), want)
