"""The NVFP4 writer's narrow index splits (cuda_src/common/paged.cuh kv_udiv_magic) with the
launcher's magic numbers (kvkit.cuda.write.udiv_magic): the kernel's arithmetic, modelled on
uint64 NumPy arrays, equals floor division for every divisor tried and numerators at every
multiple's edges and the 32-bit extremes. No GPU needed."""

from __future__ import annotations

import numpy as np
import pytest

from kvkit.cuda.write import udiv_magic

DIVISORS = sorted(
    set(range(1, 300)) | {2**k + e for k in range(9, 32) for e in (-1, 0, 1)} | {0xFFFFFFFF}
)


def _kernel_div(n: np.ndarray, d: int) -> np.ndarray:
    m, s1, s2 = (int(v) for v in udiv_magic(d))
    n = n.astype(np.uint64)
    t = (n * np.uint64(m)) >> np.uint64(32)
    return ((t + ((n - t) >> np.uint64(s1))) >> np.uint64(s2)) & np.uint64(0xFFFFFFFF)


@pytest.mark.parametrize("d", DIVISORS)
def test_magic_division_is_floor_division(d):
    rng = np.random.default_rng(d)
    q = np.unique(np.concatenate([np.arange(0, 70), (2**32 - 1) // d - np.arange(0, 70)]))
    q = q[(q >= 0) & (q <= (2**32 - 1) // d)].astype(np.uint64)
    edges = (q[:, None] * np.uint64(d) + np.array([0, 1, d - 1], np.uint64)[None, :]).ravel()
    n = np.concatenate(
        [edges, rng.integers(0, 2**32, 4096, dtype=np.uint64), np.array([2**32 - 1], np.uint64)]
    )
    n = n[n < 2**32]
    np.testing.assert_array_equal(_kernel_div(n, d), n // np.uint64(d))


def test_magic_rejects_bad_divisors():
    for d in (0, -1, 2**32):
        with pytest.raises(ValueError):
            udiv_magic(d)
