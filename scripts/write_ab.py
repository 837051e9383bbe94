"""Write kernel time per launch setting, interleaved, with the host's launch cost hidden.

    python scripts/write_ab.py --formats turboquant_4bit_nc,turboquant_k8v4 \
        --settings "default 4:8 2:16" [--rounds 3] [--slots pages|scatter|sorted] [--json out.json]
        [--unit-scales]

A setting is ``default``, ``RPW:MIN_CTAS`` (KVKIT_WRITE_TQ_RPW / KVKIT_WRITE_TQ_MIN_CTAS for
the TurboQuant write; other formats ignore them) or ``NAME=VALUE[,NAME=VALUE...]``: any
KVKIT_WRITE_* variables that choose a write kernel variant (kvkit/cuda/write.py). Each round
times every (setting, format) once, in turn, so clock or thermal drift over the run hits every
setting alike. One timing = CUDA events around ``batch`` back-to-back ``kvkit.write_kv`` calls
of 4M token-heads (fp16 in, the slot mapping of --slots): with a ~1-2 ms kernel the host's
~0.1 ms per call stays hidden behind the queue, so the time is the kernel's (``kvkit bench``
times single calls with the host included, as a user sees them; its write rows move by a few
percent from run to run).
Prints per format and setting the median over rounds of the per-call median, its spread, and
the ratio to the first setting. ``--slots`` picks the slot mapping (kvkit.bench.write_slots):
``pages`` (the default: pages in a random order, tokens in page order, a paged prefill's
mapping), ``scatter`` (every token a different page: the narrow rows of packed planes, e.g.
NVFP4's 8 scale bytes per row, become partial-sector writes) or ``sorted``.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

ENV = ("KVKIT_WRITE_TQ_RPW", "KVKIT_WRITE_TQ_MIN_CTAS")


def _apply(setting: str) -> None:
    for name in [n for n in os.environ if n.startswith("KVKIT_WRITE_")]:
        os.environ.pop(name)
    if setting == "default":
        return
    if "=" in setting:
        for item in setting.split(","):
            name, value = item.split("=", 1)
            if not name.startswith("KVKIT_WRITE_"):
                raise SystemExit(f"setting {setting!r}: only KVKIT_WRITE_* variables")
            os.environ[name] = value
    else:
        rpw, ctas = setting.split(":")
        os.environ[ENV[0]], os.environ[ENV[1]] = rpw, ctas


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--formats", required=True)
    ap.add_argument("--settings", default="default")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=9, help="timings per (round, setting, format)")
    ap.add_argument("--batch", type=int, default=10, help="calls per timing")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--slots", choices=("pages", "scatter", "sorted"), default="pages")
    ap.add_argument("--json")
    ap.add_argument(
        "--unit-scales",
        action="store_true",
        help="K / V scales 1 (default: calibrated for N(0, 1), 5 / 448 for FP8 keys)",
    )
    args = ap.parse_args()

    import cupy as cp

    import kvkit
    from kvkit import formats
    from kvkit.bench import write_inputs, write_layer

    k, v, slots = write_inputs(args.head_dim, 8, slot_order=args.slots)
    names = args.formats.split(",")
    settings = args.settings.split()
    layers = {name: write_layer(formats.get(name, args.head_dim), 8, k.shape[0]) for name in names}
    if args.unit_scales:  # e.g. TurboQuant variant 5's power-of-two K scale path (k8v4)
        for layer in layers.values():
            if layer.fmt.has_global_scales:
                layer.k_scale = layer.v_scale = 1.0
    start, stop = cp.cuda.Event(), cp.cuda.Event()

    def one(layer) -> float:
        for _ in range(2):  # warm-up (and the build of a new setting's kernel)
            kvkit.write_kv(layer, k, v, slots)
        times = []
        for _ in range(args.reps):
            start.record()
            for _ in range(args.batch):
                kvkit.write_kv(layer, k, v, slots)
            stop.record()
            stop.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, stop) / args.batch)
        return float(np.median(times))

    res: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for s in settings:
            _apply(s)
            for name in names:
                res.setdefault((name, s), []).append(one(layers[name]))
    _apply("default")
    w = max(len(s) for s in settings) + 12
    head = "".join(f"{s:>{w}}" for s in settings)
    print(f"{'format':<22}{head}   (ms per call: median, ratio to the first; [min-max])")
    rows = []
    for name in names:
        line = f"{name:<22}"
        base = float(np.median(res[(name, settings[0])]))
        for s in settings:
            t = res[(name, s)]
            med = float(np.median(t))
            line += f"{med:>8.4f} x{med / base:.3f}"[-w:].rjust(w)
            rows.append(dict(format=name, setting=s, ms=med, all_ms=t))
        print(line)
        print(" " * 22 + "".join(f"[{min(res[(name, s)]):.4f}-{max(res[(name, s)]):.4f}]".rjust(w)
                                 for s in settings))  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
