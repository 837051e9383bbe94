"""Decode and write benchmarks on a CUDA GPU (``kvkit bench``, ``benchmarks/run.py``).

Method (DESIGN.md section 8; the device README's METHOD.md):

* the public call is timed exactly as a user makes it (``kvkit.decode`` / ``kvkit.write_kv``,
  host overhead included) with CUDA events: warm-up, then the median of ``reps`` runs; and
  again, for decode, as the replay of a CUDA graph that captured ``GRAPH_STEPS`` calls back
  to back (the time per call: one host launch per graph keeps the launch latency out);
* SDPA likewise: eager for the plain rows, a torch CUDA graph of the same number of calls
  for the graph rows (``sdpa_fp16_ms`` of a row is measured the way the row's kvkit time is);
* inputs are larger than the L2 cache or rotated: when one cache is smaller than twice the L2,
  several are built and the runs cycle through them;
* bytes are counted explicitly: decode reads the cache planes of every token it attends to,
  the block tables and q, and writes o (float32); write reads fp16 K and V and the slot
  mapping and writes the packed planes. Effective bandwidth = bytes / time, reported next to
  a device-to-device copy measured in the same run (bytes read + bytes written);
* where torch is importable, ``torch.nn.functional.scaled_dot_product_attention`` on
  contiguous fp16 K/V of the same shape (``enable_gqa=True``) runs in the same process.

Outputs: a table on stdout, ``bench.json`` (one row per measurement: op, format, B, T, Hq, Hkv,
D, kvkit_ms, sdpa_fp16_ms, bytes, effective_TBps, copy_TBps, graph) and ``bench.png``.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import formats

BLOCK_SIZE = 16
#: The issue's shape set: (B, T) at Hq=32, Hkv=8, D=128, plus head dims 64/256 and GQA 16
#: (and GQA 8 and head_dim 96, the group and head size of many served models, beside them:
#: ``shape_set``; formats without that head_dim, the MSE-key TurboQuant presets at 96, are
#: left out of its rows).
MAIN = [(1, 32768), (8, 8192), (32, 4096), (64, 8192), (1, 131072)]
#: Token-heads per write measurement (4M, the write target's size).
WRITE_TOKEN_HEADS = 4 * 2**20


@dataclass(frozen=True)
class Shape:
    B: int
    T: int
    Hq: int = 32
    Hkv: int = 8
    D: int = 128

    def label(self) -> str:
        return shape_label(self.B, self.T, self.Hq, self.Hkv, self.D)


def shape_label(B: int, T: int, Hq=32, Hkv=8, D=128, eq: str = "") -> str:
    """ "B64 T8192", plus " D64" / " Hq128" / " Hkv4" where they differ from the main set (a
    None field is left out); eq="=" gives "B=64 T=8192 D=64"."""
    label = f"B{eq}{B} T{eq}{T}"
    for name, value, main in (("D", D, 128), ("Hq", Hq, 32), ("Hkv", Hkv, 8)):
        if value is not None and value != main:
            label += f" {name}{eq}{value}"
    return label


def row_label(row: dict, eq: str = "") -> str:
    """shape_label of a bench row (bench.json)."""
    return shape_label(row["B"], row["T"], row["Hq"], row["Hkv"], row["D"], eq)


#: Decode steps whose CUDA-graph replay is the latency target (B=1 and B=8 at T=4096).
STEPS = [(1, 4096), (8, 4096)]


def shape_set(quick: bool = False) -> list[Shape]:
    shapes = [Shape(b, t) for b, t in MAIN]
    shapes += [Shape(32, 4096, D=64), Shape(32, 4096, D=256), Shape(32, 4096, Hq=128)]
    shapes += [Shape(32, 4096, Hq=64), Shape(32, 4096, D=96)]  # GQA 8, head_dim 96
    shapes += [Shape(b, t) for b, t in STEPS]
    return [Shape(8, 8192), Shape(64, 8192)] if quick else shapes


def parse_shapes(text: str) -> list[Shape]:
    """Shapes from ``"BxT[xHqxHkvxD],..."``, e.g. ``"64x8192,1x131072,32x4096x32x8x256"``.

    Missing fields take the main set's defaults (Hq=32, Hkv=8, D=128).
    """
    shapes = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        fields = item.lower().split("x")
        if len(fields) not in (2, 5) or not all(f.isdigit() and int(f) > 0 for f in fields):
            raise ValueError(f"bad shape {item!r}: want BxT or BxTxHqxHkvxD with positive integers")
        values = [int(f) for f in fields]
        shape = Shape(*values)
        if shape.Hq % shape.Hkv:
            raise ValueError(f"bad shape {item!r}: Hq={shape.Hq} is not a multiple of Hkv")
        shapes.append(shape)
    if not shapes:
        raise ValueError("no shapes given")
    return shapes


def _l2_bytes() -> int:
    import cupy as cp

    return int(cp.cuda.Device().attributes["L2CacheSize"])


def time_ms(fn, reps: int, warmup: int = 3) -> float:
    """Median milliseconds of fn(i) over reps runs, CUDA events on the current stream."""
    import cupy as cp

    for i in range(warmup):
        fn(i)
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for i in range(reps):
        start.record()
        fn(i)
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return float(np.median(times))


#: Calls captured per CUDA graph: replaying several steps back to back keeps the host's
#: launch latency out of the per-step time (one launch per graph, not per step).
GRAPH_STEPS = 8


def _graph_calls(steps: int, slots: int) -> int:
    """Calls per graph: at least ``steps``, a multiple of ``slots`` (each rotation slot as
    often as the others, consecutive calls on different slots)."""
    return -(-max(steps, slots) // slots) * slots


def graph_ms(fn, reps: int, slots: int = 1, steps: int = GRAPH_STEPS) -> float | None:
    """Median milliseconds per call of a CUDA-graph replay: one graph captures ``steps``
    calls fn(0), fn(1), ... (a multiple of ``slots``, so rotated inputs stay rotated; call
    j uses slot j % slots), and the time of one replay is divided by the calls in it. None
    if capture fails (e.g. a CuPy without graph support).

    fn(j) must not allocate: decode steps run through a ``kvkit.DecodePlan``."""
    import cupy as cp

    n = _graph_calls(steps, slots)
    stream = cp.cuda.Stream(non_blocking=True)
    try:
        with stream:
            for j in range(max(3, slots)):  # warm: modules loaded, buffers planned
                fn(j)
            stream.synchronize()
            stream.begin_capture()
            for j in range(n):
                fn(j)
            graph = stream.end_capture()
            ms = time_ms(lambda i: graph.launch(stream), reps)
    except Exception as exc:  # report, don't hide: the row records None
        print(f"  graph capture failed: {type(exc).__name__}: {exc}")
        return None
    return ms / n


def torch_graph_ms(fn, reps: int, slots: int = 1, steps: int = GRAPH_STEPS) -> float | None:
    """graph_ms for a torch callable (torch.cuda.CUDAGraph), timed with torch events."""
    import torch

    n = _graph_calls(steps, slots)
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for j in range(max(3, slots)):
                fn(j)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for j in range(n):
                fn(j)
        for _ in range(3):
            graph.replay()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(reps):
            start.record()
            graph.replay()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
    except Exception as exc:
        print(f"  torch graph capture failed: {type(exc).__name__}: {exc}")
        return None
    return float(np.median(times)) / n


def copy_tbps() -> float:
    import cupy as cp

    n = 2**30  # 4 GiB of float32 each way
    src = cp.ones(n, cp.float32)
    dst = cp.empty_like(src)

    def copy(i, dst=dst, src=src):
        cp.copyto(dst, src)

    ms = time_ms(copy, reps=10)
    return 2 * n * 4 / (ms * 1e-3) / 1e12


def _fill_layer(layer, n_slots: int, rng) -> None:
    import cupy as cp

    import kvkit

    chunk = 1 << 16
    for s in range(0, n_slots, chunk):
        n = min(chunk, n_slots - s)
        k = rng.standard_normal((n, layer.num_kv_heads, layer.head_dim), dtype=cp.float32)
        kvkit.write_kv(layer, k.astype(cp.float16), k.astype(cp.float16),
                       cp.arange(s, s + n, dtype=cp.int64))  # fmt: skip


def build_decode_case(
    name: str, shape: Shape, rng, *, block_size: int = BLOCK_SIZE, shuffle: bool = True,
    seed: int = 0,
):  # fmt: skip
    """A cache holding B sequences of T tokens on pages of block_size tokens, shuffled (a
    seeded permutation, the benchmark's layout) or in order, and its (B, pages) int32 block
    tables."""
    import cupy as cp

    import kvkit

    fmt = formats.get(name, shape.D)
    pages = math.ceil(shape.T / block_size)
    cache = kvkit.PagedKVCache(fmt, 1, shape.Hkv, shape.B * pages, block_size, backend="cuda")
    layer = cache.layer(0)
    if fmt.has_global_scales:  # data ~ N(0, 1): amax about 5
        layer.k_scale = layer.v_scale = fmt.calibrate(np.array([5.0]))
    _fill_layer(layer, shape.B * pages * block_size, rng)
    order = np.arange(shape.B * pages)
    if shuffle:
        order = np.random.default_rng(seed).permutation(order)
    return layer, cp.asarray(order.astype(np.int32).reshape(shape.B, pages))


def sdpa_runner(shape: Shape):
    """(run, slots): run(i) calls torch SDPA fp16 (``enable_gqa=True``) for one decode step
    of ``shape`` on contiguous K / V (B, Hkv, T, D) float16, slot i % slots of enough rotated
    copies to pass twice the L2. Needs torch with CUDA."""
    import torch
    import torch.nn.functional as F

    kv_bytes = 2 * shape.B * shape.Hkv * shape.T * shape.D * 2
    n_rot = max(1, math.ceil(2 * _l2_bytes() / kv_bytes))
    dims = (shape.B, shape.Hkv, shape.T, shape.D)
    # Distinct K and V tensors: with K is V the kernel would read half the bytes.
    kvs = [
        tuple(torch.randn(dims, device="cuda", dtype=torch.float16) for _ in range(2))
        for _ in range(n_rot)
    ]
    qt = torch.randn(shape.B, shape.Hq, 1, shape.D, device="cuda", dtype=torch.float16)

    def run(i):
        k, v = kvs[i % len(kvs)]
        F.scaled_dot_product_attention(qt, k, v, enable_gqa=True)

    return run, n_rot


def decode_plan_us(cases, shape: Shape, q, lens, splits: int | None, reps: int):
    """(the split count launched, graph-replay us per step or None) of a
    ``kvkit.DecodePlan(num_splits=splits)`` step (None: the default heuristic) over the rotated
    ``cases`` (``build_decode_case`` pairs); ``q``: (B, Hq, D) float16, ``lens``: (B,) int32."""
    import kvkit

    plans = [
        kvkit.DecodePlan(layer, shape.B, shape.Hq, tables.shape[1], num_splits=splits)
        for layer, tables in cases
    ]

    def step(i):
        plans[i % len(plans)].run(q, cases[i % len(cases)][1], lens)

    ms = graph_ms(step, reps, slots=len(cases))
    return plans[0].num_splits, (None if ms is None else round(1e3 * ms, 2))


def decode_bytes(fmt, shape: Shape) -> int:
    cache = shape.B * shape.T * shape.Hkv * fmt.bytes_per_token_head
    tables = shape.B * math.ceil(shape.T / BLOCK_SIZE) * 4
    q_o = shape.B * shape.Hq * shape.D * (2 + 4)
    return cache + tables + q_o


def bench_decode(names, shapes, reps, copy_bw, graph=True):
    import cupy as cp

    import kvkit

    try:
        import torch
    except Exception:  # torch is optional
        torch = None
    l2 = _l2_bytes()
    rng = cp.random.RandomState(0)
    rows = []
    for shape in shapes:
        lens = cp.full((shape.B,), shape.T, dtype=cp.int32)
        q = rng.standard_normal((shape.B, shape.Hq, shape.D), dtype=cp.float32).astype(cp.float16)
        sdpa = sdpa_graph = None
        if torch is not None:
            run_sdpa, slots = sdpa_runner(shape)
            sdpa = round(time_ms(run_sdpa, reps), 4)
            sdpa_graph = torch_graph_ms(run_sdpa, reps, slots=slots) if graph else None
            sdpa_graph = None if sdpa_graph is None else round(sdpa_graph, 4)
            del run_sdpa
        for name in names:
            try:
                fmt = formats.get(name, shape.D)
            except ValueError as exc:  # e.g. MSE keys need a power-of-two head_dim
                print(f"  {name} at {shape.label()}: skipped ({exc})")
                continue
            nbytes = decode_bytes(fmt, shape)
            n_rot = max(1, math.ceil(2 * l2 / (nbytes - shape.B * shape.Hq * shape.D * 6)))
            cases = [build_decode_case(name, shape, rng) for _ in range(n_rot)]

            def run(i, q=q, cases=cases, lens=lens):
                layer, tables = cases[i % len(cases)]
                kvkit.decode(q, layer, tables, lens)

            # Warm-up: every rotation slot twice, so the timed calls are a decode loop's steady
            # state (each slot a layer that a model calls every step), not first calls.
            timings = [(False, time_ms(run, reps, warmup=max(3, 2 * len(cases) + 1)))]
            if graph:
                # The graph captures a planned step (fixed splits, preallocated buffers).
                plans = [kvkit.DecodePlan(layer, shape.B, shape.Hq, tables.shape[1])
                         for layer, tables in cases]  # fmt: skip

                def step(i, q=q, cases=cases, plans=plans, lens=lens):
                    plans[i % len(plans)].run(q, cases[i % len(cases)][1], lens)

                timings.append((True, graph_ms(step, reps, slots=len(cases))))
                del plans, step
            for is_graph, ms in timings:
                if ms is None:
                    continue
                rows.append(
                    dict(
                        op="decode", format=name, B=shape.B, T=shape.T, Hq=shape.Hq,
                        Hkv=shape.Hkv, D=shape.D, kvkit_ms=round(ms, 4),
                        sdpa_fp16_ms=sdpa_graph if is_graph else sdpa,
                        bytes=nbytes, effective_TBps=round(nbytes / (ms * 1e-3) / 1e12, 3),
                        copy_TBps=round(copy_bw, 3), graph=is_graph,
                    )
                )  # fmt: skip
            print(f"decode {name:<20} {shape.label():<22} {timings[0][1]:8.3f} ms", flush=True)
            del cases, run
            cp.get_default_memory_pool().free_all_blocks()
    return rows


#: Slot orders of the write benchmark. "pages": the pages in a seeded random order, the tokens
#: of each page in order (what a paged prefill's slot mapping looks like: the block allocator's
#: pages are scattered, a sequence fills each page it gets); "scatter": a seeded permutation of
#: all slots (every token on a different page, as the B tokens of one decode step are); "sorted":
#: 0..N-1 (one long contiguous run). Packed planes with narrow rows (NVFP4's 8 scale bytes per
#: token, a TurboQuant slot of 134 bytes) turn into partial-sector writes under "scatter".
WRITE_SLOT_ORDERS = ("pages", "scatter", "sorted")


def write_slots(n: int, order: str, block_size: int = 16, seed: int = 1) -> np.ndarray:
    """Slot mapping (n,) int64 of the write benchmark: a permutation of 0..n-1 in one of
    WRITE_SLOT_ORDERS; n must be a multiple of block_size for "pages"."""
    rng = np.random.default_rng(seed)
    if order == "sorted":
        return np.arange(n, dtype=np.int64)
    if order == "scatter":
        return rng.permutation(n).astype(np.int64)
    if order == "pages":
        if n % block_size:
            raise ValueError(f"n={n} is not a multiple of block_size={block_size}")
        pages = rng.permutation(n // block_size).astype(np.int64)
        t = np.arange(n, dtype=np.int64)
        return pages[t // block_size] * block_size + t % block_size
    raise ValueError(f"slot order must be one of {WRITE_SLOT_ORDERS}, got {order!r}")


def write_inputs(head_dim: int = 128, num_kv_heads: int = 8, *, slot_order: str = "pages"):
    """The write benchmark's inputs: k, v (N, Hkv, D) float16 (N = 4M token-heads / Hkv,
    standard normal) and slots (N,) int64 (write_slots in `slot_order`, 16-token pages)."""
    import cupy as cp

    n = WRITE_TOKEN_HEADS // num_kv_heads
    rng = cp.random.RandomState(1)
    k = rng.standard_normal((n, num_kv_heads, head_dim), dtype=cp.float32).astype(cp.float16)
    v = rng.standard_normal((n, num_kv_heads, head_dim), dtype=cp.float32).astype(cp.float16)
    return k, v, cp.asarray(write_slots(n, slot_order, BLOCK_SIZE))


def write_layer(fmt, num_kv_heads: int, n_slots: int):
    """A CUDA cache layer of n_slots slots (16-token pages) for the write benchmark, global
    scales (where the format has them) calibrated for standard-normal data."""
    import kvkit

    cache = kvkit.PagedKVCache(fmt, 1, num_kv_heads, n_slots // BLOCK_SIZE, BLOCK_SIZE,
                               backend="cuda")  # fmt: skip
    layer = cache.layer(0)
    if fmt.has_global_scales:
        layer.k_scale = layer.v_scale = fmt.calibrate(np.array([5.0]))
    return layer


def bench_write(names, reps, copy_bw, head_dim=128, num_kv_heads=8, orders=("pages", "scatter")):
    """write_kv of 4M token-heads (fp16 in) per format and slot order (WRITE_SLOT_ORDERS);
    rows carry the order under "slots"."""
    import cupy as cp

    import kvkit

    rows = []
    for order in orders:
        k, v, slots = write_inputs(head_dim, num_kv_heads, slot_order=order)
        n = k.shape[0]
        for name in names:
            fmt = formats.get(name, head_dim)
            layer = write_layer(fmt, num_kv_heads, n)
            ms = time_ms(
                lambda i, layer=layer, k=k, v=v, s=slots: kvkit.write_kv(layer, k, v, s), reps
            )
            nbytes = n * num_kv_heads * (2 * head_dim * 2 + fmt.bytes_per_token_head) + n * 8
            rows.append(
                dict(
                    op="write", format=name, B=n, T=1, Hq=None, Hkv=num_kv_heads, D=head_dim,
                    kvkit_ms=round(ms, 4), sdpa_fp16_ms=None, bytes=nbytes,
                    effective_TBps=round(nbytes / (ms * 1e-3) / 1e12, 3),
                    copy_TBps=round(copy_bw, 3), graph=False, slots=order,
                )
            )  # fmt: skip
            print(f"write  {name:<20} {n * num_kv_heads} token-heads, {order:<7} slots "
                  f"{ms:8.3f} ms", flush=True)  # fmt: skip
            del layer
            cp.get_default_memory_pool().free_all_blocks()
    return rows


def print_table(rows) -> None:
    print(f"\n{'op':<6} {'format':<19} {'shape':<22} {'graph':<5} {'ms':>8} {'sdpa ms':>8} "
          f"{'TB/s':>6} {'%copy':>6} {'sdpa/kvkit':>10}")  # fmt: skip
    for r in rows:
        if r["op"] == "decode":
            shape = row_label(r)
        else:
            shape = f"{r['B'] * r['T'] * r['Hkv']} th, {r.get('slots', 'scatter')}"
        sd = r["sdpa_fp16_ms"]
        ratio = f"{sd / r['kvkit_ms']:.2f}x" if sd else "-"
        print(
            f"{r['op']:<6} {r['format']:<19} {shape:<22} {str(r['graph']):<5} "
            f"{r['kvkit_ms']:>8.3f} {(sd if sd is not None else float('nan')):>8.3f} "
            f"{r['effective_TBps']:>6.2f} {100 * r['effective_TBps'] / r['copy_TBps']:>6.1f} "
            f"{ratio:>10}"
        )


def markdown_tables(rows) -> str:
    """BENCHMARKS.md tables from bench rows: decode (plain and graph side by side, with the
    SDPA time measured the same way) and write."""

    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    dec = {}
    for r in rows:
        if r["op"] == "decode":
            dec.setdefault((r["format"], r["B"], r["T"], r["Hq"], r["D"]), {})[r["graph"]] = r
    out = [
        "| format | shape | kvkit ms | graph ms | SDPA ms | SDPA graph ms | TB/s (graph) "
        "| % of copy (graph) | SDPA / kvkit (graph) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for pair in dec.values():
        plain, gr = pair.get(False), pair.get(True)
        ref = gr or plain
        ratio = None
        if gr is not None and gr["sdpa_fp16_ms"]:
            ratio = f"{gr['sdpa_fp16_ms'] / gr['kvkit_ms']:.2f}x"
        times = [num(r and r[key], ".4f") for key in ("kvkit_ms", "sdpa_fp16_ms")
                 for r in (plain, gr)]  # fmt: skip
        out.append(
            f"| {ref['format']} | {row_label(ref, '=')} | {times[0]} | {times[1]} | {times[2]} "
            f"| {times[3]} | {ref['effective_TBps']:.2f} "
            f"| {100 * ref['effective_TBps'] / ref['copy_TBps']:.1f} | {ratio or '-'} |"
        )
    writes = [r for r in rows if r["op"] == "write"]
    if writes:
        out += ["", "| format | token-heads | slots | ms | TB/s | % of copy |",
                "|---|---|---|---|---|---|"]  # fmt: skip
        for r in writes:
            out.append(
                f"| {r['format']} | {r['B'] * r['T'] * r['Hkv']} | {r.get('slots', 'scatter')} "
                f"| {r['kvkit_ms']:.3f} "
                f"| {r['effective_TBps']:.2f} | {100 * r['effective_TBps'] / r['copy_TBps']:.1f} |"
            )
    return "\n".join(out) + "\n"


def plot_points(rows) -> dict:
    """What the plot draws, per decode shape (B, T, Hq, D) and format: ``ms`` the CUDA-graph
    replay time where the rows have one (the time the issue's targets read), else the plain
    call's; ``plain_ms`` the plain call's (None without a plain row); ``floor_ms`` bytes / the
    same run's copy bandwidth; and per shape ``sdpa_ms`` / ``sdpa_plain_ms`` likewise."""
    out: dict = {}
    for r in rows:
        if r["op"] != "decode":
            continue
        shape = out.setdefault((r["B"], r["T"], r["Hq"], r["D"]),
                               {"formats": {}, "sdpa_ms": None, "sdpa_plain_ms": None})  # fmt: skip
        pt = shape["formats"].setdefault(r["format"], {"ms": None, "plain_ms": None})
        pt["floor_ms"] = r["bytes"] / (r["copy_TBps"] * 1e12) * 1e3
        if r["graph"]:
            pt["ms"] = r["kvkit_ms"]
            shape["sdpa_ms"] = shape["sdpa_ms"] or r["sdpa_fp16_ms"]
        else:
            pt["plain_ms"] = r["kvkit_ms"]
            shape["sdpa_plain_ms"] = shape["sdpa_plain_ms"] or r["sdpa_fp16_ms"]
    for shape in out.values():
        for pt in shape["formats"].values():
            pt["ms"] = pt["ms"] if pt["ms"] is not None else pt["plain_ms"]
        shape["sdpa_ms"] = shape["sdpa_ms"] or shape["sdpa_plain_ms"]
    return out


def plot(rows, path: Path) -> bool:
    """Decode time per format per shape: bars the CUDA-graph replay (plain calls where a row
    has no graph time), hollow dots the plain calls, ticks the byte floor, lines SDPA fp16."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return False
    points = plot_points(rows)
    shapes = list(points)
    names = list(dict.fromkeys(f for s in points.values() for f in s["formats"]))
    ncols = min(4, len(shapes))
    nrows = math.ceil(len(shapes) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.4 * ncols, 4.4 * nrows), squeeze=False)
    for ax in axes.flat[len(shapes) :]:
        ax.set_visible(False)
    for ax, (b, t, hq, d) in zip(axes.flat, shapes):
        shape = points[(b, t, hq, d)]
        xs = np.arange(len(names))

        def col(key, shape=shape):
            return [np.nan if n not in shape["formats"] or shape["formats"][n][key] is None
                    else shape["formats"][n][key] for n in names]  # fmt: skip

        ax.bar(xs, col("ms"), color="tab:blue", label="kvkit decode (graph replay)")
        ax.scatter(xs, col("plain_ms"), marker="o", s=14, facecolors="none",
                   edgecolors="tab:gray", label="kvkit decode (plain call)")  # fmt: skip
        ax.scatter(xs, col("floor_ms"), marker="_", s=300, color="black",
                   label="bytes / copy bandwidth")  # fmt: skip
        if shape["sdpa_ms"]:
            ax.axhline(shape["sdpa_ms"], color="tab:red", ls="--", label="torch SDPA fp16 (graph)")
        if shape["sdpa_plain_ms"] and shape["sdpa_plain_ms"] != shape["sdpa_ms"]:
            ax.axhline(shape["sdpa_plain_ms"], color="tab:red", ls=":", lw=0.8,
                       label="torch SDPA fp16 (plain)")  # fmt: skip
        ax.set_yscale("log")
        ax.set_xticks(xs, names, rotation=75, fontsize=7)
        ax.set_title(f"B={b} T={t}" + ("" if (hq, d) == (32, 128) else f"\nHq={hq} D={d}"),
                     fontsize=9)  # fmt: skip
        ax.set_ylabel("ms (log)")
    axes[0][0].legend(fontsize=6, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kvkit bench", description=__doc__.splitlines()[0])
    add_arguments(ap)
    return run(ap.parse_args(argv))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", type=Path, default=Path("bench_out"), help="output folder")
    ap.add_argument("--formats", default=",".join(formats.names()), help="comma-separated")
    ap.add_argument("--reps", type=int, default=30, help="timed runs per point (median)")
    ap.add_argument("--quick", action="store_true", help="two shapes only")
    ap.add_argument(
        "--shapes",
        type=parse_shapes,
        default=None,
        help="decode shapes instead of the set: BxT[xHqxHkvxD],... (e.g. 64x8192,1x131072)",
    )
    ap.add_argument("--no-graph", action="store_true", help="skip CUDA-graph replay timings")
    ap.add_argument("--no-write", action="store_true", help="skip the write benchmark")


def run(args: argparse.Namespace) -> int:
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device visible")
    except Exception as exc:
        print(f"kvkit bench needs CuPy and a CUDA GPU ({type(exc).__name__}: {exc})")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    names = [n for n in args.formats.split(",") if n]
    copy_bw = copy_tbps()
    print(f"device copy: {copy_bw:.2f} TB/s (read + write)")
    shapes = args.shapes if args.shapes is not None else shape_set(args.quick)
    rows = bench_decode(names, shapes, args.reps, copy_bw, graph=not args.no_graph)
    if not args.no_write:
        rows += bench_write(names, args.reps, copy_bw)
    (args.out / "bench.json").write_text(json.dumps(rows, indent=1))
    (args.out / "bench.md").write_text(markdown_tables(rows))
    if plot(rows, args.out / "bench.png"):
        print(f"plot: {args.out / 'bench.png'}")
    print_table(rows)
    return 0
