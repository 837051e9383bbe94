"""Variant 5's cell table (kvkit/cuda/write.py _tq_bucket_defines imad_squares): the kernel's
key squares are x + code * dl (uint32 arithmetic, write_turboquant.cu KvTqCell), which must be
the bits of c[base]^2 for code = base and of c[base + 1]^2 (c[base]^2 in a cell without a
midpoint) for code = base + 1, in every preset's table. CPU only."""

from __future__ import annotations

import re

import numpy as np
import pytest

from kvkit import formats
from kvkit.cuda.write import _tq_bucket_defines
from kvkit.formats.arch_models import tq_bucket_table

MSE = [n for n in formats.names() if n.startswith("turboquant") and n != "turboquant_k8v4"]


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("name", MSE)
def test_imad_squares_give_both_squares(name, d):
    fmt = formats.get(name, d)
    table = tq_bucket_table(fmt.midpoints, fmt.centroids)
    assert table is not None
    plain = _tq_bucket_defines(fmt, True, False)["TQ_BKT_TABLE"]
    imad = _tq_bucket_defines(fmt, True, True)
    assert imad["TQ_BKT_IMAD_SQ"] == "1"
    pat = r"\{0x([0-9A-F]{8})u,(\d+),0x([0-9A-F]{8})u,0x([0-9A-F]{8})u\}"
    cells = re.findall(pat, imad["TQ_BKT_TABLE"])
    assert len(cells) == table.cells
    lo = np.asarray(table.sq_lo, np.float32).view(np.uint32)
    hi = np.asarray(table.sq_hi, np.float32).view(np.uint32)
    for i, (mid, base, x, dl) in enumerate(cells):
        b, x, dl = int(base), int(x, 16), int(dl, 16)
        assert b == int(table.base[i])
        assert (x + b * dl) & 0xFFFFFFFF == int(lo[i])
        assert (x + (b + 1) * dl) & 0xFFFFFFFF == int(hi[i])
        assert f"{{0x{mid}u,{b}," in plain  # the same midpoints and bases as variant 3's table
