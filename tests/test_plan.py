"""DecodePlan on the CPU backend: same results as kvkit.decode, shape checks."""

from __future__ import annotations

import numpy as np
import pytest

import kvkit
from kvkit import formats
from kvkit.testing.synthetic import llm_like_kv, llm_like_queries


def filled_layer(name="turboquant_4bit_nc", n=70, hkv=2, d=64):
    layer = kvkit.PagedKVCache(formats.get(name, d), 1, hkv, 8, 16).layer(0)
    k, v = llm_like_kv(n, hkv, d, seed=2)
    kvkit.write_kv(layer, k, v, np.arange(n))
    return layer


def test_plan_run_equals_decode():
    layer = filled_layer()
    q = llm_like_queries(1, 8, 64, seed=2, num_kv_heads=2)
    tables = np.arange(5, dtype=np.int32)[None]
    lens = np.array([70], np.int32)
    plan = kvkit.DecodePlan(layer, 1, 8, 5, num_splits=3, window=20, softcap=10.0)
    o, lse = plan.run(q, tables, lens, return_lse=True)
    ref_o, ref_lse = kvkit.decode(q, layer, tables, lens, num_splits=3, window=20,
                                  softcap=10.0, return_lse=True)  # fmt: skip
    np.testing.assert_array_equal(o, ref_o)
    np.testing.assert_array_equal(lse, ref_lse)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(batch=0, num_heads=8, max_blocks=5), "batch"),
        (dict(batch=1, num_heads=5, max_blocks=5), "multiple"),
        (dict(batch=1, num_heads=8, max_blocks=5, q_dtype="int8"), "q_dtype"),
    ],
)
def test_plan_argument_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        kvkit.DecodePlan(filled_layer(), **kwargs)
