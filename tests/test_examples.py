"""The examples run (CPU ones here; CUDA ones are marked gpu) and can fail when they should."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("fmt, d", [("turboquant_3bit_nc", 64), ("nvfp4_4over6", 32), ("bf16", 16)])
def test_fuzz_layout_example_passes(fmt, d, capsys):
    assert (
        load("fuzz_layout").main(["--format", fmt, "--head-dim", str(d), "--examples", "15"]) == 0
    )
    assert "no layout error found" in capsys.readouterr().out


def test_fuzz_layout_example_catches_a_corrupted_write(monkeypatch, capsys):
    module = load("fuzz_layout")
    real_write = module.kvkit.write_kv

    def corrupting_write(layer, k, v, slots, **kw):
        real_write(layer, k, v, slots, **kw)
        live = np.flatnonzero(np.asarray(slots) >= 0)
        if live.size:  # flip one bit of the first written slot
            blk, off = divmod(int(slots[live[0]]), layer.block_size)
            plane = next(iter(layer.planes.values())).view(np.uint8)
            plane[blk, 0, off, 0] ^= 1

    monkeypatch.setattr(module.kvkit, "write_kv", corrupting_write)
    assert (
        module.main(["--format", "turboquant_4bit_nc", "--head-dim", "64", "--examples", "10"]) == 1
    )
    assert "FAILED" in capsys.readouterr().out


def test_numpy_decode_loop_example_matches_float64():
    import subprocess
    import sys

    cmd = [sys.executable, str(EXAMPLES / "numpy_decode_loop.py"), "--layers", "5",
           "--steps", "40", "--window", "16", "--check-every", "13", "--boundary", "1"]  # fmt: skip
    env = {**__import__("os").environ, "PYTHONPATH": str(EXAMPLES.parent)}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "worst relative error" in out.stdout
    assert "2 fp16 boundary, 3 turboquant_4bit_nc" in out.stdout


@pytest.mark.gpu
def test_cupy_decode_loop_example():
    import subprocess
    import sys

    cmd = [sys.executable, str(EXAMPLES / "cupy_decode_loop.py"), "--layers", "5",
           "--steps", "40", "--window", "16", "--check-every", "13", "--boundary", "1"]  # fmt: skip
    env = {**__import__("os").environ, "PYTHONPATH": str(EXAMPLES.parent)}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "cuda" in out.stdout and "worst relative error" in out.stdout


@pytest.mark.gpu
def test_torch_nvfp4_example():
    pytest.importorskip("torch")
    from kvkit.testing.tolerance import DECODE_GPU_RTOL

    assert load("torch_nvfp4").main(batch=2, seq_len=300) <= DECODE_GPU_RTOL
