"""kvkit.testing.synthetic and kvkit.testing.rng: shapes, dtypes, determinism, realism."""

from __future__ import annotations

import numpy as np
import pytest

from kvkit.testing.rng import derive, rng, seed_from_name
from kvkit.testing.synthetic import key_outlier_channels, llm_like_kv, llm_like_queries

# ------------------------------------------------------------------------------------ rng


def test_rng_is_deterministic():
    assert np.array_equal(rng(7).standard_normal(16), rng(7).standard_normal(16))
    assert not np.array_equal(rng(7).standard_normal(16), rng(8).standard_normal(16))


def test_seed_from_name_is_stable_crc32():
    # CRC-32 of b"abc" is a published constant: the seed must not depend on the process.
    assert seed_from_name("abc") == 0x352441C2
    assert rng("abc").integers(1 << 30) == rng(0x352441C2).integers(1 << 30)


def test_derive_streams_are_deterministic_and_distinct():
    a1 = derive(3, "keys").standard_normal(8)
    a2 = derive(3, "keys").standard_normal(8)
    b = derive(3, "values").standard_normal(8)
    c = derive(4, "keys").standard_normal(8)
    assert np.array_equal(a1, a2)
    assert not np.array_equal(a1, b)
    assert not np.array_equal(a1, c)


@pytest.mark.parametrize("bad", [-1, True])
def test_rng_rejects_bad_seeds(bad):
    with pytest.raises((ValueError, TypeError)):
        rng(bad)


# ------------------------------------------------------------------------------ synthetic


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 1, 64), (37, 2, 128), (5, 3, 80), (4, 1, 7)])
def test_kv_shapes_and_dtypes(shape, dtype):
    k, v = llm_like_kv(*shape, seed=1, dtype=dtype)
    assert k.shape == shape and v.shape == shape
    assert k.dtype == dtype and v.dtype == dtype
    assert np.all(np.isfinite(k)) and np.all(np.isfinite(v))


def test_kv_empty():
    k, v = llm_like_kv(0, 2, 64)
    assert k.shape == v.shape == (0, 2, 64)


def test_kv_deterministic_and_seed_dependent():
    k1, v1 = llm_like_kv(64, 2, 64, seed=5)
    k2, v2 = llm_like_kv(64, 2, 64, seed=5)
    k3, v3 = llm_like_kv(64, 2, 64, seed=6)
    assert np.array_equal(k1, k2) and np.array_equal(v1, v2)
    assert not np.array_equal(k1, k3) and not np.array_equal(v1, v3)
    # String seeds work and are stable too.
    assert np.array_equal(llm_like_kv(8, 1, 64, seed="t")[0], llm_like_kv(8, 1, 64, seed="t")[0])


def test_seq_id_changes_tokens_not_model():
    k0, _ = llm_like_kv(4096, 2, 64, seed=2, seq_id=0)
    k1, _ = llm_like_kv(4096, 2, 64, seed=2, seq_id=1)
    assert not np.array_equal(k0, k1)
    # Same model: the per-channel means agree far better than their size.
    m0, m1 = k0.mean(axis=0), k1.mean(axis=0)
    assert np.abs(m0 - m1).max() < 0.2 * np.abs(m0).max()


def test_dtypes_are_casts_of_one_float64_draw():
    k64, v64 = llm_like_kv(32, 2, 64, seed=9, dtype=np.float64)
    for dtype in (np.float16, np.float32):
        k, v = llm_like_kv(32, 2, 64, seed=9, dtype=dtype)
        assert np.array_equal(k64.astype(dtype), k)
        assert np.array_equal(v64.astype(dtype), v)


def test_values_well_inside_fp16_range():
    k, v = llm_like_kv(4096, 4, 128, seed=0)
    q = llm_like_queries(8, 16, 128, seed=0, num_kv_heads=4)
    for x in (k, v, q):
        assert np.abs(x).max() < 1000.0  # fp16 max is 65504
    # ... and the outlier magnitude follows outlier_scale.
    k_big, _ = llm_like_kv(256, 1, 64, seed=0, outlier_scale=50.0)
    assert np.abs(k_big).max() < 1000.0


@pytest.mark.parametrize("n_out", [1, 4, 8])
def test_outlier_channels_present(n_out):
    h, d = 4, 128
    k, _ = llm_like_kv(2048, h, d, seed=3, outlier_channels=n_out)
    idx = key_outlier_channels(h, d, seed=3, outlier_channels=n_out)
    assert idx.shape == (h, n_out) and idx.dtype == np.int64
    assert np.all((idx >= 0) & (idx < d))
    for head in range(h):
        assert len(set(idx[head].tolist())) == n_out
        mag = np.abs(k[:, head, :].astype(np.float64)).mean(axis=0)  # (D,)
        normal = np.delete(mag, idx[head])
        # Every outlier channel dwarfs a typical channel ...
        assert mag[idx[head]].min() > 4.0 * np.median(normal)
        # ... and the largest channels of the head are exactly the outlier channels.
        assert set(np.argsort(mag)[-n_out:].tolist()) == set(idx[head].tolist())


def test_no_outliers():
    k, _ = llm_like_kv(1024, 2, 64, seed=3, outlier_channels=0)
    mag = np.abs(k.astype(np.float64)).mean(axis=0)
    assert mag.max() < 4.0 * np.median(mag)


def test_keys_have_per_channel_offset_and_smooth_positional_component():
    k, _ = llm_like_kv(4096, 2, 128, seed=4, outlier_channels=0)
    k = k.astype(np.float64)
    # Per-channel means are far from zero compared with their standard error.
    mean = k.mean(axis=0)
    stderr = k.std(axis=0) / np.sqrt(k.shape[0])
    assert np.mean(np.abs(mean) > 10 * stderr) > 0.5

    # The rotary part varies smoothly over positions: a 256-token moving average keeps it,
    # while shuffling the tokens in time leaves only averaged-down noise.
    def drift(x):
        kernel = np.ones(256) / 256
        var = [
            np.var(np.convolve(x[:, h, c], kernel, mode="valid"))
            for h in range(x.shape[1])
            for c in range(x.shape[2])
        ]
        return float(np.sqrt(np.mean(var)))

    shuffled = k[rng(0).permutation(k.shape[0])]
    assert drift(k) > 2.0 * drift(shuffled)


def test_values_heavy_tailed_but_centred():
    _, v = llm_like_kv(8192, 2, 128, seed=5)
    v = v.astype(np.float64)
    z = (v - v.mean(axis=0)) / v.std(axis=0)
    kurt = float(np.mean(z**4))
    assert 3.2 < kurt < 12.0  # Gaussian is 3; Student-t with 6 dof is 6 before clipping
    assert np.abs(v.mean()) < 0.1


@pytest.mark.parametrize("q_len", [None, 1, 3])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_queries_shape_dtype_determinism(q_len, dtype):
    q = llm_like_queries(2, 8, 64, seed=1, q_len=q_len, num_kv_heads=2, dtype=dtype)
    expect = (2, 8, 64) if q_len is None else (2, q_len, 8, 64)
    assert q.shape == expect and q.dtype == dtype
    q2 = llm_like_queries(2, 8, 64, seed=1, q_len=q_len, num_kv_heads=2, dtype=dtype)
    assert np.array_equal(q, q2)
    assert not np.array_equal(q, llm_like_queries(2, 8, 64, seed=2, q_len=q_len, num_kv_heads=2))


def test_queries_reject_bad_gqa():
    with pytest.raises(ValueError):
        llm_like_queries(1, 6, 64, seed=0, num_kv_heads=4)


def _attention_weights(q, k):
    """q (Hq, D), k (T, Hkv, D) -> float64 softmax weights (Hq, T)."""
    hq, hkv = q.shape[0], k.shape[1]
    kv_of = np.arange(hq) // (hq // hkv)
    s = np.einsum("hd,thd->ht", q.astype(np.float64), k.astype(np.float64)[:, kv_of])
    s /= np.sqrt(q.shape[-1])
    w = np.exp(s - s.max(axis=1, keepdims=True))
    return w / w.sum(axis=1, keepdims=True)


def test_attention_is_peaked_not_uniform():
    t, hkv, hq, d = 2048, 4, 16, 128
    k, _ = llm_like_kv(t, hkv, d, seed=0)
    q = llm_like_queries(2, hq, d, seed=0, num_kv_heads=hkv)
    for b in range(2):
        w = _attention_weights(q[b], k)
        eff_tokens = np.exp(-(w * np.log(np.maximum(w, 1e-300))).sum(axis=1))
        assert np.median(eff_tokens) < t / 4  # uniform would be t
        assert np.median(w.max(axis=1)) > 10.0 / t


def test_queries_correlate_with_key_offsets():
    hkv, hq, d = 2, 8, 128
    k, _ = llm_like_kv(4096, hkv, d, seed=11)
    q = llm_like_queries(64, hq, d, seed=11, num_kv_heads=hkv).astype(np.float64)
    key_mean = k.astype(np.float64).mean(axis=0)  # (Hkv, D)
    kv_of = np.arange(hq) // (hq // hkv)
    qm = q.mean(axis=0)  # (Hq, D)
    cos = np.sum(qm * key_mean[kv_of], axis=-1) / (
        np.linalg.norm(qm, axis=-1) * np.linalg.norm(key_mean[kv_of], axis=-1)
    )
    assert np.all(cos > 0.2)
    # A different model's queries do not line up with these keys.
    other = llm_like_queries(64, hq, d, seed=12, num_kv_heads=hkv).astype(np.float64).mean(0)
    cos_other = np.sum(other * key_mean[kv_of], axis=-1) / (
        np.linalg.norm(other, axis=-1) * np.linalg.norm(key_mean[kv_of], axis=-1)
    )
    assert np.mean(np.abs(cos_other)) < np.mean(cos)
