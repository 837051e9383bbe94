"""kvkit.models: built-in model configs and the boundary-layer policy."""

from __future__ import annotations

import dataclasses

import pytest

from kvkit import formats, models
from kvkit.models import ModelConfig, boundary_layer_count, is_boundary_layer, layer_formats

# ------------------------------------------------------------------------------- configs

# (layers, KV heads, head_dim, q heads) from the models' public config.json files.
PUBLIC = {
    "llama-3.1-8b": (32, 8, 128, 32),
    "llama-3.3-70b": (80, 8, 128, 64),
    "qwen3-8b": (36, 8, 128, 32),
    "mistral-7b": (32, 8, 128, 32),
}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_builtin_configs(name):
    m = models.get(name)
    assert (m.num_layers, m.num_kv_heads, m.head_dim, m.num_q_heads) == PUBLIC[name]
    assert m.name == name


def test_names_lists_builtins():
    assert sorted(models.names()) == sorted(PUBLIC)


@pytest.mark.parametrize(
    "alias", ["Llama-3.1-8B", " llama-3.1-8b ", "meta-llama/Llama-3.1-8B", "LLAMA-3.1-8B"]
)
def test_get_is_case_insensitive_and_drops_org(alias):
    assert models.get(alias) is models.MODELS["llama-3.1-8b"]


@pytest.mark.parametrize("name", ["llama-3-8b", "", "gpt-5", "llama-3.1-8b-instruct"])
def test_unknown_model_raises_with_known_names(name):
    with pytest.raises(ValueError, match="unknown model.*llama-3.1-8b"):
        models.get(name)


def test_get_rejects_non_string():
    with pytest.raises(TypeError):
        models.get(8)  # type: ignore[arg-type]


def test_config_is_frozen():
    m = models.get("qwen3-8b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.num_layers = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    "args, exc",
    [
        (("x", 0, 8, 128, 32), ValueError),
        (("x", 32, 0, 128, 32), ValueError),
        (("x", 32, 8, 0, 32), ValueError),
        (("x", 32, 8, 128, 12), ValueError),  # q heads not a multiple of KV heads
        (("x", 32.0, 8, 128, 32), TypeError),
        (("x", True, 8, 128, 32), TypeError),
        (("", 32, 8, 128, 32), ValueError),
    ],
)
def test_config_validation(args, exc):
    with pytest.raises(exc):
        ModelConfig(*args)


def test_q_heads_optional():
    assert ModelConfig("custom", 4, 2, 64).num_q_heads is None


# ------------------------------------------------------------------------- boundary policy


@pytest.mark.parametrize(
    "layers, n, expected",
    [
        (32, 2, 2),
        (32, 0, 0),
        (32, 16, 16),
        (32, 17, 16),  # capped at L // 2
        (5, 3, 2),
        (3, 2, 1),
        (2, 2, 1),
        (1, 2, 0),  # a 1-layer model has no boundary layers
    ],
)
def test_boundary_layer_count(layers, n, expected):
    assert boundary_layer_count(layers, n) == expected


def test_boundary_layer_count_default_is_two():
    assert boundary_layer_count(32) == 2 == models.DEFAULT_BOUNDARY_LAYERS


@pytest.mark.parametrize("layers, n", [(0, 2), (32, -1)])
def test_boundary_layer_count_rejects(layers, n):
    with pytest.raises(ValueError):
        boundary_layer_count(layers, n)


@pytest.mark.parametrize("layers", [1, 2, 3, 4, 5, 8, 32, 80])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 40, 100])
def test_layer_formats_counts(layers, n):
    fmts = layer_formats(layers, "turboquant_3bit_nc", 128, boundary_layers=n)
    assert len(fmts) == layers
    k = min(n, layers // 2)
    names = [f.name for f in fmts]
    assert names[:k] == ["fp16"] * k
    assert names[layers - k :] == ["fp16"] * k
    assert names[k : layers - k] == ["turboquant_3bit_nc"] * (layers - 2 * k)
    assert names.count("fp16") == 2 * k
    assert [is_boundary_layer(i, layers, n) for i in range(layers)] == [
        name == "fp16" for name in names
    ]


def test_layer_formats_default_policy():
    fmts = layer_formats(32, "nvfp4", 128)
    assert [f.name for f in fmts] == ["fp16"] * 2 + ["nvfp4"] * 28 + ["fp16"] * 2
    assert all(f.head_dim == 128 for f in fmts)
    assert fmts[2] is fmts[29]  # one immutable object per distinct format


def test_layer_formats_zero_disables():
    fmts = layer_formats(32, "nvfp4", 128, boundary_layers=0)
    assert {f.name for f in fmts} == {"nvfp4"}


def test_layer_formats_boundary_format_and_options():
    fmts = layer_formats(
        8, "turboquant_4bit_nc", 64, boundary_layers=1, boundary_format="bf16", rotation="hadamard"
    )
    assert [f.name for f in fmts] == ["bf16"] + ["turboquant_4bit_nc"] * 6 + ["bf16"]
    assert fmts[1] == formats.get("turboquant_4bit_nc", 64, rotation="hadamard")
    assert fmts[1].rotation == "hadamard"


def test_layer_formats_errors():
    with pytest.raises(ValueError, match="unknown format"):
        layer_formats(32, "nvfp5", 128)
    with pytest.raises(ValueError, match="unknown format"):
        layer_formats(32, "nvfp4", 128, boundary_format="fp32")
    with pytest.raises(ValueError):
        layer_formats(32, "turboquant_4bit_nc", 96)  # MSE keys need a power-of-two D


def test_model_config_layer_formats():
    m = models.get("llama-3.3-70b")
    fmts = m.layer_formats("fp8_e4m3", boundary_layers=3)
    assert len(fmts) == 80
    assert [f.name for f in fmts].count("fp16") == 6


def test_layer_formats_build_a_cache():
    from kvkit import PagedKVCache

    fmts = layer_formats(6, "turboquant_k3v4_nc", 64, boundary_layers=2)
    cache = PagedKVCache(fmts, 6, 2, 4, 16)
    assert [f.name for f in cache.formats] == [f.name for f in fmts]
