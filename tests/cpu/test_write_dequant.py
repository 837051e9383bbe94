"""CPU write/dequantize kernels against the spec's reference quantizer, Hypothesis-fuzzed.

Strategies derive from kvkit.formats: every format, its legal head dims, every block size,
head counts, slot mappings with padding and gaps, fp16/bf16/fp32 inputs up to +-60000.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import example, given
from hypothesis import strategies as st

import kvkit
from kvkit import formats
from kvkit.cache import BLOCK_SIZES

MSE_DIMS = (64, 128, 256)
OTHER_DIMS = (16, 32, 48, 64, 96, 128, 256)


def legal_dims(name: str) -> tuple[int, ...]:
    fmt_is_mse = name.startswith("turboquant") and name != "turboquant_k8v4"
    return MSE_DIMS if fmt_is_mse else OTHER_DIMS


@st.composite
def write_cases(draw):
    name = draw(st.sampled_from(formats.names()))
    d = draw(st.sampled_from(legal_dims(name)))
    block_size = draw(st.sampled_from(BLOCK_SIZES))
    heads = draw(st.integers(1, 3))
    num_blocks = draw(st.integers(1, 3))
    capacity = num_blocks * block_size
    n = draw(st.integers(1, min(capacity, 40)))
    seed = draw(st.integers(0, 2**32 - 1))
    dtype = draw(st.sampled_from(["float32", "float16", "bfloat16"]))
    magnitude = draw(st.sampled_from([1e-3, 1.0, 30.0, 60000.0]))
    padding = draw(st.floats(0.0, 0.5))
    return name, d, block_size, heads, num_blocks, n, seed, dtype, magnitude, padding


def make_inputs(d, heads, n, seed, dtype, magnitude, capacity, padding):
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((n, heads, d)) * magnitude
    v = rng.standard_normal((n, heads, d)) * magnitude
    k[..., : max(1, d // 32)] *= 4  # outlier channels
    cap = 60000.0
    k, v = np.clip(k, -cap, cap), np.clip(v, -cap, cap)
    cast = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    k, v = k.astype(cast), v.astype(cast)
    slots = rng.permutation(capacity)[:n].astype(rng.choice([np.int32, np.int64]))
    slots[rng.random(n) < padding] = -1
    return k, v, slots


@given(write_cases())
@example(("turboquant_3bit_nc", 64, 16, 1, 1, 16, 0, "float32", 60000.0, 0.0))
@example(("nvfp4_4over6", 16, 16, 2, 1, 5, 1, "float16", 1e-3, 0.3))
# Found by the deep profile: every slot padding, the reference got zero rows to reshape.
@example(("nvfp4", 16, 16, 1, 1, 1, 0, "float32", 0.001, 0.5))
def test_write_bytes_equal_the_reference_quantizer(case):
    name, d, bs, heads, num_blocks, n, seed, dtype, magnitude, padding = case
    fmt = formats.get(name, d)
    cache = kvkit.PagedKVCache(fmt, 1, heads, num_blocks, bs)
    layer = cache.layer(0)
    k, v, slots = make_inputs(d, heads, n, seed, dtype, magnitude, num_blocks * bs, padding)
    if fmt.has_global_scales:
        layer.k_scale = fmt.calibrate(k.astype(np.float32))
        layer.v_scale = fmt.calibrate(v.astype(np.float32))
    kvkit.write_kv(layer, k, v, slots)

    live = slots >= 0
    ref = fmt.encode(
        k[live].astype(np.float32), v[live].astype(np.float32), layer.k_scale, layer.v_scale
    )
    blocks, offsets = np.divmod(slots[live].astype(np.int64), bs)
    written = np.zeros((num_blocks, bs), bool)
    written[blocks, offsets] = True
    for plane, arr in layer.planes.items():
        np.testing.assert_array_equal(arr[blocks, :, offsets, :], ref[plane], err_msg=plane)
        # every slot the mapping did not name is still all zero
        untouched = arr.transpose(0, 2, 1, 3)[~written]
        assert not untouched.view(np.uint8).any(), plane

    k_out, v_out = kvkit.dequantize(layer, slots)
    rk, rv = fmt.decode(ref, layer.k_scale, layer.v_scale)
    np.testing.assert_array_equal(k_out[live], rk)
    np.testing.assert_array_equal(v_out[live], rv)
    assert not k_out[~live].any() and not v_out[~live].any()


def test_token_major_views_are_written_through_strides():
    # An NHD view of the same memory: planes indexed (block, head, token, byte) by stride.
    fmt = formats.get("turboquant_4bit_nc", 64)
    cache = kvkit.PagedKVCache(fmt, 1, 2, 2, 16)
    layer = cache.layer(0)
    nhd = np.zeros((2, 16, 2, fmt.slot_bytes), np.uint8)
    layer.planes["slots"] = nhd.transpose(0, 2, 1, 3)
    rng = np.random.default_rng(0)
    k = rng.standard_normal((3, 2, 64)).astype(np.float32)
    kvkit.write_kv(layer, k, k, np.array([0, 17, 31]))
    ref = fmt.encode(k, k)["slots"]
    np.testing.assert_array_equal(nhd[0, 0], ref[0])
    np.testing.assert_array_equal(nhd[1, 1], ref[1])
    np.testing.assert_array_equal(nhd[1, 15], ref[2])


def test_rewriting_a_slot_replaces_its_bytes():
    fmt = formats.get("turboquant_3bit_nc", 128)
    layer = kvkit.PagedKVCache(fmt, 1, 1, 1, 16).layer(0)
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((1, 1, 128)).astype(np.float32) for _ in range(2))
    kvkit.write_kv(layer, a, a, np.array([5]))
    kvkit.write_kv(layer, b, b, np.array([5]))
    np.testing.assert_array_equal(layer.planes["slots"][0, 0, 5], fmt.encode(b, b)["slots"][0, 0])
