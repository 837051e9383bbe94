"""Unquantized (fp16, bf16) and per-layer-scaled FP8 E4M3 formats.

fp16: planes "k", "v" hold D float16 each (a plain IEEE cast: overflow gives inf).
bf16: planes "k", "v" hold the uint16 bits of D bfloat16 (RNE).
fp8_e4m3: planes "k", "v" hold D E4M3 bytes; value = e4m3(byte) * scale with the layer's
fp32 k_scale / v_scale; write: byte = e4m3_satfinite(x / scale) (IEEE float32 division).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import codecs
from .base import Format, PlaneSpec, amax_scale, f32


@dataclass(frozen=True, repr=False)
class DenseFormat(Format):
    name: str
    head_dim: int
    family: str = "dense"

    @property
    def element_dtype(self) -> str:
        return "float16" if self.name == "fp16" else "uint16"

    @property
    def planes(self) -> dict[str, PlaneSpec]:
        p = PlaneSpec(self.head_dim, self.element_dtype)
        return {"k": p, "v": p}

    def _enc(self, x: np.ndarray) -> np.ndarray:
        if self.name == "fp16":
            with np.errstate(over="ignore"):
                return x.astype(np.float16)
        return codecs.bf16_bits_array(x)

    def _dec(self, x: np.ndarray) -> np.ndarray:
        if self.name == "fp16":
            return np.asarray(x, dtype=np.float16).astype(np.float32)
        return codecs.bf16_values_array(x)

    def encode(self, k, v, k_scale=1.0, v_scale=1.0):
        k, v = self._check_kv(k, v)
        return {"k": self._enc(k), "v": self._enc(v)}

    def decode(self, planes, k_scale=1.0, v_scale=1.0):
        return self._dec(planes["k"]), self._dec(planes["v"])

    def _render_cuda_defines(self):
        d = super()._render_cuda_defines()
        d["KV_FORMAT_DENSE"] = "1"
        d["KV_DENSE_BF16"] = "1" if self.name == "bf16" else "0"
        return d


@dataclass(frozen=True, repr=False)
class FP8Format(Format):
    name: str
    head_dim: int
    family: str = "fp8"
    has_global_scales: bool = True

    @property
    def planes(self) -> dict[str, PlaneSpec]:
        p = PlaneSpec(self.head_dim, "uint8")
        return {"k": p, "v": p}

    def encode(self, k, v, k_scale=1.0, v_scale=1.0):
        k, v = self._check_kv(k, v)
        return {
            "k": codecs.e4m3_encode_array(k / f32(k_scale)),
            "v": codecs.e4m3_encode_array(v / f32(v_scale)),
        }

    def decode(self, planes, k_scale=1.0, v_scale=1.0):
        k = codecs.e4m3_decode_array(planes["k"]) * f32(k_scale)
        v = codecs.e4m3_decode_array(planes["v"]) * f32(v_scale)
        return k, v

    def calibrate(self, x: np.ndarray) -> float:
        """amax / 448: the largest element maps to E4M3's largest finite value."""
        return amax_scale(x, codecs.E4M3_MAX)

    def _render_cuda_defines(self):
        d = super()._render_cuda_defines()
        d["KV_FORMAT_FP8"] = "1"
        return d
