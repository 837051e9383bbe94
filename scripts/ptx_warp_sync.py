"""Warp-synchronous PTX instructions that run under a branch which is not warp-uniform.

    python scripts/ptx_warp_sync.py turboquant_3bit_nc[,...] [--head-dim 128] [--dtype 0]
        [--arch sm_90] [--variant 4]

A shfl / vote / bar.warp / match / redux ``.sync`` whose member mask names all 32 lanes must be
run by all 32 (CUDA: "all non-exited threads named in mask must execute the same intrinsic").
Inside a branch that only some lanes take, the others wait at the branch's end: undefined, and
on an H200 it broke later shuffles of the TurboQuant write (wrong bytes, illegal instructions)
while earlier code layouts happened to survive it, so no test on a GPU is a reliable guard.
This reads the kernel's PTX control flow instead: for every such instruction, the conditional
branches it is control dependent on (it post-dominates one successor of the branch but not the
branch), and whether each branch predicate is warp-uniform, i.e. the result of a ``vote.sync``
(``.all`` / ``.any`` / ``.uni``) or the negation of one. Anything else is reported. PTX, not SASS,
because the question is about the program as written; ptxas keeps the branch structure.
"""

from __future__ import annotations

import argparse
import re
import sys

_SYNC = re.compile(r"\b(shfl\.sync|vote\.sync|bar\.warp\.sync|match\.\w+\.sync|redux\.sync)\b")
_BRA = re.compile(r"^(?:@(!?)(%p\d+)\s+)?bra(?:\.uni)?\s+(\$?\w+);")
_LABEL = re.compile(r"^(\$?\w+):$")
_VOTE = re.compile(r"^vote\.sync\.(?:all|any|uni)\.pred\s+(%p\d+),")
_NOT = re.compile(r"^not\.pred\s+(%p\d+),\s*(%p\d+);")


class Block:
    """A basic block: its label (or a made-up name) and its instruction lines."""

    def __init__(self, name: str):
        self.name = name
        self.ins: list[str] = []


def _body(ptx: str, entry: str | None) -> list[str]:
    """The instruction lines of one .entry (the first, or the named one)."""
    starts = [m.start() for m in re.finditer(r"\.entry\s+(\w+)", ptx)]
    names = re.findall(r"\.entry\s+(\w+)", ptx)
    if not starts:
        raise ValueError("no .entry in the PTX")
    i = names.index(entry) if entry else 0
    text = ptx[starts[i] : starts[i + 1] if i + 1 < len(starts) else len(ptx)]
    text = text[text.index("{") + 1 :]
    out = []
    for line in text.splitlines():
        s = line.split("//")[0].strip()
        if s and not s.startswith(".") and s not in ("{", "}"):
            out.append(s)
    return out


def _blocks(lines: list[str]) -> list[Block]:
    blocks = [Block("<entry>")]
    for s in lines:
        m = _LABEL.match(s)
        if m:
            blocks.append(Block(m.group(1)))
            continue
        blocks[-1].ins.append(s)
        if _BRA.match(s) or re.match(r"^(?:@!?%p\d+\s+)?(ret|exit|trap);", s):
            blocks.append(Block(f"<after {s}>"))
    return [b for b in blocks if b.ins or not b.name.startswith("<after")]


def _successors(blocks: list[Block]) -> list[set[int]]:
    index = {b.name: i for i, b in enumerate(blocks)}
    succ = []
    for i, b in enumerate(blocks):
        last = b.ins[-1] if b.ins else ""
        nxt = {i + 1} if i + 1 < len(blocks) else set()
        m = _BRA.match(last)
        if m:
            succ.append({index[m.group(3)]} | (nxt if m.group(2) else set()))
        elif re.match(r"^(ret|exit|trap);", last):
            succ.append(set())
        else:
            succ.append(nxt)
    return succ


def _postdominators(succ: list[set[int]]) -> list[set[int]]:
    n = len(succ)
    pd = [set(range(n)) if s else {i} for i, s in enumerate(succ)]
    changed = True
    while changed:
        changed = False
        for i in reversed(range(n)):
            if succ[i]:
                new = set.intersection(*(pd[j] for j in succ[i])) | {i}
                if new != pd[i]:
                    pd[i], changed = new, True
    return pd


def _uniform_predicates(lines: list[str]) -> set[str]:
    """Predicates every write of which is a vote.sync (all lanes get the same value) or the
    negation of such a predicate; one written any other way too is not trusted."""
    defs: dict[str, list[str | None]] = {}  # predicate -> per write: the negated source, or None
    other: set[str] = set()
    for s in lines:
        m = _VOTE.match(s)
        if m:
            defs.setdefault(m.group(1), []).append(None)
            continue
        m = _NOT.match(s)
        if m:
            defs.setdefault(m.group(1), []).append(m.group(2))
            continue
        m = re.match(r"^(?:@!?%p\d+\s+)?[\w.]+\s+(%p\d+)[,|]", s)
        if m:
            other.add(m.group(1))
    uni = {p for p, ds in defs.items() if p not in other and all(d is None for d in ds)}
    changed = True
    while changed:
        changed = False
        for p, ds in defs.items():
            if p not in uni and p not in other and all(d is None or d in uni for d in ds):
                uni.add(p)
                changed = True
    return uni


def divergent_syncs(ptx: str, entry: str | None = None) -> list[tuple[str, str]]:
    """(sync instruction, branch) for every warp-synchronous instruction that depends on a
    conditional branch whose predicate is not warp-uniform; [] when there is none."""
    lines = _body(ptx, entry)
    blocks = _blocks(lines)
    succ = _successors(blocks)
    pd = _postdominators(succ)
    uni = _uniform_predicates(lines)
    bad = []
    for i, b in enumerate(blocks):
        for ins in b.ins:
            if not _SYNC.search(ins):
                continue
            for x, s in enumerate(succ):
                if len(s) == 2 and i not in pd[x] and any(i in pd[y] for y in s):
                    m = _BRA.match(blocks[x].ins[-1])
                    if m.group(2) not in uni:
                        bad.append((ins, blocks[x].ins[-1]))
    return bad


def main(argv: list[str] | None = None) -> int:
    import os
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kvkit import formats
    from kvkit.cuda.compiler import compile_entry
    from kvkit.cuda.write import tq_launch_defines

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("formats")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="0")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--variant", default=None, help="KVKIT_WRITE_TQ_VARIANT")
    args = ap.parse_args(argv)
    if args.variant is not None:
        os.environ["KVKIT_WRITE_TQ_VARIANT"] = args.variant
    status = 0
    for name in args.formats.split(","):
        fmt = formats.get(name, args.head_dim)
        defines = dict(fmt.cuda_defines())
        defines.update(KV_IN_DTYPE=args.dtype, KV_SLOT_T="long long")
        defines.update(tq_launch_defines(fmt, args.dtype))
        res = compile_entry("write_turboquant.cu", defines, args.arch, ptx_only=True)
        bad = divergent_syncs(res.ptx)
        print(f"{name} D={args.head_dim} dtype {args.dtype} {args.arch}: {len(bad)} divergent")
        for ins, bra in bad:
            print(f"    {ins}    under    {bra}")
        status |= bool(bad)
    return status


if __name__ == "__main__":
    sys.exit(main())
