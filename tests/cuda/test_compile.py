"""Every write / dequantize kernel compiles for every target, without a GPU (CI).

Needs NVRTC only (pip ``nvidia-cuda-nvrtc-cu12`` or a CUDA toolkit); the module is skipped
when NVRTC is genuinely absent. Checks: ``compile_only(arch)`` builds and returns the write and
dequantize kernels for every format; the hardware conversions appear exactly on the targets
that have them (E2M1 on sm_100a / sm_120a, E4M3 on sm_89+) and vanish under
``KVKIT_FORCE_SOFTWARE_CONVERSIONS``; only ``common/arch.cuh`` tests ``__CUDA_ARCH__``; no
kernel spills (``--ptxas-options=-v`` on real targets; where a log lacks ptxas's statistics, the
cubin's stack frames, ``kvkit.cuda.cubin_info``).
"""

from __future__ import annotations

import re
from functools import cache

import pytest

pytest.importorskip("cupy_backends.cuda.libs.nvrtc")

from kvkit import formats  # noqa: E402
from kvkit.cuda import compiler, cubin_info  # noqa: E402
from kvkit.cuda.compiler import TARGETS, compile_entries, compile_entry, compile_only  # noqa: E402
from kvkit.cuda.write import tq_launch_defines  # noqa: E402

if compiler.nvrtc_unavailable_reason():
    pytest.skip(compiler.nvrtc_unavailable_reason(), allow_module_level=True)

DENSE = ("fp16", "bf16", "fp8_e4m3")
NVFP4 = ("nvfp4", "nvfp4_4over6")
TQ = tuple(n for n in formats.names() if n.startswith("turboquant"))
#: kernel name -> the formats compile_only must build it for
OUR_KERNELS = {
    "kvkit_write_dense": DENSE,
    "kvkit_dequant_dense": DENSE,
    "kvkit_write_nvfp4": NVFP4,
    "kvkit_dequant_nvfp4": NVFP4,
    "kvkit_write_turboquant": TQ,
    "kvkit_dequant_turboquant": TQ,
}
E2M1_CVT = "cvt.rn.satfinite.e2m1x2.f32"
E4M3_CVT = "cvt.rn.satfinite.e4m3x2.f32"
HW_FP4 = {"sm_100a", "sm_120a"}
HW_FP8 = {"sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120a"}
_SPILL_RE = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def _spills(case, res) -> list[tuple[str, str]]:
    """(spill store bytes, spill load bytes) of each function of one build (a result of
    ``compile_entry(..., verbose_ptxas=True)``), from its ptxas log. A log without ptxas's
    statistics (the GPU machine's NVRTC 13.0 returned such logs from its cache before
    ``--no-cache``, benchmarks/NOTES.md v20-v21) hides nothing only where the cubin proves
    that there is no spill: every stack frame in it is 0 bytes
    (``kvkit.cuda.cubin_info.spill_free``); then no spills. A nonzero frame may be spills or a
    local array, which only the log tells apart: that fails, as does a build without a
    cubin."""
    spills = _SPILL_RE.findall(res.log)
    if spills:
        return spills
    assert res.cubin is not None, f"no ptxas statistics and no cubin for {case}: {res.log!r}"
    reason = cubin_info.spill_free(res.cubin)
    assert reason is None, f"no ptxas statistics for {case}, and {reason}; log: {res.log!r}"
    return [("0", "0")]


def _spilled_builds(cases, results, mma: bool = False) -> list:
    """The cases (one per result of ``compile_entries(..., verbose_ptxas=True)``) that spill
    (``_spills``: the ptxas log's spill stores or loads, else the cubin's frames); with ``mma``
    every PTX must hold the tensor-core mma."""
    bad = []
    for case, res in zip(cases, results, strict=True):
        if mma:
            assert "mma.sync.aligned" in res.ptx, case  # the tensor-core core
        spills = _spills(case, res)
        if any(int(s) or int(lo) for s, lo in spills):
            bad.append((case, spills))
    return bad


def test_verbose_builds_bypass_nvrtcs_cache():
    """ptxas statistics need ptxas to run: from NVRTC 12.9 a verbose build asks for no cache
    (a cached cubin comes with an empty ptxas part of the log), other builds keep it."""
    verbose = compiler._options("write_dense.cu", {}, "sm_90", False, True)
    assert "--ptxas-options=-v" in verbose
    assert ("--no-cache" in verbose) == (compiler.nvrtc_version() >= (12, 9))
    assert "--no-cache" not in compiler._options("write_dense.cu", {}, "sm_90", False, False)
    assert "--no-cache" not in compiler._options("write_dense.cu", {}, "sm_90", True, True)


def _ptxas_builds(jobs) -> list:
    """``compile_entries(jobs, verbose_ptxas=True)``: the builds whose logs _spilled_builds
    reads (verbose builds bypass NVRTC's cache, whose cubins come without ptxas statistics:
    kvkit.cuda.compiler._options, benchmarks/NOTES.md v21)."""
    return compile_entries(list(jobs), verbose_ptxas=True)


def test_spill_check_falls_back_on_the_cubin():
    """A log without ptxas's statistics (front-end warnings only, or empty, as NVRTC 12.9+
    returned for a cubin from its cache before ``--no-cache``): ``_spills`` takes the cubin's
    word where every stack frame is 0 bytes, and fails with the frames where one is not: the
    FP8-key TurboQuant write with float16 inputs at 16 CTAs per SM on sm_90 has an 8-byte
    frame and no spills (test_local_memory_gpu.py ``_allowed``), which the cubin cannot tell
    from a spill."""
    import dataclasses

    framed_defines = _defines("turboquant_k8v4", 128, "1")
    assert framed_defines["TQ_KEY_FP8"] == "1" and framed_defines["TQ_MIN_CTAS_SM90"] == "16"
    cases = [("dequant_nvfp4.cu", "nvfp4_4over6", 512), ("write_turboquant.cu", "k8v4", 128)]
    jobs = [("dequant_nvfp4.cu", _defines("nvfp4_4over6", 512), "sm_90"),
            ("write_turboquant.cu", framed_defines, "sm_90")]  # fmt: skip
    plain, framed = compile_entries(jobs, verbose_ptxas=True)
    assert _spilled_builds(cases, [plain, framed]) == []  # by the logs
    assert "8 bytes stack frame, 0 bytes spill stores" in framed.log
    warning = 'decode.cu(1): warning #550-D: variable "x" was set but never used\n'
    for log in (warning, ""):
        assert _spilled_builds(cases[:1], [dataclasses.replace(plain, log=log)]) == []
        with pytest.raises(AssertionError, match=r"no ptxas statistics for .*k8v4.*stack frame"):
            _spilled_builds(cases[1:], [dataclasses.replace(framed, log=log)])
    with pytest.raises(AssertionError, match="no ptxas statistics and no cubin"):
        _spilled_builds(cases[:1], [dataclasses.replace(plain, log=warning, cubin=None)])


@cache
def _built(arch: str):
    return compile_only(arch)


def _defines(name: str, d: int = 128, in_dtype: str = "1", slot_t: str = "long long", **extra):
    defines = dict(formats.get(name, d).cuda_defines())
    defines.update(KV_IN_DTYPE=in_dtype, KV_SLOT_T=slot_t, **{k: str(v) for k, v in extra.items()})
    if name in TQ:  # the write launcher's defines (other TurboQuant entries ignore them)
        defines.update(tq_launch_defines(formats.get(name, d), in_dtype))
    return defines


@pytest.mark.parametrize("arch", TARGETS)
def test_compile_only_builds_every_write_and_dequant_kernel(arch):
    built = _built(arch)
    for kernel, names in OUR_KERNELS.items():
        for name in names:
            key = f"{kernel}[{name}]"
            assert key in built, f"{key} missing for {arch}"
            res = built[key]
            assert res.ptx and f".entry {kernel}(" in res.ptx
            assert res.cubin, f"{key}: no cubin for the real target {arch}"


@pytest.mark.parametrize("arch", TARGETS)
def test_hardware_fp4_conversion_only_on_arch_specific_blackwell(arch):
    built = _built(arch)
    for name in NVFP4:
        ptx = built[f"kvkit_write_nvfp4[{name}]"].ptx
        assert (E2M1_CVT in ptx) == (arch in HW_FP4), (arch, name)


@pytest.mark.parametrize("arch", TARGETS)
def test_hardware_fp8_conversion_on_sm89_and_newer(arch):
    built = _built(arch)
    for key in (
        "kvkit_write_dense[fp8_e4m3]",
        "kvkit_write_turboquant[turboquant_k8v4]",
        "kvkit_write_nvfp4[nvfp4]",  # the E4M3 block scales
    ):
        assert (E4M3_CVT in built[key].ptx) == (arch in HW_FP8), (arch, key)
    # formats without E4M3 bytes never need the instruction
    assert E4M3_CVT not in built["kvkit_write_dense[fp16]"].ptx


@pytest.mark.parametrize("arch", ["sm_90", "sm_120a"])
def test_force_software_conversions_removes_hardware_paths(arch):
    for entry, name in (("write_nvfp4.cu", "nvfp4_4over6"), ("write_dense.cu", "fp8_e4m3")):
        res = compile_entry(entry, _defines(name, KVKIT_FORCE_SOFTWARE_CONVERSIONS=1), arch)
        assert E2M1_CVT not in res.ptx and E4M3_CVT not in res.ptx
        assert "cvt.f32.f16" not in res.ptx  # fp16 inputs widen through the integer twin
        plain = compile_entry(entry, _defines(name), arch)
        assert "cvt.f32.f16" in plain.ptx


@pytest.mark.parametrize("arch", ["sm_80", "sm_89"])
def test_ptx_override_builds(arch):
    """The arch override (KVKIT_ARCH=sm_80 on a newer GPU) loads PTX for compute_XY."""
    for entry, name in (
        ("write_dense.cu", "fp8_e4m3"),
        ("write_nvfp4.cu", "nvfp4"),
        ("write_turboquant.cu", "turboquant_k3v4_nc"),
        ("dequant_turboquant.cu", "turboquant_4bit_nc"),
    ):
        res = compile_entry(entry, _defines(name), arch, ptx_only=True)
        assert res.cubin is None and f".target {arch}" in res.ptx
        has_e4m3 = name in ("fp8_e4m3", "nvfp4", "turboquant_k8v4")
        assert (E4M3_CVT in res.ptx) == (arch == "sm_89" and has_e4m3), (arch, name)


def test_only_arch_cuh_mentions_cuda_arch():
    root = compiler.cuda_src_dir()
    offenders = [
        str(p.relative_to(root))
        for p in sorted(root.rglob("*"))
        if p.suffix in (".cu", ".cuh", ".h")
        and p.relative_to(root).as_posix() != "common/arch.cuh"
        and "__CUDA_ARCH" in p.read_text()
    ]
    assert offenders == []


def _variants():
    """(entry, format, head_dim, KV_IN_DTYPE, KV_SLOT_T): each family at its extremes."""
    out = []
    for kind in ("write", "dequant"):
        for name in DENSE + NVFP4:
            fam = "dense" if name in DENSE else "nvfp4"
            for d in (16, 128, 512):
                out.append((f"{kind}_{fam}.cu", name, d, "1", "long long"))
        for name in TQ:
            dims = (16, 48, 128, 192, 512) if name == "turboquant_k8v4" else (64, 128, 256)
            for d in dims:
                out.append((f"{kind}_turboquant.cu", name, d, "1", "long long"))
    for entry, name in (
        ("write_dense.cu", "bf16"),
        ("write_nvfp4.cu", "nvfp4_4over6"),
        ("write_turboquant.cu", "turboquant_3bit_nc"),
    ):
        for dt in ("0", "2"):
            out.append((entry, name, 128, dt, "int"))
    return out


@pytest.mark.parametrize("arch", TARGETS)
def test_no_kernel_spills(arch):
    variants = _variants()
    results = _ptxas_builds(
        (entry, _defines(name, d, dt, slot_t), arch) for entry, name, d, dt, slot_t in variants
    )
    assert _spilled_builds(variants, results) == []


# The tensor-core decode stage 1 (decode_mma.cuh) is capped at 128 registers for R <= 8 rows
# at D <= 128 (four CTAs per SM; TurboQuant's codebook presets' tile pairs at 5-8 rows and D =
# 128: 168, three CTAs per SM, KVKIT_DECODE_TQ_PAIRS8), at 255 otherwise (D = 256 takes R <= 8
# only); a spill there costs local-memory traffic in the hottest loop.
_DECODE_ENTRY = {"dense": "decode_dense.cu", "fp8": "decode_dense.cu",
                 "nvfp4": "decode_nvfp4.cu", "turboquant": "decode_turboquant.cu"}  # fmt: skip


_SM90_PATH_SWITCHES = {"bulk0", "wpipe0", "tqslab0", "tqslab1", "tq64cpasync", "rows8",
                       "slabs64", "cp64"}  # fmt: skip
_SOFT_FP8_SWITCHES = {"nantile0"}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_tensor_core_decode_does_not_spill(arch):
    cases, jobs = [], []
    # "nvfp4-unpack0": NVFP4 with the pair-by-pair E2M1 unpacking (KVKIT_DECODE_NVFP4_UNPACK=0, kept
    # for A/B runs); "nvfp4-bulk0": NVFP4's cp.async tile copies on sm_90
    # (KVKIT_DECODE_NVFP4_BULK=0; the default copies by the copy engine there); "nvfp4-rev0":
    # session 10's NVFP4 tile (KVKIT_DECODE_NVFP4_REV=0; the default is nvdec2's); "-runs": the row
    # runs of the cp.async row copies (KVKIT_DECODE_ROW_RUNS=1; the default where every row plane is
    # >= 64 bytes, kvkit/cuda/decode.py row_runs_default), fp8 / fp16 / bf16 also at head_dim 96
    # (six- and twelve-chunk rows, KVD_ROW_RUNS_EVEN); "-tqv0": TurboQuant without the packed mma
    # columns (KVKIT_DECODE_TQ_VARIANT=0, kept for A/B runs); "-nantile0": the software-FP8 path's
    # exact E4M3 conversion in every tile (KVKIT_DECODE_FP8_NANTILE=0; the default converts NaN-free
    # tiles without the NaN patch); "nvfp4-wpipe0": NVFP4's warp-slab launches with the CTA barrier
    # per tile (KVKIT_DECODE_WARP_PIPE=0; the default runs warp-independent pipelines); "-tqslab0" /
    # "-tqslab1": TurboQuant's page-run / warp-slab copies on sm_90+ (KVKIT_DECODE_TQ_SLABS; the
    # default takes slabs for codebook keys, page runs for k8v4); "-tq64cpasync": TurboQuant's
    # cp.async copies below head_dim 128 (KVKIT_DECODE_TQ_SLABS64=0; the default takes warp slabs
    # there); "nvfp4-rows8": NVFP4's warp slabs for one row tile only
    # (KVKIT_DECODE_NVFP4_SLAB_ROWS=8; the default takes two); "nvfp4-slabs64" / "nvfp4-cp64": NVFP4
    # at head_dim 64 with warp slabs and gapped value rows / cp.async
    # (KVKIT_DECODE_NVFP4_SLABS_OTHER_D=1 / 0; the default takes warp slabs, unpadded rows);
    # "-pairs0": the warp pipes' tile loop one tile at a time (KVKIT_DECODE_TILE_PAIRS=0, for A/B
    # runs; the default takes two on sm_90 up to 8 query rows at head_dim <= 128, TurboQuant at 5-8
    # with three CTAs per SM, so the default nvfp4 and turboquant_4bit_nc builds are also built at G
    # x q_len = 8 x 1 and 2 x 4, NVFP4's pair builds at 8 rows, and, for the tile-pair loop's
    # per-lane row offsets (KVKIT_DECODE_PAIR_ADDR, default 1), at 4 x 2 and 16 x 1 at head_dim 128
    # and 8 x 1 at 64); "-pairaddr0": that loop's addresses as before (KVKIT_DECODE_PAIR_ADDR=0, for
    # A/B runs); "-nvissue0": NVFP4's pair loop without the issue and row trims
    # (KVKIT_DECODE_NV_ISSUE=0, A/B runs; default 1); "-tqissue0": the same without TurboQuant's
    # trims (KVKIT_DECODE_TQ_ISSUE=0, A/B runs; default 1); "-nvpack0": NVFP4 without its packed mma
    # columns and unguarded softmax (KVKIT_DECODE_NV_PACK=0, A/B runs; default 1 from head_dim 128,
    # 2 below); "-cpv2" / "-cpv20": NVFP4's cp.async tile loop with the page ring per warp / the CTA
    # barrier (KVKIT_DECODE_CP_ASYNC_V2=1 / 0, A/B runs; sm_80 / sm_89 only, the sm_90 build is the
    # default's); "-cpv2r": the page windows without the tile-pair loop of NVFP4's default 3
    # (KVKIT_DECODE_CP_ASYNC_V2=2, the launcher's fallback where the pairs' CTAs fit fewer times on
    # an SM; the other families' default but fp8's); "-tq17": TurboQuant's codebook presets with
    # word-aligned value loads, held key-run alignment and the unguarded softmax
    # (KVKIT_DECODE_TQ17=1, A/B runs; default 0); "-tqpv16": TurboQuant's codebook presets with the
    # PV on fp16 mma and "-tqpv16_0" the bf16 PV before it (KVKIT_DECODE_TQ_PV16=1, the default, and
    # =0, A/B runs); "-nocap": the build a decode without a soft-cap runs (KV_SOFTCAP=0: the tanh
    # left out of the loops; the entries without it are the soft-cap builds); "-tq3banks0": 3bit_nc
    # at head_dim 128 with its tokens in order (KVKIT_DECODE_TQ3_BANKS=0, A/B runs; the default 1
    # takes a bank-friendly order), also at G x q_len = 16 x 1 (the single-tile loop) and 2 x 4;
    # "-tq4o640": 4bit_nc at head_dim 64 with its tokens in order (KVKIT_DECODE_TQ4_ORDER64=0, A/B
    # runs; the default 1 takes a bank-friendly order), both also at 8 x 1, 2 x 4 and 16 x 1 there;
    # "-tq3o640": 3bit_nc at head_dim 64 with its tokens in order (KVKIT_DECODE_TQ3_ORDER64=0, A/B
    # runs; the default 1 takes a bank-friendly order, the tile pairs' second key run from a held
    # word), both at head_dim 64 at 4 x 1, 8 x 1 (127 registers on sm_90 with the order), 2 x 2 and
    # 16 x 1; "-tqp80": 4bit_nc at 8 x 1, head_dim 128, one tile at a time at four CTAs per SM
    # (KVKIT_DECODE_TQ_PAIRS8=0, A/B runs; the default 1 takes the tile pairs at three: 158-168
    # registers on sm_90); "-nv960": NVFP4 at head_dim 96 without its register runs
    # (KVKIT_DECODE_NV96=0, A/B runs; the default 1 takes them, built at 4 x 1, 2 x 2, 16 x 1, 8 x 1
    # and 2 x 4 there); "-nv96p80": those runs' cp.async pairs up to 4 rows only
    # (KVKIT_DECODE_NV96_PAIRS8=0, A/B runs; the default 1 takes them up to 8).
    switches = {
        "unpack0": ("KVKIT_DECODE_NVFP4_UNPACK", "0"),
        "bulk0": ("KVKIT_DECODE_NVFP4_BULK", "0"),
        "rev0": ("KVKIT_DECODE_NVFP4_REV", "0"),
        "runs": ("KVD_ROW_RUNS_ON", "1"),
        "tqv0": ("KVKIT_DECODE_TQ_VARIANT", "0"),
        "nantile0": ("KVKIT_DECODE_FP8_NANTILE", "0"),
        "wpipe0": ("KVKIT_DECODE_WARP_PIPE", "0"),
        "tqslab0": ("KVKIT_DECODE_TQ_SLABS", "0"),
        "tqslab1": ("KVKIT_DECODE_TQ_SLABS", "1"),
        "tq64cpasync": ("KVKIT_DECODE_TQ_SLABS64", "0"),
        "rows8": ("KVKIT_DECODE_NVFP4_SLAB_ROWS", "8"),
        "slabs64": ("KVKIT_DECODE_NVFP4_SLABS_OTHER_D", "1"),
        "cp64": ("KVKIT_DECODE_NVFP4_SLABS_OTHER_D", "0"),
        "pairs0": ("KVKIT_DECODE_TILE_PAIRS", "0"),
        "pairaddr0": ("KVKIT_DECODE_PAIR_ADDR", "0"),
        "nvissue0": ("KVKIT_DECODE_NV_ISSUE", "0"),
        "tqissue0": ("KVKIT_DECODE_TQ_ISSUE", "0"),
        "nvpack0": ("KVKIT_DECODE_NV_PACK", "0"),
        "cpv2": ("KVKIT_DECODE_CP_ASYNC_V2", "1"),
        "cpv20": ("KVKIT_DECODE_CP_ASYNC_V2", "0"),
        "cpv2r": ("KVKIT_DECODE_CP_ASYNC_V2", "2"),
        "tq17": ("KVKIT_DECODE_TQ17", "1"),
        "tqpv16": ("KVKIT_DECODE_TQ_PV16", "1"),
        "tqpv16_0": ("KVKIT_DECODE_TQ_PV16", "0"),
        "nocap": ("KV_SOFTCAP", "0"),
        "tq3banks0": ("KVKIT_DECODE_TQ3_BANKS", "0"),
        "tq4o640": ("KVKIT_DECODE_TQ4_ORDER64", "0"),
        "tq3o640": ("KVKIT_DECODE_TQ3_ORDER64", "0"),
        "tqp80": ("KVKIT_DECODE_TQ_PAIRS8", "0"),
        "nv960": ("KVKIT_DECODE_NV96", "0"),
        "nv96p80": ("KVKIT_DECODE_NV96_PAIRS8", "0"),
    }
    for name in ("fp16", "fp16-runs", "bf16", "bf16-runs", "fp8_e4m3", "fp8_e4m3-runs",
                 "fp8_e4m3-nantile0", "nvfp4", "nvfp4-runs", "nvfp4-unpack0", "nvfp4-bulk0",
                 "nvfp4-rev0", "nvfp4-wpipe0", *TQ, "turboquant_4bit_nc-tqv0",
                 "turboquant_k8v4-tqv0", "turboquant_4bit_nc-tqslab0",
                 "turboquant_k8v4-tqslab1", "turboquant_3bit_nc-tq64cpasync",
                 "nvfp4-rows8", "nvfp4-slabs64", "nvfp4-cp64", "nvfp4-pairs0",
                 "turboquant_4bit_nc-pairs0", "nvfp4-pairaddr0",
                 "turboquant_4bit_nc-pairaddr0", "nvfp4-nvissue0",
                 "turboquant_4bit_nc-tqissue0", "nvfp4-nvpack0", "nvfp4-cpv2",
                 "nvfp4-cpv20", "nvfp4-cpv2r", "turboquant_4bit_nc-tq17",
                 "turboquant_k3v4_nc-tq17", "turboquant_4bit_nc-tqpv16",
                 "turboquant_3bit_nc-tqpv16", "turboquant_k3v4_nc-tqpv16",
                 "turboquant_4bit_nc-tqpv16_0", "nvfp4-nocap", "turboquant_4bit_nc-nocap",
                 "turboquant_3bit_nc-nocap", "fp16-nocap",
                 "turboquant_3bit_nc-tq3banks0", "turboquant_4bit_nc-tq4o640",
                 "turboquant_3bit_nc-tq3o640", "turboquant_4bit_nc-tqp80",
                 "nvfp4-nv960", "nvfp4-nv96p80"):  # fmt: skip
        name, _, switch = name.partition("-")
        # Switches between sm_90+ paths (bulk copies, warp slabs and pipes) build the default's
        # PTX on sm_80, and the software-FP8 path's switch the default's where the hardware
        # converts (sm_90): PTX identical at every shape here (session 26), so not again.
        if switch in (_SM90_PATH_SWITCHES if arch == "sm_80" else _SOFT_FP8_SWITCHES):
            continue
        fmt = formats.get(name, 128)
        shapes = ((4, 1, 128, "1"), (8, 2, 128, "0"), (4, 1, 64, "1"), (4, 1, 256, "1"),
                  (2, 4, 256, "2"))  # fmt: skip
        if name == "turboquant_3bit_nc" and switch in ("", "tq3banks0"):  # both orders
            shapes += ((16, 1, 128, "1"), (2, 4, 128, "1"))
        if name == "turboquant_4bit_nc" and switch in ("", "tq4o640"):  # both orders
            shapes += ((8, 1, 64, "0"), (2, 4, 64, "1"), (16, 1, 64, "1"))
        if name == "turboquant_3bit_nc" and switch in ("", "tq3o640"):  # both orders
            shapes += ((8, 1, 64, "0"), (2, 2, 64, "1"), (16, 1, 64, "1"))
        if switch == "tq3o640":  # (the other head_dims' builds are the default's)
            shapes = tuple(x for x in shapes if x[2] == 64)
        if switch == "runs" and name != "nvfp4":  # 96-byte / 192-byte rows (KVD_ROW_RUNS_EVEN)
            shapes += ((4, 1, 96, "1"),)
        if switch == "tqp80":  # (only 5-8 rows at head_dim 128 differ from the default)
            shapes = ((8, 1, 128, "1"),)
        if name == "nvfp4" and switch in ("", "nv960"):  # head_dim 96
            shapes += ((4, 1, 96, "1"), (2, 2, 96, "2"), (16, 1, 96, "0"), (8, 1, 96, "0"),
                       (2, 4, 96, "1"))  # fmt: skip
        if switch == "nv960":  # (the other head_dims' builds are the default's)
            shapes = tuple(x for x in shapes if x[2] == 96)
        if switch == "nv96p80":  # (only 5-8 rows at head_dim 96 differ from the default)
            shapes = ((8, 1, 96, "0"), (2, 4, 96, "1"))
        if not switch and name in ("nvfp4", "turboquant_4bit_nc"):
            shapes += ((8, 1, 128, "0"), (2, 4, 128, "2"), (4, 2, 128, "1"), (16, 1, 128, "0"),
                       (8, 1, 64, "0"))  # fmt: skip
        for group, q_len, d, q_dtype in dict.fromkeys(shapes):  # (each build once)
            defines = dict(formats.get(name, d).cuda_defines())
            defines.update(KV_IN_DTYPE=q_dtype, KV_GROUP=str(group), KV_Q_LEN=str(q_len))
            if switch:
                key, value = switches[switch]
                defines[key] = value
            cases.append((name, group, q_len, d, q_dtype))
            jobs.append((_DECODE_ENTRY[fmt.family], defines, arch))
    assert _spilled_builds(cases, _ptxas_builds(jobs), mma=True) == []


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90", "sm_100a", "sm_120a"])
def test_turboquant_256_token_order_and_pairs_do_not_spill(arch):
    """TurboQuant at head_dim 256 with its tile pairs (KVKIT_DECODE_TQ_PAIRS256, default 2:
    every codebook-key preset, pairs up to 4 rows on sm_90 / sm_100a only), and with the
    bank-friendly token order as well (KVKIT_DECODE_TQ_TOKEN_ORDER=2, an A/B build), on the
    tensor-core shapes (G x q_len 4x1, 8x1, 4x2, 2x4): no spills at the 255-register cap of
    D = 256. 3bit_nc's default takes its value windows, token order and pair addresses
    (KVKIT_DECODE_TQ3_256=2: 242-244 registers on sm_90 at 4 rows); also built with the
    windows alone (=1: 246-250) and as before (=0). k3v4_nc's default takes its interleaved key
    chunks (KVKIT_DECODE_K3V4=1: 234-255 on sm_90, at the cap at 4 x 1); also built as before
    (=0). The A/B builds (the token order, 3bit_nc's =0, k3v4's =0) on the pair targets sm_90 /
    sm_100a only (CI time)."""
    cases, jobs = [], []
    order = ({"KVKIT_DECODE_TQ_TOKEN_ORDER": "2"},)
    tq3 = ({"KVKIT_DECODE_TQ3_256": "0"},)
    k3v4 = ({"KVKIT_DECODE_K3V4": "0"},)
    for name in ("turboquant_4bit_nc", "turboquant_3bit_nc", "turboquant_k3v4_nc"):
        more = order + {"turboquant_3bit_nc": tq3, "turboquant_k3v4_nc": k3v4}.get(name, ())
        more = more if arch in ("sm_90", "sm_100a") else ()
        for extra in ({},) + more:
            for group, q_len in ((4, 1), (8, 1), (4, 2), (2, 4)):
                defines = dict(formats.get(name, 256).cuda_defines())
                defines.update(KV_IN_DTYPE="1", KV_GROUP=str(group), KV_Q_LEN=str(q_len), **extra)
                cases.append((name, tuple(extra), group, q_len))
                jobs.append(("decode_turboquant.cu", defines, arch))
    assert _spilled_builds(cases, _ptxas_builds(jobs), mma=True) == []


# Head-dim-64 token orders whose tile pairs hold more registers (the default builds): preset,
# switch, targets, (G, q_len) shapes.
_D64_ORDER_BUILDS = (
    ("turboquant_k3v4_nc", "KVKIT_DECODE_K3V4", ("sm_80", "sm_90", "sm_100a"),
     ((4, 1), (8, 1), (2, 2), (1, 1), (2, 4))),
    ("turboquant_3bit_nc", "KVKIT_DECODE_TQ3_ORDER64", ("sm_100a", "sm_120a"),
     ((4, 1), (8, 1), (16, 1))),
)  # fmt: skip


@pytest.mark.parametrize(
    "name, switch, arch, shapes",
    [(n, sw, a, sh) for n, sw, archs, sh in _D64_ORDER_BUILDS for a in archs],
)
def test_d64_token_orders_do_not_spill(name, switch, arch, shapes):
    """The head_dim-64 token orders at their defaults (1), on the tensor-core shapes:
    turboquant_k3v4_nc's (KVKIT_DECODE_K3V4: the tile pairs at four CTAs per SM, <= 128
    registers, hold 101-128; sm_90 4 x 1: 127, sm_100a 2 x 2: 128; 0: 94-124) and
    turboquant_3bit_nc's (KVKIT_DECODE_TQ3_ORDER64: one more held shift for the K rows' key
    runs; on the targets test_tensor_core_decode_does_not_spill leaves out, which builds sm_80
    and sm_90): no spills."""
    cases, jobs = [], []
    for group, q_len in shapes:
        defines = dict(formats.get(name, 64).cuda_defines())
        defines.update(KV_IN_DTYPE="1", KV_GROUP=str(group), KV_Q_LEN=str(q_len), **{switch: "1"})
        cases.append((group, q_len))
        jobs.append(("decode_turboquant.cu", defines, arch))
    assert _spilled_builds(cases, _ptxas_builds(jobs), mma=True) == []


def test_module_files_are_compiled_once_and_reused(tmp_path, monkeypatch):
    """module_file compiles when its file is missing and, in a later process (fresh
    in-memory caches), finds the file by its key without running NVRTC; a changed define
    is a different file."""
    monkeypatch.setenv("KVKIT_CACHE_DIR", str(tmp_path))
    defines = _defines("nvfp4")
    first = compiler.module_file("write_nvfp4.cu", defines, "sm_90", False)
    assert first.parent == tmp_path and first.suffix == ".cubin" and first.stat().st_size > 0
    ptx = compiler.module_file("write_nvfp4.cu", defines, "sm_80", True)
    assert ptx.suffix == ".ptx" and ".target sm_80" in ptx.read_text()

    # A later process: nothing cached in memory, NVRTC must not run.
    compiler._module_key_frozen.cache_clear()
    compiler._compile_cached_frozen.cache_clear()

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled although the file was cached")

    monkeypatch.setattr(compiler, "compile_entry", no_compile)
    assert compiler.module_file("write_nvfp4.cu", defines, "sm_90", False) == first
    assert compiler.module_file("write_nvfp4.cu", defines, "sm_80", True) == ptx
    with pytest.raises(AssertionError, match="compiled although"):
        compiler.module_file("write_nvfp4.cu", _defines("nvfp4", in_dtype="0"), "sm_90", False)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([first.name, ptx.name])


# Variant 4 is an A/B build now (5 is the default, built on every target by
# test_no_kernel_spills): sm_90 only, where it was measured (all seven targets took ~170 s of
# CI's ten minutes, three ~40 s).
# Variant 5 (branch tqw6: fast FP8 keys, nudged value reciprocals, float16x2 value min / max,
# key squares by IMAD) the same way; the helper also built it for sm_86, sm_89 and sm_100a
# (benchmarks/NOTES.md "tqw6").
@pytest.mark.parametrize("variant", ["4"])
@pytest.mark.parametrize("arch", ["sm_90"])
def test_turboquant_write_variant_4_does_not_spill(arch, variant, monkeypatch):
    """KVKIT_WRITE_TQ_VARIANT=4 (window packing of 3-bit codes, the in-place exact key
    fallback; variant 5, the default, builds on it): every TurboQuant preset at D = 64 / 128 /
    256 (k8v4 also 512) and every input dtype builds without spills, as the default does
    (test_no_kernel_spills builds the default)."""
    monkeypatch.setenv("KVKIT_WRITE_TQ_VARIANT", variant)
    cases, jobs = [], []
    for name in TQ:
        for d in (64, 128, 256, 512) if name == "turboquant_k8v4" else (64, 128, 256):
            for dt in ("0", "1", "2"):
                defines = _defines(name, d, dt)
                assert defines["TQ_VARIANT"] == variant
                cases.append((name, d, dt))
                jobs.append(("write_turboquant.cu", defines, arch))
    assert _spilled_builds(cases, _ptxas_builds(jobs)) == []


def test_turboquant_write_warp_counts_do_not_spill(monkeypatch):
    """KVKIT_WRITE_TQ_WARPS=6 (an A/B count beside the default 4, level with it on the H200;
    the CTA caps scale to the same warps per SM, as for 2 and 8, which measured slower): every
    preset at D = 64 / 128 with float16 inputs (the capped builds) and k8v4 at D = 48 (the
    shared-memory body, whose staging grows with the warps) builds without spills on sm_90,
    where the count was measured."""
    monkeypatch.setenv("KVKIT_WRITE_TQ_WARPS", "6")
    cases = [(name, d) for name in TQ for d in (64, 128)] + [("turboquant_k8v4", 48)]
    jobs = []
    for name, d in cases:
        defines = _defines(name, d, "1")
        assert defines["TQ_WARPS"] == "6"
        jobs.append(("write_turboquant.cu", defines, "sm_90"))
    assert _spilled_builds(cases, _ptxas_builds(jobs)) == []


# (The control flow in question is the same PTX on every target; three builds keep CI short.)
@pytest.mark.parametrize(
    "arch, variant",
    [("sm_80", "4"), ("sm_90", "4"), ("sm_90", "3"), ("sm_80", "5"), ("sm_90", "5")],
)
def test_turboquant_write_shuffles_are_warp_uniform(arch, variant, monkeypatch):
    """KVKIT_WRITE_TQ_VARIANT=3, 4 and 5 (the default): no shuffle / vote runs under a branch that
    only some lanes take (scripts/ptx_warp_sync.py reads the PTX control flow). Variant 4 as
    first written shuffled the rows' first zeros with a full mask under the per-row test `vlo
    == 0 || vhi == 0`: undefined whenever a warp mixed rows of zeros (padding slots, rows past
    the end) with other rows, and on an H200 its window shuffles then read other row pieces'
    codes (wrong key bytes under compute-sanitizer) or died with an illegal instruction.
    Variant 3 had the same branch and happened to survive it, so GPU runs are no guard; every
    variant now tests it warp-uniformly (__any_sync)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "scripts" / "ptx_warp_sync.py"
    spec = importlib.util.spec_from_file_location("ptx_warp_sync", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setenv("KVKIT_WRITE_TQ_VARIANT", variant)
    cases = [(name, d, dt) for name in TQ
             for d in ((64, 128, 256, 512) if name == "turboquant_k8v4" else (64, 128, 256))
             for dt in ("0", "1", "2")]  # fmt: skip
    results = compile_entries(
        [("write_turboquant.cu", _defines(name, d, dt), arch) for name, d, dt in cases],
        ptx_only=True,
    )
    bad = []
    for (name, d, dt), res in zip(cases, results, strict=True):
        found = mod.divergent_syncs(res.ptx)
        if found:
            bad.append((name, d, dt, found[0]))
    assert bad == []


def test_turboquant_write_without_a_cell_table_compiles():
    """The binary-search bucketing (a user codebook whose midpoints no 256-cell table
    separates: tq_launch_defines then gives no TQ_BKT) builds without spills."""
    cases = (("turboquant_4bit_nc", 128), ("turboquant_3bit_nc", 64))
    jobs = []
    for name, d in cases:
        defines = {k: v for k, v in _defines(name, d).items() if not k.startswith("TQ_BKT")}
        jobs.append(("write_turboquant.cu", defines, "sm_90"))
    assert _spilled_builds(cases, _ptxas_builds(jobs)) == []


@pytest.mark.parametrize("arch", TARGETS)
def test_dense_fast_body_does_not_spill(arch, monkeypatch):
    """KVKIT_WRITE_DENSE_VARIANT=1 (write_dense.cu's fast body, capped at 32 registers for full
    occupancy where the target has 2048 threads per SM): no spills for any dense format and
    input dtype, with the launcher's defines (fp8 with float32 / bfloat16 inputs keep body 0)."""
    from kvkit.cuda.write import dense_launch_defines

    monkeypatch.setenv("KVKIT_WRITE_DENSE_VARIANT", "1")
    cases = [(name, dt) for name in DENSE for dt in ("0", "1", "2")]
    jobs = []
    for name, dt in cases:
        fmt = formats.get(name, 128)
        defines = _defines(name, 128, dt, "long long", **dense_launch_defines(fmt, dt))
        jobs.append(("write_dense.cu", defines, arch))
    assert _spilled_builds(cases, _ptxas_builds(jobs)) == []


def test_compile_entries_keeps_job_order_and_raises_a_failure():
    """compile_entries (threads) returns compile_entry's result for each job in job order, and
    a job that does not compile raises its CompileError."""
    jobs = [("write_dense.cu", _defines(name), "sm_80") for name in ("fp16", "fp8_e4m3", "bf16")]
    results = compile_entries(jobs, ptx_only=True, workers=3)
    assert [r.ptx for r in results] == [
        compile_entry(entry, defines, arch, ptx_only=True).ptx for entry, defines, arch in jobs
    ]
    assert len({r.ptx for r in results}) == 3
    broken = dict(_defines("fp16"), KV_DENSE_CPT="3")  # write_dense.cu's #error branch
    with pytest.raises(compiler.CompileError):
        compile_entries([jobs[0], ("write_dense.cu", broken, "sm_80")], ptx_only=True)
