"""Side-by-side decode times of several bench runs (A/B of kernel variants in one device call).

    python scripts/ab_compare.py [--write] NAME=DIR/bench.json NAME=DIR/bench.json ...

Prints, per format and shape, the graph-replay decode ms of each run (with --write: the
write ms) and the ratio of each run to the first. Rows missing from a run print as "-". Runs
are compared only within one device call (scripts/ab_bench.sh), where they share the GPU,
clocks and inputs' sizes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvkit.bench import shape_label


def load(spec: str, op: str = "decode") -> tuple[str, dict]:
    name, _, path = spec.partition("=")
    if not path:
        raise SystemExit(f"want NAME=PATH, got {spec!r}")
    rows = json.loads(Path(path).read_text())
    table = {}
    for r in rows:
        # Decode rows: the graph replays; write rows are timed as plain calls.
        if r["op"] == op and (r["graph"] or op == "write"):
            table[(r["format"], r["B"], r["T"], r["Hq"], r["Hkv"], r["D"])] = r["kvkit_ms"]
    return name, table


def compare(runs: list[tuple[str, dict]]) -> str:
    keys = list(dict.fromkeys(k for _, table in runs for k in table))
    head = f"{'format':<20} {'shape':<22}" + "".join(f" {name:>12}" for name, _ in runs)
    lines = [head + "".join(f" {name + '/' + runs[0][0]:>14}" for name, _ in runs[1:])]
    for key in keys:
        fmt, b, t, hq, hkv, d = key
        shape = shape_label(b, t, hq, hkv, d)
        vals = [table.get(key) for _, table in runs]
        line = f"{fmt:<20} {shape:<22}" + "".join(
            f" {v:12.4f}" if v is not None else f" {'-':>12}" for v in vals
        )
        base = vals[0]
        for v in vals[1:]:
            line += f" {v / base:14.3f}" if v is not None and base else f" {'-':>14}"
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    op = "decode"
    if argv and argv[0] == "--write":
        op, argv = "write", argv[1:]
    if len(argv) < 2:
        print(__doc__)
        return 2
    print(compare([load(a, op) for a in argv]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
