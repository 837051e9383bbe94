"""Host-side argument checks for paged decode, shared by the Numba and CUDA backends.

Split in two so the CUDA path can run the first half on every call without synchronizing:
`check_decode_shapes` looks only at shapes, dtypes and host scalars (works on CuPy arrays),
`check_decode_indices` reads block tables and sequence lengths (host NumPy; on the GPU the
kernels flag bad indices instead and `validate=True` raises them).
"""

from __future__ import annotations

import numpy as np

from kvkit._checks import check_int, check_positive_finite
from kvkit.splits import MAX_SPLITS

__all__ = ["check_decode_args", "check_decode_indices", "check_decode_shapes"]

_QUERY_DTYPES = ("float16", "float32", "bfloat16")


def _dtype_name(arr) -> str:
    dtype = getattr(arr, "dtype", None)
    return getattr(dtype, "name", str(dtype))


def check_decode_shapes(
    q,
    block_tables,
    seq_lens,
    *,
    num_kv_heads: int,
    head_dim: int,
    num_blocks: int,
    block_size: int,
    scale,
    num_splits,
    window,
    sinks,
    softcap,
) -> tuple[int, int, int]:
    """Check everything about a decode call that needs no read of array contents.

    Args:
        q: (B, q_len, Hq, D) or (B, Hq, D) (read as q_len = 1), float16 / float32 /
            bfloat16 (by dtype name, e.g. ml_dtypes.bfloat16).
        block_tables: (B, max_blocks) int32.
        seq_lens: (B,) int32.
        num_kv_heads, head_dim, num_blocks, block_size: ints >= 1 describing the cache.
        scale: finite real > 0.
        num_splits: int in [1, MAX_SPLITS], or None (the caller picks one).
        window: int >= 1 or None.
        sinks: (Hq,) floating array or None (only shape and dtype are looked at).
        softcap: finite real > 0 or None.

    Returns:
        (B, q_len, Hq).

    Raises:
        TypeError / ValueError naming the offending argument.
    """
    num_kv_heads = check_int("num_kv_heads", num_kv_heads, 1)
    head_dim = check_int("head_dim", head_dim, 1)
    check_int("num_blocks", num_blocks, 1)
    check_int("block_size", block_size, 1)

    for name, arr in (("q", q), ("block_tables", block_tables), ("seq_lens", seq_lens)):
        if not hasattr(arr, "shape") or not hasattr(arr, "dtype"):
            raise TypeError(f"{name} must be an array, got {type(arr).__name__}")

    if _dtype_name(q) not in _QUERY_DTYPES:
        raise TypeError(f"q must be float16, float32 or bfloat16, got {_dtype_name(q)}")
    if q.ndim == 3:
        batch, num_heads, d = q.shape
        q_len = 1
    elif q.ndim == 4:
        batch, q_len, num_heads, d = q.shape
    else:
        raise ValueError(f"q must be (B, q_len, Hq, D) or (B, Hq, D), got shape {q.shape}")
    if d != head_dim:
        raise ValueError(f"q head_dim {d} does not match the cache's head_dim {head_dim}")
    if q_len < 1:
        raise ValueError(f"q must hold at least one query per sequence, got q_len={q_len}")
    if num_heads < 1 or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"q's number of heads ({num_heads}) must be a positive multiple of "
            f"num_kv_heads ({num_kv_heads})"
        )

    if _dtype_name(block_tables) != "int32":
        raise TypeError(f"block_tables must be int32, got {_dtype_name(block_tables)}")
    if block_tables.ndim != 2 or block_tables.shape[0] != batch:
        raise ValueError(
            f"block_tables must be (B={batch}, max_blocks), got shape {block_tables.shape}"
        )
    if _dtype_name(seq_lens) != "int32":
        raise TypeError(f"seq_lens must be int32, got {_dtype_name(seq_lens)}")
    if seq_lens.shape != (batch,):
        raise ValueError(f"seq_lens must be (B={batch},), got shape {seq_lens.shape}")

    check_positive_finite("scale", scale)
    if num_splits is not None:
        check_int("num_splits", num_splits, 1)
        if num_splits > MAX_SPLITS:
            # Same bound on both backends (the CUDA heuristic's cap).
            raise ValueError(f"num_splits must be <= MAX_SPLITS={MAX_SPLITS}, got {num_splits}")
    if window is not None:
        check_int("window", window, 1)
    if softcap is not None:
        check_positive_finite("softcap", softcap)
    if sinks is not None:
        if not hasattr(sinks, "shape") or not hasattr(sinks, "dtype"):
            raise TypeError(f"sinks must be an array, got {type(sinks).__name__}")
        if _dtype_name(sinks) not in ("float16", "float32", "float64", "bfloat16"):
            raise TypeError(f"sinks must be a floating array, got {_dtype_name(sinks)}")
        if tuple(sinks.shape) != (num_heads,):
            raise ValueError(f"sinks must be (Hq={num_heads},), got shape {sinks.shape}")
    return batch, q_len, num_heads


def check_decode_indices(
    block_tables: np.ndarray,
    seq_lens: np.ndarray,
    *,
    q_len: int,
    num_blocks: int,
    block_size: int,
    sinks: np.ndarray | None = None,
) -> None:
    """Check the contents of block tables, sequence lengths (and sinks): reads the data.

    Only the pages a sequence actually uses (the first ceil(seq_len / block_size) entries
    of its row) must lie in [0, num_blocks); the rest of a row is padding and is ignored.

    Args:
        block_tables: (B, max_blocks) int32, host array (shape already checked).
        seq_lens: (B,) int32, host array.
        q_len: queries per sequence; every seq_len must be >= q_len.
        num_blocks: pages in the cache.
        block_size: tokens per page.
        sinks: (Hq,) floating or None; must not hold NaN or +inf (-inf means "no sink").

    Raises:
        ValueError naming the argument, the sequence and the offending value.
    """
    block_tables = np.asarray(block_tables)
    seq_lens = np.asarray(seq_lens)
    max_blocks = block_tables.shape[1]
    lens = seq_lens.astype(np.int64)

    bad = np.flatnonzero(lens < 0)
    if bad.size:
        b = int(bad[0])
        raise ValueError(f"seq_lens[{b}] = {lens[b]} is negative")
    bad = np.flatnonzero(lens < q_len)
    if bad.size:
        b = int(bad[0])
        raise ValueError(f"seq_lens[{b}] = {lens[b]} is shorter than q_len = {q_len}")
    capacity = max_blocks * block_size
    bad = np.flatnonzero(lens > capacity)
    if bad.size:
        b = int(bad[0])
        raise ValueError(
            f"seq_lens[{b}] = {lens[b]} exceeds the block table's capacity "
            f"{max_blocks} blocks x {block_size} tokens = {capacity}"
        )

    n_pages = (lens + block_size - 1) // block_size
    used = np.arange(max_blocks)[None, :] < n_pages[:, None]
    out_of_range = used & ((block_tables < 0) | (block_tables >= num_blocks))
    if out_of_range.any():
        b, j = (int(x) for x in np.argwhere(out_of_range)[0])
        raise ValueError(
            f"block_tables[{b}, {j}] = {int(block_tables[b, j])} is outside "
            f"[0, num_blocks={num_blocks}) but sequence {b} uses that page"
        )

    if sinks is not None:
        s = np.asarray(sinks, dtype=np.float64)
        if np.isnan(s).any() or np.isposinf(s).any():
            raise ValueError("sinks must not contain NaN or +inf")


def check_decode_args(
    q,
    block_tables,
    seq_lens,
    *,
    num_kv_heads: int,
    head_dim: int,
    num_blocks: int,
    block_size: int,
    scale,
    num_splits,
    window,
    sinks,
    softcap,
) -> tuple[int, int, int]:
    """All decode argument checks: `check_decode_shapes` then `check_decode_indices`.

    Arguments as in `check_decode_shapes`; block_tables, seq_lens and sinks must be host
    (NumPy) arrays for the second half. Returns (B, q_len, Hq).
    """
    batch, q_len, num_heads = check_decode_shapes(
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
    check_decode_indices(
        block_tables,
        seq_lens,
        q_len=q_len,
        num_blocks=num_blocks,
        block_size=block_size,
        sinks=sinks,
    )
    return batch, q_len, num_heads
