"""One write_kv of 4M token-heads (fp16 K and V in, shuffled slots), repeated: a target for
Nsight Compute, with the shapes of ``kvkit bench``'s write rows.

    ncu --kernel-name regex:kvkit_write --launch-skip 2 --launch-count 1 \
        python scripts/profile_write.py turboquant_4bit_nc
"""

from __future__ import annotations

import sys

import cupy as cp
import numpy as np

import kvkit
from kvkit import formats
from kvkit.bench import BLOCK_SIZE, WRITE_TOKEN_HEADS


def main(argv: list[str]) -> int:
    name = argv[0] if argv else "turboquant_4bit_nc"
    heads, head_dim = 8, 128
    n = WRITE_TOKEN_HEADS // heads
    rng = cp.random.RandomState(1)
    k = rng.standard_normal((n, heads, head_dim), dtype=cp.float32).astype(cp.float16)
    v = rng.standard_normal((n, heads, head_dim), dtype=cp.float32).astype(cp.float16)
    slots = cp.asarray(np.random.default_rng(1).permutation(n).astype(np.int64))
    fmt = formats.get(name, head_dim)
    layer = kvkit.PagedKVCache(fmt, 1, heads, n // BLOCK_SIZE, BLOCK_SIZE, backend="cuda").layer(0)
    if fmt.has_global_scales:
        layer.k_scale = layer.v_scale = fmt.calibrate(np.array([5.0]))
    for _ in range(5):
        kvkit.write_kv(layer, k, v, slots)
    cp.cuda.Device().synchronize()
    print(name, n * heads, "token-heads")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
