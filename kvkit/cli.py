"""The ``kvkit`` command line (also ``python -m kvkit``).

Each subcommand is a pair of functions registered in ``COMMANDS``: one adds its arguments to
an ``argparse`` sub-parser, the other runs it and returns the process exit status. Heavy
imports (Numba kernels, CuPy) happen inside the run functions, so ``kvkit --help`` is instant.
To add a command (``bench``, ``capacity``, ``report``), write its two functions and add one
entry to ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

__all__ = ["COMMANDS", "CommandError", "build_parser", "main", "parse_formats"]


class CommandError(Exception):
    """A user-facing failure: printed as ``kvkit <command>: error: <message>``, exit status 2."""


def parse_formats(text: str) -> list[str]:
    """Split a comma-separated format list; blanks dropped, duplicates removed, order kept."""
    seen: dict[str, None] = {}
    for part in text.split(","):
        name = part.strip()
        if name:
            seen.setdefault(name, None)
    if not seen:
        raise argparse.ArgumentTypeError("expected at least one format name")
    return list(seen)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value}")
    return value


# --------------------------------------------------------------------------------------- demo


def _add_demo(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend", choices=("cpu", "cuda"), default="cpu", help="kernel backend (default: cpu)"
    )
    parser.add_argument("--head-dim", type=_positive_int, default=128, help="default: 128")
    parser.add_argument(
        "--seq-len", type=_positive_int, default=2048, help="tokens per sequence (default: 2048)"
    )
    parser.add_argument("--batch", type=_positive_int, default=2, help="sequences (default: 2)")
    parser.add_argument("--q-heads", type=_positive_int, default=32, help="default: 32")
    parser.add_argument("--kv-heads", type=_positive_int, default=8, help="default: 8")
    parser.add_argument(
        "--block-size", type=_positive_int, default=16, help="tokens per page (default: 16)"
    )
    parser.add_argument(
        "--formats",
        type=parse_formats,
        default=None,
        metavar="NAME[,NAME...]",
        help="comma-separated cache formats (default: every format in kvkit.formats.names())",
    )
    parser.add_argument("--seed", type=_non_negative_int, default=0, help="default: 0")
    parser.add_argument(
        "--repeats",
        type=_positive_int,
        default=3,
        help="timed calls after one warm-up call; the median is shown (default: 3)",
    )


def _run_demo(args: argparse.Namespace) -> int:
    from kvkit import demo

    config = demo.DemoConfig(
        backend=args.backend,
        head_dim=args.head_dim,
        seq_len=args.seq_len,
        batch=args.batch,
        num_q_heads=args.q_heads,
        num_kv_heads=args.kv_heads,
        block_size=args.block_size,
        formats=args.formats,
        seed=args.seed,
        repeats=args.repeats,
    )
    try:
        rows = demo.run_demo(config)
    except demo.DemoError as exc:
        raise CommandError(str(exc)) from exc
    print(demo.format_table(rows, config), flush=True)
    return 0


# -------------------------------------------------------------------------------------- bench


def _add_bench(parser: argparse.ArgumentParser) -> None:
    from kvkit import bench

    bench.add_arguments(parser)


def _run_bench(args: argparse.Namespace) -> int:
    from kvkit import bench

    return bench.run(args)


# ----------------------------------------------------------------------------------- capacity


def _memory_size(text: str) -> int:
    from kvkit.planner import parse_memory

    try:
        return parse_memory(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_capacity(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=None,
        help="built-in model config (llama-3.1-8b, llama-3.3-70b, qwen3-8b, mistral-7b); "
        "or give --layers, --kv-heads and --head-dim",
    )
    parser.add_argument("--layers", type=_positive_int, default=None, help="attention layers")
    parser.add_argument("--kv-heads", type=_positive_int, default=None, help="KV heads per layer")
    parser.add_argument("--head-dim", type=_positive_int, default=None, help="head dimension")
    parser.add_argument(
        "--memory",
        type=_memory_size,
        required=True,
        metavar="SIZE",
        help="KV-cache memory budget, e.g. 40GiB, 80GB, 1.5TiB (B, KB/KiB, MB/MiB, GB/GiB, "
        "TB/TiB; KB = 1000 B, KiB = 1024 B)",
    )
    parser.add_argument(
        "--formats",
        type=parse_formats,
        default=None,
        metavar="NAME[,NAME...]",
        help="comma-separated cache formats (default: every format that supports the head_dim)",
    )
    parser.add_argument(
        "--boundary-layers",
        type=_non_negative_int,
        default=2,
        metavar="N",
        help="first and last N layers in --boundary-format, capped at layers // 2; 0 disables "
        "(default: 2)",
    )
    parser.add_argument(
        "--boundary-format", default="fp16", help="format of the boundary layers (default: fp16)"
    )
    parser.add_argument(
        "--window",
        type=_non_negative_int,
        default=0,
        metavar="R",
        help="the last R tokens of each sequence also kept in fp16 in every layer: reserved "
        "per sequence up front, not counted as capacity (default: 0)",
    )
    parser.add_argument(
        "--sequences",
        type=_positive_int,
        default=1,
        help="concurrent sequences the --window reserve is made for (default: 1)",
    )
    parser.add_argument(
        "--block-size",
        type=_positive_int,
        default=None,
        help="tokens per page: round tokens down to whole pages (default: no rounding)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _run_capacity(args: argparse.Namespace) -> int:
    import json

    from kvkit import models, planner

    custom = (args.layers, args.kv_heads, args.head_dim)
    if args.model is not None:
        if any(x is not None for x in custom):
            raise CommandError("give --model or --layers/--kv-heads/--head-dim, not both")
        try:
            model = models.get(args.model)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
    elif all(x is not None for x in custom):
        model = models.ModelConfig("custom", args.layers, args.kv_heads, args.head_dim)
    else:
        raise CommandError("give --model, or all of --layers, --kv-heads and --head-dim")
    try:
        cmp = planner.compare(
            model,
            args.memory,
            args.formats,
            boundary_layers=args.boundary_layers,
            boundary_format=args.boundary_format,
            window=args.window,
            sequences=args.sequences,
            block_size=args.block_size,
        )
    except (ValueError, TypeError) as exc:
        raise CommandError(str(exc)) from exc
    if args.json:
        print(json.dumps(cmp.as_dict(), indent=2), flush=True)
    else:
        print(planner.format_table(cmp), flush=True)
    return 0


# ------------------------------------------------------------------------------------- report


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text}")
    return value


def _margins(text: str) -> list[float]:
    values = [_positive_float(part) for part in text.split(",") if part.strip()]
    if not values:
        raise argparse.ArgumentTypeError("expected at least one margin")
    return sorted(set(values))


def _add_report(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", default="kvkit-report", metavar="DIR",
        help="directory for report.json and the PNG plots (default: kvkit-report)",
    )  # fmt: skip
    parser.add_argument(
        "--formats",
        type=parse_formats,
        default=None,
        metavar="NAME[,NAME...]",
        help="comma-separated cache formats (default: every format in kvkit.formats.names())",
    )
    parser.add_argument("--head-dim", type=_positive_int, default=128, help="default: 128")
    parser.add_argument(
        "--tokens", type=_positive_int, default=1024, help="tokens per sequence (default: 1024)"
    )
    parser.add_argument(
        "--sequences", type=_positive_int, default=4, help="synthetic sequences (default: 4)"
    )
    parser.add_argument("--q-heads", type=_positive_int, default=32, help="default: 32")
    parser.add_argument("--kv-heads", type=_positive_int, default=8, help="default: 8")
    parser.add_argument("--seed", type=_non_negative_int, default=0, help="default: 0")
    parser.add_argument(
        "--trials", type=_positive_int, default=2000,
        help="needle trials, each scored at every margin (default: 2000)",
    )  # fmt: skip
    parser.add_argument(
        "--margins", type=_margins, default=None, metavar="M[,M...]",
        help="needle margins in logits (default: 0.25,0.5,1,2,4)",
    )  # fmt: skip
    parser.add_argument("--no-progress", action="store_true", help="no progress line on stderr")


def _run_report(args: argparse.Namespace) -> int:
    from kvkit import formats, report

    kwargs = {} if args.margins is None else {"margins": tuple(args.margins)}
    config = report.ReportConfig(
        head_dim=args.head_dim,
        tokens=args.tokens,
        sequences=args.sequences,
        num_q_heads=args.q_heads,
        num_kv_heads=args.kv_heads,
        formats=args.formats,
        seed=args.seed,
        trials=args.trials,
        **kwargs,
    )
    total = len(args.formats) if args.formats is not None else len(formats.names())
    progress = None if args.no_progress else report.Progress(total, "kvkit report")
    try:
        results = report.run_report(config, progress)
    except report.ReportError as exc:
        raise CommandError(str(exc)) from exc
    finally:
        if progress is not None:
            progress.close()
    print(report.format_table(results, config), flush=True)
    paths = report.write_outputs(results, config, args.out)
    if len(paths) == 1:
        print("matplotlib is not installed: no plots (pip install matplotlib)", file=sys.stderr)
    print("wrote " + ", ".join(str(p) for p in paths), flush=True)
    return 0


# ----------------------------------------------------------------------------- registration

#: name -> (help, add_arguments, run). Only real, working commands are registered here.
COMMANDS: dict[
    str,
    tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]],
] = {
    "demo": (
        "quantize LLM-like K/V into every cache format, decode one step, and print a table "
        "of size, accuracy and timing",
        _add_demo,
        _run_demo,
    ),
    "bench": (
        "time decode and write on a CUDA GPU against torch SDPA fp16 and a device copy; "
        "writes a table, bench.json and bench.png",
        _add_bench,
        _run_bench,
    ),
    "capacity": (
        "KV-cache bytes per token and tokens that fit a memory budget, per format, with and "
        "without boundary layers",
        _add_capacity,
        _run_capacity,
    ),
    "report": (
        "quality report on LLM-like synthetic K/V for every format (reconstruction error, "
        "inner-product bias, attention TV distance, output error, needle retrieval); writes a "
        "table, report.json and PNG plots",
        _add_report,
        _run_report,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvkit",
        description="Quantized paged KV caches: NVFP4, TurboQuant, FP8, FP16/BF16.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (help_text, add_arguments, run) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(command_parser)
        command_parser.set_defaults(_run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvkit`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._run(args))
    except CommandError as exc:
        print(f"kvkit {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
