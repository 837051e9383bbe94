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

    # The same calls without the replay cache (kvkit.cuda.plain_steps): the full path each time.
    from kvkit.cuda import plain_steps

    keep = plain_steps.MAX_STEPS
    plain_steps.MAX_STEPS = 0
    plain_steps.clear()
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            kvkit.decode(q, layer, tables, lens)
        t_full = (time.perf_counter() - t0) / n
        cp.cuda.Device().synchronize()
        print(f"full path (no replay): {1e6 * t_full:.1f} us per call (enqueue only)")

        # Split of the host time: the Python layers alone (launches replaced by a recorder),
        # the two launches alone with the recorded arguments, and the allocations.
        from kvkit.cuda import decode as cuda_decode

        recorded = []

        class _Recorder:
            def __init__(self, func):
                self.func = func

            def __call__(self, grid, block, args, shared_mem=0):
                recorded.append((self.func, grid, block, args, shared_mem))

            def __getattr__(self, name):  # attributes (registers, smem) for the split heuristic
                return getattr(self.func, name)

        real_stage1_for, real_merge = cuda_decode._stage1_for, cuda_decode._merge_kernel

        def stage1_for(*a, **k):
            func, *launch_facts = real_stage1_for(*a, **k)
            return (_Recorder(func), *launch_facts)

        cuda_decode._stage1_for = stage1_for
        cuda_decode._merge_kernel = lambda name: _Recorder(real_merge(name))
        try:
            t0 = time.perf_counter()
            for _ in range(n):
                kvkit.decode(q, layer, tables, lens)
            t_python = (time.perf_counter() - t0) / n
        finally:
            cuda_decode._stage1_for, cuda_decode._merge_kernel = real_stage1_for, real_merge
        per_call = len(recorded) // n  # stage 1, and the merge when there are splits
        launches = recorded[-per_call:]
        t0 = time.perf_counter()
        for _ in range(n):
            for func, grid, block, args, smem in launches:
                func(grid, block, args, shared_mem=smem)
        t_launch = (time.perf_counter() - t0) / n
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            for dims in ((shape.B, 1, shape.Hq, shape.D), (shape.B, 1, shape.Hq)):
                cp.empty(dims, dtype=cp.float32)
        t_alloc = (time.perf_counter() - t0) / n
        print(f"python layers only {1e6 * t_python:.1f} us; {len(launches)} launches with their "
              f"{sum(len(x[3]) for x in launches)} arguments {1e6 * t_launch:.1f} us; "
              f"o + lse allocation {1e6 * t_alloc:.1f} us per call")  # fmt: skip

    finally:
        plain_steps.MAX_STEPS = keep

    plan = kvkit.DecodePlan(layer, shape.B, shape.Hq, tables.shape[1])
    for _ in range(3):
        plan.run(q, tables, lens)
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        plan.run(q, tables, lens)
    t_plan = (time.perf_counter() - t0) / n
    cp.cuda.Device().synchronize()
    print(f"DecodePlan.run: {1e6 * t_plan:.1f} us per call (enqueue only)")

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
