"""Replace rows of the committed results file with rows measured later.

    python scripts/update_results.py RESULTS.json NEW.json [NEW.json ...] [--plot PNG]

A row is identified by (op, format, B, T, Hq, Hkv, D, graph); every row of each NEW file
replaces the row with the same identity in RESULTS (or is appended), later files winning.
Only measured rows move: nothing is computed or rescaled. --plot redraws the figure from the
merged rows (kvkit.bench.plot).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvkit.bench import plot

KEY = ("op", "format", "B", "T", "Hq", "Hkv", "D", "graph")


def row_key(r: dict) -> tuple:
    """A row's identity: KEY, plus the slot order of write rows (rows written before the
    benchmark had slot orders used the scatter order)."""
    slots = r.get("slots", "scatter") if r["op"] == "write" else None
    return tuple(r[k] for k in KEY) + (slots,)


def merge(base: list[dict], updates: list[list[dict]]) -> tuple[list[dict], int, int]:
    """Rows of base with updates applied in order; returns (rows, replaced, appended)."""
    index = {row_key(r): i for i, r in enumerate(base)}
    rows = list(base)
    replaced = appended = 0
    for update in updates:
        for r in update:
            key = row_key(r)
            if key in index:
                rows[index[key]] = r
                replaced += 1
            else:
                index[key] = len(rows)
                rows.append(r)
                appended += 1
    return rows, replaced, appended


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("new", type=Path, nargs="+")
    ap.add_argument("--plot", type=Path)
    args = ap.parse_args()
    base = json.loads(args.results.read_text())
    rows, replaced, appended = merge(base, [json.loads(p.read_text()) for p in args.new])
    args.results.write_text(json.dumps(rows, indent=1) + "\n")
    print(f"{args.results}: {replaced} rows replaced, {appended} appended, {len(rows)} rows")
    if args.plot and plot(rows, args.plot):
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
