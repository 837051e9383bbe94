"""Aligned plain-text tables for the command-line reports (demo, report)."""

from __future__ import annotations

from collections.abc import Sequence


def render_table(columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[str]]) -> list[str]:
    """Header, rule and one line per row, each column padded to its widest cell.

    columns: (header, align) pairs, align "<" or ">"; rows: cells already formatted as text.
    """
    widths = [max(len(h), *(len(r[j]) for r in rows)) for j, (h, _) in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            f"{v:{align}{w}}" for v, (_, align), w in zip(values, columns, widths)
        ).rstrip()

    header = line([h for h, _ in columns])
    return [header, "-" * len(header), *(line(r) for r in rows)]
