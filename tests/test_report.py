"""kvkit report: a small run through the CLI, its JSON, its sanity relations and its plots.

The bounds below are sanity bounds on a small synthetic run, not numerical contracts: they
catch a report that measures the wrong thing (a swapped argument, a missing dequantize), and
leave room for any correct quantizer.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kvkit import cli, report

pytest.importorskip("matplotlib")

FORMATS = ("fp16", "turboquant_4bit_nc", "turboquant_3bit_nc")
MARGINS = (0.25, 1.0, 4.0)
ARGS = [
    "report", "--formats", ",".join(FORMATS), "--tokens", "256", "--sequences", "2",
    "--trials", "300", "--margins", ",".join(map(str, MARGINS)), "--seed", "3", "--no-progress",
]  # fmt: skip

#: fp16 rounds to 2^-11 relative; everything built on it (K, V, scores, output) stays far
#: below 1e-2 relative on the synthetic data (|x| < 100).
FP16_MAX_REL_ERROR = 1e-2
#: fp16's attention TV distance: logit errors of ~1e-3 move softmax weights by ~1e-3.
FP16_MAX_TV = 1e-2
#: The mean needle rate over formats may dip between margins by this much (trial noise).
NEEDLE_MONOTONE_SLACK = 0.02
#: A plot with axes, points and labels is tens of KB; an empty figure is a few KB.
MIN_PNG_BYTES = 10_000


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    assert cli.main([*ARGS, "--out", str(out)]) == 0
    return out, json.loads((out / report.JSON_NAME).read_text())


def _by_format(data):
    return {r["format"]: r for r in data["results"]}


def test_json_has_every_format_settings_and_finite_numbers(run):
    _, data = run
    res = _by_format(data)
    assert list(res) == list(FORMATS)
    assert data["seed"] == 3
    assert data["settings"]["tokens"] == 256 and data["settings"]["trials"] == 300
    assert data["settings"]["margins"] == list(MARGINS)
    for r in data["results"]:
        assert len(r["needle_rate"]) == len(MARGINS)
        for key, value in r.items():
            if key == "format":
                continue
            for x in value if isinstance(value, list) else [value]:
                assert isinstance(x, (int, float)) and math.isfinite(x), (r["format"], key)
        assert 0.0 <= min(r["needle_rate"]) <= max(r["needle_rate"]) <= 1.0
    assert res["fp16"]["bits_per_element"] == 16.0
    assert res["turboquant_4bit_nc"]["bytes_per_token_head"] == 134  # vLLM's PRESET_EXPECTED
    assert res["turboquant_3bit_nc"]["capacity_vs_fp16"] == pytest.approx(512 / 102)


def test_fp16_is_nearly_exact(run):
    _, data = run
    fp16 = _by_format(data)["fp16"]
    for key in ("k_rel_error", "v_rel_error", "score_rel_rms", "output_rel_error"):
        assert fp16[key] < FP16_MAX_REL_ERROR, key
    assert abs(fp16["score_slope"] - 1.0) < FP16_MAX_REL_ERROR
    assert fp16["attention_tv"] < FP16_MAX_TV
    assert fp16["needle_rate"][-1] == 1.0


def test_three_bits_are_worse_than_four(run):
    _, data = run
    res = _by_format(data)
    b3, b4 = res["turboquant_3bit_nc"], res["turboquant_4bit_nc"]
    for key in ("k_rel_error", "v_rel_error", "score_rms_logits", "attention_tv"):
        assert b3[key] > b4[key], key
    assert b3["output_rel_error"] > b4["output_rel_error"]
    assert res["fp16"]["output_rel_error"] < b4["output_rel_error"]


def test_needle_rate_grows_with_the_margin(run):
    _, data = run
    mean = np.mean([r["needle_rate"] for r in data["results"]], axis=0)
    assert np.all(np.diff(mean) >= -NEEDLE_MONOTONE_SLACK), mean
    assert mean[-1] > mean[0]


def test_plots_exist_and_are_not_empty(run):
    out, _ = run
    for name in (report.PLOT_ERROR_VS_BITS, report.PLOT_CAPACITY, report.PLOT_NEEDLE):
        path = out / name
        assert path.is_file(), name
        assert path.stat().st_size > MIN_PNG_BYTES, (name, path.stat().st_size)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_same_seed_same_numbers(run):
    _, data = run
    cfg = report.ReportConfig(
        tokens=256, sequences=2, trials=300, margins=MARGINS, seed=3, formats=FORMATS[:2]
    )
    again = [r.__dict__ for r in report.run_report(cfg)]
    assert again == data["results"][:2]


def test_bad_arguments_are_user_errors(capsys):
    assert cli.main(["report", "--formats", "nope", "--no-progress"]) == 2
    assert "unknown format" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["report", "--margins", "-1"])
