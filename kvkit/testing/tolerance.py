"""Tolerance policy: every numerical test takes its bound from here, never from a literal.

The attention contract (DESIGN.md section 4): decode computes the same function as
"dequantize with the spec, then exact attention in float64"; a backend may add float32
rounding, nothing more. The bounds below are what float32 rounding of scores, softmax
state and accumulation can cost at the sizes the tests use. The tensor-core paths count as
float32 rounding by construction: every mma operand is exact in fp16/bf16 or a sum of
fp16/bf16 parts carrying at least 22 significant bits of the float32 value it stands for
(relative to the largest term of its accumulator), and every sum is a float32 one.
"""

from __future__ import annotations

import numpy as np

#: CPU (Numba) decode vs float64 attention over the same dequantized cache.
DECODE_CPU_RTOL = 1e-5
#: CUDA decode vs float64 attention over the same dequantized cache.
DECODE_GPU_RTOL = 1e-4
#: Two split counts of the same backend: float32 reassociation only.
SPLIT_INVARIANCE_RTOL = 1e-5
#: An fp16 cache vs float64 attention on the original K/V (LLM-like data, |k| up to ~20):
#: fp16 rounding of K (relative 2^-11) times peaked-softmax sensitivity.
FP16_CACHE_OUTPUT_RTOL = 5e-3
#: TurboQuant MSE distortion vs the published figure (relative).
DISTORTION_RTOL = 0.03
#: A float32 merge of partial states vs the float64 merge, relative to the weighted mean of
#: |o_s| (``merge_error``): a few float32 roundings per part and one exp per weight.
MERGE_RTOL = 1e-5


def _float64_pair(a, b) -> tuple[np.ndarray, np.ndarray]:
    """Both as float64 arrays of one shape (ValueError otherwise)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: {a.shape} vs {b.shape}")
    return a, b


def rel_error(out: np.ndarray, ref: np.ndarray) -> float:
    """Max over output rows of ||out - ref||_inf / ||ref||_inf, in float64.

    out, ref: (..., D). A row-normwise error: element-wise relative error is meaningless
    for attention outputs, whose entries can sit arbitrarily close to zero.
    A reference row that is all zeros is compared absolutely.
    """
    out, ref = _float64_pair(out, ref)
    if out.size == 0:
        return 0.0
    err = np.abs(out - ref).max(axis=-1)
    den = np.abs(ref).max(axis=-1)
    den = np.where(den > 0, den, 1.0)
    worst = err / den
    if not np.all(np.isfinite(worst)):
        return float("inf")
    return float(worst.max())


def rel_frobenius(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref||_F / ||ref||_F in float64 (absolute when ref is all zeros).

    A whole-array error for quality reports (demo, report), where single near-zero rows
    should not dominate as they can in ``rel_error``.
    """
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    den = float(np.linalg.norm(ref))
    err = float(np.linalg.norm(out - ref))
    return err / den if den > 0 else err


def lse_error(lse: np.ndarray, ref: np.ndarray) -> float:
    """Error of log-sum-exp values: |lse - ref| / max(|ref|, 1), worst entry, in float64.

    An absolute error in lse is a relative error in the softmax denominator, which is what
    float32 rounding perturbs; above magnitude 1 it is measured relative to |lse| because a
    float32 result itself carries an ulp of |lse|. Entries that are -inf in both (empty rows)
    count as exact; any other non-finite error (NaN, one-sided -inf) is inf.
    lse, ref: arrays of one shape.
    """
    lse, ref = _float64_pair(lse, ref)
    if lse.size == 0:
        return 0.0
    both_empty = (lse == -np.inf) & (ref == -np.inf)
    with np.errstate(invalid="ignore"):
        err = np.abs(lse - ref) / np.maximum(np.abs(ref), 1.0)
    err = np.where(both_empty, 0.0, err)
    return float(err.max()) if np.all(np.isfinite(err)) else float("inf")


def merge_error(out: np.ndarray, o: np.ndarray, lse: np.ndarray) -> float:
    """Error of a merge of partial attention states against the float64 merge of its inputs.

    out: (*batch, D) the merged o under test; o: (S, *batch, D) and lse: (S, *batch) its
    inputs. With w_s = exp(lse_s - max lse), the exact result is sum w_s o_s / sum w_s; the
    error of each entry is measured relative to sum w_s |o_s| / sum w_s, the magnitude its
    float32 rounding scales with. (Relative to the result itself the bound would be
    meaningless where the parts cancel: a weighted mean of O(1) values can be ~1e-3.) Rows
    with every part empty (lse all -inf) must be exactly 0. Returns the worst entry; inf for
    any NaN, or for a shape mismatch between out and the merge of o.
    """
    o = np.asarray(o, dtype=np.float64)
    lse = np.asarray(lse, dtype=np.float64)
    out = np.asarray(out, dtype=np.float64)
    if out.shape != o.shape[1:] or lse.shape != o.shape[:-1]:
        raise ValueError(f"shape mismatch: out {out.shape}, o {o.shape}, lse {lse.shape}")
    big_m = lse.max(axis=0)
    empty = big_m == -np.inf
    with np.errstate(invalid="ignore"):
        w = np.where(lse == -np.inf, 0.0, np.exp(lse - np.where(empty, 0.0, big_m)))
    parts = np.where(w[..., None] > 0, o, 0.0)
    total = np.where(empty, 1.0, w.sum(axis=0))[..., None]
    exact = (w[..., None] * parts).sum(axis=0) / total
    scale = (w[..., None] * np.abs(parts)).sum(axis=0) / total
    with np.errstate(invalid="ignore", divide="ignore"):
        err = np.abs(out - exact) / np.where(scale > 0, scale, 1.0)
    err = np.where(empty[..., None], np.abs(out), err)
    if err.size == 0:
        return 0.0
    return float(err.max()) if np.all(np.isfinite(err)) else float("inf")
