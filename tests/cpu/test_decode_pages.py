"""kvkit.cpu.decode: split-K paged decode vs float64 attention over the same pages."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kvkit.cpu.decode import decode_pages, decode_stage1, merge_splits
from kvkit.splits import MAX_SPLITS, split_page_range
from kvkit.testing.reference import paged_attention_f64
from kvkit.testing.tolerance import DECODE_CPU_RTOL, SPLIT_INVARIANCE_RTOL, lse_error, rel_error

SPLIT_COUNTS = (1, 3, MAX_SPLITS)


@st.composite
def decode_cases(draw):
    block_size = draw(st.sampled_from([16, 32, 64, 128]))
    q_len = draw(st.sampled_from([1, 4]))
    batch = draw(st.integers(1, 3))
    seq_lens = []
    for _ in range(batch):
        full = draw(st.integers(0, 4))
        rem = draw(st.sampled_from([0, 1, block_size - 1]))
        seq_lens.append(max(full * block_size + rem, q_len))
    return dict(
        block_size=block_size,
        group=draw(st.sampled_from([1, 4, 8])),
        num_kv_heads=draw(st.sampled_from([1, 2])),
        head_dim=draw(st.sampled_from([64, 128])),
        q_len=q_len,
        seq_lens=seq_lens,
        spare_blocks=draw(st.integers(0, 2)),
        window=draw(st.none() | st.integers(1, 3 * block_size)),
        sinks=draw(st.booleans()),
        softcap=draw(st.none() | st.sampled_from([5.0, 30.0])),
        # 1: logits ~ N(0, 1) as with q, k ~ N(0, 1) and scale 1/sqrt(D); 4: peaked softmax.
        peak=draw(st.sampled_from([1.0, 4.0])),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def build(case):
    """Arrays for a case: pages in a random permutation, unused table entries as garbage."""
    rng = np.random.default_rng(case["seed"])
    bs, hkv, d = case["block_size"], case["num_kv_heads"], case["head_dim"]
    hq = hkv * case["group"]
    seq_lens = np.array(case["seq_lens"], dtype=np.int32)
    batch = len(seq_lens)
    n_pages = [-(-int(s) // bs) for s in seq_lens]
    max_blocks = max(max(n_pages), 1) + case["spare_blocks"]
    num_blocks = sum(n_pages) + 3
    perm = rng.permutation(num_blocks)
    # Padding beyond a sequence's pages may hold anything; decode must never read it.
    block_tables = np.full((batch, max_blocks), -7, dtype=np.int32)
    used = 0
    for b, n in enumerate(n_pages):
        block_tables[b, :n] = perm[used : used + n]
        used += n
    # Keys with a few outlier channels, as in LLM caches; values zero-mean.
    k_pages = rng.standard_normal((num_blocks, hkv, bs, d)).astype(np.float32)
    k_pages[..., :4] *= 3.0
    v_pages = rng.standard_normal((num_blocks, hkv, bs, d)).astype(np.float32)
    q = rng.standard_normal((batch, case["q_len"], hq, d)).astype(np.float32)
    sinks = rng.standard_normal(hq).astype(np.float32) + 1.0 if case["sinks"] else None
    scale = case["peak"] / np.sqrt(d)
    opts = dict(scale=scale, window=case["window"], sinks=sinks, softcap=case["softcap"])
    return q, k_pages, v_pages, block_tables, seq_lens, opts


def _corner(block_size, rem, **kw):
    case = dict(
        block_size=block_size,
        group=4,
        num_kv_heads=2,
        head_dim=128,
        q_len=4,
        seq_lens=[3 * block_size + rem, block_size + rem, max(rem, 4)],
        spare_blocks=1,
        window=None,
        sinks=False,
        softcap=None,
        peak=1.0,
        seed=block_size + rem,
    )
    case.update(kw)
    return case


@given(case=decode_cases())
# Page-boundary corners: seq_len % block_size in {0, 1, block_size - 1}.
@example(case=_corner(16, 0))
@example(case=_corner(16, 1, window=17, sinks=True))
@example(case=_corner(128, 127, softcap=30.0, group=8, q_len=1))
@example(case=_corner(64, 1, window=1, peak=4.0))
def test_decode_matches_float64_and_is_split_invariant(case):
    q, k_pages, v_pages, block_tables, seq_lens, opts = build(case)
    ref_o, ref_lse = paged_attention_f64(q, k_pages, v_pages, block_tables, seq_lens, **opts)
    results = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for num_splits in SPLIT_COUNTS:
            o, lse = decode_pages(
                q, k_pages, v_pages, block_tables, seq_lens, num_splits=num_splits, **opts
            )
            assert o.dtype == np.float32 and lse.dtype == np.float32
            assert o.shape == q.shape and lse.shape == q.shape[:3]
            assert rel_error(o, ref_o) <= DECODE_CPU_RTOL, num_splits
            assert lse_error(lse, ref_lse) <= DECODE_CPU_RTOL, num_splits
            results.append((o, lse))
    o1, lse1 = results[0]
    for o, lse in results[1:]:
        assert rel_error(o, o1) <= SPLIT_INVARIANCE_RTOL
        assert lse_error(lse, lse1) <= SPLIT_INVARIANCE_RTOL


def test_stage1_empty_splits_are_neutral():
    case = _corner(16, 1, window=5)
    q, k_pages, v_pages, block_tables, seq_lens, opts = build(case)
    m, l_sum, acc = decode_stage1(
        q,
        k_pages,
        v_pages,
        block_tables,
        seq_lens,
        scale=opts["scale"],
        num_splits=MAX_SPLITS,
        window=opts["window"],
    )
    assert m.shape == l_sum.shape == q.shape[:3] + (MAX_SPLITS,)
    assert acc.shape == q.shape[:3] + (MAX_SPLITS, q.shape[3])
    for b, seq_len in enumerate(seq_lens):
        for s in range(MAX_SPLITS):
            first, end = split_page_range(int(seq_len), 16, MAX_SPLITS, s)
            # A window of 5 reaches back at most one page; splits without a page (or
            # before the window) are exactly (m=-inf, l=0, acc=0).
            if first >= end or end * 16 <= int(seq_len) - 4 - 5:
                assert np.all(m[b, :, :, s] == -np.inf)
                assert np.all(l_sum[b, :, :, s] == 0)
                assert np.all(acc[b, :, :, s] == 0)
    o, lse = merge_splits(m, l_sum, acc)
    o_ref, lse_ref = decode_pages(
        q, k_pages, v_pages, block_tables, seq_lens, num_splits=MAX_SPLITS, **opts
    )
    # Same kernels, same order: the two stages called separately give the same bits.
    np.testing.assert_array_equal(o, o_ref)
    np.testing.assert_array_equal(lse, lse_ref)


def test_merge_splits_nothing_visible():
    m = np.full((1, 1, 2, 3), -np.inf, dtype=np.float32)
    l_sum = np.zeros_like(m)
    acc = np.zeros(m.shape + (8,), dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        o, lse = merge_splits(m, l_sum, acc)
        assert np.all(o == 0) and np.all(lse == -np.inf)
        # With a sink and no visible token the sink takes all the mass: o = 0, lse = sink.
        sinks = np.array([0.5, -2.0], dtype=np.float32)
        o, lse = merge_splits(m, l_sum, acc, sinks=sinks)
        assert np.all(o == 0)
        np.testing.assert_array_equal(lse[0, 0], sinks)


def test_merge_splits_sink_above_all_logits():
    # The sink can be the maximum M: partial states are rescaled by exp(m - sink).
    m = np.array([[[[1.0, -np.inf]]]], dtype=np.float32)
    l_sum = np.array([[[[2.0, 0.0]]]], dtype=np.float32)
    acc = np.array([[[[[4.0, 2.0], [0.0, 0.0]]]]], dtype=np.float32)
    sink = 3.0
    o, lse = merge_splits(m, l_sum, acc, sinks=np.array([sink], dtype=np.float32))
    den = 2.0 * np.exp(1.0) + np.exp(sink)
    expected_o = np.array([4.0, 2.0]) * np.exp(1.0) / den
    assert rel_error(o[0, 0], expected_o[None]) <= DECODE_CPU_RTOL
    assert lse_error(lse[0, 0], [np.log(den)]) <= DECODE_CPU_RTOL


def test_half_precision_query_is_widened():
    q, k_pages, v_pages, block_tables, seq_lens, opts = build(_corner(32, 1))
    q16 = q.astype(np.float16)
    o16, lse16 = decode_pages(q16, k_pages, v_pages, block_tables, seq_lens, num_splits=3, **opts)
    o32, lse32 = decode_pages(
        q16.astype(np.float32), k_pages, v_pages, block_tables, seq_lens, num_splits=3, **opts
    )
    np.testing.assert_array_equal(o16, o32)
    np.testing.assert_array_equal(lse16, lse32)


def test_auto_split_count():
    q, k_pages, v_pages, block_tables, seq_lens, opts = build(_corner(16, 0))
    o, lse = decode_pages(q, k_pages, v_pages, block_tables, seq_lens, num_splits=None, **opts)
    ref_o, ref_lse = paged_attention_f64(q, k_pages, v_pages, block_tables, seq_lens, **opts)
    assert rel_error(o, ref_o) <= DECODE_CPU_RTOL
    assert lse_error(lse, ref_lse) <= DECODE_CPU_RTOL


def test_long_sequence_peaked():
    # A longer context (2k tokens) with one strongly preferred key per head.
    case = dict(
        block_size=64,
        group=4,
        num_kv_heads=1,
        head_dim=128,
        q_len=1,
        seq_lens=[2048 + 1],
        spare_blocks=0,
        window=None,
        sinks=True,
        softcap=None,
        peak=1.0,
        seed=7,
    )
    q, k_pages, v_pages, block_tables, seq_lens, opts = build(case)
    page, off = block_tables[0, 1000 // 64], 1000 % 64
    k_pages[page, 0, off] = 3.0 * q[0, 0, 0] / np.linalg.norm(q[0, 0, 0]) * np.sqrt(128)
    ref_o, ref_lse = paged_attention_f64(q, k_pages, v_pages, block_tables, seq_lens, **opts)
    for num_splits in SPLIT_COUNTS:
        o, lse = decode_pages(
            q, k_pages, v_pages, block_tables, seq_lens, num_splits=num_splits, **opts
        )
        assert rel_error(o, ref_o) <= DECODE_CPU_RTOL
        assert lse_error(lse, ref_lse) <= DECODE_CPU_RTOL


@pytest.mark.parametrize(
    "mutate, exc, match",
    [
        (lambda a: a.update(k_pages=a["k_pages"].astype(np.float64)), TypeError, "k_pages"),
        (lambda a: a.update(v_pages=a["v_pages"][:, :, :8]), ValueError, "v_pages"),
        (lambda a: a.update(q=a["q"][:, 0]), ValueError, "q"),
        (lambda a: a.update(seq_lens=a["seq_lens"].astype(np.int64)), TypeError, "seq_lens"),
        (lambda a: a.update(num_splits=MAX_SPLITS + 1), ValueError, "num_splits"),
    ],
)
def test_decode_pages_rejects_bad_arguments(mutate, exc, match):
    q, k_pages, v_pages, block_tables, seq_lens, opts = build(_corner(16, 1))
    args = dict(
        q=q,
        k_pages=k_pages,
        v_pages=v_pages,
        block_tables=block_tables,
        seq_lens=seq_lens,
        num_splits=2,
        **opts,
    )
    mutate(args)
    with pytest.raises(exc, match=match):
        decode_pages(
            args.pop("q"),
            args.pop("k_pages"),
            args.pop("v_pages"),
            args.pop("block_tables"),
            args.pop("seq_lens"),
            **args,
        )
