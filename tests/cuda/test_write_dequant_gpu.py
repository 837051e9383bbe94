"""CUDA write / dequantize kernels against the Numba backend: identical bytes, identical floats.

Every test is ``@pytest.mark.gpu``. The launchers ``kvkit.cuda.write.write_rows`` and
``kvkit.cuda.dequant.dequantize_rows`` are called directly on a ``backend="cuda"`` layer; the
reference is the same inputs, widened to float32 exactly, written into a CPU layer by
``kvkit.cpu.backend.write_rows``. Both caches start from the same random bytes, so comparing
whole planes also proves that skipped slots are left alone and that every byte of a written
slot is written.

Fuzzed (Hypothesis): every format, its legal head dims, block sizes 16..128, head counts,
slot mappings with padding and gaps (int32 and int64), fp16/bf16/fp32 inputs, magnitudes up
to 60000, rows with NaN / inf / -0 / denormals / all-NaN / all-zero. The suite is run natively
and with ``KVKIT_ARCH=sm_80`` / ``sm_89`` (PTX overrides), so nothing here names an arch.

Float comparisons are bitwise, except that two NaNs compare equal whatever their payloads:
a NaN produced by GPU arithmetic carries the canonical payload 0x7FFFFFFF, the CPU's does not
(the kernels copy a NaN operand through as the CPU does; only invalid operations on garbage
bytes can still differ in payload).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import kvkit
from kvkit import formats
from kvkit.cache import BLOCK_SIZES
from kvkit.cpu import backend as cpu_backend
from kvkit.formats import codecs

pytestmark = pytest.mark.gpu

MSE_DIMS = (64, 128, 256)
OTHER_DIMS = (16, 32, 48, 64, 96, 128, 192, 256, 512)  # 192: E = 6, 12-byte lane pieces
IN_DTYPES = ("float32", "float16", "bfloat16")
SPECIAL_VALUES = np.array(
    [np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-40, -1e-40, 3e-6, -6e-8, 60000.0, -60000.0],
    dtype=np.float32,
)


def legal_dims(name: str) -> tuple[int, ...]:
    is_mse = name.startswith("turboquant") and name != "turboquant_k8v4"
    return MSE_DIMS if is_mse else OTHER_DIMS


@st.composite
def cases(draw):
    name = draw(st.sampled_from(formats.names()))
    return dict(
        name=name,
        d=draw(st.sampled_from(legal_dims(name))),
        bs=draw(st.sampled_from(BLOCK_SIZES)),
        heads=draw(st.integers(1, 4)),
        num_blocks=draw(st.integers(1, 4)),
        n=draw(st.integers(1, 48)),
        seed=draw(st.integers(0, 2**32 - 1)),
        dtype=draw(st.sampled_from(IN_DTYPES)),
        magnitude=draw(st.sampled_from([1e-3, 1.0, 30.0, 60000.0])),
        padding=draw(st.floats(0.0, 0.5)),
        specials=draw(st.booleans()),
        scale=draw(st.sampled_from(["one", "calibrate", "odd"])),
        slot_dtype=draw(st.sampled_from(["int32", "int64"])),
    )


def make_inputs(c):
    """(k32, v32 float32 (N, H, D) exact widenings, k_in, v_in in the input dtype, slots)."""
    rng = np.random.default_rng(c["seed"])
    capacity = c["num_blocks"] * c["bs"]
    n = min(c["n"], capacity)
    shape = (n, c["heads"], c["d"])
    k = rng.standard_normal(shape) * c["magnitude"]
    v = rng.standard_normal(shape) * c["magnitude"]
    k[..., : max(1, c["d"] // 32)] *= 4  # outlier channels
    k = np.clip(k, -60000.0, 60000.0).astype(np.float32)
    v = np.clip(v, -60000.0, 60000.0).astype(np.float32)
    if c["specials"]:
        for x in (k, v):
            for _ in range(3):  # scattered special values
                t, h = rng.integers(n), rng.integers(c["heads"])
                idx = rng.choice(c["d"], size=rng.integers(1, 5), replace=False)
                x[t, h, idx] = rng.choice(SPECIAL_VALUES, size=idx.size)
            t, h = rng.integers(n), rng.integers(c["heads"])
            kind = rng.integers(3)
            if kind == 0:
                x[t, h] = np.nan
            elif kind == 1:  # +0 / -0 mixed: the sign of the first-occurring minimum matters
                x[t, h] = np.where(rng.random(c["d"]) < 0.5, -0.0, 0.0)
            else:
                x[t, h] = np.float32(rng.standard_normal())
    if c["dtype"] == "float16":
        with np.errstate(over="ignore"):
            k_in, v_in = k.astype(np.float16), v.astype(np.float16)
        k32, v32 = k_in.astype(np.float32), v_in.astype(np.float32)
    elif c["dtype"] == "bfloat16":
        k_in, v_in = codecs.bf16_bits_array(k), codecs.bf16_bits_array(v)
        k32, v32 = codecs.bf16_values_array(k_in), codecs.bf16_values_array(v_in)
    else:
        k_in, v_in, k32, v32 = k, v, k, v
    slots = rng.permutation(capacity)[:n].astype(c["slot_dtype"])
    slots[rng.random(n) < c["padding"]] = -1
    return k32, v32, k_in, v_in, slots


def make_layers(fmt, heads, num_blocks, bs, seed, scales=(1.0, 1.0)):
    """(cpu layer, cuda layer) holding the same random plane bytes and global scales."""
    import cupy

    cpu = kvkit.PagedKVCache(fmt, 1, heads, num_blocks, bs).layer(0)
    gpu = kvkit.PagedKVCache(fmt, 1, heads, num_blocks, bs, backend="cuda").layer(0)
    rng = np.random.default_rng(seed ^ 0x5EED)
    for name, arr in cpu.planes.items():
        arr.view(np.uint8)[...] = rng.integers(0, 256, arr.view(np.uint8).shape, dtype=np.uint8)
        gpu.planes[name][...] = cupy.asarray(arr)
    if fmt.has_global_scales:
        for layer in (cpu, gpu):
            layer.k_scale, layer.v_scale = scales
    return cpu, gpu


def pick_scales(fmt, mode, k32, v32):
    if not fmt.has_global_scales or mode == "one":
        return 1.0, 1.0
    if mode == "odd":
        return 0.3712, 7.25
    finite = [x[np.isfinite(x)] for x in (k32, v32)]
    return tuple(fmt.calibrate(x) if x.size else 1.0 for x in finite)


def plane_bytes(layer) -> dict[str, np.ndarray]:
    out = {}
    for name, arr in layer.planes.items():
        host = arr if isinstance(arr, np.ndarray) else arr.get()
        out[name] = np.array(host, copy=True, order="C").view(np.uint8)
    return out


def assert_planes_equal(cpu, gpu, context=""):
    a, b = plane_bytes(cpu), plane_bytes(gpu)
    for name in a:
        diff = np.flatnonzero(a[name] != b[name])
        assert diff.size == 0, (
            f"{context} plane {name}: {diff.size} bytes differ, first at flat {diff[:8]}: "
            f"cpu {a[name].ravel()[diff[:8]]} cuda {b[name].ravel()[diff[:8]]}"
        )


def assert_same_floats(cpu: np.ndarray, gpu: np.ndarray, what: str) -> None:
    assert cpu.shape == gpu.shape and gpu.dtype == np.float32, (cpu.shape, gpu.shape, gpu.dtype)
    cn, gn = np.isnan(cpu), np.isnan(gpu)
    assert np.array_equal(cn, gn), f"{what}: NaN positions differ"
    diff = (cpu.view(np.uint32) != gpu.view(np.uint32)) & ~cn
    idx = np.argwhere(diff)
    assert idx.size == 0, (
        f"{what}: {len(idx)} values differ, first {idx[:4].tolist()}: "
        f"cpu {cpu[diff][:4]} cuda {gpu[diff][:4]}"
    )


def write_both(cpu, gpu, k32, v32, k_in, v_in, slots, in_dtype):
    import cupy

    from kvkit.cuda.write import write_rows

    cpu_backend.write_rows(cpu, k32, v32, slots.astype(np.int64))
    write_rows(gpu, cupy.asarray(k_in), cupy.asarray(v_in), cupy.asarray(slots), in_dtype)


def dequant_both(cpu, gpu, slots):
    import cupy

    from kvkit.cuda.dequant import dequantize_rows

    ck, cv = kvkit.dequantize(cpu, slots)
    gk, gv = dequantize_rows(gpu, cupy.asarray(slots))
    return (ck, cv), (gk.get(), gv.get())


@pytest.mark.gpu
@given(cases())
@example(  # all-NaN / mixed-zero rows, bf16 input, int32 slots, a 3-bit stream at D=64
    dict(name="turboquant_3bit_nc", d=64, bs=16, heads=1, num_blocks=1, n=16, seed=0,
         dtype="bfloat16", magnitude=60000.0, padding=0.0, specials=True, scale="one",
         slot_dtype="int32")
)  # fmt: skip
@example(
    dict(name="nvfp4_4over6", d=16, bs=16, heads=2, num_blocks=1, n=5, seed=1, dtype="float16",
         magnitude=1e-3, padding=0.3, specials=True, scale="calibrate", slot_dtype="int64")
)  # fmt: skip
@example(
    dict(name="turboquant_k8v4", d=48, bs=32, heads=3, num_blocks=2, n=40, seed=2,
         dtype="float32", magnitude=60000.0, padding=0.2, specials=True, scale="odd",
         slot_dtype="int64")
)  # fmt: skip
@example(  # padding rows (zeros: a zero V extreme) beside other rows in a warp, a partial last
    # warp, 3-bit window packing: variant 4 first shuffled under a per-row branch here
    dict(name="turboquant_k3v4_nc", d=128, bs=16, heads=1, num_blocks=2, n=18, seed=3,
         dtype="float32", magnitude=1.0, padding=0.3, specials=False, scale="one",
         slot_dtype="int32")
)  # fmt: skip
def test_cuda_write_and_dequantize_equal_numba(c):
    import cupy

    fmt = formats.get(c["name"], c["d"])
    k32, v32, k_in, v_in, slots = make_inputs(c)
    scales = pick_scales(fmt, c["scale"], k32, v32)
    cpu, gpu = make_layers(fmt, c["heads"], c["num_blocks"], c["bs"], c["seed"], scales)
    write_both(cpu, gpu, k32, v32, k_in, v_in, slots, c["dtype"])
    assert int(gpu.error_flag.get()[0]) == 0
    assert_planes_equal(cpu, gpu, context=f"{fmt.name} D={c['d']} {c['dtype']}")

    # Read back every slot of the cache (written ones and random bytes) plus padding.
    read = np.concatenate([np.arange(cpu.capacity), [-1, -7]]).astype(c["slot_dtype"])
    np.random.default_rng(c["seed"]).shuffle(read)
    (ck, cv), (gk, gv) = dequant_both(cpu, gpu, read)
    assert_same_floats(ck, gk, f"{fmt.name} K")
    assert_same_floats(cv, gv, f"{fmt.name} V")
    assert not gk[read < 0].any() and not gv[read < 0].any()
    assert int(gpu.error_flag.get()[0]) == 0
    cupy.cuda.get_current_stream().synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("name", formats.names())
def test_out_of_range_slots_set_the_flag_and_write_nothing(name):
    import cupy

    from kvkit.cuda.dequant import dequantize_rows
    from kvkit.cuda.write import write_rows

    d = 64
    fmt = formats.get(name, d)
    heads, nb, bs = 2, 2, 16
    cpu, gpu = make_layers(fmt, heads, nb, bs, seed=11)
    rng = np.random.default_rng(3)
    k = rng.standard_normal((4, heads, d)).astype(np.float32)
    v = rng.standard_normal((4, heads, d)).astype(np.float32)
    slots = np.array([nb * bs, 5, -1, 10**12], dtype=np.int64)  # two beyond the cache
    before = plane_bytes(gpu)
    write_rows(gpu, cupy.asarray(k), cupy.asarray(v), cupy.asarray(slots), "float32")
    assert int(gpu.error_flag.get()[0]) & 1
    # only slot 5 changed: the CPU reference writes the in-range part alone
    cpu_backend.write_rows(cpu, k, v, np.where(slots >= nb * bs, -1, slots))
    assert_planes_equal(cpu, gpu, context=name)
    after = plane_bytes(gpu)
    changed = {p: np.flatnonzero(before[p] != after[p]) for p in before}
    assert any(c.size for c in changed.values())

    gpu.error_flag.fill(0)
    bad = np.array([5, nb * bs + 3, -2], dtype=np.int32)
    gk, gv = dequantize_rows(gpu, cupy.asarray(bad))
    assert int(gpu.error_flag.get()[0]) & 1
    gk, gv = gk.get(), gv.get()
    assert not gk[1:].any() and not gv[1:].any()
    ck, cv = kvkit.dequantize(cpu, np.array([5]))
    assert_same_floats(ck[0], gk[0], "K")
    assert_same_floats(cv[0], gv[0], "V")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["fp16", "fp8_e4m3", "nvfp4_4over6", "turboquant_k3v4_nc"])
def test_token_major_plane_views(name):
    """NHD views (token-major memory) are addressed through strides, same bytes as the CPU."""
    import cupy

    d, heads, nb, bs = 64, 3, 2, 16
    fmt = formats.get(name, d)
    cpu, gpu = make_layers(fmt, heads, nb, bs, seed=5)
    for pname, spec in fmt.planes.items():
        cpu.planes[pname] = np.zeros((nb, bs, heads, spec.width), spec.dtype).transpose(0, 2, 1, 3)
        gpu.planes[pname] = cupy.zeros((nb, bs, heads, spec.width), spec.dtype).transpose(
            0, 2, 1, 3
        )
    rng = np.random.default_rng(9)
    k = (rng.standard_normal((7, heads, d)) * 10).astype(np.float32)
    v = (rng.standard_normal((7, heads, d)) * 10).astype(np.float32)
    slots = np.array([0, 17, 31, -1, 3, 16, 8], dtype=np.int64)
    write_both(cpu, gpu, k, v, k, v, slots, "float32")
    assert_planes_equal(cpu, gpu, context=name)
    (ck, cv), (gk, gv) = dequant_both(cpu, gpu, slots)
    assert_same_floats(ck, gk, "K")
    assert_same_floats(cv, gv, "V")


@pytest.mark.gpu
@pytest.mark.parametrize("in_dtype", IN_DTYPES)
def test_every_fp32_special_through_every_format(in_dtype):
    """One row per format holding every special value and every E4M3 / E2M1 rounding edge."""
    edges = np.concatenate(
        [
            SPECIAL_VALUES,
            codecs.E4M3_VALUES[np.isfinite(codecs.E4M3_VALUES)],
            np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.5, 448.0, 464.0, 65504.0,
                      65519.0, 65520.0, 2.0**-10, 2.0**-9 * 1.5, 2.0**-24, 2.0**-25],
                     dtype=np.float32),
        ]
    )  # fmt: skip
    edges = np.concatenate([edges, -edges])
    for name in formats.names():
        d = 256
        fmt = formats.get(name, d)
        row = np.resize(edges, d).astype(np.float32)
        k = np.stack([row, row[::-1], row * np.float32(0.01)])[:, None, :]
        v = np.stack([row[::-1], row, row * np.float32(3.0)])[:, None, :]
        c = dict(dtype=in_dtype)
        if c["dtype"] == "float16":
            with np.errstate(over="ignore"):
                k_in, v_in = k.astype(np.float16), v.astype(np.float16)
            k32, v32 = k_in.astype(np.float32), v_in.astype(np.float32)
        elif c["dtype"] == "bfloat16":
            k_in, v_in = codecs.bf16_bits_array(k), codecs.bf16_bits_array(v)
            k32, v32 = codecs.bf16_values_array(k_in), codecs.bf16_values_array(v_in)
        else:
            k_in, v_in, k32, v32 = k, v, k, v
        cpu, gpu = make_layers(fmt, 1, 1, 16, seed=1, scales=(0.75, 1.5))
        slots = np.array([2, 9, 15], dtype=np.int32)
        write_both(cpu, gpu, k32, v32, k_in, v_in, slots, in_dtype)
        assert_planes_equal(cpu, gpu, context=f"{name} {in_dtype}")
        (ck, cv), (gk, gv) = dequant_both(cpu, gpu, np.arange(16))
        assert_same_floats(ck, gk, f"{name} K")
        assert_same_floats(cv, gv, f"{name} V")


@pytest.mark.gpu
@pytest.mark.parametrize("name", [n for n in formats.names() if n.startswith("turboquant")])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_turboquant_value_zero_keeps_the_first_signed_zero(name, d):
    """V rows whose minimum (or maximum) is a tie of -0 and +0 in different lanes' chunks: the
    stored zero point is the first-occurring one, as in the CPU's sequential scan. A warp
    combine in decreasing lane distances once stored +0 for -0 at element E, +0 at 2 E."""
    fmt = formats.get(name, d)
    e = -(-d // 32)
    rows = []
    for first, second in ((-0.0, 0.0), (0.0, -0.0)):
        for lane_a, lane_b in ((1, 2), (0, 17), (5, 6), (3, 30)):
            for sign in (1.0, -1.0):  # the tie as the minimum, then as the maximum
                row = np.full(d, sign, np.float32)
                row[lane_a * e], row[lane_b * e] = first, second
                rows.append(row)
    v = np.stack(rows)[:, None, :]
    k = np.ones_like(v)
    cpu, gpu = make_layers(fmt, 1, 2, 16, seed=3)
    slots = np.arange(len(rows), dtype=np.int64)
    write_both(cpu, gpu, k, v, k, v, slots, "float32")
    assert_planes_equal(cpu, gpu, context=f"{name} D={d} signed-zero ties")


@pytest.mark.gpu
@pytest.mark.parametrize("in_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", [n for n in formats.names() if n.startswith("turboquant")])
def test_turboquant_rows_at_extreme_exponents(name, in_dtype):
    """Rows whose norms, value ranges and per-element quotients sit at the ends of float32's
    exponent range (denormal to near overflow, and one huge element among tiny ones), where
    a division by a reciprocal would need its IEEE fallback: same bytes as the CPU."""
    d = 128
    fmt = formats.get(name, d)
    rng = np.random.default_rng(7)
    rows = []
    for e in (-149, -140, -126, -100, -64, -41, -39, 0, 39, 41, 64, 100, 120, 126):
        rows.append(rng.standard_normal(d) * 2.0**e)
    for big, small in ((60, -60), (100, -40), (120, -120), (0, -149)):
        r = rng.standard_normal(d) * 2.0**small
        r[rng.integers(d)] = 2.0**big
        rows.append(r)
    x = np.array(rows)
    x = np.clip(x, -3.0e38, 3.0e38).astype(np.float32)
    k = x[:, None, :]
    v = x[::-1, None, :] * np.float32(0.5)
    if in_dtype == "bfloat16":
        k_in, v_in = codecs.bf16_bits_array(k), codecs.bf16_bits_array(v)
        k32, v32 = codecs.bf16_values_array(k_in), codecs.bf16_values_array(v_in)
    else:
        k_in, v_in, k32, v32 = k, v, k, v
    n = k.shape[0]
    cpu, gpu = make_layers(fmt, 1, 2, 16, seed=3)
    slots = np.arange(n, dtype=np.int32)
    write_both(cpu, gpu, k32, v32, k_in, v_in, slots, in_dtype)
    assert_planes_equal(cpu, gpu, context=f"{name} {in_dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("in_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("d", MSE_DIMS)
@pytest.mark.parametrize("name", [n for n in formats.names() if n.startswith("turboquant")])
def test_turboquant_warps_mixing_zero_rows_with_other_rows(name, d, in_dtype):
    """One warp writes 2 or 4 rows. Warps here mix rows whose V minimum or maximum is a zero
    (all-zero rows, padding slots and rows past the end compute on zeros too) with rows that
    have none, and with rows that take the exact key fallback (a huge element): the first
    variant-4 kernel shuffled the zero rows' first zeros under a per-row branch with a full
    mask, and then wrote wrong key codes (or died with an illegal instruction) on an H200.
    23 tokens: the last warp is partial."""
    fmt = formats.get(name, d)
    rng = np.random.default_rng(21)
    n = 23
    k = rng.standard_normal((n, 1, d))
    v = rng.standard_normal((n, 1, d))
    slots = np.arange(n, dtype=np.int64)
    for t in range(n):
        kind = t % 7
        if kind == 1:  # V minimum +0 (and -0 elements after it)
            v[t, 0] = np.abs(v[t, 0])
            v[t, 0, rng.choice(d, 3, replace=False)] = [0.0, -0.0, 0.0]
        elif kind == 2:  # padding
            slots[t] = -1
        elif kind == 3:  # exact key fallback (den beyond kv_divisor's range)
            k[t, 0] *= 2.0**-120
            k[t, 0, rng.integers(d)] = 2.0**120
        elif kind == 4:  # all zero
            k[t, 0] = 0.0
            v[t, 0] = 0.0
        elif kind == 6:  # V maximum -0
            v[t, 0] = -np.abs(v[t, 0])
            v[t, 0, rng.choice(d, 2, replace=False)] = [-0.0, 0.0]
    k32, v32 = k.astype(np.float32), v.astype(np.float32)
    if in_dtype == "bfloat16":
        k_in, v_in = codecs.bf16_bits_array(k32), codecs.bf16_bits_array(v32)
        k32, v32 = codecs.bf16_values_array(k_in), codecs.bf16_values_array(v_in)
    else:
        k_in, v_in = k32, v32
    cpu, gpu = make_layers(fmt, 1, 2, 16, seed=5)
    write_both(cpu, gpu, k32, v32, k_in, v_in, slots, in_dtype)
    assert_planes_equal(cpu, gpu, context=f"{name} D={d} {in_dtype} mixed warps")


@pytest.mark.gpu
@pytest.mark.parametrize("in_dtype", ["float32", "float16"])
@pytest.mark.parametrize(
    "scale",
    [2.0**-149, 2.0**-126, 2.0**-45, 2.0**-40, 0.3712 * 2.0**-40, 2.0**-39 * 1.7, 0.3712, 1.0,
     7.25, 2.0**39 * 1.3, 2.0**40, 2.0**40 * 1.0000001, 2.0**90, 3.0e38],
)  # fmt: skip
def test_fp8_scales_at_extreme_exponents(scale, in_dtype):
    """fp8_e4m3 writes divide by the layer scale through its reciprocal where divide.cuh's
    range conditions hold and by __fdiv_rn elsewhere: scales on both sides of the [2^-40, 2^40]
    edges (and denormal / near-overflow ones) against rows whose quotients also cross them
    must give the CPU's bytes (IEEE division)."""
    d = 64
    fmt = formats.get("fp8_e4m3", d)
    rng = np.random.default_rng(11)
    rows = [rng.standard_normal(d) * 2.0**e for e in (-149, -130, -100, -41, -20, 0, 20, 60, 120)]
    edge = rng.standard_normal(d)
    edge[:8] = [0.0, -0.0, 2.0**-149, -(2.0**-126), 448.0, 464.0, 3.0e38, -3.0e38]
    rows.append(edge)
    x = np.clip(np.array(rows), -3.0e38, 3.0e38).astype(np.float32)
    if in_dtype == "float16":
        with np.errstate(over="ignore", under="ignore"):
            x = x.astype(np.float16).astype(np.float32)
    k, v = x[:, None, :], x[::-1, None, :]
    k_in, v_in = (k, v) if in_dtype == "float32" else (k.astype(np.float16), v.astype(np.float16))
    cpu, gpu = make_layers(fmt, 1, 1, 16, seed=5, scales=(scale, scale))
    slots = np.arange(k.shape[0], dtype=np.int32)
    write_both(cpu, gpu, k, v, k_in, v_in, slots, in_dtype)
    assert_planes_equal(cpu, gpu, context=f"fp8 scale {scale!r} {in_dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name,d",
    [("turboquant_4bit_nc", 128), ("turboquant_3bit_nc", 64), ("turboquant_k8v4", 192),
     ("nvfp4", 64), ("fp8_e4m3", 48),
     # TQ_VARIANT 4's window packing (3-bit codes at D = 128 / 256, 4-bit at D = 64):
     ("turboquant_3bit_nc", 128), ("turboquant_k3v4_nc", 256), ("turboquant_4bit_nc", 64)],
)  # fmt: skip
@pytest.mark.parametrize("in_dtype", IN_DTYPES)
def test_odd_address_planes_and_unaligned_inputs(name, d, in_dtype):
    """Byte planes viewed at an odd address (the writers' byte-store branch) and K / V starting
    one element past an aligned address (the run-time-alignment loads): the CPU's bytes."""
    import cupy

    heads, nb, bs, n = 3, 2, 16, 21
    fmt = formats.get(name, d)
    cpu, gpu = make_layers(fmt, heads, nb, bs, seed=11)
    for pname, plane in gpu.planes.items():
        if plane.dtype != np.uint8:
            continue
        flat = cupy.zeros(plane.size + 1, np.uint8)
        odd = flat[1:].reshape(plane.shape)
        odd[...] = plane
        assert odd.data.ptr % 2 == 1
        gpu.planes[pname] = odd
    rng = np.random.default_rng(12)
    k32 = (rng.standard_normal((n, heads, d)) * 10).astype(np.float32)
    v32 = (rng.standard_normal((n, heads, d)) * 10).astype(np.float32)
    k32[2, 1, :5] = [np.nan, np.inf, -0.0, 1e-40, -np.inf]
    if in_dtype == "bfloat16":
        k_in, v_in = codecs.bf16_bits_array(k32), codecs.bf16_bits_array(v32)
        k32, v32 = codecs.bf16_values_array(k_in), codecs.bf16_values_array(v_in)
    elif in_dtype == "float16":
        k_in, v_in = k32.astype(np.float16), v32.astype(np.float16)
        k32, v32 = k_in.astype(np.float32), v_in.astype(np.float32)
    else:
        k_in, v_in = k32, v32

    def shifted(x):
        buf = cupy.zeros(x.size + 1, x.dtype)
        out = buf[1:].reshape(x.shape)
        out[...] = cupy.asarray(x)
        return out

    slots = np.array([0, 17, 31, -1, 3, 16, 8, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 18, 19, 20, 21],
                     dtype=np.int64)  # fmt: skip
    from kvkit.cuda.write import write_rows

    cpu_backend.write_rows(cpu, k32, v32, slots)
    write_rows(gpu, shifted(k_in), shifted(v_in), cupy.asarray(slots), in_dtype)
    assert_planes_equal(cpu, gpu, context=f"{name} D={d} {in_dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["0", "1"])
@pytest.mark.parametrize(
    "scale",
    [2.0**-16, 2.0**-16 * 0.99999994, 2.0**16, 2.0**16 * 1.0000001, 1.0, 1.0 / 448.0, 0.3712,
     7.25, 2.0**-149, 3.0e38],
)  # fmt: skip
def test_fp8_every_half_through_each_dense_variant(scale, variant, monkeypatch):
    """KVKIT_WRITE_DENSE_VARIANT=1's fast chunk (float16 inputs, scales in [2^-16, 2^16], every
    half of a thread's K and V chunks finite) and its per-element fallback (scales just outside
    that range; rows below with inf / NaN in one chunk of K only) give the CPU's bytes for every
    float16 pattern, as the default body does."""
    monkeypatch.setenv("KVKIT_WRITE_DENSE_VARIANT", variant)
    d = 128
    fmt = formats.get("fp8_e4m3", d)
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    finite = h[(h & 0x7FFF) < 0x7C00]
    special = h[(h & 0x7FFF) >= 0x7C00]  # inf and every NaN payload
    rows = np.concatenate([finite, np.resize(finite, (-finite.size) % d)]).reshape(-1, d)
    mixed = np.resize(finite[::97], (special.size // 8 + 1) * d).reshape(-1, d)
    mixed[:, 8] = 0x7C00  # the second chunk of K holds +inf; its other chunks are finite
    mixed[: special.size // 8, 16:24] = np.resize(special, (special.size // 8, 8))
    x16 = np.concatenate([rows, mixed]).view(np.float16)
    n = x16.shape[0]
    k16, v16 = x16[:, None, :], x16[::-1, None, :].copy()
    v16[:, :, 8] = np.float16(1.0)  # V's second chunk finite where K's is not
    k32, v32 = k16.astype(np.float32), v16.astype(np.float32)
    bs = 16
    v_scale = min(scale * 2.0, 3.0e38)  # K and V scales differ (each is tested per thread)
    cpu, gpu = make_layers(fmt, 1, -(-n // bs), bs, seed=9, scales=(scale, v_scale))
    slots = np.random.default_rng(3).permutation(n).astype(np.int32)
    write_both(cpu, gpu, k32, v32, k16, v16, slots, "float16")
    assert_planes_equal(cpu, gpu, context=f"fp8 variant {variant} scale {scale!r}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["fp8_e4m3", "fp16", "bf16"])
@pytest.mark.parametrize("in_dtype", IN_DTYPES)
@pytest.mark.parametrize("slot_dtype", ["int32", "int64"])
def test_dense_variant_1_equals_numba(name, in_dtype, slot_dtype, monkeypatch):
    """The fast body (KVKIT_WRITE_DENSE_VARIANT=1) for every dense format and input dtype:
    specials, padding slots, out-of-range slots (flag set, nothing written), odd head counts
    (the host magic numbers), block sizes 32 and 16, D = 48 and 128."""
    import cupy

    monkeypatch.setenv("KVKIT_WRITE_DENSE_VARIANT", "1")
    for d, heads, bs, nb in ((128, 3, 32, 5), (48, 5, 16, 7), (128, 8, 16, 33)):
        c = dict(name=name, d=d, bs=bs, heads=heads, num_blocks=nb, n=nb * bs - 3, seed=d + heads,
                 dtype=in_dtype, magnitude=300.0, padding=0.2, specials=True, scale="odd",
                 slot_dtype=slot_dtype)  # fmt: skip
        fmt = formats.get(name, d)
        k32, v32, k_in, v_in, slots = make_inputs(c)
        cpu, gpu = make_layers(fmt, heads, nb, bs, c["seed"], pick_scales(fmt, "odd", k32, v32))
        write_both(cpu, gpu, k32, v32, k_in, v_in, slots, in_dtype)
        assert int(gpu.error_flag.get()[0]) == 0
        assert_planes_equal(cpu, gpu, context=f"{name} D={d} H={heads} {in_dtype} variant 1")
        before = plane_bytes(gpu)
        from kvkit.cuda.write import write_rows

        bad = slots.copy()
        bad[::2] = cpu.capacity + np.arange(bad[::2].size)
        write_rows(gpu, cupy.asarray(k_in), cupy.asarray(v_in), cupy.asarray(bad), in_dtype)
        assert int(gpu.error_flag.get()[0]) == 1
        cpu_backend.write_rows(cpu, k32[1::2], v32[1::2], slots[1::2].astype(np.int64))
        after, want = plane_bytes(gpu), plane_bytes(cpu)
        for pn in before:
            assert (after[pn] == want[pn]).all(), f"{name} {pn}: out-of-range launch"


def _nvfp4_46_blocks(n: int, seed: int) -> np.ndarray:
    """(n, 16) float32 blocks for the 4over6 decision: Gaussian blocks with a log-normal spread
    of block scales, then the blocks nearest to a tie (the fast errors cannot decide them;
    kvkit.formats.arch_models nvfp4_46_candidates) and their one-ulp neighbours."""
    from kvkit.formats import arch_models

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 16)).astype(np.float32)
    x *= np.exp(rng.normal(0.0, 1.0, (n, 1))).astype(np.float32)
    x = x.astype(np.float16).astype(np.float32)  # exact in every input dtype's neighbourhood
    c = arch_models.nvfp4_46_candidates(x, 1.0)
    gap = np.abs(c["E4"].astype(np.float64) - c["E6"]) / (c["den6"].astype(np.float64) ** 2)
    near = x[np.argsort(np.where(c["sfc4"] != c["sfc6"], gap, np.inf))[:256]]
    bits = near.view(np.uint32)
    moved = [bits.copy() for _ in range(2)]
    moved[0][:, 3] += np.uint32(1)
    moved[1][:, 11] -= np.uint32(1)
    return np.concatenate([x, near] + [m.view(np.float32) for m in moved])


@pytest.mark.gpu
@pytest.mark.parametrize("in_dtype", IN_DTYPES)
@pytest.mark.parametrize("d", [64, 128, 256])
def test_nvfp4_4over6_each_variant_equals_numba(in_dtype, d, monkeypatch):
    """KVKIT_WRITE_NVFP4_46_VARIANT 0 and 1 (the fused-error decision with the spec's errors for
    undecided blocks) give the Numba backend's bytes, hence each other's, on ~50k blocks
    including the nearest ties (the fallback runs), for unit, calibrated and odd K / V scales;
    plus a row of specials."""

    fmt = formats.get("nvfp4_4over6", d)
    heads, bs = 2, 16
    x = _nvfp4_46_blocks(24_000, d)
    rows = x.reshape(-1)[: (x.size // (2 * d)) * 2 * d].reshape(-1, heads, d)
    rows[0, 0, :12] = SPECIAL_VALUES
    n = rows.shape[0]
    k = rows
    v = rows[::-1].copy() * np.float32(0.37)
    if in_dtype == "float16":
        with np.errstate(over="ignore"):
            k_in, v_in = k.astype(np.float16), v.astype(np.float16)
        k32, v32 = k_in.astype(np.float32), v_in.astype(np.float32)
    elif in_dtype == "bfloat16":
        k_in, v_in = codecs.bf16_bits_array(k), codecs.bf16_bits_array(v)
        k32, v32 = codecs.bf16_values_array(k_in), codecs.bf16_values_array(v_in)
    else:
        k_in, v_in, k32, v32 = k, v, k, v
    nb = -(-n // bs)
    slots = np.random.default_rng(d).permutation(nb * bs)[:n].astype(np.int64)
    for scales in ((1.0, 1.0), (5.0 / (6 * 448), 1.0 / 448), (0.3712, 7.25)):
        got = {}
        for variant in ("0", "1"):
            monkeypatch.setenv("KVKIT_WRITE_NVFP4_46_VARIANT", variant)
            cpu, gpu = make_layers(fmt, heads, nb, bs, seed=d, scales=scales)
            write_both(cpu, gpu, k32, v32, k_in, v_in, slots, in_dtype)
            assert int(gpu.error_flag.get()[0]) == 0
            assert_planes_equal(cpu, gpu, context=f"4over6 variant {variant} {in_dtype} {scales}")
            got[variant] = plane_bytes(gpu)
        for name in got["0"]:
            assert np.array_equal(got["0"][name], got["1"][name]), name


# --- TurboQuant write variant 5 (KVKIT_WRITE_TQ_VARIANT=5; branch tqw6, benchmarks/NOTES.md) ---
TQ_NAMES = [n for n in formats.names() if n.startswith("turboquant")]


def _tq5_rows(rng, n, heads, d, in_dtype):
    """(k32, v32, k_in, v_in): Gaussian rows of mixed magnitudes, small-integer rows (value
    quotients on exact code boundaries: the nudged-reciprocal test must fall back there), rows
    with NaN / inf / -0 / denormals, all-zero and all-NaN rows, rows whose key norm, value scale
    and value zero saturate the slot's float16 scalars (float32 / bfloat16 inputs), and rows
    with one huge element (the exact key fallback)."""
    k = rng.standard_normal((n, heads, d)) * 10.0 ** rng.uniform(-3, 3, (n, heads, 1))
    v = rng.standard_normal((n, heads, d)) * 10.0 ** rng.uniform(-3, 3, (n, heads, 1))
    big = 60000.0 if in_dtype == "float16" else 1e7
    for t in range(n):
        h = t % heads
        kind = t % 9
        if kind == 1:  # small integers and halves: exact value code boundaries
            k[t, h] = rng.integers(-8, 9, d) * 0.5
            v[t, h] = rng.integers(-8, 9, d) * rng.choice([0.5, 0.25, 1.0, 3.0])
        elif kind == 2:  # specials in both
            for x in (k, v):
                idx = rng.choice(d, 4, replace=False)
                x[t, h, idx] = rng.choice(SPECIAL_VALUES, 4)
        elif kind == 3:  # all zero (signed zeros in V)
            k[t, h] = 0.0
            v[t, h] = np.where(rng.random(d) < 0.5, -0.0, 0.0)
        elif kind == 4:  # all NaN
            k[t, h] = np.nan
            v[t, h] = np.nan
        elif kind == 5:  # saturating scalars (float16 inputs: the largest finite halves)
            k[t, h] = rng.choice([-1.0, 1.0], d) * big
            v[t, h] = rng.uniform(-big, big, d)
            v[t, h, :2] = [-big, big]
        elif kind == 6:  # one huge key element among tiny ones; a V row of one value
            k[t, h] *= 1e-3
            k[t, h, rng.integers(d)] = big
            v[t, h] = 3.25
        elif kind == 7:  # +-inf rows
            k[t, h, rng.integers(d)] = np.inf
            v[t, h, rng.integers(d)] = -np.inf
    k32 = np.clip(k, -3.0e38, 3.0e38).astype(np.float32)
    v32 = np.clip(v, -3.0e38, 3.0e38).astype(np.float32)
    if in_dtype == "float16":
        with np.errstate(over="ignore"):
            k_in, v_in = k32.astype(np.float16), v32.astype(np.float16)
        return k_in.astype(np.float32), v_in.astype(np.float32), k_in, v_in
    if in_dtype == "bfloat16":
        k_in, v_in = codecs.bf16_bits_array(k32), codecs.bf16_bits_array(v32)
        return codecs.bf16_values_array(k_in), codecs.bf16_values_array(v_in), k_in, v_in
    return k32, v32, k32, v32


@pytest.mark.gpu
@pytest.mark.parametrize("in_dtype", IN_DTYPES)
@pytest.mark.parametrize("name", TQ_NAMES)
def test_turboquant_variant_5_equals_numba(name, in_dtype, monkeypatch):
    """KVKIT_WRITE_TQ_VARIANT=5 (fast FP8 keys of float16 inputs, value codes from two nudged
    reciprocals, float16x2 value min / max, key squares by one IMAD, float16 scalars by
    cvt.satfinite): the Numba backend's bytes at D = 64 / 128 / 256 (k8v4 also 48 and 512), three
    heads, permuted slots with padding (-1, -5), for K scales 1, 0.5 and 2^16 (powers of two:
    one multiply per key element), 0.3712 and 1 / 448 (the reciprocal path), and 2^16 (1 + 2^-23)
    (outside the fast range: the per-element path)."""
    monkeypatch.setenv("KVKIT_WRITE_TQ_VARIANT", "5")
    dims = (48, 64, 128, 256, 512) if name == "turboquant_k8v4" else MSE_DIMS
    for d in dims:
        fmt = formats.get(name, d)
        heads, bs, nb = 3, 16, 4
        n = nb * bs - 5
        rng = np.random.default_rng(d * 7 + len(in_dtype))
        k32, v32, k_in, v_in = _tq5_rows(rng, n, heads, d, in_dtype)
        slots = rng.permutation(nb * bs)[:n].astype(np.int64 if d % 128 else np.int32)
        slots[rng.random(n) < 0.15] = -1
        slots[3] = -5
        scales = [1.0]
        if fmt.has_global_scales:
            scales = [1.0, 0.5, 2.0**16, 0.3712, 1.0 / 448.0, 2.0**16 * 1.0000001]
        for ks in scales:
            cpu, gpu = make_layers(fmt, heads, nb, bs, seed=d, scales=(ks, 1.0))
            write_both(cpu, gpu, k32, v32, k_in, v_in, slots, in_dtype)
            assert int(gpu.error_flag.get()[0]) == 0
            context = f"variant 5 {name} D={d} {in_dtype} k_scale {ks!r}"
            assert_planes_equal(cpu, gpu, context=context)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "scale",
    [2.0**-16, 2.0**-16 * 0.99999994, 2.0**16, 2.0**16 * 1.0000001, 1.0, 0.5, 2.0**-7, 1.0 / 448.0,
     0.3712, 7.25, 2.0**-149, 3.0e38],
)  # fmt: skip
def test_turboquant_variant_5_fp8_keys_every_half(scale, monkeypatch):
    """Variant 5's FP8 keys of float16 inputs: every float16 pattern as a key element, at K scales
    inside [2^-16, 2^16] (powers of two: one multiply; others: the reciprocal with two
    corrections) and just outside (the per-element path), and rows whose lanes mix finite halves
    with inf / NaN ones (that lane takes the per-element path): the Numba backend's bytes."""
    monkeypatch.setenv("KVKIT_WRITE_TQ_VARIANT", "5")
    d = 128
    fmt = formats.get("turboquant_k8v4", d)
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    finite = h[(h & 0x7FFF) < 0x7C00]
    special = h[(h & 0x7FFF) >= 0x7C00]
    rows = np.concatenate([finite, np.resize(finite, (-finite.size) % d)]).reshape(-1, d)
    mixed = np.resize(finite[::97], (special.size // 8 + 1) * d).reshape(-1, d)
    mixed[:, 8] = 0x7C00  # one lane's piece holds +inf; the other lanes are finite
    mixed[: special.size // 8, 40:48] = np.resize(special, (special.size // 8, 8))
    k16 = np.concatenate([rows, mixed]).view(np.float16)[:, None, :]
    n = k16.shape[0]
    rng = np.random.default_rng(5)
    v16 = rng.standard_normal((n, 1, d)).astype(np.float16)
    k32, v32 = k16.astype(np.float32), v16.astype(np.float32)
    bs = 16
    cpu, gpu = make_layers(fmt, 1, -(-n // bs), bs, seed=9, scales=(scale, 1.0))
    slots = rng.permutation(-(-n // bs) * bs)[:n].astype(np.int32)
    write_both(cpu, gpu, k32, v32, k16, v16, slots, "float16")
    assert_planes_equal(cpu, gpu, context=f"variant 5 k8v4 scale {scale!r}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", TQ_NAMES)
def test_turboquant_variant_5_equals_default_on_gaussian_rows(name, monkeypatch):
    """Variant 5 and the default variant write the same bytes on 4096 Gaussian float16 token-heads
    (D = 128, 8 heads, page-ordered slots, the benchmark's shape scaled down)."""
    import cupy

    from kvkit.cuda.write import write_rows

    d, heads, bs = 128, 8, 16
    fmt = formats.get(name, d)
    n = 512
    rng = np.random.default_rng(17)
    k = cupy.asarray(rng.standard_normal((n, heads, d)).astype(np.float16))
    v = cupy.asarray(rng.standard_normal((n, heads, d)).astype(np.float16))
    slots = cupy.arange(n, dtype=cupy.int32)
    got = {}
    for variant in ("", "5"):
        if variant:
            monkeypatch.setenv("KVKIT_WRITE_TQ_VARIANT", variant)
        else:
            monkeypatch.delenv("KVKIT_WRITE_TQ_VARIANT", raising=False)
        _, gpu = make_layers(fmt, heads, n // bs, bs, seed=1)
        write_rows(gpu, k, v, slots, "float16")
        got[variant] = plane_bytes(gpu)
    for pname in got[""]:
        assert np.array_equal(got[""][pname], got["5"][pname]), pname


def _write_around_bad_slots(fmt, in_dtype, *, n, heads, bad, seeds, scales, context):
    """Writes n Gaussian rows (K, V scaled by `scales`) in `in_dtype` through the CUDA backend
    into 16-token pages with every fifth slot padding and the rows `bad` beyond the cache, and
    checks: the error flag is set, and the planes equal the Numba backend's writing the same
    rows with the bad slots as padding (nothing written for them)."""
    import cupy

    from kvkit.cuda.write import write_rows

    bs, d = 16, fmt.head_dim
    nb = -(-n // bs) + 1
    cpu, gpu = make_layers(fmt, heads, nb, bs, seed=seeds[0])
    rng = np.random.default_rng(seeds[1])
    k32 = (rng.standard_normal((n, heads, d)) * scales[0]).astype(np.float32)
    v32 = (rng.standard_normal((n, heads, d)) * scales[1]).astype(np.float32)
    k_in, v_in = k32, v32
    if in_dtype == "float16":
        k_in, v_in = k32.astype(np.float16), v32.astype(np.float16)
        k32, v32 = k_in.astype(np.float32), v_in.astype(np.float32)
    elif in_dtype == "bfloat16":
        k_in, v_in = codecs.bf16_bits_array(k32), codecs.bf16_bits_array(v32)
        k32, v32 = codecs.bf16_values_array(k_in), codecs.bf16_values_array(v_in)
    slots = rng.permutation(nb * bs)[:n].astype(np.int64)
    slots[::5] = -1
    slots[list(bad)] = [nb * bs + 1000 * i for i in range(len(bad))]
    write_rows(gpu, cupy.asarray(k_in), cupy.asarray(v_in), cupy.asarray(slots), in_dtype)
    assert int(gpu.error_flag.get()[0]) & 1
    cpu_backend.write_rows(cpu, k32, v32, np.where(slots >= nb * bs, -1, slots))
    assert_planes_equal(cpu, gpu, context=f"{fmt.name} D={d} {in_dtype} {context}")


# --- Load order of the NVFP4 / TurboQuant writes (KVKIT_WRITE_EARLY_LOADS; kvkit/cuda/write.py) ---
@pytest.mark.gpu
@pytest.mark.parametrize("early", ["0", "1"])
@pytest.mark.parametrize("in_dtype", ["float16", "float32"])
@pytest.mark.parametrize(
    "name", ["nvfp4", "nvfp4_4over6"] + [n for n in formats.names() if n.startswith("turboquant")]
)
def test_load_order_equals_numba_around_bad_slots(name, in_dtype, early, monkeypatch):
    """KVKIT_WRITE_EARLY_LOADS 0 (inputs loaded after the slot's test) and 1 (beside the slot's
    load: rows with a padding or bad slot then compute on their real inputs) write the Numba
    backend's bytes for the good rows, nothing for the others, and flag the bad slots: 203 rows
    (a partial last CTA), every fifth slot padding, two beyond the cache, in warps and CTAs that
    mix them with good rows."""
    monkeypatch.setenv("KVKIT_WRITE_EARLY_LOADS", early)
    fmt = formats.get(name, 128)
    _write_around_bad_slots(fmt, in_dtype, n=203, heads=2, bad=(7, 130), seeds=(17, 23),
                            scales=(3.0, 0.5), context=f"early={early}")  # fmt: skip


# --- Warps per CTA of the TurboQuant write (KVKIT_WRITE_TQ_WARPS; kvkit/cuda/write.py tq_warps) ---
@pytest.mark.gpu
@pytest.mark.parametrize("warps", ["2", "6", "8"])
@pytest.mark.parametrize("in_dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize(
    "name, d",
    [(n, 128) for n in formats.names() if n.startswith("turboquant")]
    + [("turboquant_3bit_nc", 64), ("turboquant_4bit_nc", 256), ("turboquant_k8v4", 48)],
)
def test_turboquant_write_warps_equal_numba_around_bad_slots(name, d, in_dtype, warps, monkeypatch):
    """CTAs of 2, 6 and 8 warps (the A/B counts beside the default 4) write the Numba backend's
    bytes for the good rows, nothing for the others, and flag the bad slots: 437 rows (no
    count of rows per CTA divides it, so the last CTA is partial), every fifth slot padding,
    two beyond the cache; D = 48 takes the shared-memory body, whose staging is per CTA."""
    from kvkit.cuda.write import tq_launch_defines

    monkeypatch.setenv("KVKIT_WRITE_TQ_WARPS", warps)
    fmt = formats.get(name, d)
    assert tq_launch_defines(fmt, "1")["TQ_WARPS"] == warps
    _write_around_bad_slots(fmt, in_dtype, n=437, heads=3, bad=(11, 300), seeds=(29, 31),
                            scales=(2.0, 0.7), context=f"warps={warps}")  # fmt: skip
