"""The reference quantizers in kvkit.formats against independent float64 / ml_dtypes models."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from kvkit import formats

RNG = np.random.default_rng(20261129)


def e4m3_ml(x):
    return np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn)


def llm_rows(n, d, scale=3.0):
    x = RNG.standard_normal((n, d)) * scale
    x[:, :3] *= 20  # outlier channels
    return x.astype(np.float32)


@pytest.mark.parametrize("name", ["nvfp4", "nvfp4_4over6"])
def test_nvfp4_blocks_follow_the_written_rule(name):
    fmt = formats.get(name, 128)
    x = llm_rows(300, 128)
    g = np.float32(fmt.calibrate(x))
    planes = fmt.encode(x, x, float(g), float(g))
    sf = planes["k_scale"]
    codes = np.stack([planes["k_data"] & 0xF, planes["k_data"] >> 4], -1).reshape(300, 128)
    blk = x.reshape(300, 8, 16)
    amax = np.abs(blk).max(-1)
    sf6 = e4m3_ml(amax / (np.float32(6) * g))
    sf4 = e4m3_ml(amax / (np.float32(4) * g))

    def recon(sfv):
        inv = np.float32(1) / (sfv.astype(np.float32) * g)
        q = (blk * inv[..., None]).astype(ml_dtypes.float4_e2m1fn)
        return q, q.astype(np.float64) * sfv.astype(np.float64)[..., None] * float(g)

    q6, r6 = recon(sf6)
    if name == "nvfp4":
        np.testing.assert_array_equal(sf, sf6.view(np.uint8))
        np.testing.assert_array_equal(codes.reshape(300, 8, 16), q6.view(np.uint8))
    else:
        q4, r4 = recon(sf4)
        e6 = ((blk - r6) ** 2).sum(-1)
        e4 = ((blk - r4) ** 2).sum(-1)
        # float64 errors can only disagree with the float32 rule on near-ties
        clear = np.abs(e4 - e6) > 1e-5 * e6
        pick4 = e4 < e6
        expect_sf = np.where(pick4, sf4.view(np.uint8), sf6.view(np.uint8))
        np.testing.assert_array_equal(sf[clear], expect_sf[clear])
        assert pick4.any() and (~pick4).any()
    k, _ = fmt.decode(planes, float(g), float(g))
    # decoded value = e2m1 * sf * g, float32
    ref = (
        codes.reshape(300, 8, 16).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
        * sf.view(ml_dtypes.float8_e4m3fn).astype(np.float32)[..., None]
    )
    np.testing.assert_array_equal(k, (ref * g).reshape(300, 128))


def test_four_over_six_never_has_higher_error_than_plain():
    x = llm_rows(500, 64)
    g = formats.get("nvfp4", 64).calibrate(x)
    e = {}
    for name in ("nvfp4", "nvfp4_4over6"):
        f = formats.get(name, 64)
        k, _ = f.decode(f.encode(x, x, g, g), g, g)
        e[name] = ((k.astype(np.float64) - x).reshape(500, 4, 16) ** 2).sum(-1)
    assert np.all(e["nvfp4_4over6"] <= e["nvfp4"] * (1 + 1e-5) + 1e-30)
    assert e["nvfp4_4over6"].sum() < e["nvfp4"].sum()


@pytest.mark.parametrize("name", ["turboquant_4bit_nc", "turboquant_3bit_nc", "turboquant_k3v4_nc"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_turboquant_keys_pick_the_nearest_centroid_and_fold_the_norm(name, d):
    fmt = formats.get(name, d)
    k = llm_rows(200, d)
    idx, norm = fmt.encode_keys(k)
    # Independent float64 model: dense rotation matrix, nearest centroid.
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    r = h * fmt.signs.astype(np.float64)[None, :] / math.sqrt(d)
    k64 = k.astype(np.float64)
    y = (k64 @ r.T) / np.linalg.norm(k64, axis=1, keepdims=True)
    c = fmt.centroids.astype(np.float64)
    nearest = np.abs(y[..., None] - c).argmin(-1)
    mids = (c[1:] + c[:-1]) / 2
    tie = (np.abs(y[..., None] - mids) < 1e-5).any(-1)
    np.testing.assert_array_equal(idx[~tie], nearest[~tie])
    assert tie.mean() < 0.01
    expect = np.linalg.norm(k64, axis=1) / np.linalg.norm(c[idx], axis=1)
    np.testing.assert_allclose(norm.astype(np.float64), expect, rtol=2.0**-11)
    # Reading back: R^T (norm * c[idx]) in float64.
    k_hat, _ = fmt.decode(fmt.encode(k, k))
    ref = (norm.astype(np.float64)[:, None] * c[idx]) @ r
    np.testing.assert_allclose(k_hat, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


@pytest.mark.parametrize("name", ["turboquant_k8v4", "turboquant_3bit_nc"])
def test_turboquant_values_are_within_half_a_step(name):
    fmt = formats.get(name, 128)
    v = llm_rows(300, 128, scale=5.0)
    codes, scale16, zero16 = fmt.encode_values(v)
    _, v_hat = fmt.decode(fmt.encode(v, v))
    lo, hi = v.min(1).astype(np.float64), v.max(1).astype(np.float64)
    step = (hi - lo) / ((1 << fmt.value_bits) - 1)
    np.testing.assert_allclose(scale16.astype(np.float64), step, rtol=2.0**-11)
    np.testing.assert_allclose(zero16.astype(np.float64), lo, rtol=2.0**-11)
    err = np.abs(v_hat.astype(np.float64) - v).max(1)
    # half a step, plus what fp16 rounding of scale (times up to 2^b-1 steps) and zero adds
    bound = 0.5 * step + ((1 << fmt.value_bits) - 1) * step * 2.0**-11 + np.abs(lo) * 2.0**-11
    assert np.all(err <= bound * (1 + 1e-6))


def test_turboquant_extremes_saturate_instead_of_overflowing():
    fmt = formats.get("turboquant_4bit_nc", 128)
    v = np.zeros((2, 128), np.float32)
    v[0, 0] = -125000.0  # seen in the wild (FACTS.md): fp16 zero would be -inf
    v[1, :] = 3.0  # constant vector: the scale floor applies
    k = np.zeros((2, 128), np.float32)  # zero key: norm 0, no NaN
    slots = fmt.encode(k, v)["slots"]
    k_hat, v_hat = fmt.decode({"slots": slots})
    assert np.all(np.isfinite(v_hat)) and np.all(np.isfinite(k_hat))
    assert np.all(k_hat == 0)
    _, scale16, zero16 = fmt.encode_values(v)
    assert zero16[0] == np.float16(-65504) and np.isfinite(scale16[0])
    assert scale16[1] == np.float16(1e-8)
    np.testing.assert_array_equal(v_hat[1], np.float32(np.float16(3.0)))


@pytest.mark.parametrize("name", ["fp8_e4m3", "turboquant_k8v4"])
def test_fp8_keys_divide_by_the_layer_scale(name):
    fmt = formats.get(name, 64)
    k = llm_rows(50, 64, scale=100.0)
    s = fmt.calibrate(k)
    assert s == pytest.approx(np.abs(k).max() / 448)
    planes = fmt.encode(k, k, s, 1.0)
    key_bytes = planes["k"] if name == "fp8_e4m3" else planes["slots"][:, :64]
    np.testing.assert_array_equal(key_bytes, e4m3_ml(k / np.float32(s)).view(np.uint8))


def test_calibrate_is_the_decode_convention():
    x = np.float32([[1.0, -2688.0, 3.0]])
    assert formats.calibrate(x) == pytest.approx(2688.0 / (6 * 448))
    assert formats.calibrate(np.zeros(4)) == 1.0
