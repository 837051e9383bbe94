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


def test_decode_load_width_and_slab_bit():
    # HND TurboQuant slots: rows of 134 bytes, (page, head) slabs of 16 * 134 = 2144 bytes.
    hnd = fake_plane((8, 2, 16, 134), (4288, 2144, 134, 1))
    args = cuda_decode._plane_args(hnd, "slots")
    assert [int(a) for a in args[1:4]] == [4288, 2144, 134]
    assert int(args[4]) == 2 | cuda_decode.SLAB_BIT  # rows 2-byte aligned; slabs 16-byte
    # A token-major (NHD) view: tokens not contiguous per head, no slab bit.
    nhd = fake_plane((8, 2, 16, 64), (2048, 64, 128, 1))
    assert int(cuda_decode._plane_args(nhd, "k")[4]) == 16
    # An odd base address forces single-byte loads.
    odd = fake_plane((8, 2, 16, 64), (2048, 1024, 64, 1), ptr=4097)
    assert int(cuda_decode._plane_args(odd, "k")[4]) == 1
    assert np.int32(cuda_decode._plane_args(odd, "k")[4]).dtype == np.int32


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
    "regs, threads, smem, expected",
    [
        (168, 128, 73 * 1024, 3),  # 168 x 32 x 4 = 21,504 registers a CTA: 3 fit 65,536
        (160, 128, 88 * 1024, 2),  # shared memory: 2 x 89 KB of 228 KB
        (64, 256, 10 * 1024, 4),  # registers 4 x 16,384; threads 1536 / 256 = 6
        (40, 256, 1024, 6),  # threads: 1536 / 256
        (255, 256, 200 * 1024, 1),  # never 0
    ],
)
def test_resident_ctas_once_per_kernel(regs, threads, smem, expected):
    k = _FakeKernel(regs)
    assert cuda_decode._resident_ctas(k, threads, smem) == expected
    assert cuda_decode._resident_ctas(k, threads, smem) == expected
    assert k.queries == 1  # the driver is asked once per kernel, not per decode call
