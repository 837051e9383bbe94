"""Format-agnostic split-K paged decode on the CPU (Numba).

Works on already-dequantized float32 pages: each format's CPU backend dequantizes its
planes (global scales applied) and hands the pages here, so one kernel serves every format
and is the numerical twin of the CUDA decode (DESIGN.md sections 4 and 5):

- stage 1, one work item per (batch, kv_head, split): online softmax state (m, l, acc) in
  float32 for all G = Hq / Hkv query heads and all q_len queries of that KV head, so every
  page is read once per step, as in the CUDA kernel;
- stage 2, one row per (batch, query, head): merge the splits (and the sink logit).

All arithmetic is float32 with a fixed order (no fastmath), so results differ from float64
attention by float32 rounding only, and from another split count by reassociation only.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import njit, prange

from kvkit.cpu.jit import pick, serial_twin
from kvkit.decode_args import check_decode_args
from kvkit.splits import MAX_SPLITS, choose_num_splits, page_range

__all__ = ["decode_pages", "decode_stage1", "merge_splits"]

# The one page-partition rule, compiled from kvkit.splits so both backends share its source.
_page_range = njit(cache=True)(page_range)

_NEG_INF = np.float32(-np.inf)
_ZERO = np.float32(0.0)


@njit(cache=True)
def _dot(x, y):
    # Four interleaved float32 partial sums: a fixed order (deterministic without fastmath)
    # that rounds less than one running sum over D products and runs faster (independent
    # dependency chains).
    n = x.shape[0]
    a0 = _ZERO
    a1 = _ZERO
    a2 = _ZERO
    a3 = _ZERO
    n4 = n - n % 4
    for d in range(0, n4, 4):
        a0 += x[d] * y[d]
        a1 += x[d + 1] * y[d + 1]
        a2 += x[d + 2] * y[d + 2]
        a3 += x[d + 3] * y[d + 3]
    for d in range(n4, n):
        a0 += x[d] * y[d]
    return (a0 + a1) + (a2 + a3)


@njit(cache=True, parallel=True)
def _stage1_kernel(
    q,
    k_pages,
    v_pages,
    block_tables,
    seq_lens,
    scale,
    num_splits,
    window,
    softcap,
    m_out,
    l_out,
    acc_out,
):
    # window <= 0 and softcap <= 0 mean "off": Numba kernels take no Optional scalars here,
    # which keeps one compiled specialization for every option combination.
    batch, q_len, num_heads, head_dim = q.shape
    num_kv_heads = k_pages.shape[1]
    block_size = k_pages.shape[2]
    group = num_heads // num_kv_heads
    rows = q_len * group
    per_batch = num_kv_heads * num_splits
    for item in prange(batch * per_batch):
        b = item // per_batch
        kvh = (item % per_batch) // num_splits
        split = item % num_splits
        seq_len = seq_lens[b]
        first, end = _page_range(seq_len, block_size, num_splits, split)

        m = np.full(rows, _NEG_INF, dtype=np.float32)
        l_sum = np.zeros(rows, dtype=np.float32)
        acc = np.zeros((rows, head_dim), dtype=np.float32)
        scores = np.empty(block_size, dtype=np.float32)
        page_acc = np.empty(head_dim, dtype=np.float32)

        for page_idx in range(first, end):
            page = block_tables[b, page_idx]
            t0 = page_idx * block_size
            t_last = min(t0 + block_size, seq_len) - 1
            for i in range(q_len):
                pos = seq_len - q_len + i
                lo = t0
                if window > 0:
                    lo = max(lo, pos - window + 1)
                hi = min(pos, t_last)
                if lo > hi:
                    continue
                for g in range(group):
                    h = kvh * group + g
                    r = i * group + g
                    # Page-wise online softmax: one rescale of acc per page, not per token.
                    m_page = _NEG_INF
                    q_row = q[b, i, h]
                    for t in range(lo, hi + 1):
                        off = t - t0
                        s = scale * _dot(q_row, k_pages[page, kvh, off])
                        if softcap > _ZERO:
                            s = softcap * np.float32(math.tanh(s / softcap))
                        scores[off] = s
                        if s > m_page:
                            m_page = s
                    m_new = max(m[r], m_page)
                    # exp(-inf - finite) = 0 clears the empty initial state without a branch.
                    alpha = np.float32(math.exp(m[r] - m_new))
                    # Two-level sums (tokens of this page, then pages) keep the float32
                    # error growing with the page count rather than the token count.
                    l_page = _ZERO
                    page_acc[:] = _ZERO
                    for t in range(lo, hi + 1):
                        off = t - t0
                        p = np.float32(math.exp(scores[off] - m_new))
                        l_page += p
                        v_row = v_pages[page, kvh, off]
                        for d in range(head_dim):
                            page_acc[d] += p * v_row[d]
                    l_sum[r] = l_sum[r] * alpha + l_page
                    for d in range(head_dim):
                        acc[r, d] = acc[r, d] * alpha + page_acc[d]
                    m[r] = m_new

        for i in range(q_len):
            for g in range(group):
                h = kvh * group + g
                r = i * group + g
                m_out[b, i, h, split] = m[r]
                l_out[b, i, h, split] = l_sum[r]
                for d in range(head_dim):
                    acc_out[b, i, h, split, d] = acc[r, d]


@njit(cache=True, parallel=True)
def _merge_kernel(m, l_sum, acc, sinks, has_sinks, o, lse):
    batch, q_len, num_heads, num_splits = m.shape
    head_dim = acc.shape[4]
    per_batch = q_len * num_heads
    for row in prange(batch * per_batch):
        b = row // per_batch
        i = (row % per_batch) // num_heads
        h = row % num_heads
        big_m = _NEG_INF
        for s in range(num_splits):
            big_m = max(big_m, m[b, i, h, s])
        if has_sinks:
            big_m = max(big_m, sinks[h])
        if big_m == _NEG_INF:
            # Nothing visible and no sink: defined as o = 0, lse = -inf (no 0/0).
            for d in range(head_dim):
                o[b, i, h, d] = _ZERO
            lse[b, i, h] = _NEG_INF
            continue
        total = _ZERO
        for d in range(head_dim):
            o[b, i, h, d] = _ZERO
        for s in range(num_splits):
            ms = m[b, i, h, s]
            if ms == _NEG_INF:
                continue
            w = np.float32(math.exp(ms - big_m))
            total += l_sum[b, i, h, s] * w
            for d in range(head_dim):
                o[b, i, h, d] += acc[b, i, h, s, d] * w
        if has_sinks:
            total += np.float32(math.exp(sinks[h] - big_m))
        for d in range(head_dim):
            o[b, i, h, d] /= total
        lse[b, i, h] = big_m + np.float32(math.log(total))


#: Serial twins for small calls (kvkit.cpu.jit.serial_twin says why). 2^20 multiply-adds run
#: serially in about a millisecond, the same order as waking the thread pool.
PARALLEL_MIN_WORK = 1 << 20
_stage1_serial = serial_twin(_stage1_kernel)
_merge_serial = serial_twin(_merge_kernel)


def decode_stage1(
    q, k_pages, v_pages, block_tables, seq_lens, *, scale, num_splits, window=None, softcap=None
):
    """Stage 1 of split-K decode: per-split online-softmax state. No argument checks.

    Args:
        q: (B, q_len, Hq, D) float32.
        k_pages, v_pages: (P, Hkv, block_size, D) float32, dequantized pages.
        block_tables: (B, max_blocks) int32; seq_lens: (B,) int32.
        scale: softmax scale (float); logits are scale * dot(q, k) in float32.
        num_splits: int >= 1; split s covers `kvkit.splits.split_page_range(..., s)`.
        window: int >= 1 or None; softcap: float > 0 or None (see `decode_pages`).

    Returns:
        m: (B, q_len, Hq, S) float32, running max logit per split (-inf when empty);
        l: (B, q_len, Hq, S) float32, sum of exp(logit - m) (0 when empty);
        acc: (B, q_len, Hq, S, D) float32, unnormalized sum of exp(logit - m) * v.
    """
    q = np.ascontiguousarray(q, dtype=np.float32)
    k_pages = np.ascontiguousarray(k_pages, dtype=np.float32)
    v_pages = np.ascontiguousarray(v_pages, dtype=np.float32)
    block_tables = np.ascontiguousarray(block_tables, dtype=np.int32)
    seq_lens = np.ascontiguousarray(seq_lens, dtype=np.int32)
    batch, q_len, num_heads, head_dim = q.shape
    num_splits = int(num_splits)
    m = np.empty((batch, q_len, num_heads, num_splits), dtype=np.float32)
    l_sum = np.empty_like(m)
    acc = np.empty((batch, q_len, num_heads, num_splits, head_dim), dtype=np.float32)
    # Work of the call: query rows x tokens x D multiply-adds (tokens bounded by the tables).
    work = batch * q_len * num_heads * block_tables.shape[1] * k_pages.shape[2] * head_dim
    pick(_stage1_kernel, _stage1_serial, work, PARALLEL_MIN_WORK)(
        q,
        k_pages,
        v_pages,
        block_tables,
        seq_lens,
        np.float32(scale),
        np.int64(num_splits),
        np.int64(0 if window is None else window),
        np.float32(0.0 if softcap is None else softcap),
        m,
        l_sum,
        acc,
    )
    return m, l_sum, acc


def merge_splits(m, l, acc, *, sinks=None):
    """Stage 2 of split-K decode: merge per-split states (and sink logits) in float32.

    M = max(max_s m_s, sink_h); L = sum_s l_s exp(m_s - M) + exp(sink_h - M);
    o = sum_s acc_s exp(m_s - M) / L; lse = M + log(L). Rows with nothing visible and no
    sink give o = 0, lse = -inf, without NaN or warnings.

    Args:
        m, l: (B, q_len, Hq, S) float32; acc: (B, q_len, Hq, S, D) float32 (`decode_stage1`).
        sinks: (Hq,) float32 per-head sink logits or None; they join the denominator only.

    Returns:
        o: (B, q_len, Hq, D) float32; lse: (B, q_len, Hq) float32, natural log.
    """
    m = np.ascontiguousarray(m, dtype=np.float32)
    l_sum = np.ascontiguousarray(l, dtype=np.float32)
    acc = np.ascontiguousarray(acc, dtype=np.float32)
    batch, q_len, num_heads, _ = m.shape
    has_sinks = sinks is not None
    sinks_arr = (
        np.ascontiguousarray(sinks, dtype=np.float32)
        if has_sinks
        else np.zeros(num_heads, dtype=np.float32)
    )
    o = np.empty((batch, q_len, num_heads, acc.shape[4]), dtype=np.float32)
    lse = np.empty((batch, q_len, num_heads), dtype=np.float32)
    pick(_merge_kernel, _merge_serial, acc.size, PARALLEL_MIN_WORK)(
        m, l_sum, acc, sinks_arr, has_sinks, o, lse
    )
    return o, lse


def decode_pages(
    q,
    k_pages,
    v_pages,
    block_tables,
    seq_lens,
    *,
    scale,
    num_splits,
    window=None,
    sinks=None,
    softcap=None,
):
    """Paged attention decode over dequantized float32 pages (split-K, two stages).

    Query i of sequence b sits at position p = seq_lens[b] - q_len + i and attends to
    tokens t <= p (and p - window < t when `window` is set); token t lives in page
    block_tables[b, t // block_size] at offset t % block_size. Query head h reads KV head
    h // (Hq // Hkv).

    Args:
        q: (B, q_len, Hq, D) float32 (float16 / bfloat16 are accepted and widened).
        k_pages, v_pages: (P, Hkv, block_size, D) float32, global scales already applied.
        block_tables: (B, max_blocks) int32, entries in [0, P) for the pages in use.
        seq_lens: (B,) int32, q_len <= seq_len <= max_blocks * block_size.
        scale: finite float > 0; logits s = scale * dot(q, k) in float32.
        num_splits: int in [1, MAX_SPLITS], or None to pick with
            `kvkit.splits.choose_num_splits` over Numba's thread count.
        window: int >= 1 or None, sliding window length (the query's own token included).
        sinks: (Hq,) floating or None, per-head sink logits (denominator only).
        softcap: float > 0 or None; s = softcap * tanh(s / softcap).

    Returns:
        o: (B, q_len, Hq, D) float32; lse: (B, q_len, Hq) float32, natural log.

    Raises:
        TypeError / ValueError from `kvkit.decode_args.check_decode_args`, or for pages
        that are not 4-D float32 arrays of matching shape.
    """
    for name, pages in (("k_pages", k_pages), ("v_pages", v_pages)):
        if not isinstance(pages, np.ndarray) or pages.dtype != np.float32 or pages.ndim != 4:
            raise TypeError(f"{name} must be a 4-D float32 NumPy array (P, Hkv, block_size, D)")
    if k_pages.shape != v_pages.shape:
        raise ValueError(f"k_pages {k_pages.shape} and v_pages {v_pages.shape} differ in shape")
    if not isinstance(q, np.ndarray) or q.ndim != 4:
        raise ValueError("q must be a (B, q_len, Hq, D) NumPy array")
    num_blocks, num_kv_heads, block_size, head_dim = k_pages.shape
    batch, q_len, _ = check_decode_args(
        q,
        block_tables,
        seq_lens,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        num_blocks=num_blocks,
        block_size=block_size,
        scale=scale,
        num_splits=num_splits,
        window=window,
        sinks=sinks,
        softcap=softcap,
    )
    if num_splits is None:
        max_len = int(np.max(seq_lens)) if batch else 0
        num_splits = choose_num_splits(
            max(batch, 1),
            num_kv_heads,
            max_len,
            block_size,
            num_workers=numba.get_num_threads(),
            max_splits=MAX_SPLITS,
        )
    m, l_sum, acc = decode_stage1(
        q,
        k_pages,
        v_pages,
        block_tables,
        seq_lens,
        scale=scale,
        num_splits=num_splits,
        window=window,
        softcap=softcap,
    )
    return merge_splits(m, l_sum, acc, sinks=sinks)
