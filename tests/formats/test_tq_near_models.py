"""The near decisions of the TurboQuant write kernel (TQ_VARIANT 2) give the spec's codes wherever
they claim to (DESIGN.md 4, 7; cuda_src/write_turboquant.cu kv_tq_keys / kv_tq_values).

The reference is the spec's own formula in NumPy float32 (IEEE, subnormals kept, as the write
kernels build with -ftz=false): keys #{midpoints <= RN(t / den)}, values
clamp(floor(RN(RN(RN(v - lo) / scale) + 0.5)), 0, top) with NaN -> 0. The models are
kvkit.formats.arch_models tq_near_key_index / tq_near_value_codes (where the proofs are): where
their ``ok`` holds, the kernel keeps the fast code; elsewhere it divides exactly, so only the
``ok`` elements need checking, plus that ``ok`` holds almost everywhere on Gaussian-like rows
(the fallback is rare, else the variant would be slow).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvkit import formats
from kvkit.formats import arch_models
from kvkit.formats.turboquant import V_SCALE_FLOOR

MSE = [n for n in formats.names() if n.startswith("turboquant") and not n.endswith("k8v4")]
f32 = np.float32


def _tables():
    out = []
    for name in MSE:
        for d in (64, 128, 256):
            fmt = formats.get(name, d)
            table = arch_models.tq_bucket_table(fmt.midpoints, fmt.centroids)
            out.append(pytest.param(fmt.midpoints, table, id=f"{name}-{d}"))
    return out


def _spec_key_index(t, den, mids):
    with np.errstate(all="ignore"):
        y = (np.asarray(t, f32) / np.asarray(den, f32)).astype(f32)
        return (mids[None, :] <= y.reshape(-1)[:, None]).sum(axis=1).reshape(y.shape)


def _check_keys(t, den, mids, table):
    idx, ok = arch_models.tq_near_key_index(t, den, table)
    want = _spec_key_index(t, den, mids)
    bad = ok & (idx != want)
    assert not bad.any(), (t[bad][:5], np.broadcast_to(den, t.shape)[bad][:5])
    return ok


def _near_midpoint_t(mids, den, spread):
    """t whose quotients by den land on and around each midpoint (and 0), +- spread ulps."""
    steps = np.arange(-spread, spread + 1)
    ys = []
    for m in np.concatenate([mids, [0.0, -0.0]]).astype(f32):
        bits = np.asarray(m, f32).view(np.int32).astype(np.int64)
        ys.extend(((bits + steps) & 0xFFFFFFFF).astype(np.uint32).view(f32))
    y = np.asarray(ys, f32)
    y = y[np.isfinite(y)]
    with np.errstate(all="ignore"):
        return (y.astype(np.float64) * float(den)).astype(f32)


@pytest.mark.parametrize("mids, table", _tables())
def test_every_preset_table_allows_near_decisions(mids, table):
    assert table is not None and arch_models.tq_near_table_ok(table)


@pytest.mark.parametrize("mids, table", _tables())
@pytest.mark.parametrize("den", [1.0, 11.313708, 0.0017, 3.7e5, 2.0**-40, 2.0**40, 1e-30, 1e30])
def test_keys_on_and_around_every_midpoint(mids, table, den):
    mids = np.asarray(mids, f32)
    t = _near_midpoint_t(mids, den, 40)
    t = np.concatenate([t, -t, [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-45, -1e-45, 3e38, -3e38]])
    t = t.astype(f32)
    _check_keys(t, f32(den), mids, table)


@pytest.mark.parametrize("mids, table", _tables())
def test_keys_of_gaussian_rows_rarely_fall_back(mids, table):
    rng = np.random.default_rng(7)
    d = 128
    k = rng.standard_normal((4096, d)).astype(f32) * f32(rng.uniform(1e-3, 1e3))
    t = (k @ (np.sign(rng.standard_normal((d, d))) / 1.0)).astype(f32)  # any t, scaled like FWHT
    n = np.sqrt((k.astype(np.float64) ** 2).sum(axis=1)).astype(f32)
    den = (f32(np.sqrt(d)) * n).astype(f32)
    ok = _check_keys(t, den[:, None], mids, table)
    assert ok.mean() > 0.999


@given(
    t=st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True),
    den=st.floats(width=32, min_value=2.0**-126, max_value=2.0**127, allow_subnormal=False),
    preset=st.sampled_from(range(len(MSE) * 3)),
)
@example(t=-1.4e-45, den=4.0, preset=0)  # RN(t / den) = -0: counts the 0 midpoint
@example(t=-2.8e-45, den=4.0, preset=0)  # -2^-149 (tie at -2^-150 goes to even, -0)
@example(t=0.0, den=1.0, preset=0)
def test_keys_hypothesis(t, den, preset):
    name, d = MSE[preset // 3], (64, 128, 256)[preset % 3]
    fmt = formats.get(name, d)
    table = arch_models.tq_bucket_table(fmt.midpoints, fmt.centroids)
    _check_keys(np.array([t], f32), f32(den), np.asarray(fmt.midpoints, f32), table)


@given(
    m=st.integers(0, 14),
    ulps=st.integers(-64, 64),
    den=st.floats(width=32, min_value=2.0**-40, max_value=2.0**40),
    preset=st.sampled_from(range(len(MSE) * 3)),
)
def test_keys_hypothesis_near_midpoints(m, ulps, den, preset):
    name, d = MSE[preset // 3], (64, 128, 256)[preset % 3]
    fmt = formats.get(name, d)
    mids = np.asarray(fmt.midpoints, f32)
    table = arch_models.tq_bucket_table(fmt.midpoints, fmt.centroids)
    y = (np.asarray(mids[m % len(mids)], f32).view(np.int32) + np.int32(ulps)).view(f32)
    t = f32(float(y) * float(den))
    _check_keys(np.array([t, -t], f32), f32(den), mids, table)


def _spec_value_codes(v, bits):
    v = np.asarray(v, f32)
    top = f32((1 << bits) - 1)
    with np.errstate(all="ignore"):
        lo = np.fmin.reduce(v, axis=-1)
        hi = np.fmax.reduce(v, axis=-1)
        scale = ((hi - lo) / top).astype(f32)
        scale = np.where(scale >= f32(V_SCALE_FLOOR), scale, f32(V_SCALE_FLOOR)).astype(f32)
        a = (v - lo[..., None]).astype(f32)
        q = (a / scale[..., None]).astype(f32)
        z = np.floor((q + f32(0.5)).astype(f32))
        z = np.where(np.isnan(z), f32(0), z)
        return np.clip(z, 0, top).astype(np.int64)


def _v5(v, bits, r_err):
    return arch_models.tq_near_value_codes_v5(v, bits, V_SCALE_FLOOR, r_err)[::2]


# The write kernel's near value decisions: variant 2 (tq_near_value_codes) and variant 3 and
# later (tq_near_value_codes_v3, which also returns the fma's bit pattern) and variant 5
# (tq_near_value_codes_v5, two nudged reciprocals): (codes, ok) each.
VALUE_MODELS = {
    "v2": lambda v, bits: arch_models.tq_near_value_codes(v, bits, V_SCALE_FLOOR),
    "v3": lambda v, bits: arch_models.tq_near_value_codes_v3(v, bits, V_SCALE_FLOOR)[::2],
    # variant 5 with its row reciprocal exact (RN) and 2^-22 above / below (rcp.approx's range)
    "v5": lambda v, bits: _v5(v, bits, 0.0),
    "v5+": lambda v, bits: _v5(v, bits, 2.0**-22),
    "v5-": lambda v, bits: _v5(v, bits, -(2.0**-22)),
}


def _check_values(v, bits, model):
    codes, ok = VALUE_MODELS[model](v, bits)
    want = _spec_value_codes(v, bits)
    bad = ok & ((codes != want) | (codes < 0) | (codes > (1 << bits) - 1))
    assert not bad.any(), np.argwhere(bad)[:5]
    return ok


@pytest.mark.parametrize("model", sorted(VALUE_MODELS))
@pytest.mark.parametrize("bits", [3, 4])
def test_values_on_every_decision_boundary(bits, model):
    """Rows [lo, hi] whose other elements sit on and around lo + scale (k - 1/2), k = 1..top."""
    top = (1 << bits) - 1
    rows = []
    for lo, hi in [(0.0, 1.0), (-3.0, 7.5), (-1e-3, 2e-3), (100.0, 100.5), (-65504.0, 65504.0),
                   (0.0, 15.0), (0.0, 7.0), (-1e-7, 1e-7), (5e-8, 6e-8)]:  # fmt: skip
        scale = max(np.float32(np.float32(hi) - np.float32(lo)) / np.float32(top), V_SCALE_FLOOR)
        scale = np.float32(scale)
        for k in range(1, top + 1):
            c = np.float32(np.float32(lo) + np.float32(scale * np.float32(k - 0.5)))
            bits32 = np.asarray(c, f32).view(np.int32)
            near = (bits32 + np.arange(-12, 13, dtype=np.int32)).view(f32)
            if np.signbit(c):
                near = near[::-1]
            row = np.concatenate([[lo, hi], near]).astype(f32)
            row = np.clip(row, lo, hi).astype(f32)
            rows.append(row)
    width = max(len(r) for r in rows)
    v = np.stack([np.pad(r, (0, width - len(r)), mode="edge") for r in rows])
    _check_values(v, bits, model)


@pytest.mark.parametrize("model", sorted(VALUE_MODELS))
@pytest.mark.parametrize("bits", [3, 4])
def test_values_of_gaussian_rows_rarely_fall_back(bits, model):
    rng = np.random.default_rng(3)
    v = (rng.standard_normal((4096, 128)) * rng.uniform(1e-4, 1e4, (4096, 1))).astype(f32)
    v = v.astype(np.float16).astype(f32)  # fp16 inputs, as the benchmark's
    ok = _check_values(v, bits, model)
    # ~2e-4 of fp16 elements: (v - lo) / (hi - lo) of two fp16 grid values is often a fraction
    # with a small denominator, so some quotients sit exactly on a code boundary and must
    # take the exact division (about one warp in ten has such a lane at D = 128).
    assert ok.mean() > 0.999


@given(
    row=st.lists(
        st.floats(width=16, allow_nan=True, allow_infinity=False), min_size=2, max_size=16
    ),
    bits=st.sampled_from([3, 4]),
)
# (v - lo) / scale = 0.5 exactly: z = 1.0 (v2); a r = 0.5: rint ties to even, e = 0.5, near (v3)
@example(row=[0.0, 0.25, 7.5], bits=4)
@example(row=[0.0, float("nan"), 1.0], bits=4)  # NaN element: not ok
# The filtering is Hypothesis's own (floats of width 16 are drawn wider and rejected when not
# representable); with five models the randomized dev profile tripped this health check now
# and then (seen in sessions 13 and 14), never an assertion.
@settings(suppress_health_check=[HealthCheck.filter_too_much])
@pytest.mark.parametrize("model", sorted(VALUE_MODELS))
def test_values_hypothesis_fp16_rows(row, bits, model):
    _check_values(np.array([row], f32), bits, model)


@given(
    row=st.lists(
        st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True),
        min_size=2,
        max_size=16,
    ),
    bits=st.sampled_from([3, 4]),
)
@pytest.mark.parametrize("model", sorted(VALUE_MODELS))
def test_values_hypothesis_float32_rows(row, bits, model):
    _check_values(np.array([row], f32), bits, model)
