"""Host-side plane argument checks of the CUDA launchers (no GPU needed: fake planes)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from kvkit.cuda import decode as cuda_decode
from kvkit.cuda.write import plane_args


def fake_plane(shape, strides, itemsize=1, ptr=4096):
    return SimpleNamespace(ndim=len(shape), shape=shape, strides=strides, itemsize=itemsize,
                           data=SimpleNamespace(ptr=ptr))  # fmt: skip


def test_strides_in_elements():
    p = fake_plane((4, 2, 16, 64), (4096, 2048, 128, 2), itemsize=2)
    args = plane_args(p)
    assert args[0] is p and [int(a) for a in args[1:]] == [2048, 1024, 64]


@pytest.mark.parametrize(
    "shape, strides, match",
    [
        ((4, 2, 16), (32, 16, 1), "num_blocks"),
        ((4, 2, 16, 8), (256, 128, 8, 2), "contiguous"),
        ((4, 2, 16, 8), (-256, 128, 8, 1), "non-negative"),
    ],
)
def test_bad_planes_are_rejected(shape, strides, match):
    with pytest.raises(ValueError, match=match):
        plane_args(fake_plane(shape, strides), "k")


OFF32 = cuda_decode.OFF32_BIT


def test_decode_load_width_and_slab_bit():
    # HND TurboQuant slots: rows of 134 bytes, (page, head) slabs of 16 * 134 = 2144 bytes.
    hnd = fake_plane((8, 2, 16, 134), (4288, 2144, 134, 1))
    args = cuda_decode._plane_args(hnd, "slots")
    assert [int(a) for a in args[1:4]] == [4288, 2144, 134]
    # rows 2-byte aligned; slabs 16-byte; small offsets
    assert int(args[4]) == 2 | cuda_decode.SLAB_BIT | OFF32
    # A token-major (NHD) view: tokens not contiguous per head, no slab bit.
    nhd = fake_plane((8, 2, 16, 64), (2048, 64, 128, 1))
    assert int(cuda_decode._plane_args(nhd, "k")[4]) == 16 | OFF32
    # An odd base address forces single-byte loads.
    odd = fake_plane((8, 2, 16, 64), (2048, 1024, 64, 1), ptr=4097)
    assert int(cuda_decode._plane_args(odd, "k")[4]) == 1 | OFF32
    assert np.int32(cuda_decode._plane_args(odd, "k")[4]).dtype == np.int32


def _vec(shape, strides, itemsize=1):
    return int(cuda_decode._plane_args(fake_plane(shape, strides, itemsize), "k")[4])


G = 1 << 31


@pytest.mark.parametrize(
    "shape, strides, itemsize, fits",
    [
        # contiguous HND fp16 (bytes: 2 * 128 per row); the block stride is far below 2^31
        ((1024, 8, 16, 128), (8 * 16 * 256, 16 * 256, 256, 2), 2, True),
        # token-major (NHD) uint8 view of the same bytes
        ((1024, 8, 16, 64), (8 * 16 * 64, 64, 8 * 64, 1), 1, True),
        # page stride of 2^31 bytes (a huge interleaved pool): only the page term is 64-bit
        ((4, 2, 16, 64), (G, 1024, 64, 1), 1, False),
        ((4, 2, 16, 64), (G - 16, 1024, 64, 1), 1, True),
        # the same, with the page stride in elements below 2^31 but in bytes at 2^31
        ((4, 2, 16, 64), (G, 1024, 128, 2), 2, False),
        # head-major pool (Hkv, num_blocks, bs, W) viewed as (num_blocks, Hkv, bs, W): the
        # last head's last row ends one byte before 2^31 (fits) or at or past it
        ((4, 4, 16, 64), (1024, (G - 15 * 64 - 64) // 3, 64, 1), 1, True),
        ((4, 4, 16, 64), (1024, (G - 15 * 64 - 64) // 3 + 1, 64, 1), 1, False),
        ((4, 2, 16, 64), (1024, G - 15 * 64 - 64 - 1, 64, 1), 1, True),
        ((4, 2, 16, 64), (1024, G - 15 * 64 - 64, 64, 1), 1, False),
        # the token term alone past 2^31 (a strided token axis)
        ((4, 1, 16, 64), (1024, 0, (G - 64) // 15 + 1, 1), 1, False),
        # rows ending exactly below the limit with fp32 elements (width counts in bytes)
        ((4, 1, 1, (G - 4) // 4), (0, 0, 0, 4), 4, True),
        ((4, 1, 1, G // 4), (0, 0, 0, 4), 4, False),
        # a single head and token: only the row width counts
        ((4, 1, 1, 64), (64, 64, 64, 1), 1, True),
    ],
)
def test_off32_bit(shape, strides, itemsize, fits):
    assert cuda_decode.offsets_fit_32bit(shape, strides, itemsize) is fits
    vec = _vec(shape, strides, itemsize)
    assert bool(vec & OFF32) is fits
    # the bit leaves the load width and the slab bit alone
    assert vec & cuda_decode.VEC_MASK in (1, 2, 4, 8, 16)
    assert not vec & ~(cuda_decode.VEC_MASK | cuda_decode.SLAB_BIT | OFF32)


def test_off32_never_for_negative_strides():
    assert not cuda_decode.offsets_fit_32bit((4, 2, 16, 64), (-1024, 512, 64, 1), 1)
    assert not cuda_decode.offsets_fit_32bit((4, 2, 16, 64), (1024, 512, -64, 1), 1)


def test_load_width_code_matches_the_kernel():
    """The Python bits are the ones decode_core.cuh decodes (KVD_VEC_MASK and the two flags),
    and the flags do not overlap the width bits or each other."""
    from kvkit.cuda import compiler

    text = (compiler.cuda_src_dir() / "common" / "decode_core.cuh").read_text()
    for name, value in (("KVD_VEC_MASK", cuda_decode.VEC_MASK),
                        ("KVD_SLAB_BIT", cuda_decode.SLAB_BIT),
                        ("KVD_OFF32_BIT", cuda_decode.OFF32_BIT)):  # fmt: skip
        assert f"#define {name} {value}\n" in text, name
    assert cuda_decode.VEC_MASK & cuda_decode.SLAB_BIT == 0
    assert (cuda_decode.VEC_MASK | cuda_decode.SLAB_BIT) & cuda_decode.OFF32_BIT == 0
    assert 16 <= cuda_decode.VEC_MASK


class _FakeKernel:
    """A stage-1 kernel stand-in that counts driver attribute queries."""

    def __init__(self, regs):
        self.regs = regs
        self.queries = 0

    @property
    def attributes(self):
        self.queries += 1
        return {"num_regs": self.regs}


@pytest.mark.parametrize(
    "regs, threads, smem, sm_kb, expected",
    [
        (168, 128, 73 * 1024, 228, 3),  # 168 x 32 x 4 = 21,504 registers a CTA: 3 fit 65,536
        (160, 128, 88 * 1024, 228, 2),  # shared memory: 2 x 89 KB of 228 KB
        (160, 128, 88 * 1024, 164, 1),  # an A100's 164 KB: 1 x 89 KB
        (127, 128, 54896, 164, 3),  # 3 x (53.6 + 1) KB of an A100's 164 KB (registers: 4)
        (64, 256, 10 * 1024, 228, 4),  # registers 4 x 16,384; threads 1536 / 256 = 6
        (40, 256, 1024, 228, 6),  # threads: 1536 / 256
        (255, 256, 200 * 1024, 100, 1),  # never 0
    ],
)
def test_resident_ctas_once_per_kernel(regs, threads, smem, sm_kb, expected, monkeypatch):
    # The device's shared memory per SM stood in for (no GPU here).
    monkeypatch.setattr(cuda_decode, "_smem_per_sm", lambda: sm_kb * 1024)
    monkeypatch.setattr(cuda_decode, "_resident_cache", {})
    k = _FakeKernel(regs)
    assert cuda_decode._resident_ctas(k, threads, smem) == expected
    assert cuda_decode._resident_ctas(k, threads, smem) == expected
    assert k.queries == 1  # the driver is asked once per kernel, not per decode call
