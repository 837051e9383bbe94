"""A model of the software E4M3 path's per-tile NaN-free conversion (cuda_src/common/
decode_codes.cuh kv_dc_e4m3x4_f16x2_finite and kv_dc_e4m3_nan_acc / _found, used by
decode_mma.cuh under KV_MMA_NANTILE_K / _V) against ml_dtypes' float8_e4m3fn (an independent
decoder) and against a transcription of the exact pair conversion kv_dc_e4m3x2_f16x2 the
other tiles keep: for every code pair in both halves of a word, the fast words are the exact
words' bits wherever no byte is a NaN code, and the word test flags exactly the words that
hold one (0x7F / 0xFF), whatever the neighbouring bytes' carries. The GPU tests
(test_decode_codes_gpu.py, test_decode_gpu.py) then check the kernels.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np

from kvkit.formats.arch_models import prmt

U32 = np.uint32


def bitsel(m: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """kv_bitsel<M>(a, b): (a & M) | (b & ~M)."""
    m = U32(m)
    return (a & m) | (b & ~m)


def byte_perm(a: np.ndarray, b: np.ndarray, sel: int) -> np.ndarray:
    """__byte_perm(a, b, sel) on arrays (selector nibbles 0..7, no sign replication)."""
    src = np.stack([a, b], axis=-1).astype(U32).view(np.uint8).reshape(*a.shape, 8)
    idx = [(sel >> (4 * i)) & 7 for i in range(4)]
    return np.ascontiguousarray(src[..., idx]).view(U32).reshape(a.shape)


def finite_words(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """kv_dc_e4m3x4_f16x2_finite: (lo, hi) fp16x2 words of bytes 0, 1 and 2, 3."""
    w = np.asarray(w, dtype=U32)
    h = bitsel(0x80808080, w, w >> U32(1))
    low = w << U32(7)
    mask = U32(0xBF80BF80)
    return byte_perm(low, h, 0x5140) & mask, byte_perm(low, h, 0x7362) & mask


def exact_pair(two: np.ndarray) -> np.ndarray:
    """kv_dc_e4m3x2_f16x2 (software): bytes 0, 1 of `two` -> fp16x2, NaN patched in."""
    two = np.asarray(two, dtype=U32)
    u = byte_perm(two, np.zeros_like(two), 0x1404)
    mag = (u >> U32(1)) & U32(0x3F803F80)
    # set.gt.u32.f16x2 on non-negative finite halves: an unsigned compare per half.
    nan = np.zeros_like(u)
    for sh in (0, 16):
        half = (mag >> U32(sh)) & U32(0xFFFF)
        nan |= np.where(half > 0x3F00, U32(0xFFFF), U32(0)) << U32(sh)
    return (u & U32(0x80008000)) | mag | (nan & U32(0x7E007E00))


def nan_found(words: np.ndarray) -> np.ndarray:
    """kv_dc_e4m3_nan_found(kv_dc_e4m3_nan_acc(0, w)) per word."""
    w = np.asarray(words, dtype=U32)
    return (((w + U32(0x01010101)) ^ w) & U32(0x80808080)) != 0


def _is_nan_byte(words: np.ndarray) -> np.ndarray:
    b = np.asarray(words, dtype=U32).view(np.uint8).reshape(-1, 4)
    return np.isnan(b.view(ml_dtypes.float8_e4m3fn).astype(np.float32))


def test_prmt_model_agrees_with_the_arch_model():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 2**32, 64, dtype=np.uint64).astype(U32)
    b = rng.integers(0, 2**32, 64, dtype=np.uint64).astype(U32)
    for sel in (0x5140, 0x7362, 0x1404):
        got = byte_perm(a, b, sel)
        assert [int(x) for x in got] == [prmt(int(x), int(y), sel) for x, y in zip(a, b)]


def test_finite_words_equal_the_exact_pairs_and_ml_dtypes_for_every_pair():
    pairs = np.arange(1 << 16, dtype=U32)
    mixed = (pairs * U32(40503)) & U32(0xFFFF)  # every pair once, next to another
    for other in (np.zeros_like(pairs), np.full_like(pairs, 0xFFFF), mixed):
        for words in (pairs | (other << U32(16)), other | (pairs << U32(16))):
            lo, hi = finite_words(words)
            nan = _is_nan_byte(words)
            value = words.view(np.uint8).reshape(-1, 4).view(ml_dtypes.float8_e4m3fn)
            want16 = (value.astype(np.float64) / 256.0).astype(np.float16).view(np.uint16)
            for k, (got, exact) in enumerate(
                ((lo, exact_pair(words & U32(0xFFFF))), (hi, exact_pair(words >> U32(16))))
            ):
                for h in (0, 1):
                    col = 2 * k + h
                    g = ((got >> U32(16 * h)) & U32(0xFFFF)).astype(np.uint16)
                    e = ((exact >> U32(16 * h)) & U32(0xFFFF)).astype(np.uint16)
                    ok = ~nan[:, col]
                    assert np.array_equal(g[ok], e[ok])  # the exact path's bits
                    assert np.array_equal(g[ok], want16[ok, col])  # ml_dtypes' value * 2^-8
                    # The exact path's NaN codes are fp16 NaNs (what the fast path must not see).
                    assert np.isnan(e[~ok].view(np.float16)).all()


def test_nan_test_flags_exactly_the_words_with_a_nan_code():
    special = [0x00, 0x01, 0x7E, 0x7F, 0x80, 0x81, 0xFE, 0xFF, 0x3F, 0xBF]
    words = np.array(
        [sum(b << (8 * i) for i, b in enumerate(c)) for c in itertools.product(special, repeat=4)],
        dtype=U32,
    )
    rng = np.random.default_rng(1)
    words = np.concatenate([words, rng.integers(0, 2**32, 1 << 20, dtype=np.uint64).astype(U32)])
    assert np.array_equal(nan_found(words), _is_nan_byte(words).any(axis=1))
    # Folded over a tile's words (acc |= ...): set iff some word holds a NaN code.
    tiles = words[: (words.size // 16) * 16].reshape(-1, 16)
    acc = np.zeros(tiles.shape[0], U32)
    for j in range(16):
        w = tiles[:, j]
        acc |= (w + U32(0x01010101)) ^ w
    want = _is_nan_byte(tiles.reshape(-1)).reshape(-1, 64).any(axis=1)
    assert np.array_equal((acc & U32(0x80808080)) != 0, want)
