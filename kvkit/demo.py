"""``kvkit demo``: every cache format on the same LLM-like data, side by side.

For each format the demo builds a one-layer paged cache, writes ``batch`` synthetic sequences
of ``seq_len`` tokens into it (pages shuffled, so block tables matter), decodes one query
step for the whole batch, and measures:

* bytes per token per KV head (K and V together) and the compression against fp16;
* attention output error: ``||o - o_ref||_F / ||o_ref||_F`` over the whole batch, where ``o``
  is ``kvkit.decode``'s output and ``o_ref`` float64 attention over the *unquantized* K/V
  (quantization plus kernel error; the per-row worst case of
  :func:`kvkit.testing.tolerance.rel_error` is noisier and grows with the batch);
* top-1 agreement: the fraction of (sequence, query head) pairs whose most-attended token,
  from float64 softmax over the dequantized keys (``kvkit.dequantize``), is the same token as
  with the original keys;
* the wall time of the write (all ``batch * seq_len`` tokens) and of the decode call, as the
  median of ``repeats`` calls after one warm-up call (which absorbs Numba JIT compilation).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvkit.testing.rng import derive
from kvkit.testing.synthetic import llm_like_kv, llm_like_queries
from kvkit.testing.tolerance import rel_frobenius
from kvkit.texttable import render_table

__all__ = ["DemoConfig", "DemoError", "DemoRow", "format_table", "run_demo"]


class DemoError(Exception):
    """A configuration or environment problem, reported to the user without a traceback."""


@dataclass(frozen=True)
class DemoConfig:
    backend: str = "cpu"
    head_dim: int = 128
    seq_len: int = 2048
    batch: int = 2
    num_q_heads: int = 32
    num_kv_heads: int = 8
    block_size: int = 16
    formats: Sequence[str] | None = None  # None: kvkit.formats.names()
    seed: int = 0
    repeats: int = 3


@dataclass(frozen=True)
class DemoRow:
    format: str
    bytes_per_token_head: int
    compression: float  # fp16 bytes / format bytes
    rel_error: float  # Frobenius: decode output vs float64 attention, unquantized K/V
    top1: float  # fraction of (sequence, query head) with the same argmax token
    write_ms: float
    decode_ms: float


@dataclass
class _Backend:
    name: str
    cache_backend: str | None
    to_device: Callable[[np.ndarray], object] = field(default=lambda x: x)
    to_host: Callable[[object], np.ndarray] = field(default=np.asarray)
    sync: Callable[[], None] = field(default=lambda: None)


def _backend(name: str) -> _Backend:
    if name == "cpu":
        return _Backend("cpu", None)
    if name == "cuda":
        try:
            import cupy
        except Exception as exc:
            raise DemoError(
                "--backend cuda needs CuPy and a CUDA device; CuPy is not importable here "
                f'({type(exc).__name__}: {exc}). Install with: pip install -e ".[cuda]"'
            ) from None
        try:
            if cupy.cuda.runtime.getDeviceCount() < 1:
                raise RuntimeError("no CUDA device visible")
        except Exception as exc:
            raise DemoError(f"--backend cuda: no usable CUDA device ({exc})") from None
        return _Backend(
            "cuda",
            "cuda",
            to_device=cupy.asarray,
            to_host=cupy.asnumpy,
            sync=cupy.cuda.get_current_stream().synchronize,
        )
    raise DemoError(f"unknown backend {name!r} (expected 'cpu' or 'cuda')")


def _timed(fn: Callable[[], object], sync: Callable[[], None], repeats: int):
    """Run fn once as warm-up, then ``repeats`` timed times; return (last result, median ms)."""
    result = fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return result, statistics.median(times)


def _softmax_argmax(q: np.ndarray, k: np.ndarray, scale: float) -> np.ndarray:
    """q (Hq, D), k (T, Hkv, D) -> (Hq,) index of the largest float64 attention weight."""
    hq, hkv = q.shape[0], k.shape[1]
    kv_of = np.arange(hq) // (hq // hkv)
    q64 = q.astype(np.float64)
    k64 = k.astype(np.float64)
    scores = np.einsum("hd,thd->ht", q64, k64[:, kv_of, :]) * scale  # (Hq, T)
    weights = np.exp(scores - scores.max(axis=1, keepdims=True))
    weights /= weights.sum(axis=1, keepdims=True)
    return weights.argmax(axis=1)


def _global_scales(fmt, k: np.ndarray, v: np.ndarray) -> tuple[float, float] | None:
    """Per-layer (k_scale, v_scale) to set before writing, or None to keep the defaults (1.0).

    NVFP4 needs them (``fmt.calibrate``: amax / (6 * 448)). The other formats with global
    scales (fp8_e4m3, turboquant_k8v4's FP8 keys) keep 1.0: the synthetic data (|x| < 100) fits
    E4M3 (max 448) as it is, and rescaling would not change its relative precision.
    """
    if not fmt.has_global_scales or getattr(fmt, "family", "") != "nvfp4":
        return None
    return float(fmt.calibrate(k)), float(fmt.calibrate(v))


def _check(cfg: DemoConfig) -> None:
    for attr in ("head_dim", "seq_len", "batch", "num_q_heads", "num_kv_heads", "block_size"):
        if getattr(cfg, attr) < 1:
            raise DemoError(f"{attr} must be >= 1, got {getattr(cfg, attr)}")
    if cfg.num_q_heads % cfg.num_kv_heads:
        raise DemoError(
            f"q heads ({cfg.num_q_heads}) must be a multiple of kv heads ({cfg.num_kv_heads})"
        )
    if cfg.repeats < 1:
        raise DemoError(f"repeats must be >= 1, got {cfg.repeats}")


def run_demo(cfg: DemoConfig) -> list[DemoRow]:
    """Run the demo and return one row per format, in the order requested."""
    _check(cfg)
    backend = _backend(cfg.backend)  # fail fast, before the kernels are imported

    import kvkit
    from kvkit import formats as fmts
    from kvkit.testing.reference import attention_f64

    known = list(fmts.names())
    names = list(cfg.formats) if cfg.formats is not None else known
    unknown = [n for n in names if n not in known]
    if unknown:
        raise DemoError(f"unknown format(s) {', '.join(unknown)}; known: {', '.join(known)}")

    b, t, d = cfg.batch, cfg.seq_len, cfg.head_dim
    hq, hkv, bs = cfg.num_q_heads, cfg.num_kv_heads, cfg.block_size
    scale = 1.0 / math.sqrt(d)

    # One synthetic model; each sequence is a different draw of its token noise.
    seqs = [llm_like_kv(t, hkv, d, seed=cfg.seed, seq_id=i) for i in range(b)]
    k_all = np.concatenate([k for k, _ in seqs])  # (B*T, Hkv, D) float32
    v_all = np.concatenate([v for _, v in seqs])
    q = llm_like_queries(b, hq, d, seed=cfg.seed, num_kv_heads=hkv)  # (B, Hq, D) float32

    # Paging: every sequence gets ceil(T / bs) pages, drawn from a shuffled pool.
    pages = -(-t // bs)
    num_blocks = b * pages
    perm = derive(cfg.seed, "demo", "pages").permutation(num_blocks)
    block_tables = perm.reshape(b, pages).astype(np.int32)
    pos = np.arange(t)
    seq_slots = [block_tables[i, pos // bs].astype(np.int64) * bs + pos % bs for i in range(b)]
    slot_mapping = np.concatenate(seq_slots)
    seq_lens = np.full(b, t, dtype=np.int32)

    # References from the unquantized data, in float64.
    ref_o = np.stack(
        [attention_f64(q[i][None], k, v, scale=scale)[0][0] for i, (k, v) in enumerate(seqs)]
    )  # (B, Hq, D)
    ref_top = np.stack([_softmax_argmax(q[i], k, scale) for i, (k, _) in enumerate(seqs)])

    dev = backend.to_device
    k_dev, v_dev, slots_dev = dev(k_all), dev(v_all), dev(slot_mapping)
    q_dev, bt_dev, sl_dev = dev(q), dev(block_tables), dev(seq_lens)
    seq_slots_dev = [dev(s) for s in seq_slots]

    fp16_bytes = fmts.get("fp16", head_dim=d).bytes_per_token_head
    rows = []
    for name in names:
        try:
            fmt = fmts.get(name, head_dim=d)
        except (ValueError, NotImplementedError) as exc:
            raise DemoError(f"format {name} does not support head_dim {d}: {exc}") from None
        try:
            cache = kvkit.PagedKVCache(fmt, 1, hkv, num_blocks, bs, backend=backend.cache_backend)
        except (ImportError, NotImplementedError) as exc:
            raise DemoError(f"backend {backend.name} is not available for {name}: {exc}") from None
        layer = cache.layer(0)
        scales = _global_scales(fmt, k_all, v_all)
        if scales is not None:
            layer.k_scale, layer.v_scale = scales

        _, write_ms = _timed(
            lambda layer=layer: kvkit.write_kv(layer, k_dev, v_dev, slots_dev),
            backend.sync,
            cfg.repeats,
        )
        out, decode_ms = _timed(
            lambda layer=layer: kvkit.decode(q_dev, layer, bt_dev, sl_dev, scale=scale),
            backend.sync,
            cfg.repeats,
        )
        o = backend.to_host(out).astype(np.float64)

        agree = 0
        for i in range(b):
            k_deq, _ = kvkit.dequantize(layer, seq_slots_dev[i])
            top = _softmax_argmax(q[i], backend.to_host(k_deq), scale)
            agree += int(np.count_nonzero(top == ref_top[i]))

        nbytes = int(fmt.bytes_per_token_head)
        rows.append(
            DemoRow(
                format=name,
                bytes_per_token_head=nbytes,
                compression=fp16_bytes / nbytes,
                rel_error=rel_frobenius(o, ref_o),
                top1=agree / (b * hq),
                write_ms=write_ms,
                decode_ms=decode_ms,
            )
        )
    return rows


_COLUMNS = (
    ("format", "<"),
    ("bytes/token-head", ">"),
    ("vs fp16", ">"),
    ("attn rel err", ">"),
    ("top-1 agree", ">"),
    ("write ms", ">"),
    ("decode ms", ">"),
)


def format_table(rows: Sequence[DemoRow], cfg: DemoConfig) -> str:
    """The demo's output: a caption line, one aligned table (one row per format), a legend."""
    cells = [
        [
            r.format,
            str(r.bytes_per_token_head),
            f"{r.compression:.2f}",
            f"{r.rel_error:.2e}",
            f"{r.top1:.3f}",
            f"{r.write_ms:.3f}",
            f"{r.decode_ms:.3f}",
        ]
        for r in rows
    ]
    caption = (
        f"kvkit demo: backend {cfg.backend}, batch {cfg.batch}, seq_len {cfg.seq_len}, "
        f"q heads {cfg.num_q_heads}, kv heads {cfg.num_kv_heads}, head_dim {cfg.head_dim}, "
        f"block_size {cfg.block_size}, seed {cfg.seed}"
    )
    legend = "\n".join(
        [
            "bytes/token-head: K+V bytes per token per KV head; vs fp16: compression factor.",
            "attn rel err: ||o - o_ref||_F / ||o_ref||_F, decode output vs float64 attention "
            "on the unquantized K/V.",
            "top-1 agree: fraction of (sequence, query head) attending most to the same token "
            "as with the original keys.",
            f"times: median of {cfg.repeats} calls after a warm-up; write = "
            f"{cfg.batch * cfg.seq_len} tokens, decode = one step for the batch.",
        ]
    )
    return "\n".join([caption, "", *render_table(_COLUMNS, cells), "", legend])
