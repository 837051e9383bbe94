"""Scalar argument checks shared by every module: one wording for every error."""

from __future__ import annotations

import math
import numbers


def check_int(name: str, value: object, minimum: int) -> int:
    """An int (Python or NumPy, not bool) >= minimum, returned as a Python int."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_positive_finite(name: str, value: object) -> float:
    """A real number (not bool) that is finite and > 0, returned as a float."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"{name} must be finite and > 0, got {value}")
    return value
