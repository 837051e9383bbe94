"""Scalar codebooks for TurboQuant MSE keys.

After the rotation, each coordinate of a unit vector is close to N(0, 1/D). The default
codebook is the Lloyd-Max quantizer of that Gaussian, iterated to convergence with the
centroid and cell-probability integrals in closed form (erf and the Gaussian density), in
float64, then scaled by 1/sqrt(D) and rounded to float32. Bucketing uses float32 midpoints,
each the float32 rounding of the float64 mean of two adjacent float32 centroids;
a coordinate's index is the number of midpoints <= it (a value on a midpoint goes up).
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np

_LLOYD_TOL = 1e-15
_LLOYD_MAX_ITERS = 100_000


def _phi(x: float) -> float:
    return math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi) if math.isfinite(x) else 0.0


def _cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


@cache
def lloyd_max_standard(levels: int) -> tuple[float, ...]:
    """Converged Lloyd-Max levels for N(0, 1), ascending, float64."""
    # Start from equal-probability cell centres: any symmetric start converges for a
    # log-concave density; this one just converges quickly.
    c = [math.sqrt(2.0) * _erfinv(2.0 * (i + 0.5) / levels - 1.0) for i in range(levels)]
    for _ in range(_LLOYD_MAX_ITERS):
        t = [-math.inf] + [(c[i] + c[i + 1]) / 2.0 for i in range(levels - 1)] + [math.inf]
        new = [(_phi(t[i]) - _phi(t[i + 1])) / (_cdf(t[i + 1]) - _cdf(t[i])) for i in range(levels)]
        delta = max(abs(a - b) for a, b in zip(new, c))
        c = new
        if delta < _LLOYD_TOL:
            break
    else:  # pragma: no cover - the iteration is a contraction for the Gaussian
        raise RuntimeError("Lloyd-Max iteration did not converge")
    return tuple(c)


def _erfinv(y: float) -> float:
    # Newton on erf; only used for a starting point, so a few steps from 0 are plenty.
    x = 0.0
    for _ in range(100):
        err = math.erf(x) - y
        x -= err / (2.0 / math.sqrt(math.pi) * math.exp(-x * x))
    return x


def lloyd_max(bits: int, head_dim: int) -> np.ndarray:
    """(2**bits,) float32 centroids for N(0, 1/head_dim), ascending."""
    levels = lloyd_max_standard(1 << bits)
    return (np.asarray(levels) / math.sqrt(head_dim)).astype(np.float32)


def midpoints(centroids: np.ndarray) -> np.ndarray:
    """(n-1,) float32 bucketing thresholds of an ascending float32 codebook."""
    c = np.asarray(centroids, dtype=np.float32).astype(np.float64)
    return ((c[:-1] + c[1:]) / 2.0).astype(np.float32)


def check_codebook(centroids: object, bits: int) -> np.ndarray:
    """Validate a user codebook: 2**bits finite, strictly ascending values -> float32."""
    c = np.asarray(centroids, dtype=np.float64)
    if c.shape != (1 << bits,):
        raise ValueError(
            f"codebook must have shape ({1 << bits},) for {bits}-bit keys, got {c.shape}"
        )
    if not np.all(np.isfinite(c)):
        raise ValueError("codebook must be finite")
    c32 = c.astype(np.float32)
    if not np.all(np.diff(c32) > 0):
        raise ValueError("codebook must be strictly ascending (after rounding to float32)")
    return c32
