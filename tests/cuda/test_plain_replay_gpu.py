"""Plain kvkit.decode calls replayed from kvkit.cuda.plain_steps equal the full path bit for
bit, follow new arrays and contents, and drop a step when the layer changes."""

from __future__ import annotations

import numpy as np
import pytest

import kvkit
from kvkit import formats
from kvkit.cuda import plain_steps
from kvkit.testing.synthetic import llm_like_kv, llm_like_queries

pytestmark = pytest.mark.gpu


def gpu_layer(name):
    """300 tokens of 2 KV heads (D = 128) written into pages 0..18 of a 24-page CUDA layer."""
    import cupy as cp

    layer = kvkit.PagedKVCache(formats.get(name, 128), 1, 2, 24, 16, backend="cuda").layer(0)
    k, v = llm_like_kv(300, 2, 128, seed=7)
    if layer.fmt.has_global_scales:
        layer.k_scale, layer.v_scale = layer.fmt.calibrate(k), layer.fmt.calibrate(v)
    kvkit.write_kv(layer, cp.asarray(k), cp.asarray(v), cp.arange(300, dtype=cp.int64))
    return layer


def _full_path(monkeypatch, *args, **kwargs):
    """kvkit.decode with the replay cache off."""
    with monkeypatch.context() as m:
        m.setattr(plain_steps, "MAX_STEPS", 0)
        return kvkit.decode(*args, **kwargs)


@pytest.mark.parametrize("name", ["fp16", "nvfp4", "turboquant_4bit_nc"])
@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("sinks", [False, True])
def test_replayed_plain_calls_equal_the_full_path(name, num_splits, sinks, monkeypatch):
    import cupy as cp

    plain_steps.clear()
    layer = gpu_layer(name)
    hq = 8
    tables = cp.asarray(np.array([np.arange(12), np.arange(12, 24)], np.int32))
    sink = cp.asarray(np.linspace(-1, 1, hq).astype(np.float32)) if sinks else None
    outs = []
    for step, lens in enumerate(([150, 190], [151, 100], [40, 191], [190, 3])):
        q = llm_like_queries(2, hq, 128, seed=20 + step, num_kv_heads=2).astype(np.float16)
        q, sl = cp.asarray(q), cp.asarray(np.array(lens, np.int32))  # new arrays every call
        o, lse = kvkit.decode(q, layer, tables, sl, num_splits=num_splits, sinks=sink,
                              return_lse=True)  # fmt: skip
        ref_o, ref_lse = _full_path(monkeypatch, q, layer, tables, sl, num_splits=num_splits,
                                    sinks=sink, return_lse=True)  # fmt: skip
        cp.testing.assert_array_equal(o, ref_o)
        cp.testing.assert_array_equal(lse, ref_lse)
        outs.append(o)
    assert len(plain_steps._steps) == 1  # recorded on the second call, replayed after
    assert len({int(o.data.ptr) for o in outs}) == len(outs)  # a fresh o every call


def test_a_changed_layer_takes_the_full_path_again(monkeypatch):
    import cupy as cp

    plain_steps.clear()
    layer = gpu_layer("fp8_e4m3")
    q = cp.asarray(llm_like_queries(2, 8, 128, seed=2, num_kv_heads=2).astype(np.float16))
    tables = cp.asarray(np.array([np.arange(12), np.arange(12, 24)], np.int32))
    lens = cp.asarray(np.array([150, 190], np.int32))
    for _ in range(3):
        kvkit.decode(q, layer, tables, lens, num_splits=3)
    layer.k_scale = layer.k_scale * 2.0  # folded into a launch argument: must not be stale
    o = kvkit.decode(q, layer, tables, lens, num_splits=3)
    cp.testing.assert_array_equal(o, _full_path(monkeypatch, q, layer, tables, lens, num_splits=3))


@pytest.mark.parametrize("name", ["fp8_e4m3", "nvfp4_4over6", "turboquant_3bit_nc"])
def test_replayed_writes_equal_the_full_path(name, monkeypatch):
    """Repeated kvkit.write_kv calls of one signature (new k / v / slot arrays each time)
    write the same bytes as the full path, into the right slots."""
    import cupy as cp

    plain_steps.clear()
    fmt = formats.get(name, 128)
    replayed = kvkit.PagedKVCache(fmt, 1, 2, 8, 16, backend="cuda").layer(0)
    full = kvkit.PagedKVCache(fmt, 1, 2, 8, 16, backend="cuda").layer(0)
    for layer in (replayed, full):
        layer.k_scale, layer.v_scale = 0.02, 0.03
    rng = np.random.default_rng(4)
    order = rng.permutation(128)
    for step in range(5):
        k, v = llm_like_kv(16, 2, 128, seed=30 + step)
        slots = order[16 * step : 16 * step + 16].astype(np.int64)
        slots[3] = -1  # padding stays untouched
        args = (cp.asarray(k), cp.asarray(v), cp.asarray(slots))
        kvkit.write_kv(replayed, *args)
        with monkeypatch.context() as m:
            m.setattr(plain_steps, "MAX_STEPS", 0)
            kvkit.write_kv(full, *[cp.array(a) for a in args])
    assert len(plain_steps._steps) == 1
    for plane in full.planes:
        cp.testing.assert_array_equal(replayed.planes[plane], full.planes[plane])
    assert int(replayed.error_flag.get()[0]) == 0


def test_forty_layers_round_robin_replay_equal_the_full_path(monkeypatch):
    """A model's step loop: one decode per layer, 40 layers (more than the old 32-step cache)
    in round robin, three times. The third round replays every layer, all of them carving
    their partials from one shared buffer per stream, which grows while older steps still
    point into the old one (split counts 2 and 3 alternate; every fourth layer is one split
    with sinks); each output equals the full path's bit for bit."""
    import cupy as cp

    from kvkit import ops

    plain_steps.clear()
    num_layers, hq = 40, 8
    cache = kvkit.PagedKVCache(formats.get("fp8_e4m3", 128), num_layers, 2, 6, 16, backend="cuda")
    layers = [cache.layer(i) for i in range(num_layers)]
    for i, layer in enumerate(layers):
        k, v = llm_like_kv(96, 2, 128, seed=100 + i)
        layer.k_scale, layer.v_scale = layer.fmt.calibrate(k), layer.fmt.calibrate(v)
        kvkit.write_kv(layer, cp.asarray(k), cp.asarray(v), cp.arange(96, dtype=cp.int64))
    tables = cp.asarray(np.array([[0, 1, 2], [3, 4, 5]], np.int32))
    sink = cp.asarray(np.linspace(-1, 1, hq).astype(np.float32))

    def options(i):
        return dict(num_splits=1, sinks=sink) if i % 4 == 3 else dict(num_splits=2 + i % 2)

    replays = []
    replay = ops._replay_plain

    def counted_replay(*args):
        replays.append(1)
        return replay(*args)

    monkeypatch.setattr(ops, "_replay_plain", counted_replay)
    per_round = []
    for step in range(3):
        lens = cp.asarray(np.array([40 + step, 48 - step], np.int32))
        qs = [
            cp.asarray(llm_like_queries(2, hq, 128, seed=1000 * step + i, num_kv_heads=2)
                       .astype(np.float16))
            for i in range(num_layers)
        ]  # fmt: skip
        before = len(replays)
        outs = [  # back to back, as a model runs them: the shared partials are reused
            kvkit.decode(q, layer, tables, lens, return_lse=True, **options(i))
            for i, (q, layer) in enumerate(zip(qs, layers))
        ]
        per_round.append(len(replays) - before)
        for i, ((o, lse), q, layer) in enumerate(zip(outs, qs, layers)):
            ref_o, ref_lse = _full_path(monkeypatch, q, layer, tables, lens, return_lse=True,
                                        **options(i))  # fmt: skip
            cp.testing.assert_array_equal(o, ref_o)
            cp.testing.assert_array_equal(lse, ref_lse)
    assert per_round == [0, 0, num_layers]  # seen, recorded, replayed
    steps = list(plain_steps._steps.values())
    assert len(steps) == num_layers
    assert len({id(s.partials) for s in steps}) == 1  # one shared buffer for the stream
