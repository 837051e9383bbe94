"""kvkit.cpu.merge.merge_states: combining attention over disjoint key sets."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvkit.cpu.decode import decode_stage1, merge_splits
from kvkit.cpu.merge import merge_states
from kvkit.testing.reference import attention_f64
from kvkit.testing.tolerance import DECODE_CPU_RTOL, lse_error, rel_error


@given(
    sizes=st.lists(st.integers(0, 40), min_size=1, max_size=5),
    num_heads=st.sampled_from([1, 4]),
    peak=st.sampled_from([1.0, 4.0]),
    seed=st.integers(0, 2**32 - 1),
)
def test_merge_of_disjoint_parts_equals_full_attention(sizes, num_heads, peak, seed):
    rng = np.random.default_rng(seed)
    d = 64
    total = sum(sizes)
    q = rng.standard_normal((1, num_heads, d)).astype(np.float32)
    k = rng.standard_normal((total, 1, d)).astype(np.float32)
    v = rng.standard_normal((total, 1, d)).astype(np.float32)
    scale = peak / np.sqrt(d)
    # Parts are random (not contiguous) disjoint key subsets, some possibly empty.
    order = rng.permutation(total)
    parts_o, parts_lse = [], []
    start = 0
    for n in sizes:
        idx = np.sort(order[start : start + n])
        start += n
        if n == 0:
            # An empty part: lse = -inf, and o may be garbage (NaN) that must be ignored.
            parts_o.append(np.full((num_heads, d), np.nan, dtype=np.float32))
            parts_lse.append(np.full(num_heads, -np.inf, dtype=np.float32))
            continue
        # q_len = 1 sits at the last position, so it sees every key of the part.
        o_p, lse_p = attention_f64(q, k[idx], v[idx], scale=scale)
        parts_o.append(o_p[0].astype(np.float32))
        parts_lse.append(lse_p[0].astype(np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        o, lse = merge_states(np.stack(parts_o), np.stack(parts_lse))
    assert o.dtype == np.float32 and lse.dtype == np.float32
    assert o.shape == (num_heads, d) and lse.shape == (num_heads,)
    if total == 0:
        assert np.all(o == 0) and np.all(lse == -np.inf)
        return
    ref_o, ref_lse = attention_f64(q, k, v, scale=scale)
    assert rel_error(o, ref_o[0]) <= DECODE_CPU_RTOL
    assert lse_error(lse, ref_lse[0]) <= DECODE_CPU_RTOL


def test_all_empty_gives_zero_and_minus_inf():
    o = np.full((3, 2, 5, 8), np.nan, dtype=np.float32)
    lse = np.full((3, 2, 5), -np.inf, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, out_lse = merge_states(o, lse)
    assert out.shape == (2, 5, 8) and out_lse.shape == (2, 5)
    assert np.all(out == 0) and np.all(out_lse == -np.inf)


def test_single_part_is_identity():
    rng = np.random.default_rng(3)
    o = rng.standard_normal((1, 4, 16)).astype(np.float32)
    lse = rng.standard_normal((1, 4)).astype(np.float32)
    out, out_lse = merge_states(o, lse)
    np.testing.assert_array_equal(out, o[0])
    np.testing.assert_array_equal(out_lse, lse[0])


def test_two_parts_closed_form():
    # Parts with denominators e^0 = 1 and e^(log 3) = 3: weights 1/4 and 3/4.
    o = np.array([[[1.0, 0.0]], [[0.0, 1.0]]], dtype=np.float32)
    lse = np.array([[0.0], [np.log(3.0)]], dtype=np.float32)
    out, out_lse = merge_states(o, lse)
    assert rel_error(out, np.array([[0.25, 0.75]])) <= DECODE_CPU_RTOL
    assert lse_error(out_lse, [np.log(4.0)]) <= DECODE_CPU_RTOL


def test_unbatched_rows():
    o = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    lse = np.array([-np.inf, 0.5], dtype=np.float32)
    out, out_lse = merge_states(o, lse)
    np.testing.assert_array_equal(out, [3.0, 4.0])
    assert out_lse == np.float32(0.5)


def test_agrees_with_split_merge_of_decode():
    # merge_states over normalized split outputs == the decode's own stage-2 merge.
    rng = np.random.default_rng(5)
    bs, d, splits = 16, 32, 4
    k_pages = rng.standard_normal((6, 1, bs, d)).astype(np.float32)
    v_pages = rng.standard_normal((6, 1, bs, d)).astype(np.float32)
    q = rng.standard_normal((1, 1, 2, d)).astype(np.float32)
    block_tables = rng.permutation(6)[None].astype(np.int32)
    seq_lens = np.array([70], dtype=np.int32)
    m, l_sum, acc = decode_stage1(
        q, k_pages, v_pages, block_tables, seq_lens, scale=1 / np.sqrt(d), num_splits=splits
    )
    o_ref, lse_ref = merge_splits(m, l_sum, acc)
    with np.errstate(divide="ignore", invalid="ignore"):
        part_o = np.where(l_sum[..., None] > 0, acc / l_sum[..., None], np.float32(0))
        part_lse = m + np.log(l_sum)
    # (B, q_len, Hq, S[, D]) -> (S, B, q_len, Hq[, D])
    o, lse = merge_states(np.moveaxis(part_o, 3, 0), np.moveaxis(part_lse, 3, 0))
    assert rel_error(o, o_ref) <= DECODE_CPU_RTOL
    assert lse_error(lse, lse_ref) <= DECODE_CPU_RTOL


@pytest.mark.parametrize(
    "o, lse, exc",
    [
        (np.zeros((2, 3, 4), np.float32), np.zeros((2, 4), np.float32), ValueError),
        (np.zeros((2, 3, 4), np.int32), np.zeros((2, 3), np.float32), TypeError),
        (np.zeros((2, 3, 4), np.float32), np.zeros((2, 3), np.int64), TypeError),
        (np.zeros((0, 3, 4), np.float32), np.zeros((0, 3), np.float32), ValueError),
        (np.zeros(4, np.float32), np.zeros((), np.float32), ValueError),
    ],
)
def test_rejects_bad_arguments(o, lse, exc):
    with pytest.raises(exc):
        merge_states(o, lse)
