"""The tensor-core operand conversions of cuda_src/common/decode_codes.cuh, every input.

``cuda_src/probe_codes.cu`` runs one conversion per thread on the path the device takes
(native, or the software path under ``KVKIT_ARCH=sm_80``, which ``scripts/gpu_check.sh`` also
runs), and the bits are compared with ml_dtypes' decoding of the same codes: E4M3 through
``float8_e4m3fn``, E2M1 through ``float4_e2m1fn``, each scaled by the conversion's stated
power-of-two factor and rounded to float16 (exact: every value fits).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kvkit.cuda.compiler import resolve_arch

pytestmark = pytest.mark.gpu

# The targets with the hardware E4M3 -> f16x2 conversion (cvt.rn.f16x2.e4m3x2, sm_89+).
HW_FP8_TARGETS = {"sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120a"}


def _run(kernel: str, inputs: np.ndarray, extra: int = 0) -> np.ndarray:
    import cupy as cp

    from kvkit.cuda.compiler import get_kernel

    func = get_kernel("probe_codes.cu", kernel, {})
    x = cp.asarray(inputs.astype(np.uint32))
    out = cp.full(x.size + extra, 0xDEADBEEF, dtype=cp.uint32)
    func(((x.size + 255) // 256,), (256,), (x, out, np.int32(x.size)))
    return cp.asnumpy(out)


def _halves(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lo = (words & 0xFFFF).astype(np.uint16).view(np.float16)
    hi = (words >> 16).astype(np.uint16).view(np.float16)
    return lo, hi


def test_e4m3_pairs_to_f16x2_every_pair():
    codes = np.arange(1 << 16, dtype=np.uint32)
    out = _run("kv_probe_e4m3x2_f16x2", codes, extra=1)
    factor = float(out[-1:].view(np.float32)[0])
    target, _ = resolve_arch()
    assert factor == (1.0 if target in HW_FP8_TARGETS else 256.0)
    lo, hi = _halves(out[:-1])
    for got, code in ((lo, codes & 0xFF), (hi, codes >> 8)):
        value = code.astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
        want = (value / factor).astype(np.float16)
        nan = np.isnan(value)
        assert np.array_equal(np.isnan(got), nan)
        # bitwise, so -0 and every subnormal count
        assert np.array_equal(got[~nan].view(np.uint16), want[~nan].view(np.uint16))


def test_e4m3_words_to_f16x2_finite_every_pair_in_both_positions():
    """kv_dc_e4m3x4_f16x2_finite (the software path's per-tile fast conversion, decode_mma.cuh
    KV_MMA_NANTILE_K / _V): every code pair in bytes 0, 1 and in bytes 2, 3 of a word (the
    other two bytes the next pair, so NaN codes sit below, above and beside others) gives
    ml_dtypes' value times 2^-8 bitwise for every non-NaN code; the word's NaN test is set
    exactly when one of its four bytes is a NaN code. Integer code only: the same on every
    target."""
    pairs = np.arange(1 << 16, dtype=np.uint32)
    other = (pairs + 1) & 0xFFFF
    words = np.concatenate([pairs | (other << 16), other | (pairs << 16)])
    out = _run("kv_probe_e4m3x4_f16x2_finite", words, extra=2 * words.size)
    lo, hi, flag = out[0::3], out[1::3], out[2::3]
    codes = words.view(np.uint8).reshape(-1, 4)
    value = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    nan = np.isnan(value)
    np.testing.assert_array_equal(flag, nan.any(axis=1).astype(np.uint32))
    for k, w in enumerate((lo, hi)):
        for h, got in enumerate(_halves(w)):
            col = 2 * k + h
            want = (value[:, col] / 256.0).astype(np.float16)
            ok = ~nan[:, col]
            assert np.array_equal(got[ok].view(np.uint16), want[ok].view(np.uint16))


def test_e2m1_bytes_to_f16x2_every_byte():
    byte = np.arange(256, dtype=np.uint32)
    lo, hi = _halves(_run("kv_probe_e2m1x2_f16x2", byte))
    for got, code in ((lo, byte & 0xF), (hi, byte >> 4)):
        value = code.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
        want = (value * 2.0**-14).astype(np.float16)
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


def test_e2m1_words_to_four_f16x2_every_pair_in_every_position():
    """kv_dc_e2m1x8_f16x2: word k of the four holds nibbles k (low half) and k + 4 (high);
    every code pair in every position, the other nibbles random (they must not matter)."""
    import cupy as cp

    from kvkit.cuda.compiler import get_kernel

    rng = np.random.default_rng(0)
    pair = np.arange(256, dtype=np.uint32)
    words = []
    for k in range(4):
        other = rng.integers(0, 1 << 32, size=(8, 256), dtype=np.uint64).astype(np.uint32)
        keep = np.uint32(~((0xF << (4 * k)) | (0xF << (4 * k + 16))) & 0xFFFFFFFF)
        nib = ((pair & 0xF) << (4 * k)) | ((pair >> 4) << (4 * k + 16))
        words.append(((other & keep) | nib).ravel())
    x = np.concatenate(words + [np.array([0, 0xFFFFFFFF], np.uint32)])
    func = get_kernel("probe_codes.cu", "kv_probe_e2m1x8_f16x2", {})
    xd = cp.asarray(x)
    out = cp.full(4 * x.size, 0xDEADBEEF, dtype=cp.uint32)
    func(((x.size + 255) // 256,), (256,), (xd, out, np.int32(x.size)))
    out = cp.asnumpy(out).reshape(-1, 4)
    for k in range(4):
        lo, hi = _halves(out[:, k])
        for got, code in ((lo, (x >> (4 * k)) & 0xF), (hi, (x >> (4 * k + 16)) & 0xF)):
            value = code.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float64)
            want = (value * 2.0**-14).astype(np.float16)
            assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), k
