"""The launcher's split-length build choice (kvkit/cuda/split_builds.py), without a GPU: the
tile count of the longest split, the rule and the loop flags the kernels report in their PTX
(tests/cuda/test_decode_defaults.py: a switch set in the environment wins over the rule)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvkit import formats
from kvkit.cuda import split_builds as sb
from kvkit.cuda.compiler import compile_entry
from kvkit.splits import split_page_range


@given(
    max_tokens=st.integers(0, 300_000),
    block_size=st.sampled_from([1, 8, 16, 32, 64, 128, 256]),
    num_splits=st.integers(1, 128),
    tile=st.sampled_from([32, 64]),
)
def test_split_tiles_is_the_longest_split_in_tiles(max_tokens, block_size, num_splits, tile):
    """Against the splits themselves: the most pages any split of a max_tokens sequence holds
    (kvkit.splits.split_page_range, every split), in tiles, rounded up."""
    longest = max(
        max(0, end - first)
        for first, end in (
            split_page_range(max_tokens, block_size, num_splits, s) for s in range(num_splits)
        )
    )
    assert sb.split_tiles(max_tokens, block_size, num_splits, tile) == -(
        -(longest * block_size) // tile
    )


def test_split_tiles_rejects_bad_arguments():
    with pytest.raises(ValueError):
        sb.split_tiles(-1, 16, 1, 64)
    with pytest.raises(ValueError):
        sb.split_tiles(100, 16, 0, 64)
    with pytest.raises(ValueError):
        sb.split_tiles(100, 0, 1, 64)


ALL_LOOPS = range(16)


@pytest.mark.parametrize("name", ["nvfp4", "nvfp4_4over6"])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
def test_nvfp4_pair_builds_give_short_splits_the_single_tile_loop(name, head_dim):
    """At head_dim 128 only: at 64 the pairs measured faster at every split length, other
    head_dims were not measured. Packed builds (LOOP_PACKED) need longer splits for pairs."""
    fmt = formats.get(name, head_dim)
    for loop in ALL_LOOPS:
        pairs = bool(loop & sb.LOOP_TILE_PAIRS) and head_dim == 128
        packed = bool(loop & sb.LOOP_PACKED)
        short = (sb.NVFP4_PACKED_PAIRS_MIN_TILES if packed else sb.NVFP4_PAIRS_MIN_TILES) - 1
        for tiles in (0, 1, short):
            want = (("KVKIT_DECODE_TILE_PAIRS", "0"),) if pairs else ()
            assert sb.split_length_switches(fmt, loop, tiles) == want
        for tiles in (short + 1, 64, 10_000):
            assert sb.split_length_switches(fmt, loop, tiles) == ()


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_k8v4_long_splits_take_warp_slabs_where_the_target_copies_in_bulk(head_dim):
    fmt = formats.get("turboquant_k8v4", head_dim)
    long = sb.K8V4_SLABS_MIN_TILES
    for loop in ALL_LOOPS:
        ok = head_dim == 128 and loop & sb.LOOP_BULK_COPY and not loop & sb.LOOP_WARP_SLABS
        for tiles in (long, 5 * long):
            want = (("KVKIT_DECODE_TQ_SLABS", "1"),) if ok else ()
            assert sb.split_length_switches(fmt, loop, tiles) == want
        for tiles in (0, long - 1):
            assert sb.split_length_switches(fmt, loop, tiles) == ()


@pytest.mark.parametrize(
    "name", sorted(set(formats.names()) - {"nvfp4", "nvfp4_4over6", "turboquant_k8v4"})
)
def test_other_formats_keep_their_build(name):
    fmt = formats.get(name, 128)
    for loop in ALL_LOOPS:
        for tiles in (0, 1, 8, 9, 64, 10_000):
            assert sb.split_length_switches(fmt, loop, tiles) == ()


_LAUNCH = re.compile(r"kv_decode_launch\[16\] = \{([0-9, ]+)\}")


def _loop_flags(name: str, head_dim: int, arch: str, **switches: str) -> int:
    """The 4th int32 of the stage-1 module's kv_decode_launch, read from its PTX (NVRTC, no
    GPU): G = 4, q_len = 1, float16 queries."""
    fmt = formats.get(name, head_dim)
    defines = dict(fmt.cuda_defines())
    defines.update(KV_IN_DTYPE="1", KV_GROUP="4", KV_Q_LEN="1", **switches)
    entry = {"nvfp4": "decode_nvfp4.cu", "turboquant": "decode_turboquant.cu"}[fmt.family]
    ptx = compile_entry(entry, defines, arch, ptx_only=True).ptx
    ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
    raw = [int(x) for x in _LAUNCH.search(ptx).group(1).split(",")]
    words = np.frombuffer(bytes(raw + [0] * (16 - len(raw))), dtype="<i4")
    assert words[2] == 64  # tokens per tile: the split_tiles unit
    return int(words[3])


P, B, S, K = sb.LOOP_TILE_PAIRS, sb.LOOP_BULK_COPY, sb.LOOP_WARP_SLABS, sb.LOOP_PACKED


@pytest.mark.parametrize(
    "name, head_dim, arch, switches, flags",
    [
        ("nvfp4", 128, "sm_90", {}, P | B | S | K),  # packed pair loop on warp slabs
        ("nvfp4", 128, "sm_90", {"KVKIT_DECODE_TILE_PAIRS": "0"}, B | S | K),
        ("nvfp4", 128, "sm_90", {"KVKIT_DECODE_NV_PACK": "0"}, P | B | S),
        ("nvfp4", 64, "sm_100a", {}, P | B | S),  # no packing below head_dim 128
        ("nvfp4", 128, "sm_120a", {}, B | S | K),  # no pairs on sm_120
        # No copy engine: no slabs; the cp.async path's pairs (KVKIT_DECODE_CP_ASYNC_V2=3,
        # NVFP4's default there), none under 2.
        ("nvfp4", 128, "sm_80", {}, P | K),
        ("nvfp4", 128, "sm_80", {"KVKIT_DECODE_CP_ASYNC_V2": "2"}, K),
        ("turboquant_k8v4", 128, "sm_90", {}, B | K),  # page runs
        ("turboquant_k8v4", 128, "sm_90", {"KVKIT_DECODE_TQ_SLABS": "1"}, B | S | K),
        ("turboquant_k8v4", 64, "sm_90", {}, P | B | S),  # TurboQuant packs from 128
        ("turboquant_4bit_nc", 128, "sm_90", {}, P | B | S | K),
        # Variant 0: neither packing nor, at head_dim 128, pairs (its query buffers).
        ("turboquant_4bit_nc", 128, "sm_90", {"KVKIT_DECODE_TQ_VARIANT": "0"}, B | S),
    ],
)
def test_kernels_report_the_loop_they_were_built_with(name, head_dim, arch, switches, flags):
    """The flags decode_core.cuh writes into kv_decode_launch, i.e. the facts the rule reads:
    a wrong bit would launch the wrong build."""
    assert _loop_flags(name, head_dim, arch, **switches) == flags
