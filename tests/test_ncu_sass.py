"""scripts/ncu_sass.py on a hand-made Nsight Compute source CSV (no GPU, no ncu)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("ncu_sass", ROOT / "scripts" / "ncu_sass.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_classes_opcodes_and_hot_lines(tmp_path):
    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
              "stall_wait", "stall_short_sb", "stall_barrier (Not Issued)"]  # fmt: skip
    rows = [
        ["0x10", "LDS.64 R2, [R4]", "30", "400", "0", "30", "0"],  # 4 per unit
        ["0x20", "HMMA.16816.F32 R8, R2, R6, R8", "50", "100", "40", "10", "9"],  # 1 per unit
        ["0x30", "@!P0  BRA 0x40", "20", "1,000", "20", "0", "0"],  # 10 per unit
    ]
    text = '"Kernel Name","k",\n' + "\n".join(
        ",".join(f'"{c}"' for c in line) for line in [header, *rows]
    )
    path = tmp_path / "k.sass.csv"
    path.write_text(text)
    out = _module().summarize(path, unit=100, top=2).splitlines()
    assert out[0].startswith("k.sass.csv: 1500 warp instructions, 100 stall samples, 15 per unit")
    ops = {line.split()[0]: line.split()[1:] for line in out[2:5]}
    assert ops["BRA"] == ["66.7", "20.0"] and ops["LDS"] == ["26.7", "30.0"]
    assert ops["HMMA"] == ["6.7", "50.0"]
    classes = [line.split()[0] for line in out[6:9]]
    assert classes == ["x10.0", "x4.0", "x1.0"]
    assert "stall samples by reason: wait:60 short_sb:40" in out  # not-issued left out
    hot = out[-2:]
    assert hot[0].startswith("50.00% x1.00") and "wait:40 short_sb:10" in hot[0]
    assert "barrier" not in hot[0]  # not-issued columns are not reasons
    assert hot[1].startswith("30.00% x4.00") and hot[1].endswith("short_sb:30")
