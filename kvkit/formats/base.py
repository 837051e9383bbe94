"""The Format interface every cache format implements, and shared validation."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PlaneSpec:
    """One per-token-head plane: ``width`` elements of ``dtype`` (uint8 for packed planes)."""

    width: int
    dtype: str

    @property
    def nbytes(self) -> int:
        return self.width * np.dtype(self.dtype).itemsize


def f32(x: float) -> np.float32:
    return np.float32(x)


def check_global_scale(name: str, value: object) -> float:
    """A per-layer global scale must be a finite positive number."""
    try:
        s = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a float, got {type(value).__name__}") from None
    if not math.isfinite(s) or s <= 0.0:
        raise ValueError(f"{name} must be finite and > 0, got {s}")
    if float(np.float32(s)) == 0.0 or not math.isfinite(float(np.float32(s))):
        raise ValueError(f"{name}={s} is not representable as a positive float32")
    return s


def cuda_float(x: float) -> str:
    """A float32 value as a C++ literal that round-trips exactly."""
    v = np.float32(x)
    if not np.isfinite(v):
        raise ValueError(f"cannot render non-finite {x} as a CUDA literal")
    return np.format_float_scientific(v, unique=True, exp_digits=2) + "f"


class Format:
    """A cache format: what every byte of a token-head's planes means.

    Attributes:
        name: registry name, e.g. ``"turboquant_4bit_nc"``.
        head_dim: D, elements per head vector.
        family: ``"dense"``, ``"fp8"``, ``"nvfp4"`` or ``"turboquant"``.
        has_global_scales: whether a layer carries per-layer fp32 ``k_scale`` / ``v_scale``.
    """

    name: str
    head_dim: int
    family: str
    has_global_scales: bool = False

    @property
    def planes(self) -> dict[str, PlaneSpec]:
        raise NotImplementedError

    @property
    def bytes_per_token_head(self) -> int:
        """K + V bytes for one token and one KV head."""
        return sum(p.nbytes for p in self.planes.values())

    def encode(
        self, k: np.ndarray, v: np.ndarray, k_scale: float = 1.0, v_scale: float = 1.0
    ) -> dict[str, np.ndarray]:
        """Reference quantizer (NumPy): k, v (..., D) float32 -> {plane: (..., width)}."""
        raise NotImplementedError

    def decode(
        self, planes: dict[str, np.ndarray], k_scale: float = 1.0, v_scale: float = 1.0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Reference dequantizer (NumPy): {plane: (..., width)} -> k, v (..., D) float32."""
        raise NotImplementedError

    def calibrate(self, x: np.ndarray) -> float:
        """A per-layer global scale for data like x (1.0 for formats without one)."""
        return 1.0

    def cuda_defines(self) -> dict[str, str]:
        """Preprocessor defines that describe this format to the CUDA kernels (a new dict).

        Rendered once per format object (formats are immutable): the TurboQuant codebook and
        signs as text cost about 0.1 ms, which a launch on the hot path must not pay.
        """
        cached = self.__dict__.get("_cuda_defines_cache")
        if cached is None:
            cached = self._render_cuda_defines()
            object.__setattr__(self, "_cuda_defines_cache", cached)  # frozen: bypass
        return dict(cached)

    def _render_cuda_defines(self) -> dict[str, str]:
        d = {"KV_HEAD_DIM": str(self.head_dim)}
        for pname, spec in self.planes.items():
            d[f"KV_PLANE_{pname.upper()}_WIDTH"] = str(spec.width)
        return d

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, head_dim={self.head_dim})"

    def _check_kv(self, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = np.asarray(k, dtype=np.float32)
        v = np.asarray(v, dtype=np.float32)
        if k.shape != v.shape or k.shape[-1:] != (self.head_dim,):
            raise ValueError(
                f"k and v must both be (..., {self.head_dim}), got {k.shape} and {v.shape}"
            )
        return k, v


def amax_scale(x: np.ndarray, divisor: float) -> float:
    """max|x| / divisor over the finite entries; 1.0 when x is empty or all zero."""
    a = np.asarray(x, dtype=np.float64)
    a = np.abs(a[np.isfinite(a)])
    amax = float(a.max()) if a.size else 0.0
    return amax / divisor if amax > 0 else 1.0
