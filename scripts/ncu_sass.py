"""Summarize an Nsight Compute source-page CSV (SASS, per instruction) of one kernel.

    ncu --section SourceCounters --section WarpStateStats ... -o rep python ...
    ncu -i rep.ncu-rep --page source --csv --print-source sass > k.sass.csv
    python scripts/ncu_sass.py k.sass.csv [--unit N] [--top K]

Prints the executed warp instructions by opcode (share of instructions and of stall
samples), the instructions grouped by how often each one ran per ``--unit`` executions (e.g.
the number of warp-tiles: an instruction that ran once per warp-tile lands in class x1, a
loop body run four times in x4), and the ``--top`` instructions with the most stall samples
and their main stall reasons. No GPU needed: this reads the CSV only.
"""

from __future__ import annotations

import argparse
import collections
import csv
from pathlib import Path

EXECUTED = "Instructions Executed"
SAMPLES = "Warp Stall Sampling (All Samples)"


def read(path: Path) -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(path.open()))
    # Line 0 names the kernel; line 1 is the header.
    return rows[1], rows[2:]


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def opcode(source: str) -> str:
    parts = source.split()
    if not parts:
        return "?"
    return parts[1] if parts[0].startswith("@") and len(parts) > 1 else parts[0]


def summarize(path: Path, unit: float, top: int) -> str:
    header, data = read(path)
    col = {h: i for i, h in enumerate(header)}
    executed = [number(r[col[EXECUTED]]) for r in data]
    samples = [number(r[col[SAMPLES]]) for r in data]
    sources = [r[col["Source"]] for r in data]
    total_e, total_s = sum(executed) or 1.0, sum(samples) or 1.0
    out = [f"{path.name}: {total_e:.4g} warp instructions, {total_s:.0f} stall samples, "
           f"{total_e / unit:.0f} per unit ({unit:g})"]  # fmt: skip

    by_op_e, by_op_s = collections.Counter(), collections.Counter()
    for e, s, src in zip(executed, samples, sources):
        base = opcode(src).split(".")[0]
        by_op_e[base] += e
        by_op_s[base] += s
    out.append("opcode         instr%  stall%")
    for op, e in by_op_e.most_common(20):
        out.append(f"{op:<14} {100 * e / total_e:6.1f}  {100 * by_op_s[op] / total_s:6.1f}")

    classes = collections.defaultdict(lambda: [0.0, 0, 0.0])
    for e, s in zip(executed, samples):
        if e:
            c = classes[round(e / unit, 1)]
            c[0] += e
            c[1] += 1
            c[2] += s
    out.append("runs/unit  static  instr/unit  instr%  stall%")
    for k in sorted(classes, key=lambda k: -classes[k][0])[:10]:
        e, n, s = classes[k]
        out.append(f"x{k:<8} {n:7d} {e / unit:11.1f} {100 * e / total_e:7.1f} "
                   f"{100 * s / total_s:7.1f}")  # fmt: skip

    stall_cols = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    totals = sorted(((sum(number(r[col[h]]) for r in data), h[6:]) for h in stall_cols),
                    reverse=True)  # fmt: skip
    out.append("stall samples by reason: "
               + " ".join(f"{name}:{v:.0f}" for v, name in totals[:8] if v))  # fmt: skip
    out.append("hottest instructions (stall share, executions per unit, top reasons):")
    order = sorted(range(len(data)), key=lambda i: -samples[i])[:top]
    for i in order:
        reasons = sorted(((number(data[i][col[h]]), h[6:]) for h in stall_cols), reverse=True)
        why = " ".join(f"{name}:{v:.0f}" for v, name in reasons[:3] if v)
        out.append(f"{100 * samples[i] / total_s:5.2f}% x{executed[i] / unit:<6.2f} "
                   f"{sources[i][:64]:<64} {why}")  # fmt: skip
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--unit", type=float, default=1.0, help="executions per unit of work")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    print(summarize(args.csv, args.unit, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
