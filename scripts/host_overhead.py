"""Where the host time of a plain ``kvkit.decode`` call goes (needs a CUDA GPU).

    python scripts/host_overhead.py [format] [B] [T]

Times N calls with the GPU kept busy-free (synchronize per call, so the host part is the
difference to the graph replay of the same step), then profiles N calls with cProfile and
prints the 25 functions with the most own time.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import cupy as cp

import kvkit
from kvkit.bench import Shape, build_decode_case


def main(argv: list[str]) -> int:
    name = argv[0] if argv else "turboquant_4bit_nc"
    batch = int(argv[1]) if len(argv) > 1 else 1
    tokens = int(argv[2]) if len(argv) > 2 else 4096
    n = 200
    shape = Shape(batch, tokens)
    rng = cp.random.RandomState(0)
    layer, tables = build_decode_case(name, shape, rng)
    q = rng.standard_normal((shape.B, shape.Hq, shape.D), dtype=cp.float32).astype(cp.float16)
    lens = cp.full((shape.B,), shape.T, dtype=cp.int32)
    for _ in range(10):
        kvkit.decode(q, layer, tables, lens)
    cp.cuda.Device().synchronize()

    t0 = time.perf_counter()
    for _ in range(n):
        kvkit.decode(q, layer, tables, lens)
    t1 = time.perf_counter()
    cp.cuda.Device().synchronize()
    t2 = time.perf_counter()
    print(f"{name} {shape.label()}: host {1e6 * (t1 - t0) / n:.1f} us per call "
          f"(enqueue only), {1e6 * (t2 - t0) / n:.1f} us per call with the drain")  # fmt: skip

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        kvkit.decode(q, layer, tables, lens)
    prof.disable()
    cp.cuda.Device().synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
