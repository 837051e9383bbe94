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
