"""Executed-path instruction count of a decode stage-1 tile loop, without a GPU.

    python scripts/sass_path.py FORMAT --dump DIR [--define N=V]  # build DIR/FORMAT.sass, .src
    python scripts/sass_path.py FORMAT --dir DIR --list      # the loop's branches, one a line
    python scripts/sass_path.py FORMAT --dir DIR --take 61f0:T,7af0:F,abb0:15 [--path]
    python scripts/sass_path.py FORMAT --dir DIR --common warps23|warps01 [--list]
    python scripts/sass_path.py FORMAT --dir DIR --pairs --common warps23 --take ...

scripts/sass_static.py counts every instruction of the tile loop, paths not taken included
(copy fallbacks, masks, soft-cap, rescale); this script follows ONE path through it and counts
the warp instructions issued on the way, which is what Nsight Compute's executed count per
warp-tile measures when every warp takes that path. Build as sass_static.py does (NVRTC PTX,
ptxas 13 with -lineinfo, nvdisasm -gi from the pip packages on PATH), so every instruction
carries its source line and inlining chain.

The walk starts at the loop head (the instruction before the tile loop's cp.async wait, or
--head) and follows the code: an unconditional branch is taken, a conditional one falls
through unless --take names its address: T (always taken), F (never), or N (taken N times,
then falls through: a loop that runs N + 1 times, e.g. an elected-lane copy loop). It stops at
the back edge to the head. Decide each branch by reading --list (source line per branch) and
the SASS around it: the predicate's sense is the compiler's, not the source's. A branch whose
lanes disagree counts as the path with the most code (the warp issues both sides). Warps that
differ (the page ring runs on threads < TILE, i.e. warps 0 and 1 of the mma core) need one
walk each. Output: the count, the opcode mix, and a split by the stage-1 body's phases
(decode_mma.cuh comments (a) scores, (b) softmax, (c) PV; "start" is the tile's copy issue,
page ring and waits). Counts are estimates: no stalls, no replays, exact only for the path
given.

--pairs walks the tile-pair loop of pair builds (the default; decode_mma_pairs.cuh):
the head is its back edge's target, the phases its comments (a2), (b2), (c2); the count is
per pair (two 16-token warp-tiles).
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from kvkit import formats
from kvkit.cuda.compiler import _nvrtc, _options, inline_source
from kvkit.cuda.decode import _STAGE1

_LINE = re.compile(r'\s*//## File ".*?", line (\d+)')
_INS = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")


def build(name: str, out: Path, head_dim: int, group: int, q_len: int, arch: str,
          extra: tuple[str, ...] = ()) -> None:  # fmt: skip
    """DIR/NAME.sass (nvdisasm -gi of the stage-1 cubin) and DIR/NAME.src (the inlined entry);
    extra: NAME=VALUE defines on top of the format's (switches such as
    KVKIT_DECODE_NVFP4_UNPACK=0)."""
    fmt = formats.get(name, head_dim)
    defines = dict(fmt.cuda_defines())
    defines.update(KV_IN_DTYPE="1", KV_GROUP=str(group), KV_Q_LEN=str(q_len))
    defines.update(d.split("=", 1) for d in extra)
    entry = _STAGE1[fmt.family][0]
    dis, src, _ = sass_with_lines(entry, defines, arch)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.src").write_text(src)
    (out / f"{name}.sass").write_text(dis)


def sass_with_lines(entry: str, defines: dict, arch: str) -> tuple[str, str, str]:
    """(nvdisasm -gi text, inlined source, ptxas -v log) of cuda_src/ENTRY built with the
    launcher's options plus -lineinfo (NVRTC PTX, then ptxas and nvdisasm from PATH)."""
    src = inline_source(entry)
    nvrtc = _nvrtc()
    prog = nvrtc.createProgram(src, entry, [], [])
    try:
        nvrtc.compileProgram(prog, [*_options(entry, defines, arch, True, False), "-lineinfo"])
        ptx = nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)
    ptx = (ptx.decode() if isinstance(ptx, bytes) else ptx).rstrip("\0")
    with tempfile.TemporaryDirectory() as tmp:
        p, c = Path(tmp, "k.ptx"), Path(tmp, "k.cubin")
        p.write_text(ptx)
        asm = subprocess.run(["ptxas", f"-arch={arch}", "-v", "-lineinfo", str(p), "-o", str(c)],
                             check=True, capture_output=True, text=True)  # fmt: skip
        dis = subprocess.run(["nvdisasm", "-gi", "-c", str(c)], capture_output=True, text=True,
                             check=True)  # fmt: skip
    return dis.stdout, src, asm.stderr


def parse(sass: Path) -> tuple[list[dict], dict[str, int]]:
    """Instructions (addr, pred, body, op, chain of source lines, innermost first), labels."""
    return parse_text(sass.read_text())


def parse_text(text: str) -> tuple[list[dict], dict[str, int]]:
    """parse() of `nvdisasm -gi` text (also scripts/sass_write_tq.py's parser)."""
    ins: list[dict] = []
    labels: dict[str, int] = {}
    chain: list[int] = []
    pending: list[int] = []
    label = None
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            pending.append(int(m.group(1)))
            continue
        m = _LABEL.match(line)
        if m:
            label = m.group(1)
            continue
        m = _INS.match(line)
        if not m:
            continue
        if pending:
            chain, pending = pending, []
        addr = int(m.group(1), 16)
        if label:
            labels[label], label = addr, None
        body_text = m.group(2).strip()
        pm = re.match(r"^(@!?U?P\w+)\s+(.*)$", body_text)
        pred, body = (pm.group(1), pm.group(2)) if pm else (None, body_text)
        ins.append(dict(addr=addr, pred=pred, body=body, op=body.split()[0], chain=list(chain)))
    return ins, labels


def loop_head(ins: list[dict], labels: dict[str, int] | None = None,
              src: list[str] | None = None) -> int:  # fmt: skip
    """The instruction before the first cp.async wait (DEPBAR); given labels and src, the
    target of the tile loop's back edge where it lies before that wait (bulk builds test
    `fast` and wait on the stage's mbarrier first, so their loop starts before the DEPBAR)."""
    for k, i in enumerate(ins):
        if not i["op"].startswith("DEPBAR"):
            continue
        head = ins[k - 1]["addr"]
        if labels is None or src is None:
            return head
        for j in ins[k + 1 :]:
            line = src[j["chain"][0] - 1].strip() if j["chain"] else ""
            m = re.search(r"`\((\.L_x_\d+)\)", j["body"])
            if j["op"].startswith("BRA") and m and line.startswith("for (int i = 0; i < n_tiles"):
                return min(head, labels[m.group(1)])
        return head
    sys.exit("no DEPBAR: pass --head")


def pair_head(ins: list[dict], labels: dict[str, int], src: list[str]) -> int:
    """The target of the tile-pair loop's back edge (decode_mma_pairs.cuh)."""
    heads = []
    for i in ins:
        line = src[i["chain"][0] - 1].strip() if i["chain"] else ""
        m = re.search(r"`\((\.L_x_\d+)\)", i["body"])
        if i["op"].startswith("BRA") and m and line.startswith("for (; i_rest + 1 < n_tiles"):
            if labels[m.group(1)] < i["addr"]:
                heads.append(labels[m.group(1)])
    if not heads:
        sys.exit(
            "no tile-pair loop in this build (pairs: warp-pipe slab builds, the default on sm_90)"
        )
    return min(heads)


def walk(ins: list[dict], labels: dict[str, int], head: int, take: dict[int, int | bool],
         on_branch=None, on_ins=None) -> int:  # fmt: skip
    """Count the instructions from head to the back edge along the decided path."""
    at = {i["addr"]: k for k, i in enumerate(ins)}
    used: dict[int, int] = collections.Counter()
    k, n = at[head], 0
    while n < 200_000:
        i = ins[k]
        n += 1
        if on_ins:
            on_ins(i)
        if i["op"].startswith("BRA"):
            m = re.search(r"`\((\.L_x_\d+)\)", i["body"]) or re.search(r"0x([0-9a-f]+)", i["body"])
            tgt = labels[m.group(1)] if m.group(1).startswith(".L") else int(m.group(1), 16)
            if i["op"].startswith("BRA.DIV"):
                t = False  # the warp is converged on the paths walked here
            elif i["pred"] is None:
                t = True
            else:
                d = take.get(i["addr"], False)
                if isinstance(d, bool):
                    t = d
                else:
                    t = used[i["addr"]] < d
                    used[i["addr"]] = used[i["addr"]] + 1 if t else 0
                if on_branch:
                    on_branch(i, t, tgt)
            if t:
                if tgt == head:
                    return n
                k = at[tgt]
                continue
        elif i["op"] == "EXIT":
            sys.exit(f"EXIT at {i['addr']:#x}: a branch decision is wrong")
        k += 1
    sys.exit("no back edge within 200000 instructions")


# --common: the taken branches of the common path of a fast launch (the docstring's list) by the
# source line of the branch; every other conditional branch falls through. Checked on NVFP4
# (D = 32..256, G = 4..16; session 10): the predicate senses are the compiler's, so read --list
# before trusting it for another format or core.
COMMON_TAKEN = (
    "at.row_off = row_off >= 0",  # the tile's row offset known (no division)
    "at.slab_off = bs <= kvd::TILE ? (at.slab_tok & (bs - 1))",  # pages of <= TILE tokens
    # The same for the slab planes of bulk builds (TurboQuant, sm_90+): before this line was
    # listed, their walks went through the page-offset division (~28 instructions).
    "at.slab_off = bs <= kvd::TILE ? 0 : t0 % bs;",
    "if (sub)",  # slab planes by warp sub-runs
    "if (slabs) {",  # bulk builds with warp slabs (decode_core.cuh issue_bulk_slabs)
    "if (block_size <= kvd::TILE)",  # issue_bulk_slabs: pages of <= TILE tokens
    "else if (sub)",  # the same, after the row-runs test (decode_core.cuh KvTilePipe::issue)
    "else if (fast)",  # row planes of a fast launch (formats without slab planes: before this
    # line was listed the walk of fp16 / bf16 / fp8 went through the synchronous fallback)
    "if (kvd::ROW_RUNS && runs",  # row runs (KVD_ROW_RUNS_ON=1 builds, tiles of 16 k tokens)
    "const int idx = bt_sh >= 0",  # power-of-two pages: the ring's page index by a shift
    "float x = sc[nr][2 * tt + j] * km[tt] * rsc[nr][j];",  # no soft-cap
    "if (!full) {",  # a fully visible tile
    "if (__any_sync(KV_FULL_MASK, rescale))",  # no rescale
    "for (int i = 0; i < n_tiles; ++i)",  # the back edge
    # The tile-pair loop (decode_mma_pairs.cuh): no soft-cap, both tiles fully visible, the
    # back edge.
    "float x = sc[h][nr][2 * tt + j] * km[h][tt] * rsc[nr][j];",
    "if (!full[h]) {",
    "for (; i_rest + 1 < n_tiles; i_rest += 2) {",
)


def common_take(ins, labels, head, src, ring: bool,
                seed: dict[int, int | bool] | None = None) -> dict[int, int | bool]:  # fmt: skip
    """--take decisions for --common: COMMON_TAKEN, plus `threadIdx.x < kvd::TILE` taken
    (skipping the page ring, warps 2-3) unless ring (warps 0-1); seed: the --take decisions,
    kept (so the code they lead to gets the common decisions too)."""
    take: dict[int, int | bool] = dict(seed or {})
    met: dict[int, bool] = {}

    def decide(i: dict, t: bool, tgt: int) -> None:
        if i["addr"] in take:
            return
        line = src[i["chain"][0] - 1].strip() if i["chain"] else ""
        if line.startswith("if (threadIdx.x < kvd::TILE)"):
            met[i["addr"]] = not ring
        else:
            met[i["addr"]] = any(line.startswith(p) for p in COMMON_TAKEN)

    for _ in range(100):
        met.clear()
        try:
            walk(ins, labels, head, take, decide)
        except SystemExit:  # a decision not made yet led to EXIT; the next round makes it
            pass
        if not met:
            return take
        take.update(met)
    sys.exit("--common: the decisions did not settle")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("format")
    ap.add_argument("--dump", type=Path, help="build DIR/FORMAT.sass and .src, then exit")
    ap.add_argument("--dir", type=Path, help="where --dump wrote them")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--q-len", type=int, default=1)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument(
        "--define",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="with --dump: an extra -D define, repeatable",
    )
    ap.add_argument("--head", help="loop head address (hex); default: before the first DEPBAR")
    ap.add_argument("--take", default="", help="ADDR:T|F|N,... branch decisions (hex addresses)")
    ap.add_argument("--common", choices=("warps23", "warps01"),
                    help="decide the branches by COMMON_TAKEN (warps01: with the page ring); "
                         "--take entries override")  # fmt: skip
    ap.add_argument(
        "--pairs",
        action="store_true",
        help="walk the tile-pair loop (KVKIT_DECODE_TILE_PAIRS=1 builds)",
    )
    ap.add_argument("--list", action="store_true", help="print each branch met on the way")
    ap.add_argument("--path", action="store_true", help="print every instruction walked")
    args = ap.parse_args(argv)
    if args.dump:
        build(args.format, args.dump, args.head_dim, args.group, args.q_len, args.arch,
              tuple(args.define))  # fmt: skip
        return 0
    if not args.dir:
        ap.error("--dir (or --dump) is required")
    ins, labels = parse(args.dir / f"{args.format}.sass")
    src = (args.dir / f"{args.format}.src").read_text().splitlines()
    if args.head:
        head = int(args.head, 16)
    elif args.pairs:
        head = pair_head(ins, labels, src)
    else:
        head = loop_head(ins, labels, src)
    take: dict[int, int | bool] = {}
    for tok in filter(None, args.take.split(",")):
        a, v = tok.split(":")
        take[int(a, 16)] = True if v == "T" else False if v == "F" else int(v)
    if args.common:
        given = dict(take)
        take = common_take(ins, labels, head, src, args.common == "warps01", given)
        taken = ",".join(f"{a:05x}:T" for a, v in take.items() if v is True and a not in given)
        print(f"--common {args.common}: --take {taken}")

    def text(ln: int) -> str:
        return src[ln - 1].strip()[:80] if ln else ""

    def branch(i: dict, t: bool, tgt: int) -> None:
        if args.list:
            ln = i["chain"][0] if i["chain"] else 0
            print(f"  {i['addr']:05x} {i['pred']:6s} {'T' if t else 'F'} -> {tgt:05x}  {text(ln)}")

    ops: collections.Counter = collections.Counter()
    body_lines: collections.Counter = collections.Counter()

    def count(i: dict) -> None:
        ops[i["op"].split(".")[0]] += 1
        ch = i["chain"]
        body_lines[ch[-2] if len(ch) >= 2 else (ch[0] if ch else 0)] += 1
        if args.path:
            ln = i["chain"][0] if i["chain"] else 0
            print(f"  {i['addr']:05x} {(i['pred'] or '') + ' ' + i['body']:64.64s} | {text(ln)}")

    n = walk(ins, labels, head, take, branch, count)

    def first(pat: str) -> int:
        return next((k + 1 for k, line in enumerate(src) if pat in line), 1 << 30)

    if args.pairs:
        a, b = first("// (a2) pair scores"), first("// (b2) pair softmax")
        c, e = first("// (c2) pair PV"), first("// (e2) pair end")
    else:
        a, b = first("// (a) S^T = K Q^T"), first("// (b) masks, soft-cap")
        c, e = first("// (c) O^T += V^T"), first("kv_cp_async_wait<0>();")
    phases = collections.Counter()
    for ln, cnt in body_lines.items():
        key = "start" if ln < a else "score" if ln < b else "softmax" if ln < c else "pv"
        phases[key if ln < e else "other"] += cnt
    print(f"{args.format}: {n} warp instructions from {head:#x} to the back edge")
    print("    " + ", ".join(f"{k} {phases[k]}" for k in ("start", "score", "softmax", "pv")))
    print("    " + ", ".join(f"{op} {k}" for op, k in ops.most_common(14)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
