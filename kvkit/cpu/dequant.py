"""CPU (Numba) dequantize kernels: cache rows -> float32 K/V in the original space.

Each kernel reads the token-heads at (blocks[m], offsets[m]) for every head and writes
out_k[m, h], out_v[m, h] (float32, D), following the read rules of ``kvkit.formats``.
Global scales arrive as float32 and are applied here, so K and V come out in model units.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..formats import codecs, nvfp4
from .jit import f16_value, fwht_inplace, get_code

_E2M1_VALUES = codecs.E2M1_VALUES
_E4M3_VALUES = codecs.E4M3_VALUES
_BLOCK = nvfp4.BLOCK


@njit(cache=True)
def _nvfp4_row(data, sf, g, out):
    for i in range(out.shape[0]):
        byte = np.int64(data[i >> 1])  # Numba: uint8 op int64 is float64; int() keeps uint8
        code = (byte >> 4) if i & 1 else (byte & 0xF)
        out[i] = (_E2M1_VALUES[code] * _E4M3_VALUES[sf[i // _BLOCK]]) * g


@njit(parallel=True, cache=True)
def dequant_nvfp4(k_data, k_sf, v_data, v_sf, gk, gv, blocks, offsets, out_k, out_v):
    """Planes (blocks, H, bs, width) uint8; blocks, offsets: (M,); out_*: (M, H, D) float32."""
    for m in prange(blocks.shape[0]):
        b, o = blocks[m], offsets[m]
        for h in range(out_k.shape[1]):
            _nvfp4_row(k_data[b, h, o], k_sf[b, h, o], gk, out_k[m, h])
            _nvfp4_row(v_data[b, h, o], v_sf[b, h, o], gv, out_v[m, h])


@njit(cache=True)
def _f16_at(slot, offset):
    return np.float32(f16_value(np.int64(slot[offset]) | (np.int64(slot[offset + 1]) << 8)))


@njit(parallel=True, cache=True)
def dequant_turboquant(
    slots, key_fp8, key_bits, value_bits, gk, signs, centroids, sqrt_d,
    norm_offset, value_offset, value_scale_offset, value_zero_offset,
    blocks, offsets, out_k, out_v,
):  # fmt: skip
    """slots (blocks, H, bs, slot_bytes) uint8; blocks, offsets: (M,); out_*: (M, H, D)."""
    d = out_k.shape[2]
    for m in prange(blocks.shape[0]):
        b, o = blocks[m], offsets[m]
        buf = np.empty(d, np.float32)
        for h in range(out_k.shape[1]):
            slot = slots[b, h, o]
            if key_fp8:
                for i in range(d):
                    out_k[m, h, i] = _E4M3_VALUES[slot[i]] * gk
            else:
                for i in range(d):
                    buf[i] = centroids[get_code(slot, 0, i, key_bits)]
                fwht_inplace(buf)
                f = _f16_at(slot, norm_offset) / sqrt_d
                for i in range(d):
                    out_k[m, h, i] = (buf[i] * f) * signs[i]
            scale = _f16_at(slot, value_scale_offset)
            zero = _f16_at(slot, value_zero_offset)
            for i in range(d):
                out_v[m, h, i] = (
                    np.float32(get_code(slot, value_offset, i, value_bits)) * scale + zero
                )
