"""Static SASS of the NVFP4 and dense (fp16 / bf16 / fp8_e4m3) write kernels, without a GPU:
registers, spills, and the length of their common path (one thread, every block fast), the
number to compare before and after a change.

    python scripts/sass_write.py nvfp4,nvfp4_4over6,fp8_e4m3,fp16 [--head-dim 128] [--dtype 1]
        [--arch sm_90] [--slot "long long"] [--define NAME=VALUE ...] [--show]
    python scripts/sass_write.py turboquant_4bit_nc,... [...]   # scripts/sass_write_tq.py

Builds ``write_nvfp4.cu`` (NVFP4 formats) or ``write_dense.cu`` (the others; its body from
``KVKIT_WRITE_DENSE_VARIANT``, as the launcher picks it) as PTX with NVRTC, assembles it with
``ptxas`` and disassembles it with ``cuobjdump -sass`` (the tools of scripts/sass_static.py; see
its docstring). The common path is followed from the entry: an unconditional branch is taken; a
conditional one is decided by the instruction that last set its predicate, by the rules below
(the narrow 32-bit index path, a slot inside the cache, 16-byte aligned loads and stores, IEEE
division and reciprocal on their fast paths, a non-zero scale, the fast-block test passing); a
predicated EXIT falls through. Every decision is printed, and a branch no rule covers is flagged
(it falls through): check them when the kernel changes. The count is of instructions issued per
thread of the common path (a static estimate of Nsight Compute's executed instructions per warp,
whose warps all take this path on LLM-like inputs); ``--dtype`` is KV_IN_DTYPE (0 float32, 1
float16, 2 bfloat16).
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sass_static import _instructions_with_predicates, _sass  # noqa: E402

from kvkit import formats  # noqa: E402
from kvkit.cuda.compiler import compile_entry  # noqa: E402
from kvkit.cuda.write import (  # noqa: E402
    DENSE_CHUNK,
    dense_launch_defines,
    nvfp4_launch_defines,
)
from kvkit.formats import NVFP4Format  # noqa: E402

#: (regex on the predicate's setter, regex on the branch, taken?)
RULES = [
    (r"^FCHK", r"^@!P", True),  # __fdiv_rn: operands in the fast range
    (r"0x1ffffff", r"^@P", True),  # __frcp_rn: exponent in the fast range
    (r"^FSETP\.NEU\.AND P\d, PT, R\d+, RZ", r"^@!P", False),  # den != 0
    (r"^LOP3\.LUT P\d, RZ, R\d+, 0x(f|7|3|1), RZ", r"^@!P", True),  # aligned loads / stores
    (r"^FSETP\.(LT|GT|GEU)\.AND P\d, PT, (R\d+, 7|R\d+, RZ|RZ, (UR|c\[))", r"^@!?P\d BRA P", True),
    (r"0x3c7fffff", r"^@P", True),  # software E4M3 (sm_80, sm_86): a normal scale,
    (r"0x43dfffff|0x7f800000", r"^@P", False),  # ... below 448, not NaN
    (r"^FSETP\.GEU\.AND P\d, PT, \|R\d+\|, \+INF", r"^@!P\d BRA (0x|P)", True),  # finite amax
    (r"^LOP3\.LUT P\d, RZ, R\d+, 0x80008000", r"^@!P", True),  # no NaN half (older kernels)
    (r"^LOP3\.LUT P\d, RZ, R\d+, 0x(f|7|3|1), RZ", r"^@P", False),  # (the same, other polarity)
    (r"^LOP3\.LUT P\d, RZ, R\d+, 0x80008000", r"^@P", False),
    (r"^FSETP\.EQU\.OR P\d, PT, \|R\d+\|, \+INF", r"^@P", False),  # finite amax (sm_100a)
    (r"^FSETP\.NE\.AND P\d, PT, \|R\d+\|, \+INF", r"^@P\d BRA", True),  # finite block
    (r"^ISETP\.GT\.OR\.EX", r"^@P", False),  # narrow index math
    (r"^ISETP\.GE\.(S64\.)?AND(\.EX)? P\d, PT, R\d+, (UR|c\[)", r"^@!P", True),  # slot < capacity
    (r"^ISETP\.NE\.AND P\d, PT, R\d+, R\d+, PT", r"^@!P\d BRA", False),  # 4over6: sf codes differ
    (r"^FSETP\.GE\.AND P\d, PT, R\d+, 9\.0949", r"^@P\d BRA P\d", True),  # ... and it is sure
]
_SETTERS = ("ISETP", "FSETP", "LOP3", "FCHK", "PLOP3", "HSETP")


def common_path(ins: list[tuple[int, str]], show: bool = False) -> tuple[int, collections.Counter]:
    """(instructions on the common path, opcode mix); prints each branch decision."""
    index = {a: i for i, (a, _) in enumerate(ins)}
    setter: dict[str, str] = {}
    i, n, mix = 0, 0, collections.Counter()
    while True:
        addr, body = ins[i]
        pred = re.match(r"^@(!?)(U?P\w+)\s+", body)
        core = body[pred.end() :] if pred else body
        op = core.split()[0]
        n += 1
        mix[op.split(".")[0]] += 1
        if show:
            print(f"{addr:05x} {body}")
        if op.startswith(_SETTERS):
            for p in re.findall(r"\b(P\d)\b", ",".join(core.split(",")[:2])):
                setter[p] = core
        if op == "EXIT" and not pred:
            return n, mix
        if op == "BRA":
            target = index[int(re.search(r"0x([0-9a-f]+)", core).group(1), 16)]
            if not pred:
                i = target
                continue
            src = setter.get(pred.group(2), "?")
            rule = next((t for s, b, t in RULES if re.search(s, src) and re.search(b, body)), None)
            tag = {True: "taken", False: "falls", None: "NO RULE: falls"}[rule]
            print(f"    {addr:05x} {body:34s} {tag:15s} <- {src[:60]}")
            if rule:
                i = target
                continue
        i += 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("formats", help="comma-separated NVFP4 or dense format names")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="1", choices=("0", "1", "2"))
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--slot", default="long long", choices=("int", "long long"))
    ap.add_argument("--define", action="append", default=[], metavar="NAME=VALUE",
                    help="an extra define (a variant; overrides the launcher's)")  # fmt: skip
    ap.add_argument("--show", action="store_true", help="print the path")
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0].startswith("turboquant"):  # the TurboQuant walker, by phase
        from sass_write_tq import main as tq_main

        return tq_main(argv)
    args = ap.parse_args(argv)
    extra = dict(d.split("=", 1) for d in args.define)
    for name in args.formats.split(","):
        fmt = formats.get(name, args.head_dim)
        defines = dict(fmt.cuda_defines())
        defines.update(KV_IN_DTYPE=args.dtype, KV_SLOT_T=args.slot)
        if isinstance(fmt, NVFP4Format):
            defines.update(nvfp4_launch_defines(fmt, args.dtype))
            bpt = int(defines["KV_NVFP4_BPT"])
            entry, unit = "write_nvfp4.cu", f"{bpt} block(s) of K and of V per thread"
        else:
            defines.update(dense_launch_defines(fmt, args.dtype))
            bpt = int(defines.get("KV_DENSE_CPT", "1"))
            entry, unit = "write_dense.cu", f"{bpt} chunk(s) of {DENSE_CHUNK} K and V elements"
        defines.update(extra)
        res = compile_entry(entry, defines, args.arch, ptx_only=True)
        log, text = _sass(res.ptx, args.arch)
        regs = re.findall(r"Used (\d+) registers", log)
        spills = re.findall(r"(\d+) bytes spill stores", log)
        ins = _instructions_with_predicates(text)
        print(f"{name} D={args.head_dim} dtype={args.dtype} {args.arch}: registers "
              f"{','.join(regs)}, spill bytes {','.join(spills)}, {len(ins)} static instructions, "
              f"{unit} per thread")  # fmt: skip
        n, mix = common_path(ins, args.show)
        what = "K/V block pair" if entry == "write_nvfp4.cu" else "K/V chunk pair"
        print(f"  common path: {n} instructions per thread, {n / bpt:.0f} per {what}")
        print("    " + ", ".join(f"{op} {k}" for op, k in mix.most_common(16)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
