"""The serial twins of the parallel CPU kernels compute the same bytes and values."""

from __future__ import annotations

import numpy as np
import pytest

import kvkit
from kvkit import formats
from kvkit.cpu import backend, decode


@pytest.mark.parametrize(
    "name", ["fp8_e4m3", "nvfp4_4over6", "turboquant_3bit_nc", "turboquant_k8v4"]
)
def test_write_and_dequantize_twins_agree(name, monkeypatch):
    fmt = formats.get(name, 64)
    rng = np.random.default_rng(0)
    k = (rng.standard_normal((300, 2, 64)) * 3).astype(np.float32)
    v = (rng.standard_normal((300, 2, 64)) * 3).astype(np.float32)
    slots = rng.permutation(320)[:300]
    results = []
    for threshold in (0, 10**9):  # 0: always parallel; huge: always serial
        monkeypatch.setattr(backend, "PARALLEL_MIN_ROWS", threshold)
        layer = kvkit.PagedKVCache(fmt, 1, 2, 20, 16).layer(0)
        if fmt.has_global_scales:
            layer.k_scale, layer.v_scale = fmt.calibrate(k), fmt.calibrate(v)
        kvkit.write_kv(layer, k, v, slots)
        results.append((layer.planes, kvkit.dequantize(layer, slots)))
    (planes_p, (kp, vp)), (planes_s, (ks, vs)) = results
    for plane in planes_p:
        np.testing.assert_array_equal(planes_p[plane], planes_s[plane])
    np.testing.assert_array_equal(kp, ks)
    np.testing.assert_array_equal(vp, vs)


def test_decode_twins_agree(monkeypatch):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((3, 2, 8, 64)).astype(np.float32)
    pages = rng.standard_normal((12, 2, 16, 64)).astype(np.float32)
    tables = rng.permutation(12).astype(np.int32).reshape(3, 4)
    lens = np.array([64, 33, 17], np.int32)
    outs = []
    for threshold in (0, 1 << 62):
        monkeypatch.setattr(decode, "PARALLEL_MIN_WORK", threshold)
        outs.append(decode.decode_pages(q, pages, pages, tables, lens, scale=0.125, num_splits=3,
                                        sinks=np.zeros(8, np.float32)))  # fmt: skip
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
