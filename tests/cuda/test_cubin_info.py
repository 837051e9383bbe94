"""``kvkit.cuda.cubin_info`` against ptxas's own statistics of the same builds.

The reference is the ``--ptxas-options=-v`` log that NVRTC returns with each cubin ("N bytes
stack frame", "Used N registers", "N bytes cumulative stack size"): the parser must find the
same kernels with the same registers, frames and stacks. Builds: decode stage 1 (NVFP4,
TurboQuant 4bit_nc), writes and a dequantize kernel for four targets, and small kernels made
to have a local array, spills and an out-of-line call. Needs NVRTC only; skipped when it is
absent (as tests/cuda/test_compile.py).
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("cupy_backends.cuda.libs.nvrtc")

from kvkit import formats  # noqa: E402
from kvkit.cuda import compiler, cubin_info  # noqa: E402
from kvkit.cuda.compiler import compile_entries, compile_entry  # noqa: E402
from kvkit.cuda.write import tq_launch_defines  # noqa: E402

if compiler.nvrtc_unavailable_reason():
    pytest.skip(compiler.nvrtc_unavailable_reason(), allow_module_level=True)

_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_STACK = re.compile(r"(\d+) bytes cumulative stack size")


def ptxas_stats(log: str) -> tuple[list[str], dict[str, dict[str, int]]]:
    """(entry functions, function -> {frame, stores, loads[, registers, stack]}) from the
    ptxas -v lines of an NVRTC log; "Used N registers" follows the properties of the kernel it
    belongs to, "cumulative stack size" is only there when nonzero."""
    entries = re.findall(r"Compiling entry function '(\S+)'", log)
    stats: dict[str, dict[str, int]] = {}
    cur = None
    for line in log.splitlines():
        if m := _PROPS.search(line):
            cur = stats.setdefault(m.group(1), {})
        elif (m := _FRAME.search(line)) and cur is not None:
            cur.update(frame=int(m.group(1)), stores=int(m.group(2)), loads=int(m.group(3)))
        elif (m := _USED.search(line)) and cur is not None:
            stack = _STACK.search(line)
            cur.update(registers=int(m.group(1)), stack=int(stack.group(1)) if stack else 0)
    return entries, stats


def _check_against_log(res) -> dict[str, dict[str, int]]:
    """The parser's kernels, registers, frames and stacks equal the log's; returns the log's."""
    entries, stats = ptxas_stats(res.log)
    assert entries, f"no ptxas statistics in the log: {res.log!r}"
    funcs = cubin_info.functions(res.cubin)
    assert sorted(entries) == sorted(f.name for f in funcs.values() if f.entry)
    limits = cubin_info.kernel_limits(res.cubin)
    for name in entries:
        got, want = funcs[name], stats[name]
        assert (got.registers, got.frame_size, got.min_stack_size) == (
            want["registers"],
            want["frame"],
            want["stack"],
        ), (name, got, want)
        assert got.registers <= limits[name]["max_registers"]
    # spill_free vouches for a cubin exactly where ptxas reports no frame anywhere
    no_frames = all(st["frame"] == 0 and st.get("stack", 0) == 0 for st in stats.values())
    assert (cubin_info.spill_free(res.cubin) is None) == no_frames, stats
    return stats


def _kvkit_jobs(arch: str) -> list:
    jobs = []
    for name, entry in (
        ("nvfp4", "decode_nvfp4.cu"),
        ("turboquant_4bit_nc", "decode_turboquant.cu"),
    ):
        defines = dict(formats.get(name, 128).cuda_defines())
        defines.update(KV_IN_DTYPE="1", KV_GROUP="4", KV_Q_LEN="1")
        jobs.append((entry, defines, arch))
    # writes and a dequantize kernel; turboquant_k8v4 with float16 inputs is the FP8-key write
    # that has an 8-byte stack frame (no spill) at its 16 CTAs per SM on sm_90
    for entry, name, d in (
        ("write_turboquant.cu", "turboquant_k8v4", 128),
        ("write_nvfp4.cu", "nvfp4", 128),
        ("dequant_nvfp4.cu", "nvfp4_4over6", 512),
    ):
        fmt = formats.get(name, d)
        defines = dict(fmt.cuda_defines(), KV_IN_DTYPE="1", KV_SLOT_T="long long")
        if entry == "write_turboquant.cu":
            defines.update(tq_launch_defines(fmt, "1"))
        jobs.append((entry, defines, arch))
    return jobs


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100a", "sm_120a"])
def test_cubin_facts_equal_ptxas_statistics(arch):
    results = compile_entries(_kvkit_jobs(arch), verbose_ptxas=True)
    framed = []
    for res in results:
        stats = _check_against_log(res)
        framed += [name for name, st in stats.items() if st["frame"]]
    # the FP8-key TurboQuant write's 8-byte frame on sm_90 is seen from both sides
    assert ("kvkit_write_turboquant" in framed) == (arch == "sm_90"), framed


_SMALL = r"""
// A local array written and read at run-time indices: a stack frame without spills.
extern "C" __global__ void tk_local(const int* idx, float* out) {
    float a[64];
    for (int i = 0; i < 64; ++i) a[i] = out[threadIdx.x * 64 + i] * 2.f;
    for (int i = 0; i < 8; ++i) a[idx[threadIdx.x + i] & 63] += 1.f;
    out[threadIdx.x] = a[idx[threadIdx.x + 8] & 63];
}
// 96 live floats under the 32-register cap of 1024 x 2 CTAs per SM: spills.
extern "C" __global__ void __launch_bounds__(1024, 2) tk_spill(const float4* in, float* out) {
    float4 v[24];
#pragma unroll
    for (int i = 0; i < 24; ++i) v[i] = in[threadIdx.x + 1024 * i];
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 24; ++i) s += v[i].x * v[(i + 5) % 24].y + v[i].z * v[(i + 7) % 24].w;
#pragma unroll
    for (int i = 0; i < 24; ++i) s = s * v[i].y + v[(i + 3) % 24].x;
    out[threadIdx.x] = s;
}
// An out-of-line callee with a local array: the kernel's cumulative stack covers it.
__device__ __noinline__ float tk_callee(const int* idx, const float* x) {
    float a[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) a[i] = x[i] + 1.f;
    return a[idx[0] & 7];
}
extern "C" __global__ void tk_call(const int* idx, float* out) {
    out[threadIdx.x] = tk_callee(idx + threadIdx.x, out + threadIdx.x * 8);
}
"""
_PLAIN = 'extern "C" __global__ void tk_plain(float* out) { out[threadIdx.x] += 1.f; }\n'


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cubin_frames_of_local_arrays_spills_and_calls(arch, tmp_path, monkeypatch):
    (tmp_path / "small.cu").write_text(_SMALL)
    (tmp_path / "plain.cu").write_text(_PLAIN)
    monkeypatch.setenv("KVKIT_CUDA_SRC", str(tmp_path))
    res = compile_entry("small.cu", {}, arch, verbose_ptxas=True)
    stats = _check_against_log(res)
    # what the kernels were written to have, by ptxas's word
    assert stats["tk_local"]["frame"] > 0 and stats["tk_local"]["stores"] == 0
    assert stats["tk_spill"]["stores"] > 0 and stats["tk_spill"]["frame"] > 0
    assert stats["tk_call"]["stack"] > 0
    reason = cubin_info.spill_free(res.cubin)
    assert "tk_local" in reason and "tk_spill" in reason and "local arrays" in reason
    plain = compile_entry("plain.cu", {}, arch, verbose_ptxas=True)
    _check_against_log(plain)
    assert cubin_info.spill_free(plain.cubin) is None


def test_cubin_info_rejects_what_it_cannot_read(tmp_path, monkeypatch):
    (tmp_path / "plain.cu").write_text(_PLAIN)
    monkeypatch.setenv("KVKIT_CUDA_SRC", str(tmp_path))
    cubin = compile_entry("plain.cu", {}, "sm_90").cubin
    assert cubin_info.functions(cubin + b"\0")["tk_plain"].frame_size == 0  # NVRTC's last byte
    for bad in (b"", b"not a cubin", cubin[: len(cubin) // 2], cubin[:64]):
        with pytest.raises(cubin_info.CubinError):
            cubin_info.functions(bad)
        assert "not readable" in cubin_info.spill_free(bad)
