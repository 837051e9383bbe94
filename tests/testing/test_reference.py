"""kvkit.testing.reference against closed forms on tiny cases.

These are exact-arithmetic facts computed by hand, so the comparisons use float64 round-off
bounds from numpy's own epsilon (the tolerance module covers kernel-vs-reference bounds).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvkit.testing.reference import attention_f64, paged_attention_f64

EPS64 = 8 * np.finfo(np.float64).eps  # a few float64 roundings in a 2-term softmax


def _close(a, b):
    np.testing.assert_allclose(a, b, rtol=EPS64, atol=EPS64)


def _two_tokens(a):
    """q = [1, 0]; keys [0, 0] and [a, 0]; values [1, 0] and [0, 1]: logits 0 and a."""
    q = np.array([[[1.0, 0.0]]])
    k = np.array([[[0.0, 0.0]], [[a, 0.0]]])
    v = np.array([[[1.0, 0.0]], [[0.0, 1.0]]])
    return q, k, v


def test_two_token_softmax_closed_form():
    a = 0.7
    q, k, v = _two_tokens(a)
    o, lse = attention_f64(q, k, v, scale=1.0)
    w1 = 1.0 / (1.0 + math.exp(-a))  # sigmoid(a): weight of the second token
    _close(o[0, 0], [1.0 - w1, w1])
    _close(lse[0, 0], math.log(1.0 + math.exp(a)))
    assert o.dtype == np.float64 and o.shape == (1, 1, 2) and lse.shape == (1, 1)


def test_default_scale_is_inverse_sqrt_head_dim():
    q, k, v = _two_tokens(0.7)
    o_default, lse_default = attention_f64(q, k, v)
    o, lse = attention_f64(q, k, v, scale=1.0 / math.sqrt(2.0))
    _close(o_default, o)
    _close(lse_default, lse)


def test_causal_offsets_for_multi_token_queries():
    # Two queries over two tokens: query 0 sits at position 0 and sees only token 0.
    q = np.array([[[1.0, 0.0]], [[1.0, 0.0]]])
    _, k, v = _two_tokens(0.7)
    o, lse = attention_f64(q, k, v, scale=1.0)
    _close(o[0, 0], [1.0, 0.0])
    _close(lse[0, 0], 0.0)
    w1 = 1.0 / (1.0 + math.exp(-0.7))
    _close(o[1, 0], [1.0 - w1, w1])


def test_window_one_sees_only_its_own_token():
    q, k, v = _two_tokens(0.7)
    o, lse = attention_f64(q, k, v, scale=1.0, window=1)
    _close(o[0, 0], [0.0, 1.0])
    _close(lse[0, 0], 0.7)
    # A window as long as the sequence changes nothing.
    o2, lse2 = attention_f64(q, k, v, scale=1.0, window=2)
    o3, lse3 = attention_f64(q, k, v, scale=1.0)
    _close(o2, o3)
    _close(lse2, lse3)


def test_sink_enters_the_denominator_only():
    a, sink = 0.7, -0.3
    q, k, v = _two_tokens(a)
    o, lse = attention_f64(q, k, v, scale=1.0, sinks=np.array([sink]))
    den = 1.0 + math.exp(a) + math.exp(sink)
    _close(o[0, 0], [1.0 / den, math.exp(a) / den])
    _close(lse[0, 0], math.log(den))
    # A -inf sink is no sink.
    o2, lse2 = attention_f64(q, k, v, scale=1.0, sinks=np.array([-np.inf]))
    o3, lse3 = attention_f64(q, k, v, scale=1.0)
    _close(o2, o3)
    _close(lse2, lse3)


def test_softcap_squashes_logits():
    a, cap = 30.0, 5.0
    q, k, v = _two_tokens(a)
    o, lse = attention_f64(q, k, v, scale=1.0, softcap=cap)
    capped = cap * math.tanh(a / cap)
    w1 = 1.0 / (1.0 + math.exp(-capped))
    _close(o[0, 0], [1.0 - w1, w1])
    _close(lse[0, 0], math.log(1.0 + math.exp(capped)))


def test_gqa_head_mapping():
    # 4 query heads on 2 KV heads: heads 0, 1 read KV head 0 and heads 2, 3 read KV head 1.
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 8))
    k = rng.standard_normal((5, 2, 8))
    v = rng.standard_normal((5, 2, 8))
    o, lse = attention_f64(q, k, v)
    for h in range(4):
        o_h, lse_h = attention_f64(
            q[:, h : h + 1], k[:, h // 2 : h // 2 + 1], v[:, h // 2 : h // 2 + 1]
        )
        _close(o[:, h], o_h[:, 0])
        _close(lse[:, h], lse_h[:, 0])


def test_single_token_copies_value():
    q = np.array([[[3.0, -1.0]]])
    k = np.array([[[0.5, 2.0]]])
    v = np.array([[[4.0, 5.0]]])
    o, lse = attention_f64(q, k, v, scale=0.5)
    _close(o[0, 0], [4.0, 5.0])
    _close(lse[0, 0], 0.5 * (1.5 - 2.0))


def test_rejects_sequence_shorter_than_queries():
    q = np.zeros((3, 1, 2))
    k = np.zeros((2, 1, 2))
    with pytest.raises(ValueError):
        attention_f64(q, k, k)


def test_paged_gather_matches_contiguous():
    rng = np.random.default_rng(1)
    block_size, num_pages, hkv, d = 4, 7, 2, 8
    k_pages = rng.standard_normal((num_pages, hkv, block_size, d))
    v_pages = rng.standard_normal((num_pages, hkv, block_size, d))
    perm = rng.permutation(num_pages)
    block_tables = np.stack([perm[:3], perm[3:6]]).astype(np.int32)
    seq_lens = np.array([9, 12], dtype=np.int32)
    q = rng.standard_normal((2, 2, 4, d))
    o, lse = paged_attention_f64(q, k_pages, v_pages, block_tables, seq_lens, window=5)
    for b in range(2):
        rows = [(block_tables[b, t // block_size], t % block_size) for t in range(seq_lens[b])]
        k = np.stack([k_pages[p, :, s] for p, s in rows])
        v = np.stack([v_pages[p, :, s] for p, s in rows])
        o_b, lse_b = attention_f64(q[b], k, v, window=5)
        _close(o[b], o_b)
        _close(lse[b], lse_b)


def test_rel_frobenius_and_text_table():
    from kvkit.testing.tolerance import rel_frobenius
    from kvkit.texttable import render_table

    ref = np.array([[3.0, 4.0], [0.0, 0.0]])
    assert rel_frobenius(ref + np.array([[0.0, 0.5], [0.0, 0.0]]), ref) == 0.1
    assert rel_frobenius(np.ones(2), np.zeros(2)) == np.sqrt(2.0)
    lines = render_table([("name", "<"), ("x", ">")], [["a", "1.5"], ["long", "10.25"]])
    assert lines == ["name      x", "-----------", "a       1.5", "long  10.25"]
