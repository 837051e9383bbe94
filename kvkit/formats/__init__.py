"""kvkit.formats: THE spec. Every byte, constant and rounding rule of every cache format.

Nothing here imports a backend. ``get(name, head_dim, **options)`` returns an immutable
``Format`` that fully describes a cache; the CPU and CUDA backends read their constants
from it (``fmt.cuda_defines()`` for the CUDA side).

Formats (bytes per token-head at D=128): fp16 512, bf16 512, fp8_e4m3 256, nvfp4 144,
nvfp4_4over6 144, turboquant_k8v4 196, turboquant_4bit_nc 134, turboquant_k3v4_nc 118,
turboquant_3bit_nc 102.
"""

from __future__ import annotations

import numpy as np

from . import codecs, turboquant
from .base import Format, PlaneSpec, check_global_scale
from .dense import DenseFormat, FP8Format
from .nvfp4 import NVFP4Format
from .turboquant import TurboQuantFormat

__all__ = [
    "Format",
    "PlaneSpec",
    "DenseFormat",
    "FP8Format",
    "NVFP4Format",
    "TurboQuantFormat",
    "get",
    "names",
    "calibrate",
    "check_global_scale",
]

_NAMES = (
    "fp16",
    "bf16",
    "fp8_e4m3",
    "nvfp4",
    "nvfp4_4over6",
    *turboquant.PRESETS,
)
MAX_HEAD_DIM = 512
#: Block scale granularity of NVFP4 and the vector width FP8 keys need.
HEAD_DIM_MULTIPLE = 16


def names() -> list[str]:
    """Every registered format name."""
    return list(_NAMES)


def get(name: str, head_dim: int, **options: object) -> Format:
    """Build a format.

    Args:
        name: one of ``names()``.
        head_dim: D. TurboQuant MSE-key presets need 64, 128 or 256; every other format
            needs D % 16 == 0 and D <= 512.
        options: TurboQuant MSE presets accept ``rotation="signed_hadamard"`` (default: the
            Hadamard rotation with the documented seeded signs) or ``"hadamard"`` (vLLM's),
            and ``codebook="lloyd_max"`` (default) or an array of 2**bits ascending centroids
            for N(0, 1/D) coordinates. No other format takes options.
    """
    if not isinstance(name, str) or name not in _NAMES:
        raise ValueError(f"unknown format {name!r}; known: {', '.join(_NAMES)}")
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)):
        raise TypeError(f"head_dim must be an int, got {type(head_dim).__name__}")
    head_dim = int(head_dim)
    if head_dim <= 0 or head_dim > MAX_HEAD_DIM or head_dim % HEAD_DIM_MULTIPLE:
        raise ValueError(
            f"head_dim must be a multiple of {HEAD_DIM_MULTIPLE} in "
            f"{HEAD_DIM_MULTIPLE}..{MAX_HEAD_DIM}, got {head_dim}"
        )
    if name in turboquant.PRESETS:
        unknown = set(options) - {"rotation", "codebook"}
        if unknown:
            raise TypeError(f"{name} got unknown options {sorted(unknown)}")
        return turboquant.make(
            name,
            head_dim,
            rotation=str(options.get("rotation", "signed_hadamard")),
            codebook_=options.get("codebook"),
        )
    if options:
        raise TypeError(f"{name} takes no options, got {sorted(options)}")
    if name in ("fp16", "bf16"):
        return DenseFormat(name=name, head_dim=head_dim)
    if name == "fp8_e4m3":
        return FP8Format(name=name, head_dim=head_dim)
    return NVFP4Format(name=name, head_dim=head_dim, four_over_six=name == "nvfp4_4over6")


def calibrate(x: np.ndarray) -> float:
    """NVFP4 decode-convention global scale for data like x: amax / (6 * 448).

    Returns 1.0 when x has no nonzero finite element.
    """
    return float(np.float32(get("nvfp4", HEAD_DIM_MULTIPLE).calibrate(x)))


_ = codecs  # re-exported for users: kvkit.formats.codecs
