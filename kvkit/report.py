"""``kvkit report``: a quality report for every cache format on LLM-like synthetic K/V.

For each format the report builds a one-layer paged cache on the CPU backend, writes
``sequences`` synthetic sequences of ``tokens`` tokens into it through the public API
(:func:`kvkit.write_kv`), reads them back (:func:`kvkit.dequantize`), decodes one query step
(:func:`kvkit.decode`), and measures, against the original float data in float64:

* **K / V reconstruction error**: ``||x_hat - x||_F / ||x||_F`` over every token-head, and the
  per-vector mean of ``||x_hat_i - x_i|| / ||x_i||``;
* **inner-product bias**: the least-squares slope of ``<q, k_hat>`` on ``<q, k>`` with one
  intercept per (sequence, query head) (softmax ignores a per-row shift, so the slope is the
  part of the bias that changes attention: < 1 flattens it, > 1 sharpens it; 1 = unbiased),
  the relative RMS error of the scores ``||s_hat - s|| / ||s||``, and the RMS error of the
  logits (``scale * <q, k>``) in logit units;
* **attention total-variation distance**: ``0.5 * sum_t |p_hat_t - p_t|`` averaged over
  (sequence, query head), ``p`` the float64 softmax of the original logits and ``p_hat`` that
  of the logits over the dequantized keys;
* **attention output error**: ``||o - o_ref||_F / ||o_ref||_F`` over the batch, ``o`` from
  ``kvkit.decode`` and ``o_ref`` float64 attention on the original K/V (as ``kvkit demo``);
* **needle retrieval rate** at several logit margins ``m``: a trial picks a sequence, a query
  head and a position ``p``, and moves the original key at ``p`` along the query so that its
  logit exceeds the best other logit by exactly ``m``; the needle is quantized (written to the
  cache like any token) and the trial succeeds when the argmax of the quantized logits over the
  sequence is still ``p``. The same trials (same queries, heads and positions) serve every
  margin and every format, so the curves differ only by the format and the margin.

Quantization is per token-head for every format once the per-layer global scales are fixed,
so the needle tokens are written to their own slots next to the haystack and scored as if they
replaced the haystack key at ``p``. NVFP4 layers get ``k_scale``/``v_scale`` from
``fmt.calibrate`` over everything the layer holds; the FP8 formats keep 1.0 (the data fits
E4M3 as it is, see ``kvkit.demo``).

Bits per element = ``8 * bytes_per_token_head / (2 * head_dim)`` (K and V together);
capacity vs fp16 = fp16 bytes / format bytes (512 / bytes at D = 128).
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

from kvkit.testing.rng import derive
from kvkit.testing.synthetic import llm_like_kv, llm_like_queries
from kvkit.testing.tolerance import rel_frobenius
from kvkit.texttable import render_table

__all__ = [
    "FormatResult",
    "Progress",
    "ReportConfig",
    "ReportError",
    "format_table",
    "run_report",
    "to_json",
    "write_outputs",
    "write_plots",
]

#: Default needle margins, in logit units (natural-log attention weight ratios).
DEFAULT_MARGINS = (0.25, 0.5, 1.0, 2.0, 4.0)
#: File names written into the output directory.
JSON_NAME = "report.json"
PLOT_ERROR_VS_BITS = "report_error_vs_bits.png"
PLOT_CAPACITY = "report_capacity.png"
PLOT_NEEDLE = "report_needle.png"


class ReportError(Exception):
    """A configuration problem, reported to the user without a traceback."""


@dataclass(frozen=True)
class ReportConfig:
    """Settings of one report run (every field is recorded in ``report.json``)."""

    head_dim: int = 128
    tokens: int = 1024  # per sequence
    sequences: int = 4
    num_q_heads: int = 32
    num_kv_heads: int = 8
    block_size: int = 16
    formats: Sequence[str] | None = None  # None: kvkit.formats.names()
    seed: int = 0
    trials: int = 2000  # needle trials (each is scored at every margin)
    margins: Sequence[float] = field(default=DEFAULT_MARGINS)


@dataclass(frozen=True)
class FormatResult:
    """Every number the report measures for one format (see the module docstring)."""

    format: str
    bytes_per_token_head: int
    bits_per_element: float
    capacity_vs_fp16: float
    k_rel_error: float
    k_vector_error: float
    v_rel_error: float
    v_vector_error: float
    score_slope: float
    score_rel_rms: float
    score_rms_logits: float
    attention_tv: float
    output_rel_error: float
    needle_rate: list[float]  # one per margin, in the config's order


class Progress:
    """A one-line ``\\r`` progress counter on stderr: ``label [####....] i/n note  12.3 s``."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None, width: int = 24):
        self.total = max(int(total), 1)
        self.label = label
        self.stream = sys.stderr if stream is None else stream
        self.width = width
        self.start = time.perf_counter()
        self._last = 0

    def update(self, done: int, note: str = "") -> None:
        """Show ``done`` of ``total`` steps finished, with a short note (e.g. what runs now)."""
        filled = round(self.width * min(done, self.total) / self.total)
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.perf_counter() - self.start
        text = f"{self.label} [{bar}] {done}/{self.total} {note} {elapsed:6.1f} s"
        pad = " " * max(self._last - len(text), 0)
        self._last = len(text)
        self.stream.write("\r" + text + pad)
        self.stream.flush()

    def close(self) -> None:
        """End the line."""
        self.stream.write("\n")
        self.stream.flush()


# ------------------------------------------------------------------------------- measurement


def _check(cfg: ReportConfig) -> None:
    for attr in ("head_dim", "tokens", "sequences", "num_q_heads", "num_kv_heads", "trials"):
        if getattr(cfg, attr) < 1:
            raise ReportError(f"{attr} must be >= 1, got {getattr(cfg, attr)}")
    if cfg.num_q_heads % cfg.num_kv_heads:
        raise ReportError(
            f"q heads ({cfg.num_q_heads}) must be a multiple of kv heads ({cfg.num_kv_heads})"
        )
    if cfg.tokens < 2:
        raise ReportError("tokens must be >= 2 (a needle needs a haystack)")
    margins = list(cfg.margins)
    if not margins or any(not (math.isfinite(m) and m > 0) for m in margins):
        raise ReportError(f"margins must be positive and finite, got {margins}")


def _vector_error(x_hat: np.ndarray, x: np.ndarray) -> float:
    """Mean over vectors (last axis) of ||x_hat - x|| / ||x|| (absolute where ||x|| = 0)."""
    num = np.linalg.norm(x_hat - x, axis=-1)
    den = np.linalg.norm(x, axis=-1)
    return float(np.mean(num / np.where(den > 0, den, 1.0)))


def _logits(q: np.ndarray, k: np.ndarray, scale: float) -> np.ndarray:
    """q (B, Hq, D), k (B, T, Hkv, D) float64 -> (B, Hq, T) logits ``scale * <q, k>`` (GQA)."""
    b, hq, d = q.shape
    hkv = k.shape[2]
    qg = q.reshape(b, hkv, hq // hkv, d)
    kt = k.transpose(0, 2, 3, 1)  # (B, Hkv, D, T)
    return (scale * np.matmul(qg, kt)).reshape(b, hq, -1)


def _softmax(s: np.ndarray) -> np.ndarray:
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    return w / w.sum(axis=-1, keepdims=True)


def _score_stats(s: np.ndarray, s_hat: np.ndarray) -> tuple[float, float, float]:
    """(slope with a per-row intercept, relative RMS error, RMS error in logit units)."""
    x = s - s.mean(axis=-1, keepdims=True)
    y = s_hat - s_hat.mean(axis=-1, keepdims=True)
    sxx = float(np.sum(x * x))
    slope = float(np.sum(x * y)) / sxx if sxx > 0 else float("nan")
    diff = s_hat - s
    rel_rms = float(np.sqrt(np.sum(diff * diff) / max(float(np.sum(s * s)), 1e-300)))
    return slope, rel_rms, float(np.sqrt(np.mean(diff * diff)))


@dataclass(frozen=True)
class _Needles:
    """The needle trials. Needle tokens pack one trial per KV head: trial j at margin i sits
    in token ``i * rows + row[j]``, head ``kv_head[j]`` (unused cells hold a haystack key)."""

    seq: np.ndarray  # (n,) sequence of each trial
    kv_head: np.ndarray  # (n,)
    pos: np.ndarray  # (n,)
    row: np.ndarray  # (n,) token row of the trial within one margin's block
    rows: int  # token rows per margin
    q: np.ndarray  # (n, D) float64 query of each trial
    k_tokens: np.ndarray  # (M * rows, Hkv, D) float32, margin-major
    v_tokens: np.ndarray  # (M * rows, Hkv, D) float32


def _trial_logits(
    q: np.ndarray, seq: np.ndarray, kv_head: np.ndarray, k_heads: np.ndarray, scale: float
) -> np.ndarray:
    """Each trial's query against every token of its sequence and KV head: (n, T) float64.

    k_heads: (S, Hkv, T, D) float64, C-contiguous per head.
    """
    out = np.empty((q.shape[0], k_heads.shape[2]))
    for b in range(k_heads.shape[0]):
        for h in range(k_heads.shape[1]):
            idx = np.flatnonzero((seq == b) & (kv_head == h))
            if idx.size:
                out[idx] = scale * (q[idx] @ k_heads[b, h].T)
    return out


def _make_needles(cfg: ReportConfig, k: np.ndarray, v: np.ndarray, scale: float) -> _Needles:
    """Draw the trials (sequence, query head, position, query) and build the needle tokens.

    k, v: (S, T, Hkv, D) float64 originals.
    """
    n, hq, hkv = cfg.trials, cfg.num_q_heads, cfg.num_kv_heads
    g = derive(cfg.seed, "report", "needle")
    seq = g.integers(0, cfg.sequences, n)
    head = g.integers(0, hq, n)
    pos = g.integers(0, cfg.tokens, n)
    queries = llm_like_queries(n, hq, cfg.head_dim, seed=cfg.seed, num_kv_heads=hkv)
    trials = np.arange(n)
    q = queries[trials, head].astype(np.float64)
    kv_head = head // (hq // hkv)
    s = _trial_logits(q, seq, kv_head, np.ascontiguousarray(k.transpose(0, 2, 1, 3)), scale)
    s_pos = s[trials, pos]
    s[trials, pos] = -np.inf
    best_other = s.max(axis=1)

    # Rank of each trial among the trials of its KV head = its token row.
    row = np.zeros(n, dtype=np.int64)
    for h in range(hkv):
        idx = np.flatnonzero(kv_head == h)
        row[idx] = np.arange(idx.size)
    rows = int(row.max()) + 1
    q_dir = q / np.sum(q * q, axis=1, keepdims=True)  # <q, q_dir> = 1
    base_k = np.broadcast_to(k[0, 0], (rows, hkv, k.shape[-1])).copy()
    base_v = np.broadcast_to(v[0, 0], (rows, hkv, v.shape[-1])).copy()
    k_tokens, v_tokens = [], []
    for m in cfg.margins:
        shift = (best_other + m - s_pos) / scale  # raw-score change that sets the margin
        tok_k, tok_v = base_k.copy(), base_v.copy()
        tok_k[row, kv_head] = k[seq, pos, kv_head] + shift[:, None] * q_dir
        tok_v[row, kv_head] = v[seq, pos, kv_head]
        k_tokens.append(tok_k)
        v_tokens.append(tok_v)
    return _Needles(
        seq,
        kv_head,
        pos,
        row,
        rows,
        q,
        np.concatenate(k_tokens).astype(np.float32),
        np.concatenate(v_tokens).astype(np.float32),
    )


def _needle_rates(
    nd: _Needles, k_hat_heads: np.ndarray, needle_k_hat: np.ndarray, scale: float
) -> list[float]:
    """Fraction of trials whose quantized-logit argmax is the needle, per margin.

    k_hat_heads: (S, Hkv, T, D) float64 dequantized haystack; needle_k_hat: the dequantized
    needle tokens (M * rows, Hkv, D).
    """
    trials = np.arange(nd.q.shape[0])
    s_hat = _trial_logits(nd.q, nd.seq, nd.kv_head, k_hat_heads, scale)
    rates = []
    for i in range(needle_k_hat.shape[0] // nd.rows):
        kn = needle_k_hat[i * nd.rows + nd.row, nd.kv_head].astype(np.float64)  # (n, D)
        s = s_hat.copy()
        s[trials, nd.pos] = scale * np.sum(nd.q * kn, axis=1)
        rates.append(float(np.mean(s.argmax(axis=1) == nd.pos)))
    return rates


def run_report(cfg: ReportConfig, progress: Progress | None = None) -> list[FormatResult]:
    """Measure every requested format; one result per format, in the order requested.

    ``progress`` (optional) is advanced once per format.
    """
    _check(cfg)
    import kvkit
    from kvkit import formats as fmts
    from kvkit.testing.reference import attention_f64

    known = list(fmts.names())
    names = list(cfg.formats) if cfg.formats is not None else known
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ReportError(f"unknown format(s) {', '.join(unknown)}; known: {', '.join(known)}")
    formats = {}
    for name in names:
        try:
            formats[name] = fmts.get(name, head_dim=cfg.head_dim)
        except (ValueError, NotImplementedError) as exc:
            raise ReportError(
                f"format {name} does not support head_dim {cfg.head_dim}: {exc}"
            ) from None

    nseq, t, d = cfg.sequences, cfg.tokens, cfg.head_dim
    hq, hkv, bs = cfg.num_q_heads, cfg.num_kv_heads, cfg.block_size
    scale = 1.0 / math.sqrt(d)

    seqs = [llm_like_kv(t, hkv, d, seed=cfg.seed, seq_id=i) for i in range(nseq)]
    k32 = np.stack([k for k, _ in seqs])  # (S, T, Hkv, D) float32: what gets written
    v32 = np.stack([v for _, v in seqs])
    k64, v64 = k32.astype(np.float64), v32.astype(np.float64)
    q32 = llm_like_queries(nseq, hq, d, seed=cfg.seed, num_kv_heads=hkv)  # (S, Hq, D)
    q64 = q32.astype(np.float64)
    needles = _make_needles(cfg, k64, v64, scale)
    num_needles = needles.k_tokens.shape[0]

    # Haystack pages shuffled (block tables matter), needle tokens in the pages after them.
    pages = -(-t // bs)
    needle_pages = -(-num_needles // bs)
    num_blocks = nseq * pages + needle_pages
    perm = derive(cfg.seed, "report", "pages").permutation(nseq * pages)
    block_tables = perm.reshape(nseq, pages).astype(np.int32)
    tpos = np.arange(t)
    hay_slots = np.concatenate(
        [block_tables[i, tpos // bs].astype(np.int64) * bs + tpos % bs for i in range(nseq)]
    )
    needle_slots = nseq * pages * bs + np.arange(num_needles, dtype=np.int64)
    slots = np.concatenate([hay_slots, needle_slots])
    k_write = np.concatenate([k32.reshape(nseq * t, hkv, d), needles.k_tokens])
    v_write = np.concatenate([v32.reshape(nseq * t, hkv, d), needles.v_tokens])
    seq_lens = np.full(nseq, t, dtype=np.int32)

    s_ref = _logits(q64, k64, scale)  # (S, Hq, T)
    p_ref = _softmax(s_ref)
    o_ref = np.stack(
        [attention_f64(q32[i][None], k32[i], v32[i], scale=scale)[0][0] for i in range(nseq)]
    )  # (S, Hq, D)

    fp16_bytes = fmts.get("fp16", head_dim=d).bytes_per_token_head
    results = []
    for i, name in enumerate(names):
        if progress is not None:
            progress.update(i, f"{name:<20}")
        fmt = formats[name]
        cache = kvkit.PagedKVCache(fmt, 1, hkv, num_blocks, bs, backend="cpu")
        layer = cache.layer(0)
        if fmt.has_global_scales and getattr(fmt, "family", "") == "nvfp4":
            layer.k_scale = float(fmt.calibrate(k_write))
            layer.v_scale = float(fmt.calibrate(v_write))
        kvkit.write_kv(layer, k_write, v_write, slots)
        k_hat, v_hat = kvkit.dequantize(layer, slots)
        kh = k_hat[: nseq * t].reshape(nseq, t, hkv, d).astype(np.float64)
        vh = v_hat[: nseq * t].reshape(nseq, t, hkv, d).astype(np.float64)

        s_hat = _logits(q64, kh, scale)
        slope, rel_rms, rms_logits = _score_stats(s_ref, s_hat)
        tv = float(np.mean(0.5 * np.abs(_softmax(s_hat) - p_ref).sum(axis=-1)))
        o = kvkit.decode(q32, layer, block_tables, seq_lens, scale=scale)
        kh_heads = np.ascontiguousarray(kh.transpose(0, 2, 1, 3))
        rates = _needle_rates(needles, kh_heads, k_hat[nseq * t :], scale)

        nbytes = int(fmt.bytes_per_token_head)
        results.append(
            FormatResult(
                format=name,
                bytes_per_token_head=nbytes,
                bits_per_element=8.0 * nbytes / (2 * d),
                capacity_vs_fp16=fp16_bytes / nbytes,
                k_rel_error=rel_frobenius(kh, k64),
                k_vector_error=_vector_error(kh, k64),
                v_rel_error=rel_frobenius(vh, v64),
                v_vector_error=_vector_error(vh, v64),
                score_slope=slope,
                score_rel_rms=rel_rms,
                score_rms_logits=rms_logits,
                attention_tv=tv,
                output_rel_error=rel_frobenius(np.asarray(o, dtype=np.float64), o_ref),
                needle_rate=rates,
            )
        )
    if progress is not None:
        progress.update(len(names), f"{'done':<20}")
    return results


# ----------------------------------------------------------------------------------- outputs


def _margin_label(m: float) -> str:
    return f"{m:g}"


def format_table(results: Sequence[FormatResult], cfg: ReportConfig) -> str:
    """A caption, one aligned table (one row per format) and a legend."""
    columns = [
        ("format", "<"),
        ("bits/el", ">"),
        ("vs fp16", ">"),
        ("K err", ">"),
        ("V err", ">"),
        ("IP slope", ">"),
        ("logit rms", ">"),
        ("attn TV", ">"),
        ("out err", ">"),
        *((f"needle@{_margin_label(m)}", ">") for m in cfg.margins),
    ]
    cells = [
        [
            r.format,
            f"{r.bits_per_element:.3f}",
            f"{r.capacity_vs_fp16:.2f}",
            f"{r.k_rel_error:.2e}",
            f"{r.v_rel_error:.2e}",
            f"{r.score_slope:.4f}",
            f"{r.score_rms_logits:.3f}",
            f"{r.attention_tv:.4f}",
            f"{r.output_rel_error:.2e}",
            *(f"{x:.3f}" for x in r.needle_rate),
        ]
        for r in results
    ]
    caption = (
        f"kvkit report: backend cpu, {cfg.sequences} sequences x {cfg.tokens} tokens, "
        f"q heads {cfg.num_q_heads}, kv heads {cfg.num_kv_heads}, head_dim {cfg.head_dim}, "
        f"needle trials {cfg.trials}, seed {cfg.seed}"
    )
    legend = "\n".join(
        [
            "bits/el: 8 * bytes_per_token_head / (2 * head_dim); vs fp16: tokens per byte "
            "relative to fp16.",
            "K err, V err: ||x_hat - x||_F / ||x||_F of the dequantized cache.",
            "IP slope: least-squares slope of <q, k_hat> on <q, k> (per-row intercept; 1 = "
            "unbiased); logit rms: RMS logit error (scale * <q, k>).",
            "attn TV: 0.5 * sum |p_hat - p|, mean over (sequence, query head); out err: decode "
            "output vs float64 attention on the original K/V (Frobenius).",
            "needle@m: fraction of trials whose quantized argmax is a needle planted m logits "
            "above the best other token.",
        ]
    )
    return "\n".join([caption, "", *render_table(columns, cells), "", legend])


def to_json(results: Sequence[FormatResult], cfg: ReportConfig) -> dict:
    """Everything as a JSON-ready dict: settings (seed included), definitions and results."""
    from kvkit import formats as fmts

    settings = asdict(cfg)
    settings["formats"] = [r.format for r in results] if cfg.formats is None else list(cfg.formats)
    settings["margins"] = [float(m) for m in cfg.margins]
    settings["backend"] = "cpu"
    settings["scale"] = 1.0 / math.sqrt(cfg.head_dim)
    settings["all_formats"] = list(fmts.names())
    return {
        "report": "kvkit report",
        "seed": cfg.seed,
        "settings": settings,
        "definitions": {
            "bits_per_element": "8 * bytes_per_token_head / (2 * head_dim)",
            "capacity_vs_fp16": "fp16 bytes_per_token_head / bytes_per_token_head",
            "k_rel_error": "||k_hat - k||_F / ||k||_F over every token-head",
            "k_vector_error": "mean over token-heads of ||k_hat - k|| / ||k||",
            "v_rel_error": "||v_hat - v||_F / ||v||_F",
            "v_vector_error": "mean over token-heads of ||v_hat - v|| / ||v||",
            "score_slope": "least-squares slope of <q,k_hat> on <q,k>, one intercept per "
            "(sequence, query head)",
            "score_rel_rms": "||s_hat - s|| / ||s|| over all scores",
            "score_rms_logits": "RMS of scale * (<q,k_hat> - <q,k>)",
            "attention_tv": "mean over (sequence, query head) of 0.5 * sum_t |p_hat - p|",
            "output_rel_error": "||o - o_ref||_F / ||o_ref||_F, o = kvkit.decode, o_ref = "
            "float64 attention on the original K/V",
            "needle_rate": "per margin: fraction of trials whose quantized-logit argmax is the "
            "needle planted that many logits above the best other token",
        },
        "results": [asdict(r) for r in results],
    }


#: One colour per format (tab10 order), stable whatever subset is plotted.
_COLORS = {
    "fp16": "tab:gray",
    "bf16": "tab:brown",
    "fp8_e4m3": "tab:green",
    "nvfp4": "tab:purple",
    "nvfp4_4over6": "tab:pink",
    "turboquant_k8v4": "tab:cyan",
    "turboquant_4bit_nc": "tab:blue",
    "turboquant_k3v4_nc": "tab:orange",
    "turboquant_3bit_nc": "tab:red",
}
#: Marker per family: o dense, s FP8, D NVFP4, ^ TurboQuant.
_MARKERS = (("turboquant", "^"), ("nvfp4", "D"), ("fp8", "s"))


def _style(name: str) -> tuple[str, str]:
    """(colour, marker) of a format in every plot."""
    marker = next((m for prefix, m in _MARKERS if name.startswith(prefix)), "o")
    return _COLORS.get(name, "tab:olive"), marker


def write_plots(results: Sequence[FormatResult], cfg: ReportConfig, out_dir: Path) -> list[Path]:
    """Write the three PNGs into out_dir; return their paths ([] without matplotlib).

    1. ``report_error_vs_bits.png``: K, V and attention output error (log) against bits per
       element (log2), one marker per format.
    2. ``report_capacity.png``: tokens per byte relative to fp16, one bar per format, each
       annotated with its attention output error.
    3. ``report_needle.png``: needle retrieval rate against the margin, one line per format.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return []
    out_dir = Path(out_dir)
    paths = []
    caption = (
        f"LLM-like synthetic K/V, D={cfg.head_dim}, {cfg.sequences}x{cfg.tokens} tokens, "
        f"seed {cfg.seed}"
    )

    # (1) error vs bits per element.
    metrics = (
        ("k_rel_error", "K reconstruction error"),
        ("v_rel_error", "V reconstruction error"),
        ("output_rel_error", "attention output error (decode vs float64)"),
    )
    fig, axes = plt.subplots(1, 3, figsize=(15, 5.2), sharey=True)
    for ax, (attr, title) in zip(axes, metrics):
        for r in results:
            color, marker = _style(r.format)
            ax.scatter(
                r.bits_per_element,
                max(getattr(r, attr), 1e-12),
                color=color,
                marker=marker,
                s=55,
                alpha=0.85,
                edgecolors="black",
                linewidths=0.5,
                zorder=3,
                label=r.format,
            )
        ax.set_yscale("log")
        ax.set_xscale("log", base=2)
        ax.set_xticks([3, 4, 6, 8, 16], ["3", "4", "6", "8", "16"])
        ax.set_xlim(2.7, 20)
        ax.set_xlabel("bits per element (K and V together)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("relative error, Frobenius (log)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 5), fontsize=8)
    fig.suptitle(f"kvkit report: error vs bits per element ({caption})", fontsize=10)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    path = out_dir / PLOT_ERROR_VS_BITS
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)

    # (2) capacity vs format, bars annotated with the output error.
    fig, ax = plt.subplots(figsize=(10, 5))
    xs = np.arange(len(results))
    caps = [r.capacity_vs_fp16 for r in results]
    ax.bar(xs, caps, color=[_style(r.format)[0] for r in results], edgecolor="black", lw=0.5)
    for x, r in zip(xs, results):
        ax.annotate(
            f"out err\n{r.output_rel_error:.1e}",
            (x, r.capacity_vs_fp16),
            xytext=(0, 3),
            textcoords="offset points",
            ha="center",
            fontsize=7,
        )
    ax.set_xticks(xs, [r.format for r in results], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"tokens per byte vs fp16 ({4 * cfg.head_dim} / bytes per token-head)")
    ax.set_ylim(0, max(caps) * 1.2)
    ax.set_title(f"kvkit report: capacity vs format, annotated with attention output error\n"
                 f"({caption})", fontsize=10)  # fmt: skip
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    path = out_dir / PLOT_CAPACITY
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)

    # (3) needle retrieval rate vs margin.
    fig, ax = plt.subplots(figsize=(8.5, 5))
    for i, r in enumerate(results):
        color, marker = _style(r.format)
        ax.plot(
            list(cfg.margins),
            r.needle_rate,
            marker=marker,
            ls=("-", "--")[i % 2],
            color=color,
            markersize=8 - 1.5 * (i % 2),
            alpha=0.85,
            label=r.format,
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(cfg.margins), [_margin_label(m) for m in cfg.margins])
    ax.set_ylim(-0.02, 1.04)
    ax.set_xlabel("needle margin over the best other token (logits)")
    ax.set_ylabel("retrieval rate (quantized argmax = needle)")
    ax.set_title(
        f"kvkit report: needle retrieval, {cfg.trials} trials per margin\n({caption}; "
        "formats with the same K encoding coincide)",
        fontsize=10,
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path = out_dir / PLOT_NEEDLE
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    return paths


def write_outputs(results: Sequence[FormatResult], cfg: ReportConfig, out_dir: Path) -> list[Path]:
    """Write report.json and the PNGs into out_dir (created); return the written paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / JSON_NAME
    path.write_text(json.dumps(to_json(results, cfg), indent=2) + "\n")
    return [path, *write_plots(results, cfg, out_dir)]
