"""NVFP4 KV format (FlashInfer / TensorRT-LLM compatible bytes).

Planes per token-head: "k_data", "v_data" (D/2 bytes: E2M1 codes, element 2j in the low
nibble of byte j), "k_scale", "v_scale" (D/16 bytes: one E4M3 block scale per 16 consecutive
elements, linear, unswizzled). Each layer carries fp32 global scales g (k_scale, v_scale).

Decode:  value = (e2m1(code) * e4m3(sf)) * g, two float32 multiplies in that order.
Write, per block of 16 elements x (float32), operation order fixed for bit-exactness:
  amax = max |x_i|                      (NaN-ignoring max, i.e. fmaxf)
  sf   = e4m3_rne_satfinite(amax / (6 * g))          6 * g and the division in float32
  den  = float(sf) * g;  inv = 1 / den, or 0 when den == 0   (IEEE float32 division)
  q_i  = e2m1_rne_satfinite(x_i * inv)
"Four over six" (nvfp4_4over6) also forms the candidate with 4 in place of 6 and keeps it
when its squared error is strictly lower (ties keep 6). The error of a candidate is
  err = sum_i d_i * d_i,  d_i = x_i - (e2m1(q_i) * float(sf)) * g,
summed in element order i = 0..15 in float32 (product rounded, then added). Readers are the
same for both writers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import arch_models, bitpack, codecs
from .base import Format, PlaneSpec, amax_scale, cuda_float, f32

BLOCK = 16
CODE_BITS = 4
#: amax maps to this E2M1 value under the plain writer; 4over6 also tries ALT_TARGET.
TARGET = 6.0
ALT_TARGET = 4.0


def encode_blocks(x: np.ndarray, g: float, four_over_six: bool) -> tuple[np.ndarray, np.ndarray]:
    """x (..., D) float32 -> (codes (..., D) uint8 one per byte, sf (..., D/16) uint8)."""
    blk = np.asarray(x, dtype=np.float32).reshape(x.shape[:-1] + (x.shape[-1] // BLOCK, BLOCK))
    g32 = f32(g)
    amax = np.fmax.reduce(np.abs(blk), axis=-1)

    def candidate(target: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        with np.errstate(over="ignore", invalid="ignore"):
            sf = codecs.e4m3_encode_array(amax / (f32(target) * g32))
            sf_val = codecs.e4m3_decode_array(sf)
            den = sf_val * g32
            inv = np.divide(f32(1.0), den, out=np.zeros_like(den), where=den != 0)
            q = codecs.e2m1_encode_array(blk * inv[..., None])
        return q, sf, sf_val

    q, sf, sf_val = candidate(TARGET)
    if four_over_six:
        q4, sf4, sf_val4 = candidate(ALT_TARGET)
        better = block_sq_error(blk, q4, sf_val4, g32) < block_sq_error(blk, q, sf_val, g32)
        q = np.where(better[..., None], q4, q)
        sf = np.where(better, sf4, sf)
    return q.reshape(x.shape), sf


def block_sq_error(blk: np.ndarray, q: np.ndarray, sf_val: np.ndarray, g32: np.float32):
    """Spec-order squared error of one candidate, (..., nblocks) float32."""
    with np.errstate(over="ignore", invalid="ignore"):
        recon = (codecs.E2M1_VALUES[q] * sf_val[..., None]) * g32
        d = blk - recon
        sq = d * d
    err = sq[..., 0]
    for i in range(1, BLOCK):
        err = err + sq[..., i]
    return err


def decode_blocks(data: np.ndarray, sf: np.ndarray, g: float) -> np.ndarray:
    """data (..., D/2) uint8, sf (..., D/16) uint8 -> (..., D) float32."""
    d = data.shape[-1] * 2
    codes = bitpack.unpack_array(data, d, CODE_BITS)
    sf_val = codecs.e4m3_decode_array(sf)
    vals = codecs.E2M1_VALUES[codes].reshape(codes.shape[:-1] + (d // BLOCK, BLOCK))
    with np.errstate(over="ignore", invalid="ignore"):
        out = (vals * sf_val[..., None]) * f32(g)
    return out.reshape(codes.shape)


@dataclass(frozen=True, repr=False)
class NVFP4Format(Format):
    name: str
    head_dim: int
    four_over_six: bool = False
    family: str = "nvfp4"
    has_global_scales: bool = True

    @property
    def planes(self) -> dict[str, PlaneSpec]:
        data = PlaneSpec(self.head_dim // 2, "uint8")
        scale = PlaneSpec(self.head_dim // BLOCK, "uint8")
        return {"k_data": data, "k_scale": scale, "v_data": data, "v_scale": scale}

    def encode(self, k, v, k_scale=1.0, v_scale=1.0):
        k, v = self._check_kv(k, v)
        out = {}
        for tag, x, g in (("k", k, k_scale), ("v", v, v_scale)):
            q, sf = encode_blocks(x, g, self.four_over_six)
            out[f"{tag}_data"] = bitpack.pack_array(q, CODE_BITS)
            out[f"{tag}_scale"] = sf
        return out

    def decode(self, planes, k_scale=1.0, v_scale=1.0):
        k = decode_blocks(planes["k_data"], planes["k_scale"], k_scale)
        v = decode_blocks(planes["v_data"], planes["v_scale"], v_scale)
        return k, v

    def calibrate(self, x: np.ndarray) -> float:
        """Decode-convention global scale amax / (6 * 448)."""
        return amax_scale(x, TARGET * codecs.E4M3_MAX)

    def _render_cuda_defines(self):
        d = super()._render_cuda_defines()
        d["KV_FORMAT_NVFP4"] = "1"
        d["KV_NVFP4_BLOCK"] = str(BLOCK)
        d["KV_NVFP4_FOUR_OVER_SIX"] = "1" if self.four_over_six else "0"
        if self.four_over_six:  # the writer's fast decision (arch_models.nvfp4_46_fast_choice)
            d["KV_NVFP4_46_MARGIN"] = cuda_float(arch_models.NVFP4_46_MARGIN)
            d["KV_NVFP4_46_DEN_LO"] = cuda_float(arch_models.NVFP4_46_DEN_LO)
            d["KV_NVFP4_46_DEN_HI"] = cuda_float(arch_models.NVFP4_46_DEN_HI)
        return d
