"""Static SASS of decode stage-1 kernels, without a GPU: registers, spills, instruction mix.

    python scripts/sass_static.py nvfp4,turboquant_4bit_nc [--head-dim 128] [--group 4]
        [--q-len 1] [--arch sm_90] [--dump DIR] [--define NAME=VALUE ...]

Builds each format's stage-1 module as PTX with NVRTC (kvkit.cuda.compiler.compile_entry),
assembles it with ``ptxas`` (CUDA 13: on PATH, or /usr/local/cuda/bin) and disassembles it
with ``cuobjdump -sass`` (pip packages ``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm``:
``pip download --no-deps`` them, unzip, and put ``nvidia/cu13/bin`` on PATH; cuobjdump calls
nvdisasm). NVRTC's own cubins are not readable by those tools, hence the ptxas step.

Prints registers and spill bytes from ptxas, the static instruction count of the kernel and of
its main loop (the longest backward branch: the tile loop, including copy paths a launch may
not take), and the loop's most common opcodes. Static counts screen a change before device
time is spent; they are not executed counts (Nsight Compute gives those: scripts/ncu_sass.py).
--dump writes each kernel's loop SASS to DIR/<format>.sass.
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from kvkit import formats
from kvkit.cuda.compiler import compile_entry
from kvkit.cuda.decode import _STAGE1


def _tool(name: str) -> str:
    path = shutil.which(name) or (f"/usr/local/cuda/bin/{name}" if name == "ptxas" else None)
    if not path or not Path(path).exists():
        sys.exit(f"{name} not found (see this script's docstring)")
    return path


def _sass(ptx: str, arch: str) -> tuple[str, str]:
    """(ptxas -v log, cuobjdump -sass text) of one PTX module."""
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp, "k.ptx"), Path(tmp, "k.cubin")
        src.write_text(ptx)
        asm = subprocess.run([_tool("ptxas"), f"-arch={arch}", "-v", str(src), "-o", str(cubin)],
                             capture_output=True, text=True, check=True)  # fmt: skip
        dis = subprocess.run([_tool("cuobjdump"), "-sass", str(cubin)], capture_output=True,
                             text=True, check=True)  # fmt: skip
        return asm.stderr, dis.stdout


def _instructions(text: str) -> list[tuple[int, str, str]]:
    """(address, opcode, text) per SASS instruction, predicates stripped."""
    out = []
    for line in text.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            body = re.sub(r"^@!?U?P\w+\s+", "", m.group(2).strip())
            out.append((int(m.group(1), 16), body.split()[0], body))
    return out


def _instructions_with_predicates(text: str) -> list[tuple[int, str]]:
    """(address, text) per SASS instruction of the first kernel, predicates kept."""
    out = []
    for line in text.splitlines():
        if "Function" in line and out:
            break
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            out.append((int(m.group(1), 16), m.group(2).strip()))
    return out


def _main_loop(ins: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """The instructions under the longest backward branch."""
    best = None
    for addr, op, body in ins:
        target = re.search(r"0x([0-9a-f]+)", body) if op == "BRA" else None
        if target and int(target.group(1), 16) < addr:
            span = (int(target.group(1), 16), addr)
            if best is None or span[1] - span[0] > best[1] - best[0]:
                best = span
    return [i for i in ins if best and best[0] <= i[0] <= best[1]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("formats", help="comma-separated format names")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--group", type=int, default=4, help="query heads per KV head")
    ap.add_argument("--q-len", type=int, default=1)
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--dump", type=Path, default=None)
    ap.add_argument(
        "--define",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an extra -D define (e.g. KVKIT_DECODE_NVFP4_UNPACK=0), repeatable",
    )
    args = ap.parse_args(argv)
    for name in args.formats.split(","):
        fmt = formats.get(name, args.head_dim)
        defines = dict(fmt.cuda_defines())
        defines.update(KV_IN_DTYPE="1", KV_GROUP=str(args.group), KV_Q_LEN=str(args.q_len))
        defines.update(d.split("=", 1) for d in args.define)
        res = compile_entry(_STAGE1[fmt.family][0], defines, args.arch, ptx_only=True)
        log, text = _sass(res.ptx, args.arch)
        regs = re.findall(r"Used (\d+) registers", log)
        spills = re.findall(r"(\d+) bytes spill stores", log)
        ins = _instructions(text)
        loop = _main_loop(ins)
        mix = collections.Counter(op.split(".")[0] for _, op, _ in loop)
        print(f"{name} D={args.head_dim} G={args.group} q_len={args.q_len} {args.arch}: "
              f"registers {','.join(regs)}, spill bytes {','.join(spills)}, "
              f"{len(ins)} instructions, main loop {len(loop)}")  # fmt: skip
        print("    " + ", ".join(f"{op} {n}" for op, n in mix.most_common(14)))
        if args.dump:
            args.dump.mkdir(parents=True, exist_ok=True)
            (args.dump / f"{name}.sass").write_text("\n".join(f"{a:#07x} {b}" for a, _, b in loop))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
