"""The decode copy's division-free run index (kv_slab_magic in cuda_src/common/decode_core.cuh).

The slab copy finds the run of 16-byte piece pc as umulhi(2 pc, ceil(2^31 / p)) instead of
pc // p. This checks that identity exhaustively over the range the kernel promises
(pc, p < 2^14; p = min(block_size, 64) * slot_bytes / 16), with integer arithmetic that does
not share the kernel's formula for the quotient.
"""

from __future__ import annotations

import numpy as np


def _umulhi_run(pc: np.ndarray, pieces: int) -> np.ndarray:
    magic = ((1 << 31) + pieces - 1) // pieces
    return ((2 * pc) * np.uint64(magic)) >> np.uint64(32)


def test_run_index_equals_floor_division_over_the_whole_range():
    pc = np.arange(1 << 14, dtype=np.uint64)
    wrong = [p for p in range(1, (1 << 14) + 1)
             if not np.array_equal(_umulhi_run(pc, p), pc // np.uint64(p))]  # fmt: skip
    assert wrong == []

