"""Bad input gets a clear error naming the argument, and nothing is written."""

from __future__ import annotations

import numpy as np
import pytest

import kvkit
from kvkit import formats


@pytest.fixture(params=["nvfp4", "turboquant_4bit_nc", "fp16"])
def layer(request):
    fmt = formats.get(request.param, 64)
    return kvkit.PagedKVCache(fmt, 2, 2, 4, 16).layer(1)


def kv(n=3, heads=2, d=64, dtype=np.float32):
    rng = np.random.default_rng(0)
    return (
        rng.standard_normal((n, heads, d)).astype(dtype),
        rng.standard_normal((n, heads, d)).astype(dtype),
    )


def snapshot(layer):
    return {name: arr.copy() for name, arr in layer.planes.items()}


def assert_unchanged(layer, before):
    for name, arr in layer.planes.items():
        np.testing.assert_array_equal(arr, before[name])


@pytest.mark.parametrize(
    "mutate, error, match",
    [
        (lambda k, v, s: (k.astype(np.float64), v, s), TypeError, "k must be"),
        (lambda k, v, s: (k, v.astype(np.int32), s), TypeError, "v must be"),
        (lambda k, v, s: (k[:, :1], v[:, :1], s), ValueError, "KV heads"),
        (lambda k, v, s: (k[..., :32], v[..., :32], s), ValueError, "head_dim"),
        (lambda k, v, s: (k[0], v[0], s), ValueError, "k must be"),
        (lambda k, v, s: (k, v[:2], s), ValueError, "same shape"),
        (lambda k, v, s: (k, v, s.astype(np.float32)), TypeError, "slot_mapping"),
        (lambda k, v, s: (k, v, s[:2]), ValueError, "slot_mapping"),
        (lambda k, v, s: (k, v, np.array([0, 1, 64])), ValueError, "beyond the cache"),
        (lambda k, v, s: (k, v, np.array([3, 3, 4])), ValueError, "same slot twice"),
        (lambda k, v, s: (k, v, list(s)), TypeError, "slot_mapping"),
    ],
)
def test_write_kv_rejects_bad_arguments_before_writing(layer, mutate, error, match):
    k, v = kv()
    args = mutate(k, v, np.array([0, 5, 63], np.int64))
    before = snapshot(layer)
    with pytest.raises(error, match=match):
        kvkit.write_kv(layer, *args)
    assert_unchanged(layer, before)


def test_write_kv_rejects_a_non_layer():
    k, v = kv()
    with pytest.raises(TypeError, match="layer"):
        kvkit.write_kv(object(), k, v, np.zeros(3, np.int64))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), "x", None])
def test_global_scales_must_be_finite_and_positive(layer, bad):
    with pytest.raises((ValueError, TypeError), match="k_scale"):
        layer.k_scale = bad
    with pytest.raises((ValueError, TypeError), match="v_scale"):
        layer.v_scale = bad
    assert layer.k_scale == 1.0 and layer.v_scale == 1.0


def test_dequantize_rejects_out_of_range_slots(layer):
    with pytest.raises(ValueError, match="beyond the cache"):
        kvkit.dequantize(layer, np.array([64]))
    with pytest.raises(TypeError, match="slots"):
        kvkit.dequantize(layer, np.array([1.0]))
    with pytest.raises(ValueError, match="slots"):
        kvkit.dequantize(layer, np.zeros((2, 2), np.int64))


def decode_args(layer, b=2, hq=4):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((b, hq, layer.head_dim)).astype(np.float32)
    tables = np.array([[0, 1], [2, 3]], np.int32)[:b]
    lens = np.array([20, 17], np.int32)[:b]
    return q, tables, lens


@pytest.mark.parametrize(
    "mutate, error, match",
    [
        (lambda q, t, s: (q.astype(np.float64), t, s), TypeError, "q must be"),
        (lambda q, t, s: (q[..., :32], t, s), ValueError, "head_dim"),
        (lambda q, t, s: (q[:, :3], t, s), ValueError, "multiple of"),
        (lambda q, t, s: (q, t.astype(np.int64), s), TypeError, "block_tables"),
        (lambda q, t, s: (q, t[:1], s), ValueError, "block_tables"),
        (lambda q, t, s: (q, t, s.astype(np.int64)), TypeError, "seq_lens"),
        (lambda q, t, s: (q, np.array([[0, 9], [2, 3]], np.int32), s), ValueError, "block_tables"),
        (lambda q, t, s: (q, np.array([[0, -1], [2, 3]], np.int32), s), ValueError, "block_tables"),
        (lambda q, t, s: (q, t, np.array([33, 17], np.int32)), ValueError, "seq_lens"),
        (lambda q, t, s: (q, t, np.array([0, 17], np.int32)), ValueError, "seq_lens"),
    ],
)
def test_decode_rejects_bad_arguments(layer, mutate, error, match):
    q, t, s = mutate(*decode_args(layer))
    with pytest.raises(error, match=match):
        kvkit.decode(q, layer, t, s)


def test_decode_ignores_table_entries_past_the_sequence(layer):
    q, _, _ = decode_args(layer)
    # Sequence 0 uses one page; entry 1 is padding and may hold anything.
    t = np.array([[0, 999], [2, 3]], np.int32)
    o = kvkit.decode(q, layer, t, np.array([16, 17], np.int32))
    assert o.shape == q.shape and np.isfinite(o).all()


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"scale": 0.0}, ValueError, "scale"),
        ({"scale": float("nan")}, ValueError, "scale"),
        ({"softcap": -1.0}, ValueError, "softcap"),
        ({"window": 0}, ValueError, "window"),
        ({"num_splits": 0}, ValueError, "num_splits"),
        ({"sinks": np.zeros(3, np.float32)}, ValueError, "sinks"),
    ],
)
def test_decode_rejects_bad_options(layer, kwargs, error, match):
    q, t, s = decode_args(layer)
    with pytest.raises(error, match=match):
        kvkit.decode(q, layer, t, s, **kwargs)


def test_cache_constructor_checks():
    fmt = formats.get("nvfp4", 64)
    with pytest.raises(ValueError, match="block_size"):
        kvkit.PagedKVCache(fmt, 1, 1, 1, 8)
    with pytest.raises(ValueError, match="num_blocks"):
        kvkit.PagedKVCache(fmt, 1, 1, 0, 16)
    with pytest.raises(TypeError, match="fmt"):
        kvkit.PagedKVCache("nvfp4", 1, 1, 1, 16)
    with pytest.raises(ValueError, match="backend"):
        kvkit.PagedKVCache(fmt, 1, 1, 1, 16, backend="tpu")
    with pytest.raises(ValueError, match="head_dim"):
        kvkit.PagedKVCache([fmt, formats.get("fp16", 128)], 2, 1, 1, 16)
    with pytest.raises(IndexError):
        kvkit.PagedKVCache(fmt, 2, 1, 1, 16).layer(2)


def test_per_layer_formats_and_plane_shapes():
    fmts = [
        formats.get("fp16", 128),
        formats.get("turboquant_3bit_nc", 128),
        formats.get("nvfp4", 128),
    ]
    cache = kvkit.PagedKVCache(fmts, 3, 8, 10, 32)
    assert cache.layer(0).planes["k"].shape == (10, 8, 32, 128)
    assert cache.layer(0).planes["k"].dtype == np.float16
    assert cache.layer(1).planes["slots"].shape == (10, 8, 32, 102)
    assert cache.layer(2).planes["k_data"].shape == (10, 8, 32, 64)
    assert cache.layer(2).planes["k_scale"].shape == (10, 8, 32, 8)
    assert cache.nbytes == 10 * 8 * 32 * (512 + 102 + 144)
