"""CPU checks of TurboQuant write variant 6's argument (branch w17; no GPU needed).

Variant 6 computes the key norm's sum of squares of float16 inputs as fmaf(x, x, acc) where the
spec (kvkit/cpu/write.py, kvkit/formats) rounds twice, RN(acc + RN(x * x)). The two agree for
every acc exactly when RN(x * x) == x * x, i.e. when every float16 value's square is a float32
(with no subnormal result, which the kernels would keep anyway: -ftz=false). This checks that
lemma over all 65536 float16 patterns, and the fused and unfused sums on the spec's order.
"""

from __future__ import annotations

import numpy as np

from kvkit.cuda.write import TQ_VARIANTS


def _finite_halves() -> np.ndarray:
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    return h[np.isfinite(h)]


def test_tq_variant_6_w17_exists():
    assert 6 in TQ_VARIANTS


def test_tq_variant_6_w17_float16_squares_are_exact_normal_float32():
    x = _finite_halves().astype(np.float64)
    sq64 = x * x  # exact in float64: at most 22 significant bits
    sq32 = (x.astype(np.float32) * x.astype(np.float32)).astype(np.float64)
    assert np.array_equal(sq32, sq64)
    nz = sq64[sq64 != 0.0]
    # no square is a float32 subnormal (nor overflows): [2^-48, 65504^2 < 2^32]
    assert nz.min() == 2.0**-48 and nz.max() < 2.0**32
    assert nz.min() >= np.finfo(np.float32).tiny


def test_tq_variant_6_w17_fused_sums_equal_the_spec_order():
    """The spec lane's sum acc = sq0; acc = RN(acc + sq_j) with sq_j = RN(x_j x_j), against the
    same sum with the exact squares x_j x_j (float64 products rounded once into the float32 add,
    as the fma does): equal on random float16 pieces of every magnitude, signed zeros included."""
    rng = np.random.default_rng(17)
    halves = _finite_halves()
    for e in (2, 4, 8):
        pieces = rng.choice(halves, size=(20000, e))
        pieces[::7, 0] = np.float16(-0.0)
        pieces[::11] = np.float16(0.0)
        x = pieces.astype(np.float32)
        spec = x[:, 0] * x[:, 0]
        fused = x[:, 0] * x[:, 0]
        for j in range(1, e):
            spec = spec + (x[:, j] * x[:, j])  # two float32 roundings
            exact = x[:, j].astype(np.float64) * x[:, j].astype(np.float64)
            assert np.array_equal(exact.astype(np.float32).astype(np.float64), exact)
            fused = fused + exact.astype(np.float32)  # one rounding of acc + (exact square)
        assert np.array_equal(spec.view(np.uint32), fused.view(np.uint32))
