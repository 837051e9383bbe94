"""The TurboQuant rotation and the two float32 reductions whose order is part of the spec.

Rotation R = H_D diag(s) / sqrt(D), with H_D the Sylvester Hadamard matrix and s a +-1 vector
that belongs to the format. It is never formed as a matrix: H_D x is a fast Walsh-Hadamard
transform (FWHT) whose stage order is fixed here so both backends round identically:
stages h = 1, 2, 4, ..., D/2; in stage h every pair (i, i + h) with bit h of i clear becomes
(a + b, a - b) in float32, a = x[i], b = x[i + h].

Sum of squares (norms): the D elements are dealt to REDUCTION_LANES = 32 lanes in contiguous
chunks of E = D / 32 (lane l holds elements [l*E, l*E + E)); each lane sums x*x of its chunk
in element order in float32 (the product rounded, then added: no fused multiply-add); then
the 32 partial sums are combined by the xor butterfly: for off in 16, 8, 4, 2, 1, every lane
l takes p[l] + p[l ^ off]. The result is lane 0's value (every lane holds the same value,
since IEEE addition commutes). This is exactly a warp-shuffle reduction over one warp.

Signs: s_i = -1 where bit 63 of splitmix64(SIGN_SEED + (i + 1) * 0x9E3779B97F4A7C15) is set,
else +1; rotation="hadamard" uses all +1 (vLLM's rotation).
"""

from __future__ import annotations

import numpy as np

REDUCTION_LANES = 32
#: The documented seed of the default signed rotation (ASCII "kvkit").
SIGN_SEED = 0x6B766B6974
ROTATIONS = ("signed_hadamard", "hadamard")

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _splitmix64(x: int) -> int:
    z = x & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def rotation_signs(head_dim: int, rotation: str) -> np.ndarray:
    """(head_dim,) float32 of +-1: the diagonal s of the rotation."""
    if rotation == "hadamard":
        return np.ones(head_dim, dtype=np.float32)
    if rotation != "signed_hadamard":
        raise ValueError(f"rotation must be one of {ROTATIONS}, got {rotation!r}")
    bits = [_splitmix64(SIGN_SEED + (i + 1) * _GOLDEN) >> 63 for i in range(head_dim)]
    return np.where(np.array(bits) == 1, -1.0, 1.0).astype(np.float32)


def fwht_array(x: np.ndarray) -> np.ndarray:
    """Unnormalized H_D x along the last axis, float32, in the spec's stage order."""
    x = np.array(x, dtype=np.float32)
    d = x.shape[-1]
    lead = x.shape[:-1]
    h = 1
    while h < d:
        y = x.reshape(lead + (d // (2 * h), 2, h))
        a = y[..., 0, :]
        b = y[..., 1, :]
        x = np.stack([a + b, a - b], axis=-2).reshape(lead + (d,))
        h *= 2
    return x


def sum_squares_array(x: np.ndarray) -> np.ndarray:
    """Sum of x*x along the last axis in the spec's lane/butterfly order, float32."""
    x = np.asarray(x, dtype=np.float32)
    d = x.shape[-1]
    if d % REDUCTION_LANES:
        raise ValueError(f"length {d} is not a multiple of {REDUCTION_LANES}")
    chunk = x.reshape(x.shape[:-1] + (REDUCTION_LANES, d // REDUCTION_LANES))
    sq = chunk * chunk
    p = sq[..., 0]
    for j in range(1, sq.shape[-1]):
        p = p + sq[..., j]
    lanes = np.arange(REDUCTION_LANES)
    off = REDUCTION_LANES // 2
    while off:
        p = p + p[..., lanes ^ off]
        off //= 2
    return p[..., 0]


# --- scalar (Numba-compatible) forms ----------------------------------------------------------


def fwht_inplace(x: np.ndarray) -> None:
    """In-place unnormalized FWHT of a 1-D float32 array, spec stage order."""
    d = x.shape[0]
    h = 1
    while h < d:
        for i in range(d):
            if i & h == 0:
                a = x[i]
                b = x[i + h]
                x[i] = a + b
                x[i + h] = a - b
        h *= 2


def sum_squares(x: np.ndarray, lanes: np.ndarray) -> np.float32:
    """Spec-order sum of squares of a 1-D float32 array; lanes: (32,) float32 scratch."""
    d = x.shape[0]
    e = d // REDUCTION_LANES
    for lane in range(REDUCTION_LANES):
        v = x[lane * e]
        acc = v * v
        for j in range(1, e):
            v = x[lane * e + j]
            acc = acc + v * v
        lanes[lane] = acc
    off = REDUCTION_LANES // 2
    while off:
        # Lane l and lane l ^ off compute the same sum, so updating the lower lane of each
        # pair in place (and copying) reproduces the simultaneous butterfly.
        for lane in range(REDUCTION_LANES):
            if lane & off == 0:
                s = lanes[lane] + lanes[lane ^ off]
                lanes[lane] = s
                lanes[lane ^ off] = s
        off //= 2
    return lanes[0]
