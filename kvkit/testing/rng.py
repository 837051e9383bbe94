"""Deterministic random number generators for tests, demos and benchmarks.

Every random array in kvkit's tests comes from a generator made here, so that a failure
reproduces from its seed alone. Seeds may be integers or strings (test names); strings map
to integers through CRC-32, which is stable across Python processes and versions (unlike
``hash``, which is salted per process).
"""

from __future__ import annotations

import zlib

import numpy as np

__all__ = ["derive", "rng", "seed_from_name"]

Seed = int | str


def seed_from_name(name: str) -> int:
    """A stable non-negative 32-bit seed for a string, e.g. a test's node id."""
    return zlib.crc32(name.encode("utf-8")) & 0xFFFFFFFF


def _as_int(seed: Seed) -> int:
    if isinstance(seed, str):
        return seed_from_name(seed)
    if isinstance(seed, (bool, np.bool_)):
        raise TypeError("seed must be an int or a str, not a bool")
    seed = int(seed)
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    return seed


def rng(seed: Seed = 0) -> np.random.Generator:
    """A fresh ``np.random.Generator`` (PCG64) for ``seed`` (an int >= 0, or a string)."""
    return np.random.Generator(np.random.PCG64(_as_int(seed)))


def derive(seed: Seed, *labels: Seed) -> np.random.Generator:
    """An independent generator for one named purpose under ``seed``.

    ``derive(s, "keys")`` and ``derive(s, "values")`` are statistically independent streams,
    and each is the same on every run. Labels may be strings or non-negative ints.
    """
    entropy = [_as_int(seed), *(_as_int(label) for label in labels)]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))
