"""Common-path SASS count of the TurboQuant write kernel, by phase, without a GPU.

    python scripts/sass_write_tq.py turboquant_4bit_nc[,...] [--head-dim 128] [--dtype 1]
        [--arch sm_90] [--slot "long long"] [--variants 0,1,2] [--show] [--branches]

(scripts/sass_write.py passes TurboQuant names here.) Builds ``write_turboquant.cu`` with
``-lineinfo`` (NVRTC PTX, ptxas, ``nvdisasm -gi``: the tools of scripts/sass_static.py) with
the launch defines of kvkit/cuda/write.py under each KVKIT_WRITE_TQ_VARIANT, then walks one
warp's common path from the entry to EXIT: fp16 inputs without NaN, aligned, a valid slot, the
narrow 32-bit index path, even slots, non-zero rows in kv_divisor's range, no zero value
extreme, every near decision holding (variant 2). A conditional branch is decided by RULES
(source line of the branch, the instruction that set its predicate, the branch text); one no
rule covers is printed as NO RULE and falls through: check the list (--branches) when the
kernel changes. The count is warp instructions for TQ_RPW rows (one warp), split by phase
(the innermost source line inside kv_tq_keys / kv_tq_values / the kernel body, by markers);
the static count (every instruction of the kernel, cold paths included) is printed beside it.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
from pathlib import Path

from kvkit import formats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sass_path import parse_text, sass_with_lines  # noqa: E402

_SETTERS = ("ISETP", "FSETP", "LOP3", "FCHK", "PLOP3", "HSETP", "VOTE")

#: (source-line regex, predicate-setter regex, "predicate branch" regex, taken?)
RULES = [
    (r"if \(in_range\)", r"ISETP\.GT", r"^@!P", False),
    (r"if \(in_range\)", r"ISETP\.GE", r"^@P", False),
    (r"if \(slot < 0\) return false", r"ISETP\.GE", r"^@!P", False),
    (r"unsigned char\* dst = active", r"ISETP\.NE", r"^@!P", False),
    (r"if \(narrow\)", r"ISETP\.LT\.AND\.EX", r"^@P", True),  # narrow: 32-bit index math
    (r"if \(slot >= capacity\)", r"ISETP\.GE", r"^@!P", True),  # slot < capacity
    (r"if \(active && aligned\)", r"LOP3", r"^@!P\d BRA P", True),  # active and aligned
    (r"nan_bits & 0x80008000", r".", r"^@!P", True),  # variant 0: no NaN half
    (r"__all_sync\(KV_FULL_WARP, even\)", r"VOTE\.ALL", r"^@P", True),
    (r"__fsqrt_rn", r"0x727fffff", r"^@!P", True),  # sqrt: a normal operand
    (r"if \(den != 0.0f\)", r"FSETP\.NEU", r"^@!P", False),
    (r"if \(den == 0.0f\)", r"FSETP", r"^@!P", False),
    (r"if \(!done\)", r".", r".", True),  # the near decisions held (variant 2)
    (r"if \(dv\.ok\)", r"FSETP\.GE\.AND", r"^@!P", False),
    (r"if \(dv\.ok\)", r"FSETP\.GTU", r"^@!P", True),
    # reciprocal: exponent in the fast range
    (r"\.y = (POW2 \? .* : )?__frcp_rn", r".", r"^@P", True),
    (r"if \(!ok\)", r".", r"^@P", True),
    # Stores by some lanes of the warp (lane 0 of a row, the packing groups' store lanes, FP8
    # key bytes of active rows): the warp issues the body, so the walk goes through it. (A
    # body after an inverted test, e.g. @P BRA on "not a store lane", is the fall-through too.)
    (r"if \(active && p == 0\)", r".", r".", False),
    (r"if \(store\)", r".", r".", False),
    (r"if \(active\)", r".", r".", False),
    (r"if \(cn != 0.0f\)", r"FSETP", r"^@!P", False),
    (r".", r"^FCHK", r"^@!P", True),  # __fdiv_rn: operands in the fast range
    (r"if \(vlo == 0.0f \|\| vhi == 0.0f\)", r"FSETP\.NEU", r"^@P\d BRA P", True),
    # variant 4: the same test, warp-uniform (no row with a zero extreme: skipped)
    (r"if \(__any_sync\(KV_FULL_WARP, vlo == 0.0f", r"VOTE\.ANY", r"^@!P", True),
    # variant 5, FP8 keys of float16 inputs: k_scale in range and every half finite (fast path)
    (r"if \(k_scale >= KV_DIV_F16_LO", r"LOP3", r"^@!P\d BRA P", True),
    (r"if \(i < TQ_BKT_CELLS\)", r".", r".", False),  # variant 5's table fill: the warp runs it
    # the key near test as a branch to the exact path (variant 5 builds): not near
    (r"ok = ok && !\(fabsf\(d\) <= TQ_NEAR_KEY\)", r"FSETP", r"^@!P", False),
]
# (variant 5's power-of-two k_scale branch, FP8 keys: added by main from --k-scale)

#: phase markers: (text of a source line, phase from that line on), searched from kv_tq_keys
PHASES = [
    ("// ---- K ----", "widen"),
    ("const float n = __fsqrt_rn", "norm"),
    ("const unsigned int sbits", "signs"),
    ("kv_vlane_fwht<R, TQ_E>(x);", "fwht"),
    ("const float den", "K divide+bucket"),
    ("if (!done) {", "K exact fallback"),
    ("const float cn", "cn sum"),
    ("kv_tq_store_codes<TQ_KEY_BITS", "K pack+store"),
    ("// ---- V ----", "widen"),
    ("float vlo = x[0][0]", "V min/max"),
    ("const float top = (float)TQ_V_TOP;", "V scale"),
    ("bool done = false;  // c holds the spec's codes", "V quantize"),
    ("kv_tq_store_codes<TQ_VALUE_BITS", "V pack+store"),
    ("__device__ __forceinline__ void kv_tq_rows(", "other"),
    ("__device__ __forceinline__ bool kv_tq_row_slot(", "index"),
    ("unsigned int kw[R][W], vw[R][W];", "loads"),
    ("if (__all_sync(KV_FULL_WARP, even))", "index"),
]


#: --define NAME=VALUE: extra launch defines (e.g. variant 5's TQ_V5_* switches)
EXTRA_DEFINES: dict[str, str] = {}


def build(fmt, dtype: str, slot: str, arch: str, variant: str) -> tuple[str, str, str]:
    """(nvdisasm -gi text, inlined source, ptxas -v log) of one build."""
    from kvkit.cuda.write import tq_launch_defines

    old = os.environ.get("KVKIT_WRITE_TQ_VARIANT")
    os.environ["KVKIT_WRITE_TQ_VARIANT"] = variant
    try:
        defines = dict(fmt.cuda_defines())
        defines.update(KV_IN_DTYPE=dtype, KV_SLOT_T=slot)
        defines.update(tq_launch_defines(fmt, dtype))
        defines.update(EXTRA_DEFINES)
    finally:
        if old is None:
            del os.environ["KVKIT_WRITE_TQ_VARIANT"]
        else:
            os.environ["KVKIT_WRITE_TQ_VARIANT"] = old
    return sass_with_lines("write_turboquant.cu", defines, arch)


def parse(text: str) -> tuple[list[dict], dict[str, int]]:
    """Instructions (addr, pred, body, op, chain: source lines innermost first), labels:
    scripts/sass_path.py's parser."""
    return parse_text(text)


def walk(ins, labels, src, show=False, branches=False):
    """(count, opcode mix, count per source chain) along the common path."""
    at = {i["addr"]: k for k, i in enumerate(ins)}
    setter: dict[str, str] = {}
    k = n = 0
    mix: collections.Counter = collections.Counter()
    lines: collections.Counter = collections.Counter()
    while n < 100_000:
        i = ins[k]
        n += 1
        mix[i["op"].split(".")[0]] += 1
        lines[tuple(i["chain"])] += 1
        body, op = i["body"], i["op"]
        if show:
            print(f"   {i['addr']:05x} {(i['pred'] or ''):5s} {body[:70]}")
        if op.startswith(_SETTERS):
            for p in re.findall(r"\b(U?P\d)\b", ",".join(body.split(",")[:2])):
                setter[p] = body
        if op == "EXIT" and not i["pred"]:
            return n, mix, lines
        if op.startswith("BRA"):
            tgt = labels[re.search(r"`\((\.L_x_\d+)\)", body).group(1)]
            text = src[i["chain"][0] - 1].strip() if i["chain"] else ""
            if op.startswith("BRA.DIV"):
                t = False  # the warp is converged on this path
            elif not i["pred"]:
                t = True
            else:
                st = setter.get(i["pred"].lstrip("@!"), "?")
                t = next((d for s, w, b, d in RULES if re.search(s, text) and re.search(w, st)
                          and re.search(b, i["pred"] + " " + body)), None)  # fmt: skip
                tag = {True: "taken", False: "falls", None: "NO RULE"}[t]
                if branches or t is None:
                    where = f"{i['addr']:05x} {i['pred']:5s} {tag:8s}"
                    print(f"    {where} <- {st[:40]:40s} | {text[:48]}")
                t = bool(t)
            if t:
                k = at[tgt]
                continue
        k += 1
    raise SystemExit("no EXIT within 100000 instructions")


def phases(lines, src) -> collections.Counter:
    start = next(k + 1 for k, s in enumerate(src) if "void kv_tq_keys(" in s)
    marks = sorted(
        (next(k + 1 for k in range(start - 1, len(src)) if pat in src[k]), name)
        for pat, name in PHASES
    )
    out: collections.Counter = collections.Counter()
    for chain, c in lines.items():
        ln = next((x for x in chain if x >= start), 0)
        out[next((name for m, name in reversed(marks) if ln >= m), "other")] += c
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("formats", help="comma-separated TurboQuant format names")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="1", choices=("1", "2"))
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--slot", default="long long", choices=("int", "long long"))
    ap.add_argument("--variants", default="0,1,2", help="KVKIT_WRITE_TQ_VARIANT values")
    ap.add_argument("--show", action="store_true", help="print the path")
    ap.add_argument("--branches", action="store_true", help="print every branch decision")
    ap.add_argument(
        "--k-scale",
        default="pow2",
        choices=("pow2", "general"),
        help="variant 5's FP8-key branch on a power-of-two k_scale (the default 1)",
    )
    ap.add_argument("--define", action="append", default=[], help="NAME=VALUE extra define")
    args = ap.parse_args(argv)
    EXTRA_DEFINES.update(d.split("=", 1) for d in args.define)
    pow2 = args.k_scale == "pow2"
    # LOP3.LUT P, RZ, bits(k_scale), 0x7fffff: P = mantissa nonzero (not a power of two)
    RULES.append((r"__float_as_uint\(k_scale\) & 0x007FFFFFu", r"0x7fffff", r"^@!P", pow2))
    RULES.append((r"__float_as_uint\(k_scale\) & 0x007FFFFFu", r"0x7fffff", r"^@P", not pow2))
    # variant 5's generic FP8 keys (bfloat16 / float32 inputs): the same test on kb
    RULES.append((r"if \(\(kb & 0x007FFFFFu\) == 0u", r".", r"^@!P", pow2))
    RULES.append((r"if \(\(kb & 0x007FFFFFu\) == 0u", r".", r"^@P", not pow2))
    for name in args.formats.split(","):
        fmt = formats.get(name, args.head_dim)
        for v in args.variants.split(","):
            text, src, log = build(fmt, args.dtype, args.slot, args.arch, v)
            src = src.splitlines()
            regs = ",".join(re.findall(r"Used (\d+) registers", log))
            spills = ",".join(re.findall(r"(\d+) bytes spill stores", log))
            ins, labels = parse(text)
            n, mix, lines = walk(ins, labels, src, args.show, args.branches)
            ph = phases(lines, src)
            head = f"{name} D={args.head_dim} dtype={args.dtype} {args.arch} variant {v}"
            print(f"{head}: registers {regs}, spill bytes {spills}, common path {n} warp instr., "
                  f"{len(ins)} static instr.")  # fmt: skip
            print(
                "    " + ", ".join(f"{p} {c}" for p, c in sorted(ph.items(), key=lambda x: -x[1]))
            )
            print("    " + ", ".join(f"{op} {c}" for op, c in mix.most_common(14)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
