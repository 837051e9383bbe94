"""Merging partial attention results over disjoint key sets (cascade / shared prefixes).

Vectorized NumPy rather than a Numba kernel: the public `merge_states` takes any number of
batch dimensions, the work is a handful of memory-bound passes over S x (D + 1) floats per
row with S small, and NumPy keeps every operation in float32 without a compile step. The
split-K merge inside decode (`kvkit.cpu.decode.merge_splits`) is the Numba twin of the CUDA
stage 2; this function is the user-facing combinator for normalized partial outputs.
"""

from __future__ import annotations

import numpy as np

__all__ = ["merge_states"]


def merge_states(o, lse):
    """Combine S attention results computed over disjoint key sets into one.

    With M = max_s lse_s and w_s = exp(lse_s - M):
    o = sum_s w_s o_s / sum_s w_s and lse = M + log(sum_s w_s). Parts with lse = -inf
    (no visible key) get weight 0 and their o is ignored (even if it holds NaN); rows where
    every part is empty give o = 0 and lse = -inf, without NaN or warnings.

    Args:
        o: (S, *batch, D) floating, each part normalized over its own keys.
        lse: (S, *batch) floating, natural-log sum of exp(logits) of each part.

    Returns:
        o: (*batch, D) float32; lse: (*batch) float32. Computed in float32.

    Raises:
        TypeError for non-floating inputs; ValueError for mismatched shapes or S = 0.
    """
    o = np.asarray(o)
    lse = np.asarray(lse)
    for name, arr in (("o", o), ("lse", lse)):
        if not (np.issubdtype(arr.dtype, np.floating) or arr.dtype.name == "bfloat16"):
            raise TypeError(f"{name} must be a floating array, got {arr.dtype}")
    if o.ndim < 2:
        raise ValueError(f"o must be (S, *batch, D), got shape {o.shape}")
    if lse.shape != o.shape[:-1]:
        raise ValueError(f"lse must be o.shape[:-1] = {o.shape[:-1]}, got {lse.shape}")
    if o.shape[0] == 0:
        raise ValueError("merge_states needs at least one part (S >= 1)")
    o = o.astype(np.float32, copy=False)
    lse = lse.astype(np.float32, copy=False)

    big_m = lse.max(axis=0)
    empty = big_m == -np.inf
    # Shift by 0 where every part is empty so lse - shift stays -inf (weight 0), not NaN.
    shift = np.where(empty, np.float32(0.0), big_m)
    weights = np.exp(lse - shift)
    parts = np.where((weights > 0)[..., None], o, np.float32(0.0))
    total = weights.sum(axis=0)
    num = (weights[..., None] * parts).sum(axis=0)
    safe_total = np.where(empty, np.float32(1.0), total)
    out = np.where(empty[..., None], np.float32(0.0), num / safe_total[..., None])
    with np.errstate(divide="ignore"):
        out_lse = np.where(empty, np.float32(-np.inf), shift + np.log(safe_total))
    return out.astype(np.float32, copy=False), out_lse.astype(np.float32, copy=False)
