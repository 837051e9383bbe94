"""kvkit.splits: page-aligned split ranges and the split-count heuristic."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvkit.splits import MAX_SPLITS, choose_num_splits, page_range, split_page_range

block_sizes = st.sampled_from([16, 32, 64, 128])


@given(seq_len=st.integers(0, 5000), block_size=block_sizes, num_splits=st.integers(1, MAX_SPLITS))
def test_splits_partition_the_pages(seq_len, block_size, num_splits):
    n_pages = -(-seq_len // block_size)
    covered = []
    for s in range(num_splits):
        first, end = split_page_range(seq_len, block_size, num_splits, s)
        assert (first, end) == page_range(seq_len, block_size, num_splits, s)
        covered.extend(range(first, end))
    # Every page exactly once, in order: splits are contiguous and page-aligned.
    assert covered == list(range(n_pages))


def test_split_page_range_examples():
    # 10 pages in 4 splits: 3 pages each, the last one short.
    ranges = [split_page_range(10 * 16, 16, 4, s) for s in range(4)]
    assert ranges == [(0, 3), (3, 6), (6, 9), (9, 10)]
    # seq_len % block_size == 1 opens one more page.
    assert split_page_range(16 * 3 + 1, 16, 1, 0) == (0, 4)
    # More splits than pages: the tail splits are empty.
    first, end = split_page_range(20, 16, 8, 5)
    assert first >= end
    assert split_page_range(0, 16, 3, 0) == (0, 0)


@pytest.mark.parametrize(
    "args, exc",
    [
        ((-1, 16, 2, 0), ValueError),
        ((10, 0, 2, 0), ValueError),
        ((10, 16, 0, 0), ValueError),
        ((10, 16, 2, 2), ValueError),
        ((10, 16, 2, -1), ValueError),
        ((10.0, 16, 2, 0), TypeError),
        ((10, True, 2, 0), TypeError),
    ],
)
def test_split_page_range_rejects_bad_arguments(args, exc):
    with pytest.raises(exc):
        split_page_range(*args)


@given(
    batch=st.integers(1, 512),
    num_kv_heads=st.sampled_from([1, 2, 4, 8, 32]),
    max_seq_len=st.integers(0, 200_000),
    block_size=block_sizes,
    num_workers=st.integers(1, 256),
    max_splits=st.integers(1, MAX_SPLITS),
    overhead=st.none() | st.integers(0, 4096),
    merge=st.integers(0, 4096),
    fill=st.integers(1, 1024),
)
def test_choose_num_splits_bounds(
    batch, num_kv_heads, max_seq_len, block_size, num_workers, max_splits, overhead, merge, fill
):
    n = choose_num_splits(
        batch,
        num_kv_heads,
        max_seq_len,
        block_size,
        num_workers=num_workers,
        max_splits=max_splits,
        cta_overhead_tokens=overhead,
        merge_overhead_tokens=merge,
        fill_items=fill,
    )
    n_pages = -(-max_seq_len // block_size)
    assert 1 <= n <= max_splits
    assert n <= max(1, n_pages)
    # The last split is never empty, so no work item is pure merge overhead.
    if n_pages:
        first, end = split_page_range(max_seq_len, block_size, n, n - 1)
        assert first < end


def test_choose_num_splits_fills_workers():
    # One sequence, 8 KV heads on 132 SMs: 2 waves want ceil(264 / 8) = 33 splits (2048
    # pages in 33 splits of 63 pages: all 33 non-empty).
    assert choose_num_splits(1, 8, 32768, 16, num_workers=132) == 33
    # On 132 SMs x 4 resident CTAs the 132 wanted splits meet the cap.
    assert choose_num_splits(1, 8, 32768, 16, num_workers=528) == MAX_SPLITS == 128
    # A big batch already fills the machine: no split.
    assert choose_num_splits(256, 8, 32768, 16, num_workers=132) == 1
    # Never more splits than pages.
    assert choose_num_splits(1, 1, 40, 16, num_workers=132) == 3
    assert choose_num_splits(1, 1, 0, 16, num_workers=132) == 1
    # A middle case: 64 items and 2 waves over 132 workers: 264 / 64 = 4.1, rounded down.
    assert choose_num_splits(8, 8, 32768, 16, num_workers=132) == 4


def test_choose_num_splits_wave_model():
    # kvkit.cuda.decode's settings: 64-token tiles, two per split at least, one tile of
    # overhead per CTA; 132 SMs x R resident CTAs. Expected counts worked by hand from
    # ceil(8 B s / 132 R) * (tokens per split + 64).
    def cuda(batch, tokens, resident=4):
        return choose_num_splits(batch, 8, tokens, 16, num_workers=132 * resident,
                                 min_split_tokens=128, cta_overhead_tokens=64)  # fmt: skip

    assert cuda(1, 4096) == 32  # the 2-tile floor: 256 pages / 8, all in one wave
    assert cuda(1, 32768) == 64  # one wave of 528 holds 66 x 8; 2048 pages in 32s: 64
    assert cuda(8, 4096) == 8  # 8 x 64 = 512 <= 528: 1 x (512 + 64); 16 splits: 2 x 320
    assert cuda(64, 8192) == 1  # 512 items fill the wave: 8256; 2 splits: 2 x 4160
    # 3 CTAs per SM (396 slots): 1 split is 2 waves x 8256, 3 splits 4 x 2795 (a 30% tail
    # wave costs less when it is short).
    assert cuda(64, 8192, resident=3) == 3
    # Zero overhead and no floor: every count that stays in one wave, the largest wins.
    assert choose_num_splits(1, 8, 4096, 16, num_workers=528, cta_overhead_tokens=0) == 64
    with pytest.raises(ValueError):
        choose_num_splits(1, 8, 4096, 16, num_workers=528, cta_overhead_tokens=-1)


def test_choose_num_splits_merge_and_fill_terms():
    # A merge cost alone (no CTA overhead) keeps one split where splitting saves less: 1024
    # tokens in one split against 64 splits of 16 plus the merge.
    assert choose_num_splits(1, 8, 1024, 16, num_workers=528, cta_overhead_tokens=0,
                             merge_overhead_tokens=1100) == 1  # fmt: skip
    assert choose_num_splits(1, 8, 1024, 16, num_workers=528, cta_overhead_tokens=0,
                             merge_overhead_tokens=900) == 64  # fmt: skip
    # ... but not where the items leave workers idle anyway (8 items, fill 132).
    assert choose_num_splits(1, 8, 1024, 16, num_workers=528, cta_overhead_tokens=0,
                             merge_overhead_tokens=1100, fill_items=132) == 64  # fmt: skip
    for bad in ({"merge_overhead_tokens": -1}, {"fill_items": 0}):
        with pytest.raises(ValueError):
            choose_num_splits(1, 8, 4096, 16, num_workers=528, cta_overhead_tokens=0, **bad)


def test_choose_num_splits_keeps_a_tile_per_split():
    # 4096 tokens in pages of 16 on 528 workers want 132 splits; with at least 64 tokens
    # (4 pages) per split there are 256 / 4 = 64.
    assert choose_num_splits(1, 8, 4096, 16, num_workers=528) == 128
    assert choose_num_splits(1, 8, 4096, 16, num_workers=528, min_split_tokens=64) == 64
    # Pages larger than the tile: the page is the unit (256 pages of 64 tokens).
    assert choose_num_splits(1, 8, 16384, 64, num_workers=528, min_split_tokens=64) == 128
    # 100 pages of 16 in units of 4 pages: at most 25 splits.
    assert choose_num_splits(1, 1, 1600, 16, num_workers=528, min_split_tokens=64) == 25
    with pytest.raises(ValueError, match="min_split_tokens"):
        choose_num_splits(1, 8, 100, 16, num_workers=4, min_split_tokens=0)


def test_choose_num_splits_rejects_bad_arguments():
    with pytest.raises(ValueError, match="batch"):
        choose_num_splits(0, 8, 100, 16, num_workers=4)
    with pytest.raises(ValueError, match="num_workers"):
        choose_num_splits(1, 8, 100, 16, num_workers=0)
    with pytest.raises(TypeError, match="block_size"):
        choose_num_splits(1, 8, 100, 16.0, num_workers=4)
