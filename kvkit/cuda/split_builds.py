"""Stage-1 builds the CUDA launcher picks by the length of a split.

Some tile loops of stage 1 win on long splits and lose on short ones (their prologue fills
more stages, or a loop iteration waits for more tiles before its first score). The split
count is known on the host before the launch (it depends on shapes only), so the launcher
compiles a second build of the same kernel, with the same arguments, and launches whichever
loop measured faster for splits of that length. A switch set in the environment
(``KVKIT_DECODE_*``, kvkit/cuda/decode.py) always wins over the choice made here.

Pure Python, no CuPy: the rule is tested on any machine.
"""

from __future__ import annotations

from .._checks import check_int
from ..splits import page_range

__all__ = [
    "K8V4_SLABS_MIN_TILES",
    "LOOP_BULK_COPY",
    "LOOP_PACKED",
    "LOOP_TILE_PAIRS",
    "LOOP_WARP_SLABS",
    "NVFP4_PACKED_PAIRS_MIN_TILES",
    "NVFP4_PAIRS_MIN_TILES",
    "split_length_switches",
    "split_tiles",
]

#: Bits of a stage-1 module's loop flags (decode_core.cuh KVD_LOOP_FLAGS, the 4th entry of
#: ``kv_decode_launch``): the build has the tile-pair loop; its target has bulk copies (the
#: copy engine, sm_90+, which warp pipes need); its fast launches copy per-warp slabs; its
#: mmas carry packed columns (decode_mma.cuh KV_MMA_PACK: NVFP4 from head_dim 128 at
#: G * q_len <= 4, kvkit/cuda/decode.py KVKIT_DECODE_NV_PACK; TurboQuant's variant 1).
LOOP_TILE_PAIRS = 1
LOOP_BULK_COPY = 2
LOOP_WARP_SLABS = 4
LOOP_PACKED = 8

#: NVFP4's tile-pair loop at head_dim 128 needs at least this many tiles per split to beat the
#: single-tile loop (a pair waits for both its tiles before its first score, and its prologue
#: fills 2 of 4 stages). Measured on the H200, graph ms, pairs on -> off, two runs each:
#: - session 15 call 1 (pair addresses off): 4 tiles (1, 16384) 0.0174 -> 0.0157 (-10%);
#:   8 tiles (1, 32768) 0.0237 / 0.0240 -> 0.0230 / 0.0231, (4, 8192) -3.5%, (8, 4096) -3.5 /
#:   -4%; 12 tiles (1, 49152) 0.0308 -> 0.0304; 16 tiles (1, 65536) +1.1%, (8, 8192) +1.6%.
#: - call 4, with pair addresses (KVKIT_DECODE_PAIR_ADDR, the default), which made the pairs
#:   3.5-5% faster: 4 tiles -8%; 8 tiles (1, 32768) 0.0236 / 0.0234 -> 0.0233 / 0.0231,
#:   (4, 8192) -1.7 / -0.4%; 12 tiles (1, 49152) 0.0300 / 0.0300 -> 0.0306 / 0.0304 (+1.3 to
#:   +2%), (8, 6144) +1.3%; 16 tiles +4%.
#: - call 5, the same way: 9 tiles (1, 36864) 0.0268 / 0.0268 -> 0.0247 / 0.0247; 10 tiles
#:   (1, 40960), (4, 10240), (8, 5120) within +-1.5%; 11 tiles (1, 45056) 0.0308 / 0.0306 ->
#:   0.0287 / 0.0286. An odd count ends in one single tile inside the pair build (its slower
#:   single-tile loop, NOTES session 14 call 6), which costs most where there are few tiles;
#:   13 and 15 were not measured (31, odd, won 4%).
#: At head_dim 64 pairs win at every length (8 tiles: (1, 32768) 0.0170 -> 0.0201 with pairs
#: off, +18%), and other head_dims were not measured: no rule there. TurboQuant's pairs won at
#: every length (-7 to -11%, 8 tiles included): no rule for them.
NVFP4_PAIRS_MIN_TILES = 12

#: The same for NVFP4's packed builds (LOOP_PACKED: one PV mma per m-tile and tile, session
#: 16), whose packing made the single-tile loop 5-6% faster at 9-16 tiles and the pairs not:
#: measured on the H200 (session 16, calls 4 and 5; graph ms, pairs off -> on, two runs each):
#: 9 tiles (1, 36864) 0.0236 / 0.0238 -> 0.0252 / 0.0251; 11 tiles +7%; 12 tiles (1, 49152)
#: 0.0289 / 0.0289 -> 0.0299 / 0.0299; 16 tiles (1, 65536) 0.0351 / 0.0351 -> 0.0361 / 0.0352,
#: (8, 8192) +0.6%; 24 tiles (1, 98304) 0.0484 / 0.0482 -> 0.0480 / 0.0480; 32 tiles
#: (1, 131072) -1.6%, (16, 8192) -2.3 / -3.9%, (32, 4096) -5.5%; 128 tiles (64, 8192) 0.2193 /
#: 0.2162 -> 0.1945 / 0.1935. 17-23 tiles were not measured (about even by interpolation).
NVFP4_PACKED_PAIRS_MIN_TILES = 24

#: turboquant_k8v4 at head_dim 128 copies whole pages by default; its warp-slab build
#: (KVKIT_DECODE_TQ_SLABS=1, with warp pipes where the target has bulk copies) needs at least
#: this many tiles per split. Measured on the H200 (session 15, call 1; graph ms, page runs ->
#: slabs, two runs each): 128 tiles (64, 8192) 0.2363 / 0.2300 -> 0.2282 / 0.2287; 64 tiles
#: (32, 8192) 0.1203 / 0.1207 -> 0.1208 / 0.1206 and Hq = 128 (32, 4096) 0.1024 / 0.1021 ->
#: 0.0948 / 0.0955; 32 tiles (16, 8192) +3%, (32, 4096) +1.5 / +2%, (1, 131072) +1.2 / +2%;
#: 16 tiles (8, 8192) +3.5%. Session 14's call 2 saw the same split. Not at head_dim 256: the
#: first rule took slabs there too, and (32, 4096) (64 tiles) measured 0.1195 in call 4's
#: benchmark against 0.1122 for page runs in session 14's.
K8V4_SLABS_MIN_TILES = 64


def split_tiles(max_tokens: int, block_size: int, num_splits: int, tile: int) -> int:
    """Tiles in the longest split of a step (``kvkit.splits.split_page_range``'s cut).

    Args:
        max_tokens: int >= 0, the longest sequence the step allows (max_blocks x block_size).
        block_size: int >= 1, tokens per page. num_splits: int >= 1.
        tile: int >= 1, tokens per stage-1 tile (``kv_decode_launch``).

    Returns:
        ceil(pages_per_split * block_size / tile), 0 for an empty step.
    """
    max_tokens = check_int("max_tokens", max_tokens, 0)
    block_size = check_int("block_size", block_size, 1)
    num_splits = check_int("num_splits", num_splits, 1)
    tile = check_int("tile", tile, 1)
    # Split 0 is a longest one: the splits' own cut, not a second copy of its arithmetic.
    first, end = page_range(max_tokens, block_size, num_splits, 0)
    return -(-(end - first) * block_size // tile)


def split_length_switches(fmt, loop: int, tiles: int) -> tuple[tuple[str, str], ...]:
    """Switches (``_FAMILY_SWITCHES`` names and values) of the stage-1 build to launch instead
    of the default build, for splits of ``tiles`` tiles; () keeps the default build.

    Args:
        fmt: a ``kvkit.formats`` format (its family and name pick the rule).
        loop: the default build's loop flags (LOOP_* bits).
        tiles: int >= 0, tiles in the longest split (``split_tiles``).
    """
    least = NVFP4_PACKED_PAIRS_MIN_TILES if loop & LOOP_PACKED else NVFP4_PAIRS_MIN_TILES
    if fmt.family == "nvfp4" and fmt.head_dim == 128 and loop & LOOP_TILE_PAIRS and tiles < least:
        return (("KVKIT_DECODE_TILE_PAIRS", "0"),)
    if (
        fmt.name == "turboquant_k8v4"
        and fmt.head_dim == 128
        and loop & LOOP_BULK_COPY
        and not loop & LOOP_WARP_SLABS
        and tiles >= K8V4_SLABS_MIN_TILES
    ):
        return (("KVKIT_DECODE_TQ_SLABS", "1"),)
    return ()
