"""The decode launcher's build defaults that follow from a format's planes (no GPU needed)."""

from __future__ import annotations

import pytest

from kvkit import formats
from kvkit.cuda.decode import ROW_RUNS_MIN_WIDTH, row_runs_default


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("name", formats.names())
def test_row_runs_default_follows_row_widths(name, head_dim):
    # Row planes per DESIGN.md section 3: fp16 / bf16 rows of 2 D bytes, fp8 rows of D bytes,
    # NVFP4 code rows of D / 2 bytes (its D / 16-byte scale rows are never whole 32-byte
    # chunk pairs); TurboQuant has one slot plane (134 bytes at D = 128: no row runs).
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
