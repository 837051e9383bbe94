"""kvkit.decode_args: every bad decode argument is named in a clear exception."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kvkit.decode_args import check_decode_args, check_decode_indices, check_decode_shapes
from kvkit.splits import MAX_SPLITS

CACHE = dict(num_kv_heads=2, head_dim=16, num_blocks=10, block_size=16)


def good():
    """A valid call: B=2, q_len=2, Hq=4, D=16, 3 blocks per row."""
    return dict(
        q=np.zeros((2, 2, 4, 16), np.float32),
        block_tables=np.array([[0, 1, 2], [3, -1, 99]], np.int32),
        seq_lens=np.array([40, 16], np.int32),
        scale=0.25,
        num_splits=3,
        window=None,
        sinks=None,
        softcap=None,
        **CACHE,
    )


def call(**changes):
    args = good()
    args.update(changes)
    return check_decode_args(args.pop("q"), args.pop("block_tables"), args.pop("seq_lens"), **args)


def test_valid_call_returns_sizes():
    # Row 1 uses one page: its -1 and 99 entries are padding and are not checked.
    assert call() == (2, 2, 4)
    assert call(q=np.zeros((2, 4, 16), np.float16), seq_lens=np.array([1, 1], np.int32)) == (
        2,
        1,
        4,
    )
    assert call(q=np.zeros((2, 2, 4, 16), ml_dtypes.bfloat16))[2] == 4
    assert call(window=1, softcap=30.0, sinks=np.zeros(4, np.float32), num_splits=None)


@pytest.mark.parametrize(
    "changes, exc, match",
    [
        (dict(q=np.zeros((2, 2, 4, 16), np.float64)), TypeError, "q must be float16"),
        (dict(q=np.zeros((2, 2, 4, 16), np.int32)), TypeError, "q must be"),
        (dict(q=np.zeros((2, 2, 2, 4, 16), np.float32)), ValueError, "q must be"),
        (dict(q=np.zeros((2, 2, 4, 8), np.float32)), ValueError, "head_dim"),
        (dict(q=np.zeros((2, 2, 3, 16), np.float32)), ValueError, "num_kv_heads"),
        (dict(q=np.zeros((2, 0, 4, 16), np.float32)), ValueError, "q_len"),
        (dict(q=[[0.0]]), TypeError, "q must be an array"),
        (dict(block_tables=np.zeros((2, 3), np.int64)), TypeError, "block_tables must be int32"),
        (dict(block_tables=np.zeros((3, 3), np.int32)), ValueError, "block_tables must be"),
        (dict(block_tables=np.zeros(3, np.int32)), ValueError, "block_tables must be"),
        (dict(seq_lens=np.zeros(2, np.int64)), TypeError, "seq_lens must be int32"),
        (dict(seq_lens=np.zeros((2, 1), np.int32)), ValueError, "seq_lens must be"),
        (dict(scale=0.0), ValueError, "scale"),
        (dict(scale=float("nan")), ValueError, "scale"),
        (dict(scale=float("inf")), ValueError, "scale"),
        (dict(scale="1"), TypeError, "scale"),
        (dict(num_splits=0), ValueError, "num_splits"),
        (dict(num_splits=MAX_SPLITS + 1), ValueError, "num_splits"),
        (dict(num_splits=2.0), TypeError, "num_splits"),
        (dict(window=0), ValueError, "window"),
        (dict(window=True), TypeError, "window"),
        (dict(softcap=-1.0), ValueError, "softcap"),
        (dict(softcap=float("inf")), ValueError, "softcap"),
        (dict(sinks=np.zeros(2, np.float32)), ValueError, "sinks"),
        (dict(sinks=np.zeros(4, np.int32)), TypeError, "sinks"),
        (dict(sinks=np.array([0, 0, np.nan, 0], np.float32)), ValueError, "sinks"),
        (dict(sinks=np.array([0, np.inf, 0, 0], np.float32)), ValueError, "sinks"),
        (dict(num_kv_heads=0), ValueError, "num_kv_heads"),
        (dict(block_size=16.0), TypeError, "block_size"),
        # Index checks: these read the arrays.
        (dict(seq_lens=np.array([40, -1], np.int32)), ValueError, r"seq_lens\[1\] = -1"),
        (dict(seq_lens=np.array([40, 1], np.int32)), ValueError, "shorter than q_len"),
        (dict(seq_lens=np.array([49, 16], np.int32)), ValueError, "capacity"),
        (
            dict(block_tables=np.array([[0, 1, 10], [3, 0, 0]], np.int32)),
            ValueError,
            r"block_tables\[0, 2\] = 10",
        ),
        (
            dict(block_tables=np.array([[0, 1, 2], [-1, 0, 0]], np.int32)),
            ValueError,
            r"block_tables\[1, 0\] = -1",
        ),
    ],
)
def test_rejects(changes, exc, match):
    with pytest.raises(exc, match=match):
        call(**changes)


def test_shapes_half_reads_no_data():
    # check_decode_shapes must work on objects whose contents cannot be read (GPU arrays).
    class Opaque:
        def __init__(self, shape, dtype):
            self.shape, self.dtype, self.ndim = shape, np.dtype(dtype), len(shape)

        def __array__(self, *args, **kwargs):
            raise AssertionError("data was read")

    args = good()
    out = check_decode_shapes(
        Opaque((2, 2, 4, 16), np.float32),
        Opaque((2, 3), np.int32),
        Opaque((2,), np.int32),
        **{k: v for k, v in args.items() if k not in ("q", "block_tables", "seq_lens")},
    )
    assert out == (2, 2, 4)


def test_indices_half_alone():
    check_decode_indices(
        np.array([[5]], np.int32), np.array([16], np.int32), q_len=1, num_blocks=6, block_size=16
    )
    with pytest.raises(ValueError, match="num_blocks=5"):
        check_decode_indices(
            np.array([[5]], np.int32),
            np.array([16], np.int32),
            q_len=1,
            num_blocks=5,
            block_size=16,
        )
