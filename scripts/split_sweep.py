"""Graph-replay time of one decode step per split count (needs a CUDA GPU).

    python scripts/split_sweep.py [--formats a,b] [--shapes 1x4096,8x4096] [--splits 8,16,32,64]

For each format and shape: the step time under CUDA-graph replay (kvkit.bench.graph_ms, caches
rotated past L2) with DecodePlan(num_splits=s) for every s, and with the default heuristic
(marked "auto", with the count it chose), so the split heuristic can be checked against
measurement.
"""

from __future__ import annotations

import argparse
import math

import cupy as cp

import kvkit
from kvkit import formats
from kvkit.bench import _l2_bytes, build_decode_case, decode_bytes, graph_ms, parse_shapes


def _time(cases, shape, q, lens, splits, reps) -> str:
    plans = [
        kvkit.DecodePlan(layer, shape.B, shape.Hq, tables.shape[1], num_splits=splits)
        for layer, tables in cases
    ]

    def step(i):
        plans[i % len(plans)].run(q, cases[i % len(cases)][1], lens)

    ms = graph_ms(step, reps, slots=len(cases))
    label = f"auto={plans[0].num_splits}" if splits is None else str(splits)
    return f"{label}:{1e3 * ms:.1f}" if ms is not None else f"{label}:-"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--formats", default="fp8_e4m3,nvfp4,turboquant_k8v4,turboquant_4bit_nc")
    ap.add_argument("--shapes", default="1x4096,1x32768")
    ap.add_argument("--splits", default="8,16,32,64,128")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    splits = [None, *(int(s) for s in args.splits.split(","))]
    rng = cp.random.RandomState(0)
    for shape in parse_shapes(args.shapes):
        q = rng.standard_normal((shape.B, shape.Hq, shape.D), dtype=cp.float32).astype(cp.float16)
        lens = cp.full((shape.B,), shape.T, dtype=cp.int32)
        for name in args.formats.split(","):
            fmt = formats.get(name, shape.D)
            n_rot = max(1, math.ceil(2 * _l2_bytes() / decode_bytes(fmt, shape)))
            cases = [build_decode_case(name, shape, rng) for _ in range(n_rot)]
            results = [_time(cases, shape, q, lens, s, args.reps) for s in splits]
            print(f"{name:<20} {shape.label():<14} us per step  " + "  ".join(results), flush=True)
            del cases
            cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
