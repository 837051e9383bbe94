"""Split-K work partitioning for decode, shared by the Numba and CUDA backends.

Pure Python on purpose: the CUDA launcher sizes its grid and its partial-state buffers from
these functions on the host, and the Numba kernel compiles `page_range` itself, so both
backends cut a sequence into exactly the same page-aligned pieces.
"""

from __future__ import annotations

from functools import lru_cache

from kvkit._checks import check_int

__all__ = ["MAX_SPLITS", "choose_num_splits", "page_range", "split_page_range"]

#: Upper bound on splits per (sequence, KV head). The split count depends only on shapes
#: (batch, heads, max_blocks * block_size, never the device-side seq_lens), so a planned step
#: (kvkit.DecodePlan) keeps its grid and partial buffers across CUDA-graph replays. One
#: sequence with 8 KV heads on an H200 (132 SMs x 4 resident stage-1 CTAs) fills its 528 CTA
#: slots with 64 splits (512 CTAs); a cap of 32 left half of them empty at B = 1 (256 CTAs,
#: measured 16-21% of copy bandwidth at (1, 131072)); 128 leaves room for models with fewer
#: KV heads.
MAX_SPLITS = 128

#: Work items per worker the heuristic aims for: more than one wave hides the tail of
#: uneven sequence lengths, more than a few only adds merge traffic.
_TARGET_WAVES = 2


def page_range(seq_len, block_size, num_splits, split):
    """Pages [first, end) of split `split`; no validation (the Numba kernel compiles this).

    All arguments are non-negative ints with block_size >= 1 and num_splits >= 1.
    Returns (first_page, end_page); the split is empty when first_page >= end_page.
    """
    n_pages = (seq_len + block_size - 1) // block_size
    pages_per_split = (n_pages + num_splits - 1) // num_splits
    first = split * pages_per_split
    end = min(first + pages_per_split, n_pages)
    return first, end


def split_page_range(seq_len: int, block_size: int, num_splits: int, split: int) -> tuple[int, int]:
    """Page range of one split of one sequence.

    n_pages = ceil(seq_len / block_size), pages_per_split = ceil(n_pages / num_splits);
    split s covers pages [s * pages_per_split, min((s + 1) * pages_per_split, n_pages)).
    Splits are page-aligned so every page (and every compressed byte in it) belongs to
    exactly one split.

    Args:
        seq_len: int >= 0, tokens in the sequence.
        block_size: int >= 1, tokens per page.
        num_splits: int >= 1.
        split: int in [0, num_splits).

    Returns:
        (first_page, end_page) as ints, indices into the sequence's block-table row; the
        split is empty when first_page >= end_page (then end_page may be < first_page).
    """
    seq_len = check_int("seq_len", seq_len, 0)
    block_size = check_int("block_size", block_size, 1)
    num_splits = check_int("num_splits", num_splits, 1)
    split = check_int("split", split, 0)
    if split >= num_splits:
        raise ValueError(f"split must be < num_splits={num_splits}, got {split}")
    return page_range(seq_len, block_size, num_splits, split)


def choose_num_splits(
    batch: int,
    num_kv_heads: int,
    max_seq_len: int,
    block_size: int,
    *,
    num_workers: int,
    max_splits: int = MAX_SPLITS,
    min_split_tokens: int = 1,
    cta_overhead_tokens: int | None = None,
    merge_overhead_tokens: int = 0,
    fill_items: int = 1,
) -> int:
    """Number of splits per (sequence, KV head) for one decode step.

    Aims for about `_TARGET_WAVES` waves of (batch x kv_head x split) work items over
    `num_workers` (SMs on CUDA, threads on CPU), never more splits than max_seq_len has
    pages (a split without a page is pure merge overhead), never a split of fewer than
    min_split_tokens tokens' worth of whole pages (a CUDA CTA works in tiles of that many
    tokens: a smaller split leaves part of its tile idle) and never more than max_splits.
    The count is then trimmed so that the last split is not empty given the page rounding of
    `split_page_range`.

    Args:
        batch: int >= 1, sequences in the step.
        num_kv_heads: int >= 1.
        max_seq_len: int >= 0, longest sequence of the step in tokens.
        block_size: int >= 1, tokens per page.
        num_workers: int >= 1, parallel workers to fill.
        max_splits: int >= 1, the cap (the partial buffers' split axis is sized by it).
        min_split_tokens: int >= 1, the least tokens per split worth launching; splits
            hold whole pages, so the cap is ceil(n_pages / ceil(min_split_tokens /
            block_size)). With cta_overhead_tokens the model also gives each split whole
            units of that many pages.
        cta_overhead_tokens: None, or int >= 0: instead of aiming for `_TARGET_WAVES`, pick the
            count with the least modelled time, ceil(items x splits / num_workers) waves
            times (tokens per split + cta_overhead_tokens), a work item's fixed cost in
            tokens' worth of streaming (ties: fewer splits). Workers that run items in
            waves (CUDA CTA slots) lose a whole wave to a small remainder; the model sees it.
        merge_overhead_tokens: int >= 0, used with cta_overhead_tokens: the model's fixed
            cost of splitting at all (the merge of partial states, a second kernel), in the
            same tokens' worth, added to every count above 1 where batch x num_kv_heads >=
            fill_items (below that, one split leaves workers idle and the merge is cheap
            beside a lone item's streaming).
        fill_items: int >= 1, used with cta_overhead_tokens: the items that give every
            processor (SM) one; a count with fewer items x splits leaves some idle, and the
            model scales its time by fill_items / (items x splits). 1: no such term.

    Returns:
        int in [1, min(max_splits, max(1, ceil(max_seq_len / block_size)))].
    """
    batch = check_int("batch", batch, 1)
    num_kv_heads = check_int("num_kv_heads", num_kv_heads, 1)
    max_seq_len = check_int("max_seq_len", max_seq_len, 0)
    block_size = check_int("block_size", block_size, 1)
    num_workers = check_int("num_workers", num_workers, 1)
    max_splits = check_int("max_splits", max_splits, 1)
    min_split_tokens = check_int("min_split_tokens", min_split_tokens, 1)
    if cta_overhead_tokens is not None:
        cta_overhead_tokens = check_int("cta_overhead_tokens", cta_overhead_tokens, 0)
    merge_overhead_tokens = check_int("merge_overhead_tokens", merge_overhead_tokens, 0)
    fill_items = check_int("fill_items", fill_items, 1)

    n_pages = max(1, -(-max_seq_len // block_size))
    items = batch * num_kv_heads
    pages_per_unit = -(-min_split_tokens // block_size)
    cap = max(1, min(max_splits, -(-n_pages // pages_per_unit)))
    if cta_overhead_tokens is not None:
        return _least_wave_time(items, n_pages, block_size, num_workers, cap,
                                cta_overhead_tokens, merge_overhead_tokens, fill_items,
                                pages_per_unit)  # fmt: skip
    # Rounded down: a fraction of a wave more is a whole extra wave of (short) items.
    splits = min(max(1, (_TARGET_WAVES * num_workers) // items), cap)
    # E.g. 10 pages in 4 splits gives 3 pages per split and 4 non-empty splits, but 10 pages
    # in 6 splits gives 2 pages per split and only 5 non-empty ones: return the 5.
    pages_per_split = -(-n_pages // splits)
    return -(-n_pages // pages_per_split)


@lru_cache(maxsize=1024)
def _least_wave_time(
    items: int,
    n_pages: int,
    block_size: int,
    workers: int,
    cap: int,
    overhead: int,
    merge: int = 0,
    fill: int = 1,
    unit: int = 1,
) -> int:
    """choose_num_splits' wave model: the split count in [1, cap] (after the last-split
    trimming) with the least waves x (tokens per split + overhead), times fill / (items x
    splits) where that is above 1, plus merge above one split where items >= fill. Splits
    hold whole units of `unit` pages (a CTA's work comes in units of min_split_tokens: a
    part unit costs a whole one), so e.g. 8192 pages in units of 8 take 64 splits of 128
    pages rather than 66 of 125."""
    best_cost, best = None, 1
    for wanted in range(1, cap + 1):
        pages_per_split = -(-n_pages // wanted)
        pages_per_split = -(-pages_per_split // unit) * unit
        splits = -(-n_pages // pages_per_split)
        cost = -(-(items * splits) // workers) * (pages_per_split * block_size + overhead)
        if items * splits < fill:
            cost = cost * fill / (items * splits)
        if splits > 1 and items >= fill:
            cost += merge
        if best_cost is None or cost < best_cost:
            best_cost, best = cost, splits
    return best
