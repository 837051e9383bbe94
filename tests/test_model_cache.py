"""ModelKVCache: boundary layers + fp16 recent window, decode == float64 attention over the
dequantized prefix plus the fp16 window."""

from __future__ import annotations

import numpy as np
import pytest

from kvkit.model_cache import ModelKVCache
from kvkit.testing.reference import attention_f64
from kvkit.testing.tolerance import DECODE_CPU_RTOL, rel_error

L, H, D, BS = 4, 2, 64, 16


def reference_kv(mc, layer, seq):
    return mc.attended_kv(layer, seq)


def run(window, q_len, appends, fmt="turboquant_3bit_nc", seed=0, **opts):
    mc = ModelKVCache(L, H, D, fmt, num_blocks=80, block_size=BS, window=window, boundary_layers=1)
    rng = np.random.default_rng(seed)
    seqs = [mc.add_sequence(), mc.add_sequence()]
    worst = 0.0
    for n in appends:
        for s in seqs:
            slots = mc.append_tokens(s, n)
            for layer in range(L):
                kv = rng.standard_normal((2, n, H, D)).astype(np.float32)
                mc.write(layer, kv[0], kv[1], slots)
        for layer in range(L):
            q = rng.standard_normal((2, q_len, 8, D)).astype(np.float32)
            o = mc.decode(layer, q, seqs, **opts)
            for i, s in enumerate(seqs):
                k, v = reference_kv(mc, layer, s)
                ref, _ = attention_f64(q[i], k, v, **opts)
                worst = max(worst, rel_error(o[i], ref))
    return mc, seqs, worst


@pytest.mark.parametrize("window", [0, 5, 20])
@pytest.mark.parametrize("q_len", [1, 4])
def test_decode_equals_float64_over_prefix_plus_window(window, q_len):
    if window and window < q_len:
        pytest.skip("the window must hold the query tokens")
    appends = [q_len + 3, 1, 40, 1, 17, q_len, 1]  # an append longer than R and than a page
    mc, seqs, worst = run(window, q_len, appends)
    assert worst <= DECODE_CPU_RTOL
    for s in seqs:
        if window:
            assert window <= mc.window_len(s) <= window + BS - 1
        assert mc.seq_len(s) == sum(appends)


def test_sinks_and_softcap_apply_once():
    _, _, worst = run(
        20, 1, [30, 1, 1], sinks=np.linspace(-1, 1, 8).astype(np.float32), softcap=8.0
    )
    assert worst <= DECODE_CPU_RTOL


def test_boundary_layers_and_free_returns_window_pages():
    mc = ModelKVCache(6, H, D, "nvfp4", num_blocks=40, block_size=BS, window=16, boundary_layers=2)
    assert [f.name for f in mc.formats] == ["fp16", "fp16", "nvfp4", "nvfp4", "fp16", "fp16"]
    free_before = len(mc._win_blocks.free_list())
    s = mc.add_sequence()
    mc.append_tokens(s, 50)
    assert len(mc._win_blocks.free_list()) < free_before
    mc.free(s)
    assert len(mc._win_blocks.free_list()) == free_before


def test_window_smaller_than_q_len_is_rejected():
    mc = ModelKVCache(2, H, D, "fp16", num_blocks=8, block_size=BS, window=2, boundary_layers=0)
    s = mc.add_sequence()
    slots = mc.append_tokens(s, 40)
    assert mc.window_len(s) == 8  # 40 tokens, whole pages released down to >= R = 2
    for layer in range(2):
        mc.write(layer, np.ones((40, H, D), np.float32), np.ones((40, H, D), np.float32), slots)
    with pytest.raises(ValueError, match="q_len"):
        mc.decode(0, np.ones((1, 10, 8, D), np.float32), [s])
