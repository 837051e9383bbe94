"""The decode launcher's build defaults that follow from a format's planes (no GPU needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvkit import formats
from kvkit.cuda.decode import ROW_RUNS_MIN_WIDTH, row_runs_default, split_count

SWEEPS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "h200_split_sweeps.json"


def _formats_at(head_dims):
    """(name, head_dim) for every format that has the head_dim (MSE keys: powers of two)."""
    out = []
    for d in head_dims:
        for name in formats.names():
            try:
                formats.get(name, d)
            except ValueError:
                continue
            out.append((name, d))
    return out


@pytest.mark.parametrize("name, head_dim", _formats_at([64, 96, 128, 256]))
def test_row_runs_default_follows_row_widths(name, head_dim):
    # Row planes per DESIGN.md section 3: fp16 / bf16 rows of 2 D bytes, fp8 rows of D bytes,
    # NVFP4 code rows of D / 2 bytes (its D / 16-byte scale rows are never whole 32-byte
    # chunk pairs); TurboQuant has one slot plane (134 bytes at D = 128: no row runs). Even
    # chunk counts qualify (96-byte fp8 rows at D = 96); NVFP4's 48-byte code rows there (three
    # chunks) and 32-byte ones at D = 64 do not, the second also for being narrower than 64.
    row_bytes = {"fp16": 2 * head_dim, "bf16": 2 * head_dim, "fp8_e4m3": head_dim,
                 "nvfp4": head_dim // 2, "nvfp4_4over6": head_dim // 2}.get(name)  # fmt: skip
    expected = row_bytes is not None and row_bytes >= ROW_RUNS_MIN_WIDTH
    assert row_runs_default(formats.get(name, head_dim)) is expected


def test_row_runs_leave_nvfp4_d64_alone():
    # Measured slower with row runs (32-byte code rows); see kvkit/cuda/decode.py.
    assert not row_runs_default(formats.get("nvfp4", 64))
    assert row_runs_default(formats.get("nvfp4", 256))


def test_build_switches_reject_unknown_values(monkeypatch):
    from kvkit.cuda.decode import _env_choice

    monkeypatch.delenv("KVKIT_DECODE_TQ_VARIANT", raising=False)
    assert _env_choice("KVKIT_DECODE_TQ_VARIANT", ("0", "1")) == ""
    monkeypatch.setenv("KVKIT_DECODE_TQ_VARIANT", "1")
    assert _env_choice("KVKIT_DECODE_TQ_VARIANT", ("0", "1")) == "1"
    monkeypatch.setenv("KVKIT_DECODE_TQ_VARIANT", "2")
    with pytest.raises(ValueError, match="KVKIT_DECODE_TQ_VARIANT='2'"):
        _env_choice("KVKIT_DECODE_TQ_VARIANT", ("0", "1"))


def _stage1_defines(monkeypatch, name: str, head_dim: int = 128, auto=(), softcap=True) -> dict:
    """The defines _stage1_for builds for one format (G = 4, q_len = 1; ``auto``: the
    launcher's split-length switches), no GPU: the device query and the module build are
    stood in for."""
    import cupy

    from kvkit.cuda import decode as cuda_decode

    seen = {}

    def fake_kernel(entry, kname, defines):
        seen.update(defines)
        return None, 0, 128, 64, 0

    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)
    monkeypatch.setattr(cuda_decode, "_stage1_kernel", fake_kernel)
    monkeypatch.setattr(cuda_decode, "_stage1_fast", {})
    cuda_decode._stage1_for(formats.get(name, head_dim), "x.cu", "k", "1", 4, 1, auto, softcap)
    return seen


def test_build_switches_reach_the_families_that_read_them(monkeypatch):
    """Each A/B switch becomes a define only for the formats whose stage 1 reads it; the warp
    pipes reach every family with warp slabs (NVFP4 and TurboQuant), the NaN-free E4M3 tiles
    the formats with E4M3 bytes, the cp.async tile loop every family (the core). Unset switches
    add no define."""
    from kvkit.cuda.decode import _FAMILY_SWITCHES

    names = [switch for switch, _, _ in _FAMILY_SWITCHES]
    for switch in names:
        monkeypatch.delenv(switch, raising=False)
    for name in formats.names():
        assert not set(names) & set(_stage1_defines(monkeypatch, name))
    values = {switch: allowed[0] for switch, allowed, _ in _FAMILY_SWITCHES}
    for switch, value in values.items():
        monkeypatch.setenv(switch, value)
    expect = {
        "nvfp4": {"KVKIT_DECODE_NVFP4_UNPACK", "KVKIT_DECODE_NVFP4_BULK",
                  "KVKIT_DECODE_NVFP4_REV", "KVKIT_DECODE_NVFP4_SLAB_ROWS",
                  "KVKIT_DECODE_NVFP4_SLABS_OTHER_D", "KVKIT_DECODE_WARP_PIPE",
                  "KVKIT_DECODE_TILE_PAIRS", "KVKIT_DECODE_PAIR_ADDR",
                  "KVKIT_DECODE_PAIRS16", "KVKIT_DECODE_CP_ON_BULK", "KVKIT_DECODE_NV_ISSUE",
                  "KVKIT_DECODE_NV96", "KVKIT_DECODE_NV96_PAIRS8",
                  "KVKIT_DECODE_NV_PACK",
                  "KVKIT_DECODE_CP_ASYNC_V2", "KVKIT_DECODE_EARLY_ISSUE"},
        "turboquant_4bit_nc": {"KVKIT_DECODE_TQ_VARIANT", "KVKIT_DECODE_TQ3",
                               "KVKIT_DECODE_TQ_SLABS", "KVKIT_DECODE_TQ_SLABS64",
                               "KVKIT_DECODE_WARP_PIPE", "KVKIT_DECODE_TILE_PAIRS",
                               "KVKIT_DECODE_TQ_TOKEN_ORDER", "KVKIT_DECODE_TQ_PAIRS256",
                               "KVKIT_DECODE_TQ_PAIRS8", "KVKIT_DECODE_PAIRS16",
                               "KVKIT_DECODE_PAIR_ADDR", "KVKIT_DECODE_TQ_ISSUE",
                               "KVKIT_DECODE_TQ3_256", "KVKIT_DECODE_K3V4",
                               "KVKIT_DECODE_TQ3_BANKS", "KVKIT_DECODE_TQ4_ORDER64",
                               "KVKIT_DECODE_TQ3_ORDER64",
                               "KVKIT_DECODE_CP_ASYNC_V2", "KVKIT_DECODE_TQ17",
                               "KVKIT_DECODE_TQ_PV16", "KVKIT_DECODE_EARLY_ISSUE"},
        "fp8_e4m3": {"KVKIT_DECODE_FP8_NANTILE", "KVKIT_DECODE_CP_ASYNC_V2",
                     "KVKIT_DECODE_EARLY_ISSUE"},
        "fp16": {"KVKIT_DECODE_CP_ASYNC_V2", "KVKIT_DECODE_DENSE_BULK",
                 "KVKIT_DECODE_EARLY_ISSUE"},
    }  # fmt: skip
    expect["turboquant_k8v4"] = expect["turboquant_4bit_nc"] | {"KVKIT_DECODE_FP8_NANTILE"}
    for name, wanted in expect.items():
        defines = _stage1_defines(monkeypatch, name)
        assert set(names) & set(defines) == wanted, name
        assert {switch: defines[switch] for switch in wanted} == {s: values[s] for s in wanted}


def test_environment_switches_win_over_the_launchers_choice(monkeypatch):
    """An auto switch becomes a define only where the environment leaves it unset."""
    auto = (("KVKIT_DECODE_TILE_PAIRS", "0"),)
    monkeypatch.delenv("KVKIT_DECODE_TILE_PAIRS", raising=False)
    assert _stage1_defines(monkeypatch, "nvfp4", auto=auto)["KVKIT_DECODE_TILE_PAIRS"] == "0"
    monkeypatch.setenv("KVKIT_DECODE_TILE_PAIRS", "1")
    assert _stage1_defines(monkeypatch, "nvfp4", auto=auto)["KVKIT_DECODE_TILE_PAIRS"] == "1"
    monkeypatch.delenv("KVKIT_DECODE_TILE_PAIRS")
    assert "KVKIT_DECODE_TILE_PAIRS" not in _stage1_defines(monkeypatch, "nvfp4")
    # A switch the format does not read stays out of its defines.
    slabs = (("KVKIT_DECODE_TQ_SLABS", "1"),)
    assert "KVKIT_DECODE_TQ_SLABS" not in _stage1_defines(monkeypatch, "nvfp4", auto=slabs)


@pytest.mark.parametrize("smem_per_sm, fallback", [(228 * 1024, False), (164 * 1024, True),
                                                   (100 * 1024, True)])  # fmt: skip
def test_cp_async_pairs_need_as_many_ctas_per_sm(monkeypatch, smem_per_sm, fallback):
    """NVFP4's cp.async default (tile pairs, KVKIT_DECODE_CP_ASYNC_V2=3) only where its CTAs
    (D = 128 4 x 1 on sm_80: 54,896 shared bytes, 127 registers) fit on an SM as many times
    as the page-window build's (29,792 bytes): kept on the H200's 228 KB (4 and 4), replaced by
    KVKIT_DECODE_CP_ASYNC_V2=2 on an A100's 164 KB (3 against 4) and sm_86 / sm_89's 100 KB
    (1 against 3)."""
    import cupy

    from kvkit.cuda import decode as cuda_decode
    from kvkit.cuda.split_builds import LOOP_TILE_PAIRS

    class FakeKernel:
        attributes = {"num_regs": 127}

    # The default build, 2's and 3's asked for by name: three modules, three kernels.
    pairs, windows, pairs_env = FakeKernel(), FakeKernel(), FakeKernel()
    built = []

    def fake_kernel(entry, kname, defines):
        built.append(defines.get("KVKIT_DECODE_CP_ASYNC_V2"))
        if defines.get("KVKIT_DECODE_CP_ASYNC_V2") == "2":
            return windows, 29792, 128, 64, 0
        if defines.get("KVKIT_DECODE_CP_ASYNC_V2") == "3":
            return pairs_env, 54896, 128, 64, LOOP_TILE_PAIRS
        return pairs, 54896, 128, 64, LOOP_TILE_PAIRS

    monkeypatch.delenv("KVKIT_DECODE_CP_ASYNC_V2", raising=False)
    monkeypatch.setattr(cupy.cuda.runtime, "getDevice", lambda: 0)
    monkeypatch.setattr(cuda_decode, "_stage1_kernel", fake_kernel)
    monkeypatch.setattr(cuda_decode, "_stage1_fast", {})
    monkeypatch.setattr(cuda_decode, "_resident_cache", {})
    monkeypatch.setattr(cuda_decode, "_cp_pairs_pick", {})
    monkeypatch.setattr(cuda_decode, "_smem_per_sm", lambda: smem_per_sm)
    fmt = formats.get("nvfp4", 128)
    for _ in range(2):  # the second call from the caches, as in a decode loop
        build, picked = cuda_decode._stage1_default(fmt, "x.cu", "k", "1", 4, 1)
        assert (build[0] is windows) is fallback
        assert picked == (cuda_decode._CP_PAIRS_FALLBACK if fallback else ())
    assert built == [None, "2"]  # each build made once
    # A value set in the environment wins: no fallback build.
    monkeypatch.setenv("KVKIT_DECODE_CP_ASYNC_V2", "3")
    build, picked = cuda_decode._stage1_default(fmt, "x.cu", "k", "1", 4, 1)
    assert build[0] is pairs_env and picked == ()


@pytest.mark.parametrize("name", ["nvfp4", "turboquant_4bit_nc", "fp16"])
def test_decodes_without_a_softcap_take_the_build_without_its_tanh(monkeypatch, name):
    """KV_SOFTCAP=0 for a decode without a soft-cap (unless KVKIT_DECODE_SOFTCAP_BUILDS=0),
    never for one with it (the kernel's default, 1, keeps the tanh)."""
    monkeypatch.delenv("KVKIT_DECODE_SOFTCAP_BUILDS", raising=False)
    assert _stage1_defines(monkeypatch, name, softcap=False)["KV_SOFTCAP"] == "0"
    assert "KV_SOFTCAP" not in _stage1_defines(monkeypatch, name, softcap=True)
    monkeypatch.setenv("KVKIT_DECODE_SOFTCAP_BUILDS", "0")
    assert "KV_SOFTCAP" not in _stage1_defines(monkeypatch, name, softcap=False)
    monkeypatch.setenv("KVKIT_DECODE_SOFTCAP_BUILDS", "2")
    with pytest.raises(ValueError, match="KVKIT_DECODE_SOFTCAP_BUILDS"):
        _stage1_defines(monkeypatch, name, softcap=False)


def test_split_count_worked_by_hand():
    # The constants: 64-token tiles, two per split at least, ten tiles of fixed work per CTA
    # and eleven for splitting at all (the merge, only where 8 B >= 132 items fill the SMs);
    # 132 SMs x R resident CTAs; fewer than 132 CTAs scale the time by 132 / CTAs. Expected
    # counts worked by hand from
    # ceil(8 B s / 132 R) * (tokens per split + 640) [* 132 / 8 B s] [+ 704].
    from kvkit.cuda import decode as cuda_decode

    consts = (cuda_decode.SPLIT_OVERHEAD_TILES, cuda_decode.SPLIT_MERGE_TILES,
              cuda_decode.SPLIT_MIN_TILES)  # fmt: skip
    assert consts == (10, 11, 2)

    def cuda(batch, tokens, resident=4):
        return split_count(batch, 8, tokens, 16, 132, resident, 64)

    # One wave holds every count up to the floor or the wave's end: the largest, as before.
    assert cuda(1, 4096) == 32  # 1 x (128 + 640); 16 splits: (256 + 640) * 132 / 128
    assert cuda(1, 32768) == 64  # 1 x (512 + 640); 128 splits: 2 waves
    # Whole 8-page units per split: 8192 pages in 64 splits of 128, not 66 of 125 (measured
    # on the H200: NVFP4 60.1 -> 59.1 us, fp8 79.7 -> 76.9).
    assert cuda(1, 131072) == 64
    assert cuda(8, 8192) == 8  # 1 x (1024 + 640); 16 splits: 2 x 1152
    # Middle batches: one wave of long CTAs over several waves of short ones (measured on the
    # H200, NVFP4: B 24 at 2 splits 45.4 us where 8 took 56.2; B 48 at 1 split 77.2 / 4 92.7).
    assert cuda(24, 4096) == 2  # 1 x 2688 + 704 = 3392; 1: 4736; 4: 2 x 1664 + 704 = 4032
    assert cuda(48, 4096) == 1  # 4736; 2 splits: 2 x 2688 + 704 = 6080
    assert cuda(64, 8192) == 1
    # 3 CTAs per SM (396 slots): 3 splits, 4 x 3376 + 704 = 14208; 1 split 2 x 8832 = 17664,
    # 2 splits 3 x 4736 + 704 = 14912.
    assert cuda(64, 8192, resident=3) == 3
    # 1 CTA per SM (bf16 at head_dim 256), B 12: one split's 96 CTAs leave 36 SMs idle,
    # 4736 * 132 / 96 = 6512; 4 splits 3 x 1664 = 4992 (measured 136.8 / 117.2 us).
    assert cuda(12, 4096, resident=1) == 4


def test_split_heuristic_on_the_measured_sweeps():
    """The CUDA split heuristic (split_count) on the H200 split sweeps committed with it (119
    format x shape rows, graph-replay us per split count; the constants were chosen on these
    rows, so this guards the model's code and constants, it does not validate them anew): every
    count it picks was measured, its picks are on average within 2.5% of each row's fastest
    measured count and never more than 17% off, and on average at least 1.5 points closer than
    the heuristic before them (the rows' "auto")."""
    rows = json.loads(SWEEPS.read_text())["rows"]
    assert len(rows) == 119
    ours, before = [], []
    for r in rows:
        times = {int(k): v for k, v in r["times"].items() if k not in ("auto", "auto_n") and v}
        times.setdefault(r["times"]["auto_n"], r["times"]["auto"])
        best = min(times.values())
        pick = split_count(r["B"], r["Hkv"], r["T"], 16, 132, r["R"], r["tile"])
        assert pick in times, (r["fmt"], r["B"], r["T"], r["Hq"], r["D"], pick)
        ours.append(times[pick] / best - 1)
        before.append(r["times"]["auto"] / best - 1)
    mean = sum(ours) / len(ours)
    assert mean <= 0.025 and max(ours) <= 0.17
    assert sum(before) / len(before) - mean >= 0.015
