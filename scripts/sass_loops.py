"""Static code size of a decode build's loops, by source line, without a GPU.

    PATH=<nvdisasm dir>:$PATH python scripts/sass_loops.py FORMAT[:D:G:Q_LEN[:NAME=VALUE...]]
        [--min 1000] [--max 3000] [--top 25] [--arch sm_90]

Builds the stage-1 decode kernel as scripts/sass_path.py does (NVRTC PTX with -lineinfo, ptxas,
``nvdisasm -gi``), finds every loop (a branch back to a lower address), and for each loop whose
span is between --min and --max instructions prints its span and its instructions counted by
innermost source line. A hot loop's span against the instructions it runs per iteration
(scripts/sass_path.py) says how much cold code sits in it, which costs instruction-cache misses
(Nsight Compute's no_inst stall) though it never runs. Extra NAME=VALUE pairs are build
defines, e.g. ``nvfp4:128:4:1:KV_SOFTCAP=0``. Fp16 queries.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sass_path import parse_text, sass_with_lines  # noqa: E402

from kvkit import formats  # noqa: E402
from kvkit.cuda.decode import _STAGE1  # noqa: E402  (each family's stage-1 entry)


def loops(ins: list[dict], labels: dict[str, int]) -> list[tuple[int, int]]:
    """(first, last) addresses of every loop: a branch to a label at a lower address."""
    out = set()
    for i in ins:
        m = re.search(r"BRA (?:`\()?(\.L_x_\d+)", i["body"])
        if m and m.group(1) in labels and labels[m.group(1)] < i["addr"]:
            out.add((labels[m.group(1)], i["addr"]))
    return sorted(out, key=lambda x: x[1] - x[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build", help="FORMAT[:D:G:Q_LEN[:NAME=VALUE...]]")
    ap.add_argument("--min", type=int, default=1000, help="least loop span, instructions")
    ap.add_argument("--max", type=int, default=1 << 30, help="largest loop span")
    ap.add_argument("--top", type=int, default=25, help="source lines per loop")
    ap.add_argument("--arch", default="sm_90")
    args = ap.parse_args()
    parts = args.build.split(":")
    name = parts[0]
    d, g, ql = (int(x) for x in (parts[1:4] if len(parts) >= 4 else ("128", "4", "1")))
    extra = dict(kv.split("=", 1) for kv in parts[4:])
    fmt = formats.get(name, d)
    defines = dict(fmt.cuda_defines())
    defines.update(KV_IN_DTYPE="1", KV_GROUP=str(g), KV_Q_LEN=str(ql), **extra)
    text, src, log = sass_with_lines(_STAGE1[fmt.family][0], defines, args.arch)
    ins, labels = parse_text(text)
    lines = src.splitlines()
    print(f"{args.build} {args.arch}: {len(ins)} instructions,",
          *re.findall(r"Used \d+ registers", log))  # fmt: skip
    for lo, hi in loops(ins, labels):
        span = [i for i in ins if lo <= i["addr"] <= hi]
        if not args.min <= len(span) <= args.max:
            continue
        hist = collections.Counter()
        for i in span:
            ln = i["chain"][0] if i.get("chain") else 0
            hist[(ln, lines[ln - 1].strip()[:90] if 0 < ln <= len(lines) else "?")] += 1
        print(f"loop {lo:#x}-{hi:#x}: {len(span)} instructions")
        for (ln, text_), n in hist.most_common(args.top):
            print(f"  {n:5d}  L{ln}: {text_}")


if __name__ == "__main__":
    main()
