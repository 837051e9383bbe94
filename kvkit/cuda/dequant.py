"""CUDA dequantize launcher: cache rows -> float32 K/V (K un-rotated, global scales applied).

``dequantize_rows(layer, slots)`` returns new CuPy float32 arrays (N, H, D). Negative slots
give zero rows; a slot beyond the cache gives a zero row and sets ``layer.error_flag`` bit 1.
Launches on the current CuPy stream, never synchronizes.

==========================  ==============================  ==================================
format family               kernel (entry)                  launch
==========================  ==============================  ==================================
fp16, bf16, fp8_e4m3        ``kvkit_dequant_dense``         1 thread per (row, head, 8
                            (dequant_dense.cu)              elements), 256 threads per CTA
nvfp4, nvfp4_4over6         ``kvkit_dequant_nvfp4``         1 thread per (row, head, 16-block),
                            (dequant_nvfp4.cu)              128 threads per CTA
turboquant_*                ``kvkit_dequant_turboquant``    1 warp per (row, head), 4 warps
                            (dequant_turboquant.cu)         per CTA
==========================  ==============================  ==================================

Defines: ``fmt.cuda_defines()`` + ``KV_SLOT_T`` (``int`` / ``long long``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .compiler import get_kernel
from .write import (
    DENSE_CHUNK,
    DENSE_THREADS,
    NVFP4_BLOCK,
    NVFP4_THREADS,
    TQ_WARPS,
    _family,
    _grid,
    check_slots,
    layer_head_args,
    plane_args,
    slot_define,
)

if TYPE_CHECKING:
    from ..cache import CacheLayer


def dequantize_rows(layer: CacheLayer, slots):
    """slots: CuPy int32/int64 (N,) -> (k, v), new CuPy float32 arrays (N, H, D)."""
    import cupy

    fmt = layer.fmt
    if slots.ndim != 1:
        raise ValueError(f"slots must be (N,), got {slots.shape}")
    n = slots.shape[0]
    check_slots(slots, n)
    h, d = layer.num_kv_heads, fmt.head_dim
    out_k = cupy.empty((n, h, d), dtype=cupy.float32)
    out_v = cupy.empty((n, h, d), dtype=cupy.float32)
    if n == 0:
        return out_k, out_v
    defines = dict(fmt.cuda_defines())
    defines["KV_SLOT_T"] = slot_define(slots)
    p = layer.planes
    family = _family(fmt)
    head = [slots, np.int64(n)] + layer_head_args(layer)
    ks, vs = np.float32(layer.k_scale), np.float32(layer.v_scale)
    tail = [out_k, out_v, layer.error_flag]
    if family == "dense":
        kern = get_kernel("dequant_dense.cu", "kvkit_dequant_dense", defines)
        args = head + plane_args(p["k"]) + plane_args(p["v"]) + [ks, vs] + tail
        kern(_grid(n * h * (d // DENSE_CHUNK), DENSE_THREADS), (DENSE_THREADS,), tuple(args))
    elif family == "nvfp4":
        kern = get_kernel("dequant_nvfp4.cu", "kvkit_dequant_nvfp4", defines)
        planes = []
        for name in ("k_data", "k_scale", "v_data", "v_scale"):
            planes += plane_args(p[name])
        args = head + planes + [ks, vs] + tail
        kern(_grid(n * h * (d // NVFP4_BLOCK), NVFP4_THREADS), (NVFP4_THREADS,), tuple(args))
    else:
        kern = get_kernel("dequant_turboquant.cu", "kvkit_dequant_turboquant", defines)
        args = head + plane_args(p["slots"]) + [ks] + tail
        kern(_grid(n * h, TQ_WARPS), (TQ_WARPS * 32,), tuple(args))
    return out_k, out_v
