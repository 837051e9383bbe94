"""DecodePlan on CUDA: equals kvkit.decode, and a captured CUDA graph replays correctly after
the inputs' contents change."""

from __future__ import annotations

import numpy as np
import pytest

import kvkit
from kvkit import formats
from kvkit.testing.synthetic import llm_like_kv, llm_like_queries
from kvkit.testing.tolerance import DECODE_GPU_RTOL, rel_error

pytestmark = pytest.mark.gpu


def gpu_layer(name, n=300, hkv=2, d=128, nb=24):
    import cupy as cp

    layer = kvkit.PagedKVCache(formats.get(name, d), 1, hkv, nb, 16, backend="cuda").layer(0)
    k, v = llm_like_kv(n, hkv, d, seed=5)
    if layer.fmt.has_global_scales:
        layer.k_scale, layer.v_scale = layer.fmt.calibrate(k), layer.fmt.calibrate(v)
    kvkit.write_kv(layer, cp.asarray(k), cp.asarray(v), cp.arange(n, dtype=cp.int64))
    return layer


@pytest.mark.parametrize("name", ["fp16", "nvfp4", "turboquant_3bit_nc"])
@pytest.mark.parametrize("num_splits", [1, 5, None])
def test_plan_equals_decode(name, num_splits):
    import cupy as cp

    layer = gpu_layer(name)
    q = cp.asarray(llm_like_queries(2, 8, 128, seed=1, num_kv_heads=2).astype(np.float16))
    tables = cp.asarray(np.array([np.arange(12), np.arange(12, 24)], np.int32))
    lens = cp.asarray(np.array([150, 190], np.int32))
    plan = kvkit.DecodePlan(layer, 2, 8, 12, num_splits=num_splits)
    o = plan.run(q, tables, lens)
    assert o.data.ptr == plan.o.data.ptr
    ref = kvkit.decode(q, layer, tables, lens, num_splits=plan.num_splits)
    cp.testing.assert_array_equal(o, ref)


@pytest.mark.parametrize("name", ["turboquant_4bit_nc", "fp8_e4m3"])
@pytest.mark.parametrize("sinks", [False, True])
def test_graph_replay_follows_new_inputs(name, sinks):
    import cupy as cp

    layer = gpu_layer(name)
    hq = 8
    q = cp.asarray(llm_like_queries(2, hq, 128, seed=3, num_kv_heads=2).astype(np.float16))
    tables = cp.asarray(np.array([np.arange(12), np.arange(12, 24)], np.int32))
    lens = cp.asarray(np.array([100, 190], np.int32))
    sink = cp.asarray(np.linspace(-1, 1, hq).astype(np.float32)) if sinks else None
    plan = kvkit.DecodePlan(layer, 2, hq, 12, num_splits=4, sinks=sink)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        plan.run(q, tables, lens)  # warm: kernels loaded before capture
        stream.synchronize()
        stream.begin_capture()
        plan.run(q, tables, lens)
        graph = stream.end_capture()
        # New contents in the same buffers, then replay.
        q[...] = cp.asarray(llm_like_queries(2, hq, 128, seed=4, num_kv_heads=2)).astype(cp.float16)
        lens[...] = cp.asarray(np.array([190, 37], np.int32))
        tables[...] = cp.asarray(np.array([np.arange(12, 24), np.arange(12)], np.int32))
        graph.launch(stream)
        stream.synchronize()
    got = plan.o[:, 0].copy()  # the plan keeps (B, q_len, Hq, D); q was (B, Hq, D)
    ref = kvkit.decode(q, layer, tables, lens, num_splits=4, sinks=sink)
    assert rel_error(cp.asnumpy(got), cp.asnumpy(ref)) <= DECODE_GPU_RTOL
    cp.testing.assert_array_equal(got, ref)


def _counting_full_path(monkeypatch):
    import kvkit.plan as plan_mod

    calls = []
    real = plan_mod._decode_cuda

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(plan_mod, "_decode_cuda", counted)
    return calls


@pytest.mark.parametrize("name", ["fp16", "turboquant_4bit_nc"])
@pytest.mark.parametrize("num_splits", [1, 4])
def test_later_runs_replay_the_prepared_launches(name, num_splits, monkeypatch):
    import cupy as cp

    layer = gpu_layer(name)
    tables = cp.asarray(np.array([np.arange(12), np.arange(12, 24)], np.int32))
    plan = kvkit.DecodePlan(layer, 2, 8, 12, num_splits=num_splits)
    calls = _counting_full_path(monkeypatch)
    for step, lens in enumerate(([150, 190], [151, 100], [40, 191])):
        # A new q array each step (new memory), new lengths in a new array.
        q = llm_like_queries(2, 8, 128, seed=10 + step, num_kv_heads=2)
        q = cp.asarray(q.astype(np.float16))
        sl = cp.asarray(np.array(lens, np.int32))
        o, lse = plan.run(q, tables, sl, return_lse=True)
        ref_o, ref_lse = kvkit.decode(q, layer, tables, sl, num_splits=plan.num_splits,
                                      return_lse=True)  # fmt: skip
        cp.testing.assert_array_equal(o, ref_o)
        cp.testing.assert_array_equal(lse, ref_lse)
    assert calls == [1]  # only the first run took the full path


def test_a_changed_layer_or_input_layout_takes_the_full_path(monkeypatch):
    import cupy as cp

    layer = gpu_layer("fp8_e4m3")
    q = cp.asarray(llm_like_queries(2, 8, 128, seed=2, num_kv_heads=2).astype(np.float16))
    tables = cp.asarray(np.array([np.arange(12), np.arange(12, 24)], np.int32))
    lens = cp.asarray(np.array([150, 190], np.int32))
    plan = kvkit.DecodePlan(layer, 2, 8, 12, num_splits=3)
    calls = _counting_full_path(monkeypatch)
    plan.run(q, tables, lens)
    layer.k_scale = layer.k_scale * 2.0  # folded into a packed argument: must not be stale
    o = plan.run(q, tables, lens)
    cp.testing.assert_array_equal(o, kvkit.decode(q, layer, tables, lens, num_splits=3))
    wide = cp.zeros((2, 24), np.int32)
    wide[:, ::2] = tables  # a strided view: not the recorded layout, and not accepted
    with pytest.raises(ValueError, match="C-contiguous"):
        plan.run(q, wide[:, ::2], lens)  # the full path's error, not a replay with it
    assert len(calls) == 3
    o = plan.run(q, tables, lens)  # the recorded layout again: a replay
    cp.testing.assert_array_equal(o, kvkit.decode(q, layer, tables, lens, num_splits=3))
    assert len(calls) == 3


def test_stage2_is_programmatic_only_where_it_waits(monkeypatch):
    """Stage 2 gets the programmatic-serialization launch (it may start before stage 1 ends)
    only from a build that waits for stage 1 by griddepcontrol: sm_90+ natively, never
    through the sm_80 PTX override, never with KVKIT_DECODE_PDL=0."""
    import cupy as cp

    from kvkit.cuda import decode as cuda_decode
    from kvkit.cuda.launch import ProgrammaticKernel

    # The native build first, whatever override the run has (the suite also runs under
    # KVKIT_ARCH=sm_80).
    monkeypatch.delenv("KVKIT_ARCH", raising=False)
    monkeypatch.delenv("KVKIT_DECODE_PDL", raising=False)
    cc = int(cp.cuda.Device().compute_capability)
    kern = cuda_decode._merge_kernel("kv_decode_merge_splits")
    assert isinstance(kern, ProgrammaticKernel) == (cc >= 90)
    assert not isinstance(cuda_decode._merge_kernel("kv_merge_states"), ProgrammaticKernel)
    monkeypatch.setenv("KVKIT_DECODE_PDL", "0")
    assert not isinstance(cuda_decode._merge_kernel("kv_decode_merge_splits"), ProgrammaticKernel)
    monkeypatch.delenv("KVKIT_DECODE_PDL")
    monkeypatch.setenv("KVKIT_ARCH", "sm_80")
    assert not isinstance(cuda_decode._merge_kernel("kv_decode_merge_splits"), ProgrammaticKernel)


@pytest.mark.parametrize("trigger", [None, "0"])
@pytest.mark.parametrize("name", ["nvfp4", "turboquant_k8v4", "fp16"])
def test_back_to_back_graph_steps_equal_ordinary_launches(name, trigger, monkeypatch):
    """A captured graph of many multi-split steps of two layers, back to back (each stage 2
    right behind its stage 1, each next stage 1 right behind a stage 2, as in a decode loop):
    the same bits as plain decodes with stage 2 launched the ordinary way. A stage 2 that read
    partial states before its stage 1 finished would differ here."""
    import cupy as cp

    if trigger is not None:
        monkeypatch.setenv("KVKIT_DECODE_PDL_TRIGGER", trigger)
    layers = [gpu_layer(name, n=380, nb=24), gpu_layer(name, n=380, nb=24)]
    hq = 8
    q = cp.asarray(llm_like_queries(2, hq, 128, seed=7, num_kv_heads=2).astype(np.float16))
    tables = cp.asarray(np.array([np.arange(12), np.arange(12, 24)], np.int32))
    lens = cp.asarray(np.array([190, 183], np.int32))
    plans = [kvkit.DecodePlan(layer, 2, hq, 12, num_splits=12) for layer in layers]
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for plan in plans:
            plan.run(q, tables, lens)
        stream.synchronize()
        stream.begin_capture()
        for _ in range(6):
            for plan in plans:
                plan.run(q, tables, lens)
        graph = stream.end_capture()
        for _ in range(3):
            graph.launch(stream)
        stream.synchronize()
    monkeypatch.setenv("KVKIT_DECODE_PDL", "0")
    for plan, layer in zip(plans, layers):
        ref = kvkit.decode(q, layer, tables, lens, num_splits=12)
        cp.testing.assert_array_equal(plan.o[:, 0], ref)
