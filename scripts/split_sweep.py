"""Graph-replay time of one decode step per split count (needs a CUDA GPU).

    python scripts/split_sweep.py [--formats a,b] [--shapes 1x4096,8x4096] [--splits 8,16,32,64]
        [--json OUT.json]

For each format and shape: the step time under CUDA-graph replay (kvkit.bench.graph_ms, caches
rotated past L2) with DecodePlan(num_splits=s) for every s, and with the default heuristic
(marked "auto", with the count it chose), so the split heuristic can be checked against
measurement. --json also writes the rows as benchmarks/results/h200_split_sweeps.json holds
them: the format, shape, the default fp16-query build's resident CTAs per SM (R), shared
bytes, threads, tile and registers, and the us per count actually launched (requests the page
rounding trims to the same count share one entry).
"""

from __future__ import annotations

import argparse
import json
import math

import cupy as cp

from kvkit import formats
from kvkit.bench import _l2_bytes, build_decode_case, decode_bytes, decode_plan_us, parse_shapes
from kvkit.cuda.decode import _STAGE1, _resident_ctas, _stage1_default


def _build_facts(fmt, group: int) -> dict:
    """Resident CTAs per SM, shared bytes, threads, tile and registers of the default stage-1
    build for fp16 queries, q_len 1 and no soft-cap (what the heuristic sees)."""
    entry, kname, _ = _STAGE1[fmt.family]
    (func, smem, threads, tile, _), _ = _stage1_default(fmt, entry, kname, "1", group, 1, False)
    regs = int(func.attributes["num_regs"])
    return dict(R=_resident_ctas(func, threads, smem), smem=smem, threads=threads, tile=tile,
                regs=regs)  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--formats", default="fp8_e4m3,nvfp4,turboquant_k8v4,turboquant_4bit_nc")
    ap.add_argument("--shapes", default="1x4096,1x32768")
    ap.add_argument("--splits", default="8,16,32,64,128")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default="", help="also write the rows to this file")
    args = ap.parse_args()
    splits = [None, *(int(s) for s in args.splits.split(","))]
    rng = cp.random.RandomState(0)
    rows = []
    for shape in parse_shapes(args.shapes):
        q = rng.standard_normal((shape.B, shape.Hq, shape.D), dtype=cp.float32).astype(cp.float16)
        lens = cp.full((shape.B,), shape.T, dtype=cp.int32)
        for name in args.formats.split(","):
            fmt = formats.get(name, shape.D)
            n_rot = max(1, math.ceil(2 * _l2_bytes() / decode_bytes(fmt, shape)))
            cases = [build_decode_case(name, shape, rng) for _ in range(n_rot)]
            times: dict[str, float | int | None] = {}
            cells = []
            for s in splits:
                n, us = decode_plan_us(cases, shape, q, lens, s, args.reps)
                label = f"auto={n}" if s is None else str(n)
                cells.append(f"{label}:{'-' if us is None else f'{us:.1f}'}")
                if s is None:
                    times.update(auto_n=n, auto=us)
                else:
                    times[str(n)] = us
            print(f"{name:<20} {shape.label():<14} us per step  " + "  ".join(cells), flush=True)
            rows.append(dict(fmt=name, B=shape.B, T=shape.T, Hq=shape.Hq, Hkv=shape.Hkv,
                             D=shape.D, **_build_facts(fmt, shape.Hq // shape.Hkv),
                             times=times))  # fmt: skip
            del cases
            cp.get_default_memory_pool().free_all_blocks()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
