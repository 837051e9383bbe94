"""The one place CUDA modules are built: NVRTC through CuPy, loaded with RawModule(path=...).

Why not ``cupy.RawModule(code=...)``: CuPy adds ``-ftz=true`` and its own ``-arch`` to such a
build, so neither the denormal behaviour the write kernels need for bit-exactness nor an older
target could be chosen. kvkit compiles with NVRTC itself and loads the result from a file:

* native target (the current device): ``-arch=sm_XY`` (``sm_100a`` / ``sm_120a`` on Blackwell,
  so the arch-specific FP4 conversions are available), loaded as a cubin;
* override (``arch="sm_80"`` or ``KVKIT_ARCH=sm_80``): PTX for ``compute_80``, loaded as PTX so
  the driver JIT-compiles that older code path for the newer GPU.

``compile_only(arch)`` needs no GPU and no driver (NVRTC from pip), which is how CI checks every
kernel for every target.

Cache key: SHA-256 over the entry's source with every ``#include "..."`` inlined, the sorted
defines, the target, the option list and the NVRTC version. Compiled files live under
``$KVKIT_CACHE_DIR`` (default ``~/.cache/kvkit``) and are reused by later processes: the key is
computed without compiling, and NVRTC runs only when the file is missing. Loaded modules are
memoized per device.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache, lru_cache
from pathlib import Path

#: Every target kvkit builds for: (NVRTC -arch for a real build, virtual arch for PTX).
TARGETS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120a")

_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[ \t]*$', re.M)
_KERNEL_RE = re.compile(
    r'extern\s+"C"\s+__global__\s+(?:__launch_bounds__\([^)]*\)\s+)?void\s+(\w+)\s*\('
)

#: Options for entries whose bytes must equal the Numba backend's: no contraction into fused
#: multiply-add, IEEE division and square root, denormals kept.
EXACT_OPTIONS = ("--fmad=false", "-ftz=false", "-prec-div=true", "-prec-sqrt=true")
#: Decode may contract (the contract allows float32 rounding), but keeps IEEE div/sqrt so the
#: softmax is reproducible across targets.
DECODE_OPTIONS = ("-ftz=false", "-prec-div=true", "-prec-sqrt=true")
COMMON_OPTIONS = ("-std=c++17",)


class CompileError(RuntimeError):
    """NVRTC rejected a kernel; the message carries the entry, target and compiler log."""


def cuda_src_dir() -> Path:
    """The cuda_src folder: ``$KVKIT_CUDA_SRC`` or the one next to the kvkit package."""
    env = os.environ.get("KVKIT_CUDA_SRC")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent
    for cand in (here.parents[1] / "cuda_src", here.parent / "cuda_src"):
        if cand.is_dir():
            return cand
    raise FileNotFoundError("cuda_src not found; set KVKIT_CUDA_SRC to its folder")


def inline_source(entry: str, root: Path | None = None) -> str:
    """The entry's source with every ``#include "x"`` replaced by x's text, each file once."""
    root = root or cuda_src_dir()
    seen: set[Path] = set()

    def expand(path: Path) -> str:
        path = path.resolve()
        if path in seen:
            return f"// (already included: {path.name})\n"
        seen.add(path)
        text = path.read_text()

        def repl(m: re.Match) -> str:
            target = root / m.group(1)
            if not target.is_file():
                raise CompileError(f"{path.name}: include {m.group(1)!r} not found under {root}")
            return f"// >>> {m.group(1)}\n{expand(target)}// <<< {m.group(1)}\n"

        return _INCLUDE_RE.sub(repl, text)

    return expand(root / entry)


def kernel_names(source: str) -> list[str]:
    """Names of the ``extern "C" __global__`` functions in a source."""
    return _KERNEL_RE.findall(source)


def entry_options(entry: str) -> tuple[str, ...]:
    """Options an entry compiles with (exact arithmetic for writes and dequantize)."""
    base = Path(entry).name
    if base.startswith(("write_", "dequant_")):
        return COMMON_OPTIONS + EXACT_OPTIONS
    return COMMON_OPTIONS + DECODE_OPTIONS


@lru_cache(maxsize=1)
def _nvrtc():
    from cupy_backends.cuda.libs import nvrtc

    return nvrtc


def nvrtc_version() -> tuple[int, int]:
    major, minor = _nvrtc().getVersion()
    return int(major), int(minor)


def nvrtc_unavailable_reason() -> str | None:
    """Why NVRTC cannot compile here (the Python binding imports but the shared library does
    not load, or it is missing), or None when ``nvrtc_version()`` works."""
    try:
        nvrtc_version()
    except Exception as exc:
        return f"NVRTC is not loadable ({type(exc).__name__}: {exc})"
    return None


def _arch_flag(arch: str, ptx_only: bool) -> str:
    if arch not in TARGETS:
        raise ValueError(f"arch must be one of {TARGETS}, got {arch!r}")
    return f"-arch={'compute_' + arch[3:] if ptx_only else arch}"


@dataclass(frozen=True)
class CompileResult:
    """One NVRTC build: PTX text (always), cubin bytes (real targets), log and key."""

    entry: str
    arch: str
    ptx: str
    cubin: bytes | None
    log: str
    key: str
    kernels: tuple[str, ...]
    options: tuple[str, ...] = field(default=())


def _key(source: str, defines: Mapping[str, str], options: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    h.update(source.encode())
    for k in sorted(defines):
        h.update(f"\0-D{k}={defines[k]}".encode())
    for o in options:
        h.update(f"\0{o}".encode())
    h.update(f"\0nvrtc{nvrtc_version()}".encode())
    return h.hexdigest()[:32]


def cache_dir() -> Path:
    d = Path(os.environ.get("KVKIT_CACHE_DIR", Path.home() / ".cache" / "kvkit"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def _options(
    entry: str, defines: Mapping[str, str], arch: str, ptx_only: bool, verbose_ptxas: bool
) -> tuple[str, ...]:
    options = (
        _arch_flag(arch, ptx_only),
        *entry_options(entry),
        *(f"-D{k}={v}" for k, v in sorted(defines.items())),
    )
    if verbose_ptxas and not ptx_only:
        options += ("--ptxas-options=-v",)
        # NVRTC 12.9+ may serve the cubin from its own cache without running ptxas, and then
        # the log has no statistics (seen on the GPU machine's NVRTC 13.0 for builds compiled
        # before: benchmarks/NOTES.md v21); --no-cache (12.9+) makes ptxas run every time.
        if nvrtc_version() >= (12, 9):
            options += ("--no-cache",)
    return options


def compile_entry(
    entry: str,
    defines: Mapping[str, str],
    arch: str,
    *,
    ptx_only: bool = False,
    verbose_ptxas: bool = False,
) -> CompileResult:
    """Compile one entry for one target with NVRTC; needs no GPU.

    Args:
        entry: file name under cuda_src, e.g. ``"write_nvfp4.cu"``.
        defines: macro name -> value text (from ``fmt.cuda_defines()`` plus launch defines).
        arch: one of ``TARGETS``.
        ptx_only: build for the virtual arch (``compute_XY``), PTX only (override path).
        verbose_ptxas: add ``--ptxas-options=-v`` (registers, spills in the log).
    """
    source = inline_source(entry)
    options = _options(entry, defines, arch, ptx_only, verbose_ptxas)
    nvrtc = _nvrtc()
    prog = nvrtc.createProgram(source, entry, [], [])
    try:
        try:
            nvrtc.compileProgram(prog, list(options))
        except Exception as exc:
            log = nvrtc.getProgramLog(prog)
            raise CompileError(f"{entry} for {arch}: {exc}\n{log}") from None
        log = nvrtc.getProgramLog(prog)
        ptx = nvrtc.getPTX(prog)
        ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
        cubin = None if ptx_only else bytes(nvrtc.getCUBIN(prog))
    finally:
        nvrtc.destroyProgram(prog)
    return CompileResult(
        entry=entry,
        arch=arch,
        ptx=ptx.rstrip("\0"),
        cubin=cubin,
        log=log.decode() if isinstance(log, bytes) else str(log),
        key=_key(source, defines, options),
        kernels=tuple(kernel_names(source)),
        options=options,
    )


def compile_entries(
    jobs: Sequence[tuple[str, Mapping[str, str], str]],
    *,
    ptx_only: bool = False,
    verbose_ptxas: bool = False,
    workers: int | None = None,
) -> list[CompileResult]:
    """``compile_entry`` for many ``(entry, defines, arch)`` jobs, in threads; results in job
    order. NVRTC compiles without holding the GIL, so the builds run side by side (about 2x on
    two cores). ``workers``: threads, default the machine's CPU count. The first failure
    raises its CompileError."""
    jobs = list(jobs)
    workers = max(1, min(len(jobs), workers or os.cpu_count() or 1))

    def one(job):
        entry, defines, arch = job
        return compile_entry(entry, defines, arch, ptx_only=ptx_only, verbose_ptxas=verbose_ptxas)

    if workers == 1:
        return [one(job) for job in jobs]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, jobs))


# --- loading on a device ----------------------------------------------------------------------


def device_arch(device_id: int | None = None) -> str:
    """The native target of a CUDA device, e.g. ``"sm_90"`` (Blackwell: ``"sm_100a"``...)."""
    import cupy

    if device_id is None:
        device_id = cupy.cuda.runtime.getDevice()
    return _device_arch(int(device_id))


@cache
def _device_arch(device_id: int) -> str:
    # A device's compute capability never changes: ask the runtime once per device.
    import cupy

    cc = int(cupy.cuda.Device(device_id).compute_capability)
    arch = f"sm_{cc}"
    if cc >= 100:
        arch += "a"  # the arch-specific target carries the FP4 conversions
    if arch not in TARGETS:
        raise RuntimeError(f"device compute capability {cc} has no kvkit target ({TARGETS})")
    return arch


def resolve_arch(arch: str | None = None, device_id: int | None = None) -> tuple[str, bool]:
    """(target, ptx_only): ``arch`` argument, else ``$KVKIT_ARCH``, else the device's own.

    An explicit target other than the device's own is built as PTX and JIT-compiled by the
    driver, which runs that target's code path on this GPU.
    """
    native = device_arch(device_id)
    want = arch or os.environ.get("KVKIT_ARCH") or native
    if want not in TARGETS:
        raise ValueError(f"arch / KVKIT_ARCH must be one of {TARGETS}, got {want!r}")
    return want, want != native


_modules: dict[tuple, object] = {}


@lru_cache(maxsize=512)
def _module_key_frozen(entry: str, defines: tuple, arch: str, ptx_only: bool) -> str:
    d = dict(defines)
    return _key(inline_source(entry), d, _options(entry, d, arch, ptx_only, False))


def module_file(entry: str, defines: Mapping[str, str], arch: str, ptx_only: bool) -> Path:
    """The cached build of an entry for a target (cubin, or PTX for an override), compiled
    with NVRTC only when the file is not there yet (e.g. by an earlier process); needs no GPU.
    The name carries the cache key, so a changed source, define, option or NVRTC is a new
    file; files are written whole (a temporary file renamed into place)."""
    key = _module_key_frozen(entry, tuple(sorted(defines.items())), arch, ptx_only)
    suffix = ".ptx" if ptx_only else ".cubin"
    path = cache_dir() / f"{Path(entry).stem}-{arch}-{key}{suffix}"
    if not path.exists():
        result = _compile_cached(entry, dict(defines), arch, ptx_only)
        data = result.ptx.encode() if ptx_only else result.cubin
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as tmp:
            tmp.write(data)
        os.replace(tmp.name, path)
    return path


def get_module(entry: str, defines: Mapping[str, str], arch: str | None = None):
    """A loaded ``cupy.RawModule`` for the entry on the current device (memoized)."""
    import cupy

    device_id = cupy.cuda.runtime.getDevice()
    target, ptx_only = resolve_arch(arch, device_id)
    memo_key = (device_id, entry, tuple(sorted(defines.items())), target, ptx_only)
    mod = _modules.get(memo_key)
    if mod is None:  # no file system access on the hot path
        mod = cupy.RawModule(path=str(module_file(entry, defines, target, ptx_only)))
        _modules[memo_key] = mod
    return mod


@lru_cache(maxsize=512)
def _compile_cached_frozen(entry: str, defines: tuple, arch: str, ptx_only: bool) -> CompileResult:
    return compile_entry(entry, dict(defines), arch, ptx_only=ptx_only)


def _compile_cached(entry: str, defines: dict, arch: str, ptx_only: bool) -> CompileResult:
    return _compile_cached_frozen(entry, tuple(sorted(defines.items())), arch, ptx_only)


def get_kernel(entry: str, name: str, defines: Mapping[str, str], arch: str | None = None):
    """One ``extern "C"`` kernel of an entry, ready to launch on the current device."""
    return get_module(entry, defines, arch).get_function(name)


# --- builds without a GPU ---------------------------------------------------------------------


def representative_builds() -> list[tuple[str, str, dict[str, str]]]:
    """(entry, variant label, defines) for every entry and format family, at D=128.

    What ``compile_only`` builds: each family's entries with each of its formats, fp16 inputs
    and int64 slots; the launch wrappers add the same defines at run time.
    """
    from .. import formats

    families = {
        "dense": ("fp16", "bf16", "fp8_e4m3"),
        "nvfp4": ("nvfp4", "nvfp4_4over6"),
        "turboquant": tuple(n for n in formats.names() if n.startswith("turboquant")),
    }
    root = cuda_src_dir()
    builds = []
    for family, names in families.items():
        for kind in ("write", "dequant", "decode"):
            entry = f"{kind}_{family}.cu"
            if not (root / entry).is_file():
                continue
            for name in names:
                defines = dict(formats.get(name, 128).cuda_defines())
                defines.update(KV_IN_DTYPE="1", KV_SLOT_T="long long")
                if kind == "write" and family == "turboquant":
                    from .write import tq_launch_defines

                    defines.update(tq_launch_defines(formats.get(name, 128), "1"))
                if kind == "decode":
                    from .decode import row_runs_default

                    if row_runs_default(formats.get(name, 128)):  # as _stage1_for's default
                        defines["KVD_ROW_RUNS_ON"] = "1"
                builds.append((entry, name, defines))
    if (root / "decode_merge.cu").is_file():
        builds.append(("decode_merge.cu", "merge", {"KV_HEAD_DIM": "128"}))
    if (root / "probe_codes.cu").is_file():  # the GPU tests' conversion probes
        builds.append(("probe_codes.cu", "probe", {}))
    return builds


def compile_only(arch: str, *, ptx_only: bool = False) -> dict[str, CompileResult]:
    """Build every kernel for one target without a GPU.

    Returns a dict from ``"<kernel name>[<variant>]"`` (variant: the format name, or
    ``"merge"``) to the ``CompileResult`` of the module that holds that kernel.
    """
    out: dict[str, CompileResult] = {}
    builds = representative_builds()
    results = compile_entries([(entry, defines, arch) for entry, _, defines in builds],
                              ptx_only=ptx_only)  # fmt: skip
    for (_, label, _), res in zip(builds, results, strict=True):
        for kname in res.kernels:
            out[f"{kname}[{label}]"] = res
    return out
