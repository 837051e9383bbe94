"""kvkit.decode on every format equals float64 attention over the dequantized cache.

The acceptance contract (DESIGN.md section 4): same function as "dequantize with the spec,
then exact attention in float64"; the CPU backend may add float32 rounding only.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import kvkit
from kvkit import formats
from kvkit.splits import MAX_SPLITS
from kvkit.testing.reference import attention_f64
from kvkit.testing.synthetic import llm_like_kv, llm_like_queries
from kvkit.testing.tolerance import (
    DECODE_CPU_RTOL,
    FP16_CACHE_OUTPUT_RTOL,
    SPLIT_INVARIANCE_RTOL,
    rel_error,
)

HEAD_DIM = 64
HKV = 2


def build(name, block_size, lens, seed):
    """A cache holding len tokens for each sequence at shuffled pages; returns the
    layer, block tables and the dequantized K/V of each sequence (the reference input)."""
    fmt = formats.get(name, HEAD_DIM)
    pages_per_seq = [(n + block_size - 1) // block_size for n in lens]
    num_blocks = sum(pages_per_seq) + 3
    layer = kvkit.PagedKVCache(fmt, 1, HKV, num_blocks, block_size).layer(0)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(num_blocks).astype(np.int32)
    width = max(pages_per_seq) + 1
    tables = np.full((len(lens), width), -7, np.int32)  # padding past each sequence: junk
    ks, vs = [], []
    start = 0
    for b in range(len(lens)):
        tables[b, : pages_per_seq[b]] = perm[start : start + pages_per_seq[b]]
        start += pages_per_seq[b]
    for b, n in enumerate(lens):
        k, v = llm_like_kv(n, HKV, HEAD_DIM, seed=seed + b)
        if fmt.has_global_scales and b == 0:
            layer.k_scale = fmt.calibrate(k)
            layer.v_scale = fmt.calibrate(v)
        t = np.arange(n)
        slots = tables[b, t // block_size].astype(np.int64) * block_size + t % block_size
        kvkit.write_kv(layer, k, v, slots)
        kd, vd = kvkit.dequantize(layer, slots)
        ks.append(kd)
        vs.append(vd)
    return layer, tables, np.array(lens, np.int32), ks, vs


def reference(q, ks, vs, **opts):
    outs, lses = zip(*(attention_f64(q[b], ks[b], vs[b], **opts) for b in range(q.shape[0])))
    return np.stack(outs), np.stack(lses)


@st.composite
def decode_cases(draw):
    name = draw(st.sampled_from(formats.names()))
    group = draw(st.sampled_from([1, 4, 8]))
    q_len = draw(st.sampled_from([1, 4]))
    block_size = draw(st.sampled_from([16, 32]))
    residue = draw(st.sampled_from([0, 1, block_size - 1]))
    lens = [
        max(q_len, draw(st.integers(0, 4)) * block_size + residue)
        for _ in range(draw(st.integers(1, 3)))
    ]
    splits = draw(st.sampled_from([1, 3, MAX_SPLITS]))
    window = draw(st.sampled_from([None, 1, 5, block_size + 3]))
    sinks = draw(st.booleans())
    softcap = draw(st.sampled_from([None, 5.0]))
    seed = draw(st.integers(0, 1000))
    return name, group, q_len, block_size, lens, splits, window, sinks, softcap, seed


@given(decode_cases())
def test_decode_equals_float64_attention_over_the_dequantized_cache(case):
    name, group, q_len, bs, lens, splits, window, use_sinks, softcap, seed = case
    layer, tables, seq_lens, ks, vs = build(name, bs, lens, seed)
    hq = HKV * group
    q = llm_like_queries(len(lens), hq, HEAD_DIM, seed=seed, q_len=q_len, num_kv_heads=HKV)
    q = q.reshape(len(lens), q_len, hq, HEAD_DIM).astype(np.float32)
    sinks = np.linspace(-1.0, 2.0, hq).astype(np.float32) if use_sinks else None
    opts = dict(window=window, sinks=sinks, softcap=softcap)
    o, lse = kvkit.decode(q, layer, tables, seq_lens, num_splits=splits, return_lse=True, **opts)
    ref_o, ref_lse = reference(q, ks, vs, scale=1 / np.sqrt(HEAD_DIM), **opts)
    assert o.shape == q.shape and o.dtype == np.float32
    assert rel_error(o, ref_o) <= DECODE_CPU_RTOL
    np.testing.assert_allclose(lse, ref_lse, rtol=DECODE_CPU_RTOL, atol=DECODE_CPU_RTOL)


@pytest.mark.parametrize("name", formats.names())
@pytest.mark.parametrize("group", [1, 4, 8])
def test_decode_grid_single_token_all_split_counts_agree(name, group):
    bs = 16
    lens = [16 * 5, 16 * 3 + 1, 16 * 7 - 1]  # seq_len % block in {0, 1, block - 1}
    layer, tables, seq_lens, ks, vs = build(name, bs, lens, seed=group)
    q = llm_like_queries(3, HKV * group, HEAD_DIM, seed=7, num_kv_heads=HKV).astype(np.float16)
    ref_o, _ = reference(q[:, None].astype(np.float32), ks, vs)
    outs = []
    for splits in (1, 3, MAX_SPLITS, None):
        o = kvkit.decode(q, layer, tables, seq_lens, num_splits=splits)
        assert o.shape == q.shape
        assert rel_error(o, ref_o[:, 0]) <= DECODE_CPU_RTOL, splits
        outs.append(o)
    for o in outs[1:]:
        assert rel_error(o, outs[0]) <= SPLIT_INVARIANCE_RTOL


def test_decode_error_against_unquantized_attention_orders_by_bits():
    # A sanity check of the formats, not of the kernel: against attention on the original
    # K/V, fewer bits give larger output error, and fp16 is within its rounding.
    errs = {}
    for name in ("fp16", "fp8_e4m3", "turboquant_4bit_nc", "turboquant_3bit_nc"):
        layer, tables, seq_lens, _, _ = build(name, 16, [200], seed=3)
        k, v = llm_like_kv(200, HKV, HEAD_DIM, seed=3)
        q = llm_like_queries(1, 8, HEAD_DIM, seed=3, num_kv_heads=HKV)
        o = kvkit.decode(q, layer, tables, seq_lens)
        ref, _ = attention_f64(q, k, v)
        errs[name] = rel_error(o, ref[0][None])
    assert errs["fp16"] <= FP16_CACHE_OUTPUT_RTOL
    assert errs["fp16"] < errs["fp8_e4m3"] < errs["turboquant_4bit_nc"] < errs["turboquant_3bit_nc"]
