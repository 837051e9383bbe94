"""One planned decode step of one format and shape, repeated: a target for Nsight Compute.

    ncu --kernel-name regex:stage1 --launch-skip 2 --launch-count 1 \
        python scripts/profile_decode.py turboquant_4bit_nc 64 8192 [Hq Hkv D]
"""

from __future__ import annotations

import sys

import cupy as cp

import kvkit
from kvkit.bench import Shape, build_decode_case


def main(argv: list[str]) -> int:
    name = argv[0] if argv else "turboquant_4bit_nc"
    batch = int(argv[1]) if len(argv) > 1 else 64
    tokens = int(argv[2]) if len(argv) > 2 else 8192
    heads = [int(a) for a in argv[3:6]] if len(argv) >= 6 else [32, 8, 128]
    shape = Shape(batch, tokens, *heads)
    rng = cp.random.RandomState(0)
    layer, tables = build_decode_case(name, shape, rng)
    q = rng.standard_normal((shape.B, shape.Hq, shape.D), dtype=cp.float32).astype(cp.float16)
    lens = cp.full((shape.B,), shape.T, dtype=cp.int32)
    plan = kvkit.DecodePlan(layer, shape.B, shape.Hq, tables.shape[1])
    for _ in range(5):
        plan.run(q, tables, lens)
    cp.cuda.Device().synchronize()
    print(name, shape.label(), "splits", plan.num_splits if hasattr(plan, "num_splits") else "?")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
