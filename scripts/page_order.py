"""Decode time by page order and page size: how much the paged layout's scattered reads cost.

    python scripts/page_order.py [--formats fp16,nvfp4] [--shapes 64x8192,1x131072]

Per format and shape, CUDA-graph replay of a planned decode step (as ``kvkit bench``) with
block tables that are (a) a random permutation of the pages (the benchmark's layout), (b) the
pages in order (each sequence's pages consecutive in memory), and (c) shuffled pages of 64
tokens instead of 16. Each KV head's share of a 16-token fp16 page is one 4 KB run; in order,
runs of consecutive pages are one page stride apart. Prints ms and effective TB/s.
"""

from __future__ import annotations

import argparse
import math


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--formats", default="fp16,nvfp4")
    ap.add_argument("--shapes", default="64x8192,1x131072")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()

    import cupy as cp

    import kvkit
    from kvkit import formats
    from kvkit.bench import _l2_bytes, build_decode_case, decode_bytes, graph_ms, parse_shapes

    rng = cp.random.RandomState(0)
    l2 = _l2_bytes()
    print(f"{'format':<10} {'shape':<14} {'layout':<22} {'ms':>8} {'TB/s':>6}")
    for shape in parse_shapes(args.shapes):
        lens = cp.full((shape.B,), shape.T, dtype=cp.int32)
        q = rng.standard_normal((shape.B, shape.Hq, shape.D), dtype=cp.float32).astype(cp.float16)
        for name in args.formats.split(","):
            fmt = formats.get(name, shape.D)
            nbytes = decode_bytes(fmt, shape)
            n_rot = max(1, math.ceil(2 * l2 / nbytes))
            for label, bs, shuffle in (("shuffled 16-token", 16, True),
                                       ("in order 16-token", 16, False),
                                       ("shuffled 64-token", 64, True)):  # fmt: skip
                pages = math.ceil(shape.T / bs)
                cases = []
                for r in range(n_rot):
                    layer, tables = build_decode_case(name, shape, rng, block_size=bs,
                                                      shuffle=shuffle, seed=r)  # fmt: skip
                    cases.append((kvkit.DecodePlan(layer, shape.B, shape.Hq, pages), tables))

                def step(i, cases=cases, q=q, lens=lens):
                    plan, tables = cases[i % len(cases)]
                    plan.run(q, tables, lens)

                ms = graph_ms(step, args.reps, slots=len(cases))
                tbps = nbytes / (ms * 1e-3) / 1e12
                print(f"{name:<10} {shape.label():<14} {label:<22} {ms:8.4f} {tbps:6.2f}",
                      flush=True)  # fmt: skip
                del cases, step
                cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
