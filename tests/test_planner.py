"""kvkit.planner and `kvkit capacity`: memory sizes, bytes per token, tokens that fit, CLI."""

from __future__ import annotations

import json

import pytest

from kvkit import formats, models, planner
from kvkit.cli import main
from kvkit.models import ModelConfig
from kvkit.planner import (
    bytes_per_token,
    compare,
    parse_memory,
    plan,
    tokens_that_fit,
    window_bytes_per_token,
    window_tokens_reserved,
)

GiB = 2**30
LLAMA8B = models.get("llama-3.1-8b")

# -------------------------------------------------------------------------- memory sizes


@pytest.mark.parametrize(
    "text, expected",
    [
        ("40GiB", 40 * 2**30),
        ("40 GiB", 40 * 2**30),
        ("40gib", 40 * 2**30),
        ("80GB", 80 * 10**9),
        ("1.5TiB", 3 * 2**39),
        ("2TB", 2 * 10**12),
        ("512MiB", 512 * 2**20),
        ("512MB", 512 * 10**6),
        ("4KiB", 4096),
        ("4KB", 4000),
        ("4096", 4096),
        ("4096B", 4096),
        ("1b", 1),
        (".5KiB", 512),
        ("1.", 1),
        ("1.0009KB", 1000),  # rounded down to whole bytes
        (" 7 MiB ", 7 * 2**20),
    ],
)
def test_parse_memory(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "GiB", "40 GiBs", "40XB", "40 G", "-1GiB", "1e9", "inf", "nan", "0", "0GiB", "0.4",
     "4 0GB", "40GiB!", "1,000MB"],
)  # fmt: skip
def test_parse_memory_errors(text):
    with pytest.raises(ValueError):
        parse_memory(text)


def test_parse_memory_type_error():
    with pytest.raises(TypeError):
        parse_memory(40)  # type: ignore[arg-type]


def test_format_bytes():
    assert planner.format_bytes(40 * GiB) == "40 GiB"
    assert planner.format_bytes(24 * 10**9) == "22.35 GiB"
    assert planner.format_bytes(1023) == "1023 B"


# ------------------------------------------------------------------------- bytes per token


def test_bytes_per_token_llama_fp16():
    fmts = LLAMA8B.layer_formats("fp16", boundary_layers=0)
    assert bytes_per_token(fmts, 8) == 32 * 8 * 512 == 131072


@pytest.mark.parametrize(
    "fmt, per_head",
    [("fp16", 512), ("bf16", 512), ("fp8_e4m3", 256), ("nvfp4", 144), ("nvfp4_4over6", 144),
     ("turboquant_k8v4", 196), ("turboquant_4bit_nc", 134), ("turboquant_k3v4_nc", 118),
     ("turboquant_3bit_nc", 102)],
)  # fmt: skip
def test_bytes_per_token_uniform(fmt, per_head):
    # Hand-computed: layers * KV heads * published bytes per token-head at D=128.
    assert plan(LLAMA8B, fmt, GiB, boundary_layers=0).bytes_per_token == 32 * 8 * per_head
    assert plan(models.get("llama-3.3-70b"), fmt, GiB, boundary_layers=0).bytes_per_token == (
        80 * 8 * per_head
    )


def test_bytes_per_token_with_boundary():
    # Llama-3.1-8B, nvfp4 inside, 2 + 2 fp16 layers: 4*8*512 + 28*8*144.
    p = plan(LLAMA8B, "nvfp4", GiB)
    assert p.boundary_layers == 2
    assert p.bytes_per_token == 4 * 8 * 512 + 28 * 8 * 144 == 48640
    # Qwen3-8B, 3bit_nc, 3 + 3 bf16 layers: 6*8*512 + 30*8*102.
    q = plan(models.get("qwen3-8b"), "turboquant_3bit_nc", GiB, boundary_layers=3,
             boundary_format="bf16")  # fmt: skip
    assert q.bytes_per_token == 6 * 8 * 512 + 30 * 8 * 102


def test_boundary_cap_in_plan():
    tiny = ModelConfig("tiny", 3, 2, 64)
    p = plan(tiny, "fp8_e4m3", GiB, boundary_layers=5)
    assert p.boundary_layers == 1
    assert p.bytes_per_token == 2 * 2 * 256 + 1 * 2 * 128


def test_window_bytes_and_scales():
    fmts = LLAMA8B.layer_formats("turboquant_4bit_nc")
    assert window_bytes_per_token(fmts, 8) == 131072  # fp16 in every layer
    assert planner.scale_bytes(LLAMA8B.layer_formats("nvfp4", boundary_layers=0)) == 32 * 8
    assert planner.scale_bytes(fmts) == 0  # MSE-key TurboQuant has no global scales


# -------------------------------------------------------------------------- tokens that fit


def test_tokens_that_fit_basics():
    assert tokens_that_fit(1000, 100) == 10
    assert tokens_that_fit(999, 100) == 9
    assert tokens_that_fit(1000, 100, reserved_bytes=101) == 8
    assert tokens_that_fit(1000, 100, reserved_bytes=5000) == 0
    assert tokens_that_fit(0, 100) == 0
    assert tokens_that_fit(10_000, 100, block_size=16) == 96  # 6 whole pages of 1600 B
    assert tokens_that_fit(1599, 100, block_size=16) == 0


@pytest.mark.parametrize(
    "kwargs",
    [dict(memory_bytes=-1, bytes_per_token=1), dict(memory_bytes=10, bytes_per_token=0),
     dict(memory_bytes=10, bytes_per_token=1, reserved_bytes=-1),
     dict(memory_bytes=10, bytes_per_token=1, block_size=0)],
)  # fmt: skip
def test_tokens_that_fit_errors(kwargs):
    with pytest.raises(ValueError):
        tokens_that_fit(**kwargs)


def test_acceptance_ratios_before_boundary_layers():
    """Issue 5: llama-3.1-8b at 40 GiB, nvfp4/fp8 = 1.78 and turboquant_4bit_nc/fp16 = 3.82."""
    mem = parse_memory("40GiB")
    t = {f: plan(LLAMA8B, f, mem, boundary_layers=0).tokens
         for f in ("fp16", "fp8_e4m3", "nvfp4", "turboquant_4bit_nc")}  # fmt: skip
    assert t["fp16"] == 40 * GiB // 131072 == 327680
    assert t["fp8_e4m3"] == 655360
    assert round(t["nvfp4"] / t["fp8_e4m3"], 2) == 1.78  # 256 / 144 = 1.777...
    assert round(t["turboquant_4bit_nc"] / t["fp16"], 2) == 3.82  # 512 / 134 = 3.8209
    cmp = compare(LLAMA8B, mem)
    assert round(cmp.row("nvfp4").uniform_vs_fp8, 2) == 1.78
    assert round(cmp.row("turboquant_4bit_nc").uniform_vs_fp16, 2) == 3.82


def test_window_reserve():
    mem = 40 * GiB
    p = plan(LLAMA8B, "turboquant_3bit_nc", mem, boundary_layers=0, window=128, sequences=64)
    reserve = 64 * 128 * 131072
    assert p.window_bytes == reserve
    assert p.tokens == (mem - reserve) // (32 * 8 * 102)
    # With pages: 128 + 15 tokens need 9 pages of 16 per sequence.
    assert window_tokens_reserved(128, 16) == 144
    assert window_tokens_reserved(1, 16) == 16
    assert window_tokens_reserved(0, 16) == 0
    assert window_tokens_reserved(100) == 100
    q = plan(LLAMA8B, "turboquant_3bit_nc", mem, boundary_layers=0, window=128, sequences=64,
             block_size=16)  # fmt: skip
    assert q.window_bytes == 64 * 144 * 131072
    assert q.tokens % 16 == 0 and q.num_blocks == q.tokens // 16
    assert q.tokens == (mem - q.window_bytes) // (16 * 32 * 8 * 102) * 16


def test_window_larger_than_memory_gives_zero_and_no_ratios():
    cmp = compare(LLAMA8B, GiB, ["nvfp4"], window=10_000)
    row = cmp.row("nvfp4")
    assert row.uniform.tokens == 0 and row.uniform_vs_fp16 is None
    assert "-" in planner.format_table(cmp)


def test_block_size_rounding():
    p = plan(LLAMA8B, "nvfp4", 40 * GiB, boundary_layers=0, block_size=16)
    assert p.tokens == 1165072 and p.num_blocks == 72817  # 1,165,084 rounded down to 16s
    assert plan(LLAMA8B, "nvfp4", 40 * GiB, boundary_layers=0).num_blocks is None


@pytest.mark.parametrize(
    "kwargs",
    [dict(window=-1), dict(sequences=0), dict(block_size=0), dict(boundary_layers=-1)],
)
def test_plan_errors(kwargs):
    with pytest.raises(ValueError):
        plan(LLAMA8B, "nvfp4", GiB, **kwargs)


def test_compare_default_formats_and_skips():
    cmp = compare(LLAMA8B, 40 * GiB)
    assert [r.format for r in cmp.rows] == formats.names()
    assert cmp.skipped == {}
    odd = compare(ModelConfig("odd", 4, 2, 96), GiB)
    assert set(odd.skipped) == {"turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc"}
    assert "turboquant_k8v4" in [r.format for r in odd.rows]  # FP8 keys take any D % 16 == 0
    with pytest.raises(ValueError):
        compare(ModelConfig("odd", 4, 2, 96), GiB, ["turboquant_4bit_nc"])


def test_compare_boundary_columns():
    cmp = compare(LLAMA8B, 40 * GiB, ["fp8_e4m3", "turboquant_3bit_nc"])
    r = cmp.row("fp8_e4m3")
    assert r.boundary is not None and r.boundary.bytes_per_token == 4 * 8 * 512 + 28 * 8 * 256
    assert r.boundary_vs_fp8 == r.boundary.tokens / 655360
    off = compare(LLAMA8B, 40 * GiB, ["fp8_e4m3"], boundary_layers=0)
    assert off.row("fp8_e4m3").boundary is None and off.boundary_layers == 0
    with pytest.raises(KeyError):
        cmp.row("nvfp4")
    with pytest.raises(ValueError, match="unknown format"):
        compare(LLAMA8B, GiB, boundary_format="fp64", boundary_layers=0)


# ------------------------------------------------------------------------------------- CLI


def _run(argv, capsys):
    rc = main(["capacity", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_table(capsys):
    rc, out, err = _run(["--model", "llama-3.1-8b", "--memory", "40GiB"], capsys)
    assert rc == 0 and err == ""
    assert "llama-3.1-8b: 32 layers, 8 KV heads, head_dim 128" in out
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    for name in formats.names():
        assert name in lines
    assert "327,680" in lines["fp16"]
    assert "655,360" in lines["fp8_e4m3"]
    assert "1.78x" in lines["nvfp4"].split("|")[0]
    assert "3.82x" in lines["turboquant_4bit_nc"].split("|")[0]
    assert "first/last 2 layers fp16" in out


def test_cli_json(capsys):
    rc, out, _ = _run(["--model", "llama-3.1-8b", "--memory", "40GiB", "--json"], capsys)
    assert rc == 0
    d = json.loads(out)
    assert d["memory_bytes"] == 40 * GiB and d["model"]["num_layers"] == 32
    rows = {r["format"]: r for r in d["rows"]}
    assert round(rows["nvfp4"]["uniform"]["ratio_vs_fp8"], 2) == 1.78
    assert round(rows["turboquant_4bit_nc"]["uniform"]["ratio_vs_fp16"], 2) == 3.82
    assert rows["fp16"]["uniform"]["bytes_per_token"] == 131072
    assert rows["nvfp4"]["boundary"]["bytes_per_token"] == 48640
    assert d["baselines"] == {"fp16": 327680, "fp8_e4m3": 655360}


def test_cli_custom_model_and_options(capsys):
    argv = ["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--memory", "40GiB",
            "--formats", "nvfp4,turboquant_4bit_nc", "--boundary-layers", "0", "--window", "128",
            "--sequences", "4", "--block-size", "16", "--json"]  # fmt: skip
    rc, out, _ = _run(argv, capsys)
    assert rc == 0
    d = json.loads(out)
    assert d["model"]["name"] == "custom" and d["model"]["num_q_heads"] is None
    assert [r["format"] for r in d["rows"]] == ["nvfp4", "turboquant_4bit_nc"]
    assert all(r["boundary"] is None for r in d["rows"])
    u = d["rows"][0]["uniform"]
    expected = plan(LLAMA8B, "nvfp4", 40 * GiB, boundary_layers=0, window=128, sequences=4,
                    block_size=16)  # fmt: skip
    assert u["tokens"] == expected.tokens and u["window_bytes"] == 4 * 144 * 131072
    assert u["num_blocks"] == expected.tokens // 16


def test_cli_table_without_boundary_and_with_window(capsys):
    rc, out, _ = _run(["--model", "qwen3-8b", "--memory", "80GB", "--boundary-layers", "0",
                       "--window", "64", "--block-size", "32"], capsys)  # fmt: skip
    assert rc == 0
    assert "first/last" not in out and "|" not in out
    assert "window: the last 64 tokens" in out and "whole blocks of 32" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "llama-4", "--memory", "1GiB"], "unknown model 'llama-4'"),
        (["--model", "llama-3.1-8b", "--layers", "4", "--memory", "1GiB"], "not both"),
        (["--layers", "4", "--kv-heads", "2", "--memory", "1GiB"], "all of"),
        (["--memory", "1GiB"], "give --model"),
        (["--model", "qwen3-8b", "--memory", "1GiB", "--formats", "nvfp5"], "unknown format"),
        (["--model", "qwen3-8b", "--memory", "1GiB", "--boundary-format", "x"], "unknown format"),
        (["--layers", "4", "--kv-heads", "2", "--head-dim", "96", "--memory", "1GiB",
          "--formats", "turboquant_3bit_nc"], "head_dim"),
    ],
)  # fmt: skip
def test_cli_errors(argv, message, capsys):
    rc, out, err = _run(argv, capsys)
    assert rc == 2 and out == ""
    assert err.startswith("kvkit capacity: error:") and message in err


@pytest.mark.parametrize(
    "argv",
    [
        ["--model", "llama-3.1-8b"],  # --memory is required
        ["--model", "llama-3.1-8b", "--memory", "40XB"],
        ["--model", "llama-3.1-8b", "--memory", "0"],
        ["--model", "llama-3.1-8b", "--memory", "1GiB", "--boundary-layers", "-1"],
        ["--model", "llama-3.1-8b", "--memory", "1GiB", "--block-size", "0"],
        ["--model", "llama-3.1-8b", "--memory", "1GiB", "--window", "x"],
    ],
)
def test_cli_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["capacity", *argv])
    assert exc.value.code == 2
    assert "usage" in capsys.readouterr().err


def test_help_lists_capacity(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "capacity" in capsys.readouterr().out
