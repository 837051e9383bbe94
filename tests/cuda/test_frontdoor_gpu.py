"""The public API on CUDA layers: same argument errors as the CPU path, torch zero-copy,
validate=True raising the CPU path's index errors."""

from __future__ import annotations

import numpy as np
import pytest

import kvkit
from kvkit import formats

pytestmark = pytest.mark.gpu


@pytest.fixture
def cp():
    import cupy

    return cupy


def layers(name="turboquant_4bit_nc", d=64, hkv=2, nb=4, bs=16):
    fmt = formats.get(name, d)
    cpu = kvkit.PagedKVCache(fmt, 1, hkv, nb, bs).layer(0)
    gpu = kvkit.PagedKVCache(fmt, 1, hkv, nb, bs, backend="cuda").layer(0)
    return cpu, gpu


def error_of(fn):
    try:
        fn()
    except (TypeError, ValueError) as exc:
        return type(exc), str(exc)
    return None


@pytest.mark.parametrize(
    "mutate",
    [
        lambda k, v, s: (k.astype("float64"), v, s),
        lambda k, v, s: (k[:, :1], v[:, :1], s),
        lambda k, v, s: (k[..., :32], v[..., :32], s),
        lambda k, v, s: (k, v[:2], s),
        lambda k, v, s: (k, v, s.astype("float32")),
        lambda k, v, s: (k, v, s[:2]),
    ],
)
def test_write_argument_errors_match_the_cpu_path(cp, mutate):
    cpu, gpu = layers()
    rng = np.random.default_rng(0)
    k = rng.standard_normal((3, 2, 64)).astype(np.float32)
    s = np.array([0, 5, 9], np.int64)
    host = error_of(lambda: kvkit.write_kv(cpu, *mutate(k, k, s)))
    dev = error_of(
        lambda: kvkit.write_kv(gpu, *mutate(cp.asarray(k), cp.asarray(k), cp.asarray(s)))
    )
    assert host is not None and host == dev
    assert not int(gpu.error_flag.get()[0])


def test_host_arrays_on_a_gpu_layer_are_rejected(cp):
    _, gpu = layers()
    k = np.zeros((1, 2, 64), np.float32)
    with pytest.raises(TypeError, match="device array"):
        kvkit.write_kv(gpu, k, k, np.zeros(1, np.int64))


def test_validate_raises_the_cpu_error_for_slots_beyond_the_cache(cp):
    cpu, gpu = layers()
    k = cp.asarray(np.ones((2, 2, 64), np.float32))
    bad = np.array([1, 64], np.int64)
    host = error_of(lambda: kvkit.write_kv(cpu, k.get(), k.get(), bad))
    dev = error_of(lambda: kvkit.write_kv(gpu, k, k, cp.asarray(bad), validate=True))
    assert host is not None and host == dev
    assert not int(gpu.error_flag.get()[0])  # validate consumes the flag


def test_validate_raises_the_cpu_error_for_bad_block_tables(cp):
    cpu, gpu = layers()
    q = np.ones((1, 4, 64), np.float32)
    tables = np.array([[0, 7]], np.int32)
    lens = np.array([20], np.int32)
    host = error_of(lambda: kvkit.decode(q, cpu, tables, lens))
    dev = error_of(
        lambda: kvkit.decode(
            cp.asarray(q), gpu, cp.asarray(tables), cp.asarray(lens), validate=True
        )
    )
    assert host is not None and host == dev


def test_torch_tensors_are_used_without_a_copy(cp):
    torch = pytest.importorskip("torch")
    from kvkit.cuda.arrays import as_cupy

    cpu, gpu = layers("nvfp4")
    k = torch.randn(5, 2, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(5, 2, 64, device="cuda", dtype=torch.float16)
    for t in (k, v):
        arr, _ = as_cupy(t, "t")
        assert arr.data.ptr == t.data_ptr()
    slots = torch.arange(5, device="cuda", dtype=torch.int64)
    kvkit.write_kv(gpu, k, k, slots)
    kvkit.write_kv(cpu, k.float().cpu().numpy(), k.float().cpu().numpy(), slots.cpu().numpy())
    for name, plane in gpu.planes.items():
        np.testing.assert_array_equal(plane.get(), cpu.planes[name])
    q = torch.randn(1, 8, 64, device="cuda", dtype=torch.float16)
    o = kvkit.decode(
        q,
        gpu,
        torch.zeros(1, 1, device="cuda", dtype=torch.int32),
        torch.full((1,), 5, device="cuda", dtype=torch.int32),
    )
    ref = kvkit.decode(q.cpu().numpy(), cpu, np.zeros((1, 1), np.int32), np.array([5], np.int32))
    from kvkit.testing.tolerance import DECODE_GPU_RTOL, rel_error

    assert rel_error(cp.asnumpy(o), ref) <= DECODE_GPU_RTOL


@pytest.mark.parametrize("dtype", ["float16", "float32", "bfloat16"])
def test_write_kv_4over6_equals_the_cpu_path(cp, dtype):
    """nvfp4_4over6 through kvkit.write_kv for each input dtype (bf16 as a torch tensor), the
    bytes of the CPU path; run under KVKIT_WRITE_NVFP4_46_VARIANT=0 and the default."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 64, 2, 128)).astype(np.float32)
    x *= np.exp(rng.normal(0.0, 1.0, (2, 64, 2, 1))).astype(np.float32)
    cpu, gpu = layers("nvfp4_4over6", d=128, nb=8)
    for layer in (cpu, gpu):
        layer.k_scale, layer.v_scale = 0.37, 5.0 / (6 * 448)
    slots = rng.permutation(cpu.capacity)[:64].astype(np.int64)
    if dtype == "bfloat16":
        torch = pytest.importorskip("torch")
        k, v = (torch.from_numpy(a).to("cuda", torch.bfloat16) for a in x)
        k32, v32 = (t.float().cpu().numpy() for t in (k, v))
        dev_slots = torch.from_numpy(slots).cuda()
    else:
        k32, v32 = (a.astype(dtype).astype(np.float32) for a in x)
        k, v = (cp.asarray(a.astype(dtype)) for a in x)
        dev_slots = cp.asarray(slots)
    kvkit.write_kv(gpu, k, v, dev_slots, validate=True)
    kvkit.write_kv(cpu, k32, v32, slots)
    for name, plane in gpu.planes.items():
        np.testing.assert_array_equal(plane.get(), cpu.planes[name], err_msg=name)
