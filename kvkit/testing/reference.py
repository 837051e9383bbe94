"""Float64 attention written the plain way: the yardstick for every decode backend.

Deliberately shares no code with the kernels (no online softmax, no splits, no pages in
`attention_f64`): each query row gathers its visible keys, takes a max-shifted softmax in
float64 and one matrix product. DESIGN.md section 4: decode must equal this function over
the same dequantized K/V up to float32 rounding.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["attention_f64", "paged_attention_f64"]


def attention_f64(q, k, v, *, scale=None, window=None, sinks=None, softcap=None):
    """Exact causal attention for one sequence, in float64.

    Query i sits at position p = T - q_len + i and sees tokens t with t <= p and, when
    `window` is set, t > p - window. Query head h reads KV head h // (Hq // Hkv).
    Logits s = scale * <q, k>, then s = softcap * tanh(s / softcap) when `softcap` is set.
    A per-head sink logit adds exp(sink_h) to the softmax denominator and nothing to the
    numerator.

    Args:
        q: (q_len, Hq, D) real array.
        k, v: (T, Hkv, D) real arrays, T >= q_len.
        scale: float, default 1 / sqrt(D).
        window: int >= 1 or None.
        sinks: (Hq,) real array or None.
        softcap: float > 0 or None.

    Returns:
        o: (q_len, Hq, D) float64; lse: (q_len, Hq) float64, natural log of the softmax
        denominator (sink included). A row with no visible key and no sink is o = 0,
        lse = -inf.
    """
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    q_len, num_heads, head_dim = q.shape
    seq_len, num_kv_heads, _ = k.shape
    if v.shape != k.shape:
        raise ValueError(f"k {k.shape} and v {v.shape} must have the same shape")
    if k.shape[2] != head_dim or num_heads % num_kv_heads:
        raise ValueError(f"incompatible q {q.shape} and k {k.shape}")
    if seq_len < q_len:
        raise ValueError(f"need T >= q_len, got T={seq_len}, q_len={q_len}")
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    if sinks is not None:
        sinks = np.asarray(sinks, dtype=np.float64)
    group = num_heads // num_kv_heads

    o = np.zeros((q_len, num_heads, head_dim))
    lse = np.full((q_len, num_heads), -np.inf)
    for i in range(q_len):
        pos = seq_len - q_len + i
        start = 0 if window is None else max(0, pos - window + 1)
        for h in range(num_heads):
            keys = k[start : pos + 1, h // group, :]
            vals = v[start : pos + 1, h // group, :]
            logits = scale * (keys @ q[i, h])
            if softcap is not None:
                logits = softcap * np.tanh(logits / softcap)
            candidates = list(logits)
            if sinks is not None:
                candidates.append(sinks[h])
            if not candidates or max(candidates) == -np.inf:
                continue
            shift = max(candidates)
            weights = np.exp(logits - shift)
            denom = weights.sum()
            if sinks is not None:
                denom += math.exp(sinks[h] - shift)
            o[i, h] = (weights @ vals) / denom
            lse[i, h] = shift + math.log(denom)
    return o, lse


def paged_attention_f64(q, k_pages, v_pages, block_tables, seq_lens, **opts):
    """`attention_f64` for a batch whose K/V live in pages.

    Token t of sequence b is read from page block_tables[b, t // block_size] at offset
    t % block_size; the sequence's tokens are gathered into contiguous (T, Hkv, D) arrays
    first, so no paging logic reaches the attention itself.

    Args:
        q: (B, q_len, Hq, D) real array.
        k_pages, v_pages: (P, Hkv, block_size, D) real arrays.
        block_tables: (B, max_blocks) integer array; seq_lens: (B,) integer array.
        **opts: scale, window, sinks, softcap as in `attention_f64`.

    Returns:
        o: (B, q_len, Hq, D) float64; lse: (B, q_len, Hq) float64.
    """
    q = np.asarray(q)
    k_pages = np.asarray(k_pages)
    v_pages = np.asarray(v_pages)
    block_size = k_pages.shape[2]
    outs, lses = [], []
    for b in range(q.shape[0]):
        tokens = np.arange(int(seq_lens[b]))
        pages = np.asarray(block_tables[b])[tokens // block_size]
        offsets = tokens % block_size
        # Advanced indices on axes 0 and 2 around a slice put the token axis first:
        # (T, Hkv, D).
        k = k_pages[pages, :, offsets, :]
        v = v_pages[pages, :, offsets, :]
        o, lse = attention_f64(q[b], k, v, **opts)
        outs.append(o)
        lses.append(lse)
    shape_o = (0,) + q.shape[1:]
    if not outs:
        return np.zeros(shape_o), np.zeros(shape_o[:-1])
    return np.stack(outs), np.stack(lses)
