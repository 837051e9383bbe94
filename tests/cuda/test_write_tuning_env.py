"""kvkit.cuda.write: the TurboQuant write's launch choices and their tuning overrides (host
side only; no GPU needed)."""

from __future__ import annotations

import numpy as np
import pytest

from kvkit import formats
from kvkit.cuda.write import (
    TQ_VARIANT_DEFAULT,
    TQ_VARIANTS,
    nvfp4_launch_defines,
    tq_launch_defines,
    tq_min_ctas,
    tq_rows_per_warp,
    tq_variant,
)


@pytest.fixture(autouse=True)
def _no_overrides(monkeypatch):
    monkeypatch.delenv("KVKIT_WRITE_TQ_RPW", raising=False)
    monkeypatch.delenv("KVKIT_WRITE_TQ_MIN_CTAS", raising=False)
    monkeypatch.delenv("KVKIT_WRITE_TQ_VARIANT", raising=False)
    monkeypatch.delenv("KVKIT_WRITE_EARLY_LOADS", raising=False)
    monkeypatch.delenv("KVKIT_WRITE_TQ_WARPS", raising=False)


def test_defaults_follow_head_dim_and_input_dtype(monkeypatch):
    fmt = formats.get("turboquant_4bit_nc", 128)
    assert tq_rows_per_warp(fmt) == 4
    assert tq_min_ctas(fmt, "1") == (6, 9)  # (other targets, sm_90)
    monkeypatch.setenv("KVKIT_WRITE_TQ_VARIANT", "4")  # variants before 5 spill at 9
    assert tq_min_ctas(fmt, "1") == (6, 8)
    monkeypatch.delenv("KVKIT_WRITE_TQ_VARIANT")
    assert tq_min_ctas(fmt, "0") == (1, 1)  # float32 inputs: no register cap
    assert tq_min_ctas(formats.get("turboquant_4bit_nc", 256), "1") == (1, 1)
    assert tq_rows_per_warp(formats.get("turboquant_k8v4", 512)) == 2
    defines = tq_launch_defines(fmt, "1")
    assert (defines["TQ_RPW"], defines["TQ_MIN_CTAS"], defines["TQ_MIN_CTAS_SM90"]) == (
        "4", "6", "9")  # fmt: skip


def test_fp8_keys_take_two_rows_per_warp_and_more_ctas():
    k8v4 = formats.get("turboquant_k8v4", 128)
    assert tq_rows_per_warp(k8v4) == 2
    assert tq_min_ctas(k8v4, "1") == (8, 16)
    assert tq_min_ctas(k8v4, "2") == (8, 8)  # bf16 inputs spill at 16 on sm_80 / sm_90
    assert tq_min_ctas(k8v4, "0") == (1, 1)


def test_overrides_reach_the_launch_defines(monkeypatch):
    monkeypatch.setenv("KVKIT_WRITE_TQ_RPW", "2")
    monkeypatch.setenv("KVKIT_WRITE_TQ_MIN_CTAS", "10")
    fmt = formats.get("turboquant_3bit_nc", 128)
    defines = tq_launch_defines(fmt, "1")
    assert (defines["TQ_RPW"], defines["TQ_MIN_CTAS"], defines["TQ_MIN_CTAS_SM90"]) == (
        "2", "10", "10")  # fmt: skip
    # An override never raises the row count above what the registers allow.
    monkeypatch.setenv("KVKIT_WRITE_TQ_RPW", "4")
    assert tq_rows_per_warp(formats.get("turboquant_k8v4", 512)) == 2


@pytest.mark.parametrize(
    "name, value",
    [("KVKIT_WRITE_TQ_RPW", "8"), ("KVKIT_WRITE_TQ_RPW", "3"), ("KVKIT_WRITE_TQ_RPW", "x"),
     ("KVKIT_WRITE_TQ_MIN_CTAS", "0"), ("KVKIT_WRITE_TQ_MIN_CTAS", "33"),
     ("KVKIT_WRITE_TQ_MIN_CTAS", "-1"), ("KVKIT_WRITE_TQ_VARIANT", "6"),
     ("KVKIT_WRITE_TQ_WARPS", "3"), ("KVKIT_WRITE_TQ_WARPS", "16"), ("KVKIT_WRITE_TQ_WARPS", "0")],
)  # fmt: skip
def test_bad_overrides_raise(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        tq_launch_defines(formats.get("turboquant_4bit_nc", 128), "1")


def test_nvfp4_blocks_per_thread(monkeypatch):
    """kvkit_write_nvfp4: two blocks per thread where D / 16 is even, except 4over6 with float32
    inputs; KVKIT_WRITE_NVFP4_BPT=1 lowers it, never raises it."""
    from kvkit.cuda.write import nvfp4_blocks_per_thread

    monkeypatch.delenv("KVKIT_WRITE_NVFP4_BPT", raising=False)
    nv, nv46 = formats.get("nvfp4", 128), formats.get("nvfp4_4over6", 128)
    assert [nvfp4_blocks_per_thread(nv, c) for c in "012"] == [2, 2, 2]
    assert [nvfp4_blocks_per_thread(nv46, c) for c in "012"] == [1, 2, 2]
    assert nvfp4_blocks_per_thread(formats.get("nvfp4", 80), "1") == 1  # 5 blocks
    monkeypatch.setenv("KVKIT_WRITE_NVFP4_BPT", "1")
    assert nvfp4_blocks_per_thread(nv, "1") == 1
    monkeypatch.setenv("KVKIT_WRITE_NVFP4_BPT", "2")
    assert nvfp4_blocks_per_thread(formats.get("nvfp4", 48), "1") == 1
    monkeypatch.setenv("KVKIT_WRITE_NVFP4_BPT", "4")
    with pytest.raises(ValueError, match="KVKIT_WRITE_NVFP4_BPT"):
        nvfp4_blocks_per_thread(nv, "1")


def test_variant_default_and_override(monkeypatch):
    fmt = formats.get("turboquant_4bit_nc", 128)
    assert tq_variant(fmt) == TQ_VARIANT_DEFAULT == 5
    # Every preset takes variant 5 (kvkit/cuda/write.py says why).
    for name in ("turboquant_3bit_nc", "turboquant_k3v4_nc", "turboquant_k8v4"):
        assert tq_variant(formats.get(name, 128)) == 5
    assert tq_launch_defines(fmt, "1")["TQ_VARIANT"] == "5"
    for v in ("0", "1", "2"):
        monkeypatch.setenv("KVKIT_WRITE_TQ_VARIANT", v)
        assert tq_launch_defines(fmt, "1")["TQ_VARIANT"] == v
        assert tq_variant(formats.get("turboquant_k8v4", 128)) == int(v)  # FP8 keys: values only
    # The near key decisions need a cell table: a binary-search codebook keeps variant 1.
    monkeypatch.setenv("KVKIT_WRITE_TQ_VARIANT", "2")
    fmt = formats.get("turboquant_4bit_nc", 128)
    assert "TQ_NEAR_KEY" in tq_launch_defines(fmt, "1")
    # Variant 3: cells without a midpoint hold +inf (0x7F800000), not NaN, in its table.
    monkeypatch.setenv("KVKIT_WRITE_TQ_VARIANT", "3")
    d = tq_launch_defines(fmt, "1")
    assert d["TQ_VARIANT"] == "3" and "0x7F800000u" in d["TQ_BKT_TABLE"]
    assert "0x7FC00000u" not in d["TQ_BKT_TABLE"] and "TQ_BKT_UA" in d
    # Variant 4 (window packing of 3-bit codes): variant 3's table and near decisions.
    monkeypatch.setenv("KVKIT_WRITE_TQ_VARIANT", "4")
    assert TQ_VARIANTS == (0, 1, 2, 3, 4, 5)
    d4 = tq_launch_defines(formats.get("turboquant_3bit_nc", 128), "1")
    assert d4["TQ_VARIANT"] == "4" and "0x7F800000u" in d4["TQ_BKT_TABLE"]
    assert tq_variant(formats.get("turboquant_k8v4", 128)) == 4
    # Variant 5 (tqw6): variant 3's table with the squares as (x, dl) bit fields.
    monkeypatch.setenv("KVKIT_WRITE_TQ_VARIANT", "5")
    d5 = tq_launch_defines(formats.get("turboquant_4bit_nc", 128), "1")
    assert d5["TQ_VARIANT"] == "5" and d5["TQ_BKT_IMAD_SQ"] == "1"
    # the model's nudge, as the float32 the literal rounds to (cuda_float: shortest round trip)
    assert np.float32(d5["TQ_V5_NUDGE"].rstrip("f")) == np.float32(2.0**-17)
    assert "0x7F800000u" in d5["TQ_BKT_TABLE"]
    assert tq_variant(formats.get("turboquant_k8v4", 128)) == 5


def test_dense_variant_default_and_override(monkeypatch):
    from kvkit.cuda.write import DENSE_VARIANT_DEFAULT, dense_launch_defines

    fp8, fp16 = formats.get("fp8_e4m3", 128), formats.get("fp16", 128)
    monkeypatch.delenv("KVKIT_WRITE_DENSE_VARIANT", raising=False)
    assert DENSE_VARIANT_DEFAULT == 1
    assert dense_launch_defines(fp8, "1")["KV_DENSE_FAST"] == "1"
    assert dense_launch_defines(fp16, "0")["KV_DENSE_FAST"] == "1"
    # fp8 has a fast chunk only for float16 inputs: float32 / bfloat16 keep body 0
    assert dense_launch_defines(fp8, "0")["KV_DENSE_FAST"] == "0"
    assert dense_launch_defines(fp8, "2")["KV_DENSE_FAST"] == "0"
    monkeypatch.setenv("KVKIT_WRITE_DENSE_VARIANT", "0")
    assert dense_launch_defines(fp8, "1")["KV_DENSE_FAST"] == "0"
    monkeypatch.setenv("KVKIT_WRITE_DENSE_VARIANT", "2")
    with pytest.raises(ValueError, match="KVKIT_WRITE_DENSE_VARIANT"):
        dense_launch_defines(fp8, "1")


def test_nvfp4_46_variant_default_and_override(monkeypatch):
    """KVKIT_WRITE_NVFP4_46_VARIANT: 1 by default, 0 on request, only for 4over6 (plain NVFP4
    builds carry no variant define, so their kernels are the same whatever it says); the
    4over6 format renders the decision's constants from kvkit.formats.arch_models."""
    from kvkit.cuda import plain_steps
    from kvkit.cuda.write import NVFP4_46_VARIANT_DEFAULT, nvfp4_launch_defines
    from kvkit.formats import arch_models

    nv, nv46 = formats.get("nvfp4", 128), formats.get("nvfp4_4over6", 128)
    monkeypatch.delenv("KVKIT_WRITE_NVFP4_46_VARIANT", raising=False)
    monkeypatch.delenv("KVKIT_WRITE_NVFP4_BPT", raising=False)
    assert NVFP4_46_VARIANT_DEFAULT == 1
    assert nvfp4_launch_defines(nv46, "1") == {
        "KV_NVFP4_BPT": "2", "KV_WRITE_EARLY": "1", "KV_NVFP4_46_VARIANT": "1"}  # fmt: skip
    assert nvfp4_launch_defines(nv46, "0")["KV_NVFP4_BPT"] == "1"
    assert nvfp4_launch_defines(nv, "1") == {"KV_NVFP4_BPT": "2", "KV_WRITE_EARLY": "1"}
    monkeypatch.setenv("KVKIT_WRITE_NVFP4_46_VARIANT", "0")
    assert nvfp4_launch_defines(nv46, "2")["KV_NVFP4_46_VARIANT"] == "0"
    assert "KV_NVFP4_46_VARIANT" not in nvfp4_launch_defines(nv, "2")
    monkeypatch.setenv("KVKIT_WRITE_NVFP4_46_VARIANT", "2")
    with pytest.raises(ValueError, match="KVKIT_WRITE_NVFP4_46_VARIANT"):
        nvfp4_launch_defines(nv46, "1")
    assert "KVKIT_WRITE_NVFP4_46_VARIANT" in plain_steps.KERNEL_ENV  # part of a replay's key
    d = nv46.cuda_defines()
    assert float(d["KV_NVFP4_46_MARGIN"][:-1]) == arch_models.NVFP4_46_MARGIN
    assert "KV_NVFP4_46_MARGIN" not in nv.cuda_defines()


def test_load_order_defaults_and_override(monkeypatch):
    """KV_WRITE_EARLY: 1 for NVFP4 and the codebook presets, 0 for FP8 keys (measured no
    gain there); KVKIT_WRITE_EARLY_LOADS sets it for both kernels and rejects other values."""
    mse, k8v4 = formats.get("turboquant_4bit_nc", 128), formats.get("turboquant_k8v4", 128)
    nv = formats.get("nvfp4_4over6", 64)
    assert tq_launch_defines(mse, "1")["KV_WRITE_EARLY"] == "1"
    assert tq_launch_defines(k8v4, "1")["KV_WRITE_EARLY"] == "0"
    assert nvfp4_launch_defines(nv, "1")["KV_WRITE_EARLY"] == "1"
    monkeypatch.setenv("KVKIT_WRITE_EARLY_LOADS", "0")
    assert tq_launch_defines(mse, "2")["KV_WRITE_EARLY"] == "0"
    assert nvfp4_launch_defines(nv, "0")["KV_WRITE_EARLY"] == "0"
    monkeypatch.setenv("KVKIT_WRITE_EARLY_LOADS", "1")
    assert tq_launch_defines(k8v4, "1")["KV_WRITE_EARLY"] == "1"
    monkeypatch.setenv("KVKIT_WRITE_EARLY_LOADS", "2")
    with pytest.raises(ValueError, match="KVKIT_WRITE_EARLY_LOADS"):
        nvfp4_launch_defines(nv, "1")


def test_warps_default_and_override_keep_the_warps_per_sm(monkeypatch):
    """TQ_WARPS is 4 by default; KVKIT_WRITE_TQ_WARPS (2, 4, 6, 8) changes it, and the CTA caps
    follow so that warps per SM (and with them ptxas's register cap) stay where they were
    measured: MSE keys 9 x 4 = 36 warps on sm_90 and 6 x 4 = 24 elsewhere, rounded down."""
    from kvkit.cuda.write import tq_warps

    fmt = formats.get("turboquant_4bit_nc", 128)
    assert tq_warps() == 4 and tq_launch_defines(fmt, "1")["TQ_WARPS"] == "4"
    expect = {"2": (12, 18), "4": (6, 9), "6": (4, 6), "8": (3, 4)}
    for warps, ctas in expect.items():
        monkeypatch.setenv("KVKIT_WRITE_TQ_WARPS", warps)
        defines = tq_launch_defines(fmt, "1")
        assert defines["TQ_WARPS"] == warps
        assert (int(defines["TQ_MIN_CTAS"]), int(defines["TQ_MIN_CTAS_SM90"])) == ctas
        assert tq_min_ctas(fmt, "0") == (1, 1)  # no cap stays no cap
    monkeypatch.setenv("KVKIT_WRITE_TQ_WARPS", "6")
    assert tq_min_ctas(formats.get("turboquant_k8v4", 128), "1") == (5, 10)  # 8 x 4, 16 x 4
    monkeypatch.setenv("KVKIT_WRITE_TQ_MIN_CTAS", "7")  # an explicit cap is taken as given
    assert tq_min_ctas(fmt, "1") == (7, 7)


def test_nvfp4_min_ctas_override(monkeypatch):
    """KVKIT_WRITE_NVFP4_MIN_CTAS (1..16, A/B sweeps) reaches the launch defines; unset, the
    kernel keeps its own (no define)."""
    fmt = formats.get("nvfp4_4over6", 128)
    monkeypatch.delenv("KVKIT_WRITE_NVFP4_MIN_CTAS", raising=False)
    assert "KV_WRITE_NVFP4_MIN_CTAS" not in nvfp4_launch_defines(fmt, "1")
    monkeypatch.setenv("KVKIT_WRITE_NVFP4_MIN_CTAS", "8")
    assert nvfp4_launch_defines(fmt, "1")["KV_WRITE_NVFP4_MIN_CTAS"] == "8"
    monkeypatch.setenv("KVKIT_WRITE_NVFP4_MIN_CTAS", "17")
    with pytest.raises(ValueError, match="KVKIT_WRITE_NVFP4_MIN_CTAS"):
        nvfp4_launch_defines(fmt, "1")
