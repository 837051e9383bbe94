"""Register counts and stack frames of the functions in a cubin, read from its ELF itself.

What for: ``--ptxas-options=-v`` puts each function's registers, stack frame and spills in the
NVRTC log, but the GPU machine's NVRTC 13.0 returned logs without them for cubins served from
its cache (benchmarks/NOTES.md v20-v21; verbose builds now pass ``--no-cache``). A cubin
carries registers and stack frames in its ``.nv.info`` sections; this module reads them with
``struct`` alone (no CUDA tool, no GPU), so the no-spill tests can fall back on them
(tests/cuda/test_compile.py).

The layout, as checked on this project's builds (NVRTC 12.9 and ptxas 13 cubins for sm_80 to
sm_120a) against ``cuobjdump -elf`` and the ``ptxas -v`` lines of the same builds
(tests/cuda/test_cubin_info.py keeps the ptxas comparison):

* A cubin is a little-endian ELF64 file (``e_machine`` 190, EM_CUDA). Its sections of type
  ``SHT_LOPROC`` (0x70000000) named ``.nv.info`` (module-wide) and ``.nv.info.<kernel>`` (one
  per kernel, ``sh_info`` = that kernel's ``.text`` section) hold attribute records.
* A record: ``u8 format, u8 attribute``, then by format: EIFMT_NVAL (1) a zero ``u16`` (a
  flag: the attribute is there); EIFMT_BVAL (2) one byte value and a zero byte; EIFMT_HVAL (3)
  one ``u16`` value; EIFMT_SVAL (4) a ``u16`` byte count and that many bytes. Records follow
  each other without padding; a format other than these raises ``CubinError``.
* The per-function facts are SVAL records of the module-wide ``.nv.info``, each ``u32
  symbol index, u32 value`` (the symbol in ``.symtab``): EIATTR_REGCOUNT (0x2f, registers),
  EIATTR_FRAME_SIZE (0x11, the "N bytes stack frame" of ptxas -v), EIATTR_MIN_STACK_SIZE
  (0x12, the "N bytes cumulative stack size" of ptxas -v: the function's frame plus those of
  the functions it calls; absent from the log when 0). Kernels' values equal ptxas's lines.
  An out-of-line callee's FRAME_SIZE need not equal its ptxas line (a ``__noinline__``
  callee: 32 bytes, its caller's frame, in the sm_90+ cubins, 0 in the log), and ptxas
  records registers and the cumulative stack for kernels only.
* These facts are not in the per-kernel sections, which hold the parameter layout,
  EIATTR_MAXREG_COUNT (0x1b, HVAL: the register cap from ``__launch_bounds__``),
  EIATTR_CRS_STACK_SIZE (0x1e), EIATTR_MAX_THREADS (0x05) and instruction offset lists.
* No attribute counts spill bytes. A spill lives in the stack frame, so a cubin whose every
  FRAME_SIZE is 0 has no spill; a nonzero frame can be spills or a local array
  (``spill_free`` says which of the two a cubin proves).
* ``CompileResult.cubin`` comes from CuPy's ``nvrtc.getCUBIN``, which drops the last byte of
  NVRTC's buffer (a zero: nvrtcGetCUBINSize was one more than CuPy's bytes, checked with
  NVRTC 12.9 through ctypes). The program headers sit at the end of the file and are not read
  here; a section read here that reaches past the data raises ``CubinError``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

EM_CUDA = 190
SHT_SYMTAB = 2
SHT_CUDA_INFO = 0x70000000  # SHT_LOPROC
STT_FUNC = 2
SHN_UNDEF = 0
STO_CUDA_ENTRY = 0x10  # st_other of a kernel (cuobjdump: "ENTRY")

EIFMT_NVAL = 1
EIFMT_BVAL = 2
EIFMT_HVAL = 3
EIFMT_SVAL = 4

#: The attribute codes read here.
EIATTR_REGCOUNT = 0x2F
EIATTR_FRAME_SIZE = 0x11
EIATTR_MIN_STACK_SIZE = 0x12
EIATTR_MAXREG_COUNT = 0x1B
EIATTR_CRS_STACK_SIZE = 0x1E
#: Every attribute code seen in this project's cubins (NVRTC 12.9, ptxas 13; sm_80 to
#: sm_120a), named as ``cuobjdump -elf`` (CUDA 13) named the same records; 0x35 and 0x5f it
#: calls "unknown Attribute". For messages only.
ATTR_NAMES = {
    0x04: "EIATTR_CTAIDZ_USED",
    0x05: "EIATTR_MAX_THREADS",
    0x0A: "EIATTR_PARAM_CBANK",
    0x0F: "EIATTR_EXTERNS",
    0x11: "EIATTR_FRAME_SIZE",
    0x12: "EIATTR_MIN_STACK_SIZE",
    0x17: "EIATTR_KPARAM_INFO",
    0x19: "EIATTR_CBANK_PARAM_SIZE",
    0x1B: "EIATTR_MAXREG_COUNT",
    0x1C: "EIATTR_EXIT_INSTR_OFFSETS",
    0x1E: "EIATTR_CRS_STACK_SIZE",
    0x28: "EIATTR_COOP_GROUP_INSTR_OFFSETS",
    0x29: "EIATTR_COOP_GROUP_MASK_REGIDS",
    0x2F: "EIATTR_REGCOUNT",
    0x31: "EIATTR_INT_WARP_WIDE_INSTR_OFFSETS",
    0x36: "EIATTR_SW_WAR",
    0x37: "EIATTR_CUDA_API_VERSION",
    0x38: "EIATTR_NUM_MBARRIERS",
    0x39: "EIATTR_MBARRIER_INSTR_OFFSETS",
    0x44: "EIATTR_UNUSED_LOAD_BYTE_OFFSET",
    0x46: "EIATTR_SYSCALL_OFFSETS",
    0x4A: "EIATTR_VRC_CTA_INIT_COUNT",
    0x4C: "EIATTR_NUM_BARRIERS",
    0x50: "EIATTR_SPARSE_MMA_MASK",
    0x55: "EIATTR_ANNOTATIONS",
}

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
#: Module-wide SVAL records about one function: u32 symbol index, u32 value.
_PER_FUNCTION = {
    EIATTR_REGCOUNT: "registers",
    EIATTR_FRAME_SIZE: "frame_size",
    EIATTR_MIN_STACK_SIZE: "min_stack_size",
}


class CubinError(ValueError):
    """The bytes are not a cubin this module can read (or are cut short)."""


@dataclass(frozen=True)
class Record:
    """One ``.nv.info`` attribute record: the section it is in, format, attribute code, and
    the value (BVAL, HVAL: int; SVAL: the payload bytes; NVAL: None)."""

    section: str
    fmt: int
    attr: int
    value: int | bytes | None


@dataclass(frozen=True)
class FunctionInfo:
    """The module-wide facts about one function; None where the cubin has no record."""

    name: str
    entry: bool  # a kernel (STO_CUDA_ENTRY), not a device function / internal subroutine
    registers: int | None = None
    frame_size: int | None = None
    min_stack_size: int | None = None


@dataclass(frozen=True)
class _Section:
    name: str
    type: int
    offset: int
    size: int
    link: int
    info: int


def _sections(data: bytes) -> list[_Section]:
    if len(data) < _EHDR.size or data[:4] != b"\x7fELF":
        raise CubinError("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise CubinError("not a little-endian ELF64 file")
    eh = _EHDR.unpack_from(data, 0)
    machine, shoff, shentsize, shnum, shstrndx = eh[2], eh[6], eh[11], eh[12], eh[13]
    if machine != EM_CUDA:
        raise CubinError(f"e_machine {machine}, not EM_CUDA ({EM_CUDA})")
    if shentsize != _SHDR.size or shoff + shnum * shentsize > len(data):
        raise CubinError("section header table missing or cut short")
    raw = [_SHDR.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
    names = _body(data, _Section("", 0, raw[shstrndx][4], raw[shstrndx][5], 0, 0))
    return [_Section(_cstr(names, sh[0]), sh[1], sh[4], sh[5], sh[6], sh[7]) for sh in raw]


def _body(data: bytes, sec: _Section) -> bytes:
    if sec.offset + sec.size > len(data):
        raise CubinError(f"section {sec.name or '.shstrtab'} reaches past the end of the data")
    return data[sec.offset : sec.offset + sec.size]


def _cstr(data: bytes, at: int) -> str:
    end = data.find(b"\0", at)
    if end < 0:
        raise CubinError("a name runs past its string table")
    return data[at:end].decode()


def _records(section: str, body: bytes) -> list[Record]:
    out, i = [], 0
    while i < len(body):
        if i + 4 > len(body):
            raise CubinError(f"{section}: a record cut short at byte {i}")
        fmt, attr, half = struct.unpack_from("<BBH", body, i)
        if fmt == EIFMT_SVAL:
            if i + 4 + half > len(body):
                raise CubinError(f"{section}: record 0x{attr:x} runs past the section")
            out.append(Record(section, fmt, attr, body[i + 4 : i + 4 + half]))
            i += 4 + half
        elif fmt == EIFMT_HVAL:
            out.append(Record(section, fmt, attr, half))
            i += 4
        elif fmt == EIFMT_BVAL:
            out.append(Record(section, fmt, attr, half & 0xFF))
            i += 4
        elif fmt == EIFMT_NVAL:
            out.append(Record(section, fmt, attr, None))
            i += 4
        else:  # not seen in these cubins: its size is not known
            raise CubinError(f"{section}: record format {fmt} at byte {i} not understood")
    return out


def nv_info_records(cubin: bytes) -> list[Record]:
    """Every attribute record of every ``.nv.info`` / ``.nv.info.<kernel>`` section, in file
    order."""
    data = bytes(cubin)
    out = []
    for sec in _sections(data):
        kernel_info = sec.name.startswith(".nv.info.")
        if sec.type == SHT_CUDA_INFO and (sec.name == ".nv.info" or kernel_info):
            out += _records(sec.name, _body(data, sec))
    return out


def _symbols(data: bytes, sections: list[_Section]) -> list[tuple[str, int, int, int]]:
    """(name, st_info, st_other, st_shndx) of each ``.symtab`` entry, by index."""
    symtab = [s for s in sections if s.type == SHT_SYMTAB]
    if len(symtab) != 1:
        raise CubinError(f"{len(symtab)} symbol tables")
    body, strtab = _body(data, symtab[0]), _body(data, sections[symtab[0].link])
    out = []
    for at in range(0, len(body) - _SYM.size + 1, _SYM.size):
        name, info, other, shndx, _, _ = _SYM.unpack_from(body, at)
        out.append((_cstr(strtab, name), info, other, shndx))
    return out


def functions(cubin: bytes) -> dict[str, FunctionInfo]:
    """name -> FunctionInfo for every function defined in the cubin: kernels and out-of-line
    device functions / internal subroutines (e.g. ``$__internal_0_$__cuda_sm20_div_s64``),
    with the registers, stack frame and cumulative stack that the module-wide ``.nv.info``
    records for it (None where it has no record: ptxas records registers and the cumulative
    stack for kernels only). Undefined function symbols are left out: the driver's syscalls
    (``__cuda_syscall_cp_async_bulk_unicast`` in the sm_120a decode builds, listed by
    EIATTR_EXTERNS) have no code and no records here, and no ptxas statistics either."""
    data = bytes(cubin)
    sections = _sections(data)
    symbols = _symbols(data, sections)
    facts: dict[int, dict[str, int]] = {}
    for rec in nv_info_records(data):
        if rec.section != ".nv.info" or rec.attr not in _PER_FUNCTION:
            continue
        if rec.fmt != EIFMT_SVAL or len(rec.value) != 8:
            raise CubinError(f"{ATTR_NAMES[rec.attr]}: want an 8-byte SVAL, got {rec}")
        index, value = struct.unpack("<II", rec.value)
        if index >= len(symbols) or symbols[index][1] & 0xF != STT_FUNC:
            raise CubinError(f"{ATTR_NAMES[rec.attr]}: symbol {index} is not a function")
        key = _PER_FUNCTION[rec.attr]
        seen = facts.setdefault(index, {})
        if key in seen and seen[key] != value:
            raise CubinError(f"two {ATTR_NAMES[rec.attr]} records for {symbols[index][0]}")
        seen[key] = value
    out = {}
    for index, (name, info, other, shndx) in enumerate(symbols):
        if info & 0xF == STT_FUNC and shndx != SHN_UNDEF:
            if name in out:
                raise CubinError(f"two function symbols named {name!r}")
            out[name] = FunctionInfo(name, bool(other & STO_CUDA_ENTRY), **facts.get(index, {}))
    return out


def kernel_limits(cubin: bytes) -> dict[str, dict[str, int]]:
    """kernel name -> the HVAL / SVAL facts of its ``.nv.info.<kernel>`` section that concern
    registers and stack: ``max_registers`` (EIATTR_MAXREG_COUNT, the cap ptxas worked under)
    and ``crs_stack_size`` (EIATTR_CRS_STACK_SIZE), where present."""
    out: dict[str, dict[str, int]] = {}
    for rec in nv_info_records(cubin):
        if not rec.section.startswith(".nv.info."):
            continue
        kernel = rec.section[len(".nv.info.") :]
        if rec.attr == EIATTR_MAXREG_COUNT and rec.fmt == EIFMT_HVAL:
            out.setdefault(kernel, {})["max_registers"] = rec.value
        elif rec.attr == EIATTR_CRS_STACK_SIZE and rec.fmt == EIFMT_SVAL and len(rec.value) == 4:
            out.setdefault(kernel, {})["crs_stack_size"] = struct.unpack("<I", rec.value)[0]
    return out


def spill_free(cubin: bytes) -> str | None:
    """None when the cubin proves that none of its functions spills: it has kernels, each
    with its registers, stack frame and cumulative stack recorded, every function (kernels,
    device functions, internal subroutines) has its frame recorded, and every frame and
    cumulative stack is 0 bytes. Otherwise the reason it cannot prove it: e.g. a nonzero
    frame, which may hold spills or a local array (only ptxas's statistics tell them apart)."""
    try:
        funcs = functions(cubin)
    except CubinError as exc:
        return f"the cubin is not readable: {exc}"
    kernels = [f for f in funcs.values() if f.entry]
    if not kernels:
        return "no kernel in the cubin"
    missing = [f.name for f in kernels if f.registers is None or f.min_stack_size is None]
    missing += [f.name for f in funcs.values() if f.frame_size is None]
    if missing:
        return f"no register / frame / stack records for {missing} in the cubin"
    framed = {
        f.name: (f.frame_size, f.min_stack_size)
        for f in funcs.values()
        if f.frame_size or f.min_stack_size
    }
    if framed:
        return (
            f"stack frames (bytes, cumulative bytes) {framed} in the cubin: spills or local "
            "arrays, which only ptxas's statistics tell apart"
        )
    return None
