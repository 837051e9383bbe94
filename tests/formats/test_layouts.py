"""Published byte counts and the registry's argument checks."""

from __future__ import annotations

import numpy as np
import pytest

from kvkit import formats

# vLLM's TurboQuant slot sizes (its unit test asserts the D=128 ones; D=64/256 from the same
# formulas, ../shared/reference/FACTS.md).
PUBLISHED_TQ_SLOTS = {
    64: {
        "turboquant_k8v4": 100,
        "turboquant_4bit_nc": 70,
        "turboquant_k3v4_nc": 62,
        "turboquant_3bit_nc": 54,
    },
    128: {
        "turboquant_k8v4": 196,
        "turboquant_4bit_nc": 134,
        "turboquant_k3v4_nc": 118,
        "turboquant_3bit_nc": 102,
    },
    256: {
        "turboquant_k8v4": 388,
        "turboquant_4bit_nc": 262,
        "turboquant_k3v4_nc": 230,
        "turboquant_3bit_nc": 198,
    },
}


@pytest.mark.parametrize("head_dim", sorted(PUBLISHED_TQ_SLOTS))
def test_turboquant_slot_sizes_equal_published_ones(head_dim):
    for name, nbytes in PUBLISHED_TQ_SLOTS[head_dim].items():
        fmt = formats.get(name, head_dim)
        assert fmt.slot_bytes == nbytes
        assert fmt.bytes_per_token_head == nbytes
        assert fmt.planes["slots"].width == nbytes


def test_nvfp4_and_dense_byte_counts():
    # NVFP4 at D=128: 64 data + 8 scale bytes per vector (FACTS.md), K and V.
    assert formats.get("nvfp4", 128).bytes_per_token_head == 2 * (64 + 8)
    assert formats.get("nvfp4_4over6", 128).bytes_per_token_head == 144
    assert formats.get("fp8_e4m3", 128).bytes_per_token_head == 256
    assert formats.get("fp16", 128).bytes_per_token_head == 512
    assert formats.get("bf16", 128).bytes_per_token_head == 512
    assert formats.get("turboquant_k8v4", 80).bytes_per_token_head == 80 + 40 + 4


def test_turboquant_field_offsets_at_d128():
    f = formats.get("turboquant_3bit_nc", 128)
    assert (f.key_index_bytes, f.key_norm_offset, f.value_offset) == (48, 48, 50)
    assert (f.value_scale_offset, f.value_zero_offset, f.slot_bytes) == (98, 100, 102)
    f = formats.get("turboquant_k8v4", 128)
    assert (f.key_bytes, f.value_offset, f.value_scale_offset) == (128, 128, 192)


def test_names_and_attributes():
    assert set(formats.names()) == {
        "fp16", "bf16", "fp8_e4m3", "nvfp4", "nvfp4_4over6", "turboquant_k8v4",
        "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc",
    }  # fmt: skip
    for name in formats.names():
        f = formats.get(name, 128)
        assert f.name == name and f.head_dim == 128
    assert formats.get("nvfp4", 64).has_global_scales
    assert formats.get("turboquant_k8v4", 64).has_global_scales
    assert not formats.get("turboquant_4bit_nc", 64).has_global_scales
    assert formats.get("nvfp4", 64) == formats.get("nvfp4", 64)


@pytest.mark.parametrize(
    "name, head_dim, options, error",
    [
        ("nope", 128, {}, ValueError),
        ("fp16", 100, {}, ValueError),
        ("fp16", 0, {}, ValueError),
        ("fp16", 128.0, {}, TypeError),
        ("nvfp4", 24, {}, ValueError),
        ("turboquant_4bit_nc", 96, {}, ValueError),
        ("turboquant_4bit_nc", 512, {}, ValueError),
        ("turboquant_4bit_nc", 128, {"rotation": "random"}, ValueError),
        ("turboquant_4bit_nc", 128, {"codebook": [0.1, 0.2]}, ValueError),
        ("turboquant_4bit_nc", 128, {"codebook": np.linspace(1, -1, 16)}, ValueError),
        ("turboquant_4bit_nc", 128, {"bits": 4}, TypeError),
        ("turboquant_k8v4", 128, {"codebook": np.zeros(16)}, ValueError),
        ("nvfp4", 128, {"rotation": "hadamard"}, TypeError),
    ],
)
def test_bad_arguments_raise(name, head_dim, options, error):
    with pytest.raises(error):
        formats.get(name, head_dim, **options)


def test_fp8_key_presets_accept_non_power_of_two_head_dims():
    assert formats.get("turboquant_k8v4", 96).slot_bytes == 96 + 48 + 4


def test_cuda_defines_render_the_layout():
    d = formats.get("turboquant_4bit_nc", 128).cuda_defines()
    assert d["TQ_SLOT_BYTES"] == "134" and d["KV_HEAD_DIM"] == "128"
    cents = [float(x.rstrip("f")) for x in d["TQ_CENTROIDS"].strip("{}").split(",")]
    np.testing.assert_array_equal(
        np.float32(cents), formats.get("turboquant_4bit_nc", 128).centroids
    )
    assert formats.get("nvfp4_4over6", 64).cuda_defines()["KV_NVFP4_FOUR_OVER_SIX"] == "1"
