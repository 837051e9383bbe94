"""Element codecs against ml_dtypes (an independent implementation) and explicit decodes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from numba import njit

from kvkit.formats import codecs

ALL_F16 = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
FINITE_F16 = ALL_F16[np.isfinite(ALL_F16)].astype(np.float32)

e2m1_jit = njit(codecs.e2m1_encode)
e4m3_jit = njit(codecs.e4m3_encode)
f16_jit = njit(codecs.f16_bits)


def ml_e4m3_bytes(x: np.ndarray) -> np.ndarray:
    # ml_dtypes' e4m3fn cast does not saturate (above 464 it gives NaN): clamp first.
    return np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def ml_e2m1_codes(x: np.ndarray) -> np.ndarray:
    return x.astype(ml_dtypes.float4_e2m1fn).view(np.uint8)


def test_e4m3_array_encoder_matches_ml_dtypes_on_every_finite_fp16():
    np.testing.assert_array_equal(codecs.e4m3_encode_array(FINITE_F16), ml_e4m3_bytes(FINITE_F16))


def test_e4m3_scalar_encoder_matches_ml_dtypes_on_every_finite_fp16():
    got = np.array([e4m3_jit(x) for x in FINITE_F16], dtype=np.uint8)
    np.testing.assert_array_equal(got, ml_e4m3_bytes(FINITE_F16))


def test_e2m1_array_encoder_matches_ml_dtypes_on_every_finite_fp16():
    np.testing.assert_array_equal(codecs.e2m1_encode_array(FINITE_F16), ml_e2m1_codes(FINITE_F16))


def test_e2m1_scalar_encoder_matches_ml_dtypes_on_every_finite_fp16():
    got = np.array([e2m1_jit(x) for x in FINITE_F16], dtype=np.uint8)
    np.testing.assert_array_equal(got, ml_e2m1_codes(FINITE_F16))


def test_encoders_match_ml_dtypes_on_float32_edges():
    # Values that are not fp16: midpoints nudged by one float32 ulp either way, huge values.
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 448.0, 464.0, 2.0**-10, 3e38])
    x = np.concatenate([mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf)]).astype(np.float32)
    x = np.concatenate([x, -x])
    np.testing.assert_array_equal(codecs.e4m3_encode_array(x), ml_e4m3_bytes(x))
    np.testing.assert_array_equal([e4m3_jit(v) for v in x], ml_e4m3_bytes(x))
    sat = np.clip(x, -6, 6)  # ml_dtypes' float4 saturates already; clip keeps huge values legal
    np.testing.assert_array_equal(codecs.e2m1_encode_array(x), ml_e2m1_codes(sat))
    np.testing.assert_array_equal([e2m1_jit(v) for v in x], ml_e2m1_codes(sat))


def test_nan_encodings_are_the_documented_ones():
    nan = np.float32(np.nan)
    assert codecs.e4m3_encode(nan) == 0x7F == codecs.e4m3_encode_array(np.array([nan]))[0]
    assert codecs.e2m1_encode(nan) == 0x7 == codecs.e2m1_encode_array(np.array([nan]))[0]
    assert codecs.f16_bits(nan) == 0x7E00


def test_every_fp4_byte_times_every_scale_byte_decodes_like_an_independent_decode():
    """All 256 x 256 (FP4 byte, E4M3 scale byte) pairs, two nibbles each."""
    fp4_bytes = np.arange(256, dtype=np.uint8)
    scale_bytes = np.arange(256, dtype=np.uint8)
    # Independent decode: ml_dtypes for both element types, float64 products.
    lo = (fp4_bytes & 0xF).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    hi = (fp4_bytes >> 4).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
    sf = scale_bytes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    ref = np.stack([lo[:, None] * sf[None, :], hi[:, None] * sf[None, :]], -1)  # (256, 256, 2)
    # Under test: the spec's tables, float32 products as the read rule says.
    codes = np.stack([fp4_bytes & 0xF, fp4_bytes >> 4], -1)  # (256, 2)
    got = codecs.E2M1_VALUES[codes][:, None, :] * codecs.E4M3_VALUES[scale_bytes][None, :, None]
    assert got.dtype == np.float32
    both_nan = np.isnan(ref) & np.isnan(got)
    np.testing.assert_array_equal(np.where(both_nan, 0, got), np.where(both_nan, 0, ref))
    assert np.isnan(got).sum() == np.isnan(ref).sum() == 2 * 256 * 2  # scale 0x7F and 0xFF


@pytest.mark.parametrize("saturate", [False, True])
def test_fp16_scalar_encoder_matches_numpy_cast(saturate):
    rng = np.random.default_rng(3)
    x = np.concatenate(
        [
            FINITE_F16,
            rng.standard_normal(20000).astype(np.float32) * np.float32(40000),
            np.float32([65503.9, 65504, 65519.99, 65520, 1e6, 2.0**-25, 2.0**-24 * 1.5, -0.0]),
            np.nextafter(FINITE_F16[:2000], np.float32(np.inf)),
        ]
    ).astype(np.float32)
    ref_in = np.clip(x, -65504, 65504) if saturate else x
    with np.errstate(over="ignore"):
        ref = ref_in.astype(np.float16).view(np.uint16)
    got = np.array([f16_jit(v, saturate) for v in x], dtype=np.uint16)
    np.testing.assert_array_equal(got, ref)
    vals = np.array([codecs.f16_value(int(b)) for b in ref[:5000]], dtype=np.float32)
    np.testing.assert_array_equal(vals, ref[:5000].view(np.float16).astype(np.float32))


def test_fp16_saturating_array_form():
    x = np.float32([70000, -1e9, 65504, np.nan, 1.0])
    got = codecs.f16_sat_array(x)
    np.testing.assert_array_equal(got[[0, 1, 2, 4]], np.float16([65504, -65504, 65504, 1.0]))
    assert np.isnan(got[3])


def test_bf16_bits_match_ml_dtypes():
    rng = np.random.default_rng(4)
    x = np.concatenate(
        [FINITE_F16, rng.standard_normal(50000).astype(np.float32) * np.float32(1e30)]
    ).astype(np.float32)
    ref = x.astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(codecs.bf16_bits_array(x), ref)
    np.testing.assert_array_equal(
        codecs.bf16_values_array(ref), ref.view(ml_dtypes.bfloat16).astype(np.float32)
    )
