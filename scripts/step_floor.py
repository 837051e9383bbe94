"""The fixed cost of a decode step: graph-replay times at small shapes (needs a CUDA GPU).

    python scripts/step_floor.py [--formats a,b] [--shapes 1x16,1x1024,...] [--json OUT.json]

A split-K decode step costs a fixed part (launches, the stage-1 prologue's dependent loads,
the first tile's latency, the partial-state stores, the merge) plus its bytes at the kernel's
streaming rate. This script measures the fixed part the way kvkit.bench times its graph rows
(one CUDA graph of many calls, caches rotated past L2, median per call), so that the SDPA
ratio targets can be checked against what a step costs before it streams anything:

* "empty": one tiny CuPy kernel per call (the graph's per-launch floor), and two dependent
  ones (the floor of a two-kernel step);
* per format and shape: the step with the default split count ("auto"), and with one split
  (a single stage-1 kernel, no merge) where that differs;
* torch SDPA fp16 on contiguous K / V of the same shape, where torch is importable.

The JSON rows: {"what", "format", "B", "T", "Hq", "Hkv", "D", "splits", "us", "bytes"}.
"""

from __future__ import annotations

import argparse
import json
import math

import cupy as cp

from kvkit import formats
from kvkit.bench import (
    _l2_bytes,
    build_decode_case,
    copy_tbps,
    decode_bytes,
    decode_plan_us,
    graph_ms,
    parse_shapes,
    sdpa_runner,
    torch_graph_ms,
)


def _empty_us(kernels: int, reps: int) -> float | None:
    """Graph-replay us per call of ``kernels`` dependent one-element CuPy kernels."""
    a = cp.ones(1, cp.float32)
    b = cp.ones(1, cp.float32)

    def step(i):
        for _ in range(kernels):
            cp.add(a, b, out=b)

    ms = graph_ms(step, reps)
    return None if ms is None else round(1e3 * ms, 2)


def _sdpa_us(shape, reps: int) -> float | None:
    try:
        import torch  # noqa: F401
    except Exception:  # torch is optional
        return None
    run, slots = sdpa_runner(shape)
    ms = torch_graph_ms(run, reps, slots=slots)
    return None if ms is None else round(1e3 * ms, 2)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--formats",
                    default="fp16,fp8_e4m3,nvfp4,turboquant_k8v4,turboquant_4bit_nc,"
                            "turboquant_3bit_nc")  # fmt: skip
    ap.add_argument("--shapes", default="1x16,1x1024,1x4096,1x32768,8x8192")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default="", help="also write the rows to this file")
    args = ap.parse_args()
    rows = []

    def add(what, us, name="", shape=None, splits=None, nbytes=None):
        dims = {} if shape is None else dict(B=shape.B, T=shape.T, Hq=shape.Hq, Hkv=shape.Hkv,
                                             D=shape.D)  # fmt: skip
        rows.append(dict(what=what, format=name, splits=splits, us=us, bytes=nbytes, **dims))
        label = "" if shape is None else shape.label()
        print(f"{what:<8} {name:<20} {label:<14} splits {splits!s:>4}  {us!s:>8} us", flush=True)

    for k in (1, 2):
        add(f"empty{k}", _empty_us(k, args.reps))
    rng = cp.random.RandomState(0)
    for shape in parse_shapes(args.shapes):
        q = rng.standard_normal((shape.B, shape.Hq, shape.D), dtype=cp.float32).astype(cp.float16)
        lens = cp.full((shape.B,), shape.T, dtype=cp.int32)
        add(
            "sdpa",
            _sdpa_us(shape, args.reps),
            "fp16",
            shape,
            nbytes=2 * shape.B * shape.Hkv * shape.T * shape.D * 2,
        )
        for name in args.formats.split(","):
            fmt = formats.get(name, shape.D)
            nbytes = decode_bytes(fmt, shape)
            n_rot = max(1, math.ceil(2 * _l2_bytes() / nbytes))
            cases = [build_decode_case(name, shape, rng) for _ in range(n_rot)]
            n, us = decode_plan_us(cases, shape, q, lens, None, args.reps)
            add("auto", us, name, shape, n, nbytes)
            if n != 1:
                n1, us1 = decode_plan_us(cases, shape, q, lens, 1, args.reps)
                add("one", us1, name, shape, n1, nbytes)
            del cases
            cp.get_default_memory_pool().free_all_blocks()
    bw = copy_tbps()
    print(f"copy {bw:.2f} TB/s")
    rows.append(dict(what="copy_TBps", us=None, value=round(bw, 3)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
