"""The `kvkit` command line: argument parsing and the demo end to end on a small case."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from kvkit.cli import build_parser, main, parse_formats

# ------------------------------------------------------------------------------ parsing


def test_demo_defaults():
    args = build_parser().parse_args(["demo"])
    assert args.command == "demo"
    assert args.backend == "cpu"
    assert args.head_dim == 128
    assert args.seq_len == 2048
    assert args.batch == 2
    assert args.formats is None  # resolved to kvkit.formats.names() when the demo runs
    assert args.seed == 0


def test_demo_options():
    args = build_parser().parse_args(
        ["demo", "--backend", "cuda", "--head-dim", "64", "--seq-len", "100", "--batch", "3",
         "--formats", "fp16, nvfp4,,fp16", "--seed", "7"]
    )  # fmt: skip
    assert (args.backend, args.head_dim, args.seq_len, args.batch, args.seed) == (
        "cuda", 64, 100, 3, 7
    )  # fmt: skip
    assert args.formats == ["fp16", "nvfp4"]


def test_parse_formats():
    assert parse_formats("a,b , a,,c") == ["a", "b", "c"]


@pytest.mark.parametrize(
    "argv",
    [
        [],  # a command is required
        ["nope"],
        ["demo", "--backend", "tpu"],
        ["demo", "--head-dim", "0"],
        ["demo", "--seq-len", "x"],
        ["demo", "--batch", "-1"],
        ["demo", "--formats", " , "],
        ["demo", "--seed", "-3"],
    ],
)
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "usage" in capsys.readouterr().err


def test_help_lists_demo(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "demo" in capsys.readouterr().out


def test_python_dash_m_kvkit():
    out = subprocess.run(
        [sys.executable, "-m", "kvkit", "demo", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--head-dim" in out.stdout


# --------------------------------------------------------------------------------- demo


def _table_rows(text: str, names: list[str]) -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        cells = line.split()
        if cells and cells[0] in names:
            assert cells[0] not in rows, f"two rows for {cells[0]}"
            rows[cells[0]] = cells[1:]
    return rows


def _run_demo(capsys, names: list[str] | None, extra: list[str] = ()) -> str:
    argv = ["demo", "--head-dim", "64", "--seq-len", "40", "--batch", "2", "--q-heads", "4",
            "--kv-heads", "2", "--seed", "1", "--repeats", "1", *extra]  # fmt: skip
    if names is not None:
        argv += ["--formats", ",".join(names)]
    assert main(argv) == 0
    return capsys.readouterr().out


def test_demo_all_formats(capsys):
    from kvkit import formats

    names = list(formats.names())
    out = _run_demo(capsys, None)
    rows = _table_rows(out, names)
    assert sorted(rows) == sorted(names), out
    fp16_bytes = formats.get("fp16", head_dim=64).bytes_per_token_head
    for name, cells in rows.items():
        assert len(cells) == 6, (name, cells)
        nbytes, compression, err, top1, write_ms, decode_ms = (float(c) for c in cells)
        for x in (nbytes, compression, err, top1, write_ms, decode_ms):
            assert math.isfinite(x), (name, cells)
        assert nbytes == formats.get(name, head_dim=64).bytes_per_token_head
        assert compression == pytest.approx(fp16_bytes / nbytes, abs=0.006)
        assert 0.0 <= err < 1.0
        assert 0.0 <= top1 <= 1.0
        assert write_ms >= 0.0 and decode_ms >= 0.0
    # Unquantized formats: float16 rounding only, and the same most-attended token.
    assert float(rows["fp16"][2]) < 1e-2
    assert float(rows["fp16"][3]) == 1.0


def test_demo_subset_in_requested_order(capsys):
    from kvkit import formats

    names = list(formats.names())
    picked = [names[-1], names[0]]
    out = _run_demo(capsys, picked)
    rows = _table_rows(out, names)
    assert list(rows) == picked


def test_demo_unknown_format(capsys):
    assert main(["demo", "--formats", "fp16,not_a_format", "--seq-len", "16"]) == 2
    err = capsys.readouterr().err
    assert "not_a_format" in err and "fp16" in err


def test_demo_cuda_without_cupy(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # makes `import cupy` raise ImportError
    assert main(["demo", "--backend", "cuda", "--seq-len", "16"]) == 2
    err = capsys.readouterr().err
    assert "cupy" in err.lower() and "cuda" in err.lower()
