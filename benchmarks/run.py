"""Decode benchmark on a CUDA GPU: kvkit per format vs torch SDPA fp16 vs a device copy.

Times the public ``kvkit.decode`` call exactly as a user makes it (host overhead included)
with CUDA events: warm-up, then the median of ``--reps`` runs. When one cache is smaller than
twice the L2 cache, several caches are built and the runs rotate through them, so the numbers
are memory numbers, not L2 numbers. Bytes are counted explicitly: cache planes of the tokens
read + block tables + q + o. Effective bandwidth = bytes / time; the copy bandwidth of the same
GPU (bytes read + bytes written of a large device-to-device copy) is measured in the same run.

    python benchmarks/run.py --out DIR [--formats a,b] [--quick]

Writes ``DIR/bench.json`` (a list of rows: op, format, B, T, Hq, Hkv, D, kvkit_ms,
sdpa_fp16_ms, bytes, effective_TBps, copy_TBps, graph) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import cupy as cp
import numpy as np

import kvkit
from kvkit import formats

MAIN_SHAPES = [(1, 32768), (8, 8192), (32, 4096), (64, 8192), (1, 131072)]
HQ, HKV, D, BS = 32, 8, 128, 16
L2_BYTES = 60 * 2**20  # H200; rotation keeps each timed input out of L2


def time_ms(fn, reps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn(0)
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for i in range(reps):
        start.record()
        fn(i)
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return float(np.median(times))


def copy_tbps() -> float:
    n = 2**30  # 4 GiB of float32 each way
    src = cp.ones(n, cp.float32)
    dst = cp.empty_like(src)

    def copy(i, dst=dst, src=src):
        cp.copyto(dst, src)

    ms = time_ms(copy, reps=10)
    return 2 * n * 4 / (ms * 1e-3) / 1e12


def build_layer(name: str, b: int, t: int, rng: cp.random.RandomState):
    fmt = formats.get(name, D)
    pages = math.ceil(t / BS)
    layer = kvkit.PagedKVCache(fmt, 1, HKV, b * pages, BS, backend="cuda").layer(0)
    if fmt.has_global_scales:
        layer.k_scale = layer.v_scale = fmt.calibrate(np.array([4.0]))
    chunk = 1 << 16
    total = b * pages * BS
    for s in range(0, total, chunk):
        n = min(chunk, total - s)
        k = rng.standard_normal((n, HKV, D), dtype=cp.float32).astype(cp.float16)
        kvkit.write_kv(layer, k, k, cp.arange(s, s + n, dtype=cp.int64))
    perm = cp.asarray(np.random.default_rng(0).permutation(b * pages).astype(np.int32))
    tables = perm.reshape(b, pages)
    return layer, tables


def bench_decode(names, shapes, reps, copy_bw):
    rows = []
    rng = cp.random.RandomState(0)
    try:
        import torch
        import torch.nn.functional as F
    except Exception:  # torch is optional
        torch = None
    for b, t in shapes:
        lens = cp.full((b,), t, dtype=cp.int32)
        q = rng.standard_normal((b, HQ, D), dtype=cp.float32).astype(cp.float16)
        sdpa_ms = None
        if torch is not None:
            kv_bytes = 2 * b * HKV * t * D * 2
            n_rot = max(1, math.ceil(2 * L2_BYTES / kv_bytes))
            shape = (b, HKV, t, D)
            ks = [torch.randn(shape, device="cuda", dtype=torch.float16) for _ in range(n_rot)]
            qt = torch.randn(b, HQ, 1, D, device="cuda", dtype=torch.float16)

            def sdpa(i, qt=qt, ks=ks):
                kv = ks[i % len(ks)]
                F.scaled_dot_product_attention(qt, kv, kv, enable_gqa=True)

            sdpa_ms = time_ms(sdpa, reps)
            del ks, sdpa
        for name in names:
            fmt = formats.get(name, D)
            cache_bytes = b * t * HKV * fmt.bytes_per_token_head
            n_rot = max(1, math.ceil(2 * L2_BYTES / cache_bytes))
            built = [build_layer(name, b, t, rng) for _ in range(n_rot)]

            def run(i, q=q, built=built, lens=lens):
                layer, tables = built[i % len(built)]
                kvkit.decode(q, layer, tables, lens)

            ms = time_ms(run, reps)
            nbytes = cache_bytes + b * math.ceil(t / BS) * 4 + b * HQ * D * (2 + 4)
            rows.append(
                dict(
                    op="decode", format=name, B=b, T=t, Hq=HQ, Hkv=HKV, D=D,
                    kvkit_ms=round(ms, 4),
                    sdpa_fp16_ms=None if sdpa_ms is None else round(sdpa_ms, 4),
                    bytes=int(nbytes), effective_TBps=round(nbytes / (ms * 1e-3) / 1e12, 3),
                    copy_TBps=round(copy_bw, 3), graph=False,
                )
            )  # fmt: skip
            tbps = rows[-1]["effective_TBps"]
            print(f"decode {name:<20} B={b:<3} T={t:<6} {ms:8.3f} ms {tbps:6.2f} TB/s", flush=True)
            del built, run
            cp.get_default_memory_pool().free_all_blocks()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench_out"))
    ap.add_argument("--formats", default=",".join(formats.names()))
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="two shapes only")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    names = args.formats.split(",")
    shapes = MAIN_SHAPES[1:4:2] if args.quick else MAIN_SHAPES
    copy_bw = copy_tbps()
    print(f"device copy: {copy_bw:.2f} TB/s (read + write)")
    rows = bench_decode(names, shapes, args.reps, copy_bw)
    (args.out / "bench.json").write_text(json.dumps(rows, indent=1))
    print(f"\n{'format':<20} {'B':>3} {'T':>6} {'kvkit ms':>9} {'sdpa ms':>8} {'TB/s':>6} "
          f"{'% copy':>6} {'vs sdpa':>7}")  # fmt: skip
    for r in rows:
        sd = r["sdpa_fp16_ms"]
        print(
            f"{r['format']:<20} {r['B']:>3} {r['T']:>6} {r['kvkit_ms']:>9.3f} "
            f"{(sd if sd is not None else float('nan')):>8.3f} {r['effective_TBps']:>6.2f} "
            f"{100 * r['effective_TBps'] / r['copy_TBps']:>6.1f} "
            f"{(sd / r['kvkit_ms'] if sd else float('nan')):>7.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
