"""The kernels the public calls load on this GPU hold no local memory (no register spills),
as built by the device's own NVRTC.

tests/cuda/test_compile.py's spill tests read ptxas's statistics from the NVRTC log of builds
made for the test (and, where a log lacks them, the cubin's frames), not of the builds the
launchers load. The driver sees those: a loaded function's ``local_size_bytes`` is the
per-thread local memory its cubin asks for, which spills (and any stack) make non-zero.
"""

from __future__ import annotations

import numpy as np
import pytest

import kvkit
from kvkit import formats
from kvkit.cuda import compiler
from kvkit.cuda import decode as cuda_decode
from kvkit.cuda import dequant as cuda_dequant
from kvkit.cuda import write as cuda_write

pytestmark = pytest.mark.gpu

HKV = 2
BLOCK = 16
#: (head_dim, G, q_len): the benchmark's main shape, its larger groups and a verify chunk,
#: and the two other head sizes.
SHAPES = [(128, 4, 1), (128, 8, 1), (128, 16, 1), (128, 2, 4), (64, 4, 1), (256, 4, 1)]
#: A one-split decode and one long enough for several splits and the tile-pair loops.
LENGTHS = (40, 3000)


@pytest.fixture
def cp():
    import cupy

    return cupy


@pytest.fixture
def loaded(monkeypatch):
    """(entry, defines, arch) of every module the launchers fetch while the test runs."""
    seen: set = set()

    def spy_module(orig):
        def get_module(entry, defines, arch=None):
            seen.add((entry, tuple(sorted(defines.items())), arch))
            return orig(entry, defines, arch)

        return get_module

    def spy_kernel(orig):
        def get_kernel(entry, name, defines, arch=None):
            seen.add((entry, tuple(sorted(defines.items())), arch))
            return orig(entry, name, defines, arch)

        return get_kernel

    monkeypatch.setattr(cuda_decode, "get_module", spy_module(cuda_decode.get_module))
    # Fresh memos, so that builds loaded by earlier tests are fetched (and seen) again.
    monkeypatch.setattr(cuda_decode, "_stage1_cache", {})
    monkeypatch.setattr(cuda_decode, "_merge_cache", {})
    monkeypatch.setattr(cuda_write, "get_kernel", spy_kernel(cuda_write.get_kernel))
    monkeypatch.setattr(cuda_dequant, "get_kernel", spy_kernel(cuda_dequant.get_kernel))
    return seen


def local_memory(seen) -> dict:
    """(entry, kernel, defines) -> local_size_bytes, for every kernel of every seen module."""
    out = {}
    for entry, defines, arch in sorted(seen, key=repr):
        module = compiler.get_module(entry, dict(defines), arch)
        for name in compiler.kernel_names(compiler.inline_source(entry)):
            try:
                kern = module.get_function(name)
            except Exception:  # a kernel this build's defines leave out
                continue
            out[(entry, name, defines)] = int(kern.attributes["local_size_bytes"])
    return out


def filled_layer(cp, name: str, d: int, tokens: int, rng):
    fmt = formats.get(name, d)
    blocks = -(-tokens // BLOCK) + 1
    layer = kvkit.PagedKVCache(fmt, 1, HKV, blocks, BLOCK, backend="cuda").layer(0)
    k = cp.asarray(rng.standard_normal((tokens, HKV, d)).astype(np.float16))
    v = cp.asarray(rng.standard_normal((tokens, HKV, d)).astype(np.float16))
    kvkit.write_kv(layer, k, v, cp.arange(tokens, dtype=cp.int64))
    return layer


@pytest.mark.parametrize("name", formats.names())
def test_decode_write_and_dequant_kernels_keep_no_local_memory(cp, loaded, name):
    rng = np.random.default_rng(7)
    used = 0
    for d, group, q_len in SHAPES:
        for tokens in LENGTHS:
            layer = filled_layer(cp, name, d, tokens, rng)
            batch = 2
            tables = cp.asarray(np.tile(np.arange(-(-tokens // BLOCK), dtype=np.int32), (batch, 1)))
            lens = cp.full((batch,), tokens, dtype=cp.int32)
            shape = (batch, group * HKV, d) if q_len == 1 else (batch, q_len, group * HKV, d)
            q = cp.asarray(rng.standard_normal(shape).astype(np.float16))
            caps = (None, 30.0) if (d, group, q_len) == (128, 4, 1) else (None,)
            for softcap in caps:
                kvkit.decode(q, layer, tables, lens, softcap=softcap)
                used += 1
        # Writes of the other input dtypes, and the dequantize kernel.
        k32 = cp.asarray(rng.standard_normal((5, HKV, d)).astype(np.float32))
        kvkit.write_kv(layer, k32, k32, cp.arange(5, dtype=cp.int64))
        kvkit.dequantize(layer, cp.arange(5, dtype=cp.int64))
    cp.cuda.Device().synchronize()
    assert used and loaded, "no kernel was loaded"
    found = local_memory(loaded)
    entries = {entry for entry, _, _ in found}
    assert any(e.startswith("decode_") for e in entries) and any(
        e.startswith("write_") for e in entries
    ), entries
    spilled = sorted(
        (
            (n, entry, kernel, {k: v for k, v in defines if k in _NAMED})
            for (entry, kernel, defines), n in found.items()
            if n > _allowed(entry, dict(defines))
        ),
        key=repr,
    )
    assert spilled == [], f"{len(spilled)} of {len(found)} kernels use local memory: {spilled[:6]}"


def _allowed(entry: str, defines: dict) -> int:
    """Local bytes a build may hold. One, measured: the FP8-key TurboQuant write with 16-bit
    inputs at its sm_90 cap of 16 CTAs an SM (kvkit/cuda/write.py _TQ_MIN_CTAS_FP8K_SM90_F16,
    32 registers) has an 8-byte stack frame under NVRTC 12.9 and 13.0 ("0 bytes spill
    stores"; none at 12 CTAs, 40 registers). Its H200 rows were measured with the frame, and
    12 CTAs measured 4% slower (benchmarks/NOTES.md v20, call 5)."""
    if (
        entry == "write_turboquant.cu"
        and defines.get("TQ_KEY_FP8") == "1"
        and defines.get("TQ_MIN_CTAS_SM90") == "16"
    ):
        return 8
    return 0


#: Defines that say which build a kernel is, for the failure message.
_NAMED = {"KV_HEAD_DIM", "KV_GROUP", "KV_Q_LEN", "KV_SOFTCAP", "KV_IN_DTYPE", "KV_Q_DTYPE"}
