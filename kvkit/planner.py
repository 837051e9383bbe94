"""Capacity planner: KV-cache bytes per token of a model and tokens that fit a memory budget.

Pure Python arithmetic over the format spec (``Format.bytes_per_token_head``); no arrays.

Accounting (all sizes in bytes, all counts in tokens):

- **Bytes per token** of a model = sum over layers of ``num_kv_heads *
  fmt.bytes_per_token_head`` (K and V together), with each layer's format from
  ``kvkit.models.layer_formats`` (boundary-layer policy). Llama-3.1-8B in fp16:
  32 layers * 8 heads * 512 B = 131,072 B/token.
- **Per-layer global scales** (fp32 ``k_scale`` and ``v_scale``: 8 B per layer for fp8_e4m3,
  nvfp4 and turboquant_k8v4) are not counted: at most 8 * L bytes per cache (640 B for 80
  layers), less than one token of any format for any built-in model. ``scale_bytes`` gives the
  exact figure.
- **Recent-token window** (``window`` = R): the last R tokens of each sequence are also kept
  in fp16 in every layer, as ``kvkit.model_cache.ModelKVCache`` does (every token is written to
  the per-layer-format cache and, while recent, to an fp16 window cache). It is a per-sequence
  constant, reserved up front for ``sequences`` sequences and subtracted from the budget:
  ``R * window_bytes_per_token`` bytes, or with ``block_size`` the whole fp16 pages that hold
  ``R + block_size - 1`` tokens (the most a ``ModelKVCache`` window holds, since it releases
  whole pages). Tokens that fit counts every token once, at its quantized cost: the window is
  overhead, not extra capacity.
- **Blocks**: with ``block_size`` set, the pool is whole pages of ``block_size`` tokens (one page
  spans every layer, as in ``PagedKVCache``), so tokens are rounded down to a multiple of
  ``block_size`` and ``num_blocks`` is the pool to allocate. Partly filled last pages of
  sequences are not modelled. Without ``block_size`` tokens are not rounded.
- **Tokens that fit** = ``(memory - reserved) // bytes_per_token`` (or whole blocks of it),
  summed over all sequences; 0 when the reserve exceeds the memory.

``compare`` builds the comparison table across formats, each with every layer in one format and
with the boundary policy; ratios are against fp16 and fp8_e4m3 caches with every layer in that
format, at the same memory, window and block size.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from . import formats
from ._checks import check_int
from .formats import Format
from .models import (
    DEFAULT_BOUNDARY_FORMAT,
    DEFAULT_BOUNDARY_LAYERS,
    ModelConfig,
    boundary_layer_count,
    layer_formats,
)

__all__ = [
    "MEMORY_UNITS",
    "WINDOW_FORMAT",
    "Plan",
    "Comparison",
    "ComparisonRow",
    "parse_memory",
    "format_bytes",
    "bytes_per_token",
    "window_bytes_per_token",
    "window_tokens_reserved",
    "scale_bytes",
    "tokens_that_fit",
    "plan",
    "compare",
    "format_table",
]

#: Suffix (case-insensitive) -> bytes. KB/MB/GB/TB are decimal (SI), KiB/MiB/GiB/TiB binary.
MEMORY_UNITS: dict[str, int] = {
    "b": 1,
    "kb": 10**3,
    "kib": 2**10,
    "mb": 10**6,
    "mib": 2**20,
    "gb": 10**9,
    "gib": 2**30,
    "tb": 10**12,
    "tib": 2**40,
}
#: Format the recent-token window is kept in.
WINDOW_FORMAT = "fp16"
#: Baselines of the comparison ratios.
BASELINES = ("fp16", "fp8_e4m3")
#: Bytes of per-layer global scales (fp32 k_scale + v_scale) for formats that have them.
GLOBAL_SCALE_BYTES = 8

_MEMORY_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*$")


def parse_memory(text: str) -> int:
    """A memory size such as ``"40GiB"``, ``"1.5 TB"`` or ``"4096"`` -> bytes (int, > 0).

    The number is a non-negative decimal; the suffix is one of B, KB, KiB, MB, MiB, GB, GiB,
    TB, TiB (case-insensitive; none means bytes). KB = 1000 B, KiB = 1024 B, and so on.
    Fractional sizes are rounded down to whole bytes.

    Raises:
        ValueError: malformed number, unknown suffix, or a size below one byte.
    """
    if not isinstance(text, str):
        raise TypeError(f"memory size must be a string, got {type(text).__name__}")
    m = _MEMORY_RE.match(text)
    if m is None:
        raise ValueError(f"cannot parse memory size {text!r} (expected e.g. 40GiB, 80GB, 1.5TiB)")
    number, suffix = m.groups()
    unit = MEMORY_UNITS.get(suffix.lower() if suffix else "b")
    if unit is None:
        raise ValueError(
            f"unknown memory unit {suffix!r} in {text!r}; use B, KB, KiB, MB, MiB, GB, GiB, TB "
            "or TiB"
        )
    value = int(Fraction(number) * unit)
    if value < 1:
        raise ValueError(f"memory size must be at least 1 byte, got {text!r}")
    return value


def format_bytes(n: int) -> str:
    """Bytes as a short binary-unit string: ``42949672960`` -> ``"40 GiB"``."""
    for suffix, unit in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= unit:
            value = n / unit
            return f"{value:.0f} {suffix}" if n % unit == 0 else f"{value:.2f} {suffix}"
    return f"{n} B"


def bytes_per_token(layer_fmts: Sequence[Format], num_kv_heads: int) -> int:
    """KV-cache bytes of one token across all layers: sum of ``num_kv_heads *
    fmt.bytes_per_token_head`` over ``layer_fmts`` (one format per layer), K and V together.
    """
    check_int("num_kv_heads", num_kv_heads, 1)
    return sum(num_kv_heads * f.bytes_per_token_head for f in layer_fmts)


def window_bytes_per_token(layer_fmts: Sequence[Format], num_kv_heads: int) -> int:
    """Bytes of one recent-window token: fp16 K and V (``4 * head_dim`` B per head) in every
    layer of ``layer_fmts``, times ``num_kv_heads``.
    """
    check_int("num_kv_heads", num_kv_heads, 1)
    return sum(
        num_kv_heads * formats.get(WINDOW_FORMAT, f.head_dim).bytes_per_token_head
        for f in layer_fmts
    )


def window_tokens_reserved(window: int, block_size: int | None = None) -> int:
    """fp16 window tokens reserved per sequence: ``window``, or with ``block_size`` whole
    pages for ``window + block_size - 1`` tokens (0 when ``window`` is 0)."""
    check_int("window", window, 0)
    if window == 0 or block_size is None:
        return window
    check_int("block_size", block_size, 1)
    return -(-(window + block_size - 1) // block_size) * block_size


def scale_bytes(layer_fmts: Sequence[Format]) -> int:
    """Bytes of per-layer fp32 global scales (8 B per layer whose format has them); not
    counted by the planner (see the module docstring)."""
    return sum(GLOBAL_SCALE_BYTES for f in layer_fmts if f.has_global_scales)


def tokens_that_fit(
    memory_bytes: int,
    bytes_per_token: int,
    *,
    reserved_bytes: int = 0,
    block_size: int | None = None,
) -> int:
    """Tokens of ``bytes_per_token`` B that fit in ``memory_bytes`` B after ``reserved_bytes``.

    ``(memory_bytes - reserved_bytes) // bytes_per_token``; with ``block_size`` (tokens per
    page) only whole pages of ``block_size * bytes_per_token`` B count, so the result is a
    multiple of ``block_size``. 0 when ``reserved_bytes >= memory_bytes``.
    """
    check_int("memory_bytes", memory_bytes, 0)
    check_int("bytes_per_token", bytes_per_token, 1)
    check_int("reserved_bytes", reserved_bytes, 0)
    available = max(memory_bytes - reserved_bytes, 0)
    if block_size is None:
        return available // bytes_per_token
    check_int("block_size", block_size, 1)
    return available // (block_size * bytes_per_token) * block_size


@dataclass(frozen=True)
class Plan:
    """Capacity of one model in one format policy at one memory budget.

    Attributes:
        model: the model config.
        format: format of the non-boundary layers.
        boundary_format: format of the boundary layers.
        boundary_layers: effective boundary layers at EACH end (after the L // 2 cap).
        memory_bytes: the budget, B.
        bytes_per_token: cache bytes of one token over all layers, B/token.
        window: recent-window tokens per sequence kept in fp16 (0: none).
        sequences: sequences the window reserve is made for.
        window_bytes: total window reserve, B (``sequences * window_tokens_reserved(window,
            block_size) * window_bytes_per_token``).
        block_size: tokens per page, or None (no rounding).
        tokens: cache tokens that fit, all sequences together.
        num_blocks: pages of ``block_size`` tokens that fit (None without ``block_size``).
    """

    model: ModelConfig
    format: str
    boundary_format: str
    boundary_layers: int
    memory_bytes: int
    bytes_per_token: int
    window: int
    sequences: int
    window_bytes: int
    block_size: int | None
    tokens: int
    num_blocks: int | None

    def as_dict(self) -> dict[str, object]:
        """JSON-ready fields (the model as its name)."""
        return {
            "format": self.format,
            "boundary_layers": self.boundary_layers,
            "boundary_format": self.boundary_format,
            "bytes_per_token": self.bytes_per_token,
            "window_bytes": self.window_bytes,
            "tokens": self.tokens,
            "num_blocks": self.num_blocks,
        }


def plan(
    model: ModelConfig,
    fmt_name: str,
    memory_bytes: int,
    *,
    boundary_layers: int = DEFAULT_BOUNDARY_LAYERS,
    boundary_format: str = DEFAULT_BOUNDARY_FORMAT,
    window: int = 0,
    sequences: int = 1,
    block_size: int | None = None,
    **fmt_options: object,
) -> Plan:
    """Capacity of ``model`` with ``fmt_name`` layers (boundary policy applied) in ``memory_bytes``.

    Args:
        model: layers, KV heads and head_dim (``kvkit.models.get(name)`` or a ``ModelConfig``).
        fmt_name: one of ``kvkit.formats.names()``.
        memory_bytes: budget for the KV cache, B.
        boundary_layers: n layers at each end in ``boundary_format`` (default 2, capped at
            L // 2; 0 disables).
        window: R recent tokens per sequence also kept in fp16 (reserved, not counted).
        sequences: concurrent sequences the window is reserved for (>= 1).
        block_size: tokens per page; rounds tokens down to whole pages. None: no rounding.
        fmt_options: passed to ``kvkit.formats.get`` for ``fmt_name``.
    """
    check_int("memory_bytes", memory_bytes, 0)
    check_int("window", window, 0)
    check_int("sequences", sequences, 1)
    if block_size is not None:
        check_int("block_size", block_size, 1)
    fmts = layer_formats(
        model.num_layers,
        fmt_name,
        model.head_dim,
        boundary_layers=boundary_layers,
        boundary_format=boundary_format,
        **fmt_options,
    )
    bpt = bytes_per_token(fmts, model.num_kv_heads)
    reserved = (
        sequences
        * window_tokens_reserved(window, block_size)
        * window_bytes_per_token(fmts, model.num_kv_heads)
    )
    tokens = tokens_that_fit(memory_bytes, bpt, reserved_bytes=reserved, block_size=block_size)
    return Plan(
        model=model,
        format=fmt_name,
        boundary_format=boundary_format,
        boundary_layers=boundary_layer_count(model.num_layers, boundary_layers),
        memory_bytes=memory_bytes,
        bytes_per_token=bpt,
        window=window,
        sequences=sequences,
        window_bytes=reserved,
        block_size=block_size,
        tokens=tokens,
        num_blocks=None if block_size is None else tokens // block_size,
    )


def _ratio(tokens: int, base: int) -> float | None:
    return tokens / base if base > 0 else None


@dataclass(frozen=True)
class ComparisonRow:
    """One format: every layer in it (``uniform``) and with the boundary policy (``boundary``,
    None when the policy is off). Ratios are tokens over the baseline's uniform tokens (None
    when the baseline fits no token)."""

    format: str
    uniform: Plan
    boundary: Plan | None
    uniform_vs_fp16: float | None
    uniform_vs_fp8: float | None
    boundary_vs_fp16: float | None
    boundary_vs_fp8: float | None

    def as_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"format": self.format}
        d["uniform"] = {
            **self.uniform.as_dict(),
            "ratio_vs_fp16": self.uniform_vs_fp16,
            "ratio_vs_fp8": self.uniform_vs_fp8,
        }
        d["boundary"] = (
            None
            if self.boundary is None
            else {
                **self.boundary.as_dict(),
                "ratio_vs_fp16": self.boundary_vs_fp16,
                "ratio_vs_fp8": self.boundary_vs_fp8,
            }
        )
        return d


@dataclass(frozen=True)
class Comparison:
    """``compare``'s result: rows in the order asked, plus formats skipped for this head_dim."""

    model: ModelConfig
    memory_bytes: int
    boundary_layers: int
    boundary_format: str
    window: int
    sequences: int
    block_size: int | None
    rows: list[ComparisonRow]
    baselines: dict[str, Plan]
    skipped: dict[str, str] = field(default_factory=dict)

    def row(self, fmt_name: str) -> ComparisonRow:
        for r in self.rows:
            if r.format == fmt_name:
                return r
        raise KeyError(fmt_name)

    def as_dict(self) -> dict[str, object]:
        """JSON-ready: the inputs, one entry per format, and the skipped formats."""
        m = self.model
        return {
            "model": {
                "name": m.name,
                "num_layers": m.num_layers,
                "num_kv_heads": m.num_kv_heads,
                "head_dim": m.head_dim,
                "num_q_heads": m.num_q_heads,
            },
            "memory_bytes": self.memory_bytes,
            "boundary_layers": self.boundary_layers,
            "boundary_format": self.boundary_format,
            "window": self.window,
            "sequences": self.sequences,
            "block_size": self.block_size,
            "baselines": {k: v.tokens for k, v in self.baselines.items()},
            "rows": [r.as_dict() for r in self.rows],
            "skipped": dict(self.skipped),
        }


def compare(
    model: ModelConfig,
    memory_bytes: int,
    fmt_names: Sequence[str] | None = None,
    *,
    boundary_layers: int = DEFAULT_BOUNDARY_LAYERS,
    boundary_format: str = DEFAULT_BOUNDARY_FORMAT,
    window: int = 0,
    sequences: int = 1,
    block_size: int | None = None,
) -> Comparison:
    """Capacity of ``model`` in each format, with and without the boundary policy.

    Args:
        fmt_names: formats to compare; None means every ``kvkit.formats.names()`` entry that
            supports ``model.head_dim`` (the others are listed in ``Comparison.skipped``). A
            named format that does not support the head_dim raises ``ValueError``.
        Other arguments as for ``plan``; ``boundary_layers=0`` (or a 1-layer model) leaves
        ``ComparisonRow.boundary`` None.

    Ratios compare tokens that fit against fp16 and fp8_e4m3 caches with every layer in that
    format, at the same memory, window, sequences and block size.
    """
    formats.get(boundary_format, model.head_dim)  # validate even when the policy is off
    common = dict(window=window, sequences=sequences, block_size=block_size)
    n = boundary_layer_count(model.num_layers, boundary_layers)
    baselines = {b: plan(model, b, memory_bytes, boundary_layers=0, **common) for b in BASELINES}
    skipped: dict[str, str] = {}
    if fmt_names is None:
        names: list[str] = []
        for name in formats.names():
            try:
                formats.get(name, model.head_dim)
            except ValueError as exc:
                skipped[name] = str(exc)
            else:
                names.append(name)
    else:
        names = list(fmt_names)
    rows = []
    t16, t8 = baselines["fp16"].tokens, baselines["fp8_e4m3"].tokens
    for name in names:
        uni = plan(model, name, memory_bytes, boundary_layers=0, **common)
        bnd = (
            plan(
                model,
                name,
                memory_bytes,
                boundary_layers=n,
                boundary_format=boundary_format,
                **common,
            )
            if n
            else None
        )
        rows.append(
            ComparisonRow(
                format=name,
                uniform=uni,
                boundary=bnd,
                uniform_vs_fp16=_ratio(uni.tokens, t16),
                uniform_vs_fp8=_ratio(uni.tokens, t8),
                boundary_vs_fp16=None if bnd is None else _ratio(bnd.tokens, t16),
                boundary_vs_fp8=None if bnd is None else _ratio(bnd.tokens, t8),
            )
        )
    return Comparison(
        model=model,
        memory_bytes=memory_bytes,
        boundary_layers=n,
        boundary_format=boundary_format,
        window=window,
        sequences=sequences,
        block_size=block_size,
        rows=rows,
        baselines=baselines,
        skipped=skipped,
    )


def _fmt_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def format_table(cmp: Comparison) -> str:
    """The comparison as a plain-text table with a header line and footnotes."""
    m = cmp.model
    lines = [
        f"{m.name}: {m.num_layers} layers, {m.num_kv_heads} KV heads, head_dim {m.head_dim}; "
        f"memory {format_bytes(cmp.memory_bytes)} ({cmp.memory_bytes:,} B)"
    ]
    group = ["every layer in the format"]
    head = ["format", "B/token", "tokens", "vs fp16", "vs fp8"]
    if cmp.boundary_layers:
        group.append(f"first/last {cmp.boundary_layers} layers {cmp.boundary_format}")
        head += ["B/token", "tokens", "vs fp16", "vs fp8"]
    body = []
    for r in cmp.rows:
        cells = [
            r.format,
            f"{r.uniform.bytes_per_token:,}",
            f"{r.uniform.tokens:,}",
            _fmt_ratio(r.uniform_vs_fp16),
            _fmt_ratio(r.uniform_vs_fp8),
        ]
        if r.boundary is not None:
            cells += [
                f"{r.boundary.bytes_per_token:,}",
                f"{r.boundary.tokens:,}",
                _fmt_ratio(r.boundary_vs_fp16),
                _fmt_ratio(r.boundary_vs_fp8),
            ]
        body.append(cells)
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]

    def render(cells: list[str]) -> str:
        out = [cells[0].ljust(widths[0])]
        out += [c.rjust(w) for c, w in zip(cells[1:], widths[1:])]
        parts = [" ".join(out[:5])]
        if len(out) > 5:
            parts.append(" ".join(out[5:]))
        return " | ".join(parts)

    width_a = sum(widths[:5]) + 4
    top = group[0].center(width_a)
    if len(group) > 1:
        top += " | " + group[1].center(sum(widths[5:]) + 3)
    lines += ["", top.rstrip(), render(head), "-" * len(render(head))]
    lines += [render(c) for c in body]
    lines.append("")
    lines.append("B/token: cache bytes per token over all layers, K and V together.")
    lines.append("tokens: tokens that fit the memory, all sequences together.")
    lines.append(
        "vs fp16 / vs fp8: tokens over those of an all-fp16 / all-fp8_e4m3 cache "
        f"({cmp.baselines['fp16'].tokens:,} / {cmp.baselines['fp8_e4m3'].tokens:,} tokens)."
    )
    if cmp.window:
        lines.append(
            f"window: the last {cmp.window} tokens of each of {cmp.sequences} sequence(s) also "
            "kept in fp16 in every layer;\n"
            f"  {format_bytes(cmp.baselines['fp16'].window_bytes)} reserved up front, not "
            "counted in tokens."
        )
    if cmp.block_size is not None:
        lines.append(f"tokens rounded down to whole blocks of {cmp.block_size}.")
    lines.append("per-layer fp32 global scales (8 B per layer) are not counted.")
    if cmp.skipped:
        lines.append(f"skipped (head_dim {m.head_dim} not supported): {', '.join(cmp.skipped)}")
    return "\n".join(lines)
