"""CPU backend entry points: route a validated call to the family's Numba kernel.

Everything here receives float32 K/V, int64 slot/row indices that are already checked, and
a layer whose planes are NumPy arrays. fp16 and bf16 are a per-element cast plus a scatter,
which NumPy does as fast as a loop would; the spec's array codecs do the cast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..formats import DenseFormat, FP8Format, NVFP4Format, TurboQuantFormat
from . import dequant, write
from .jit import pick, serial_twin

#: Token-heads below which a write or dequantize runs on the serial twin of its kernel
#: (kvkit.cpu.jit.serial_twin): a single-token decode step writes Hkv token-heads.
PARALLEL_MIN_ROWS = 256
_write_fp8 = (write.write_fp8, serial_twin(write.write_fp8))
_write_nvfp4 = (write.write_nvfp4, serial_twin(write.write_nvfp4))
_write_tq = (write.write_turboquant, serial_twin(write.write_turboquant))
_dequant_nvfp4 = (dequant.dequant_nvfp4, serial_twin(dequant.dequant_nvfp4))
_dequant_tq = (dequant.dequant_turboquant, serial_twin(dequant.dequant_turboquant))


def _kernel(pair, rows: int):
    return pick(pair[0], pair[1], rows, PARALLEL_MIN_ROWS)


if TYPE_CHECKING:
    from ..cache import CacheLayer


def _tq_args(fmt: TurboQuantFormat) -> tuple:
    return (
        fmt.key_kind == "fp8",
        fmt.key_bits,
        fmt.value_bits,
    )


def _tq_tables(fmt: TurboQuantFormat) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # FP8-key presets have no codebook; the kernels still need typed (empty) arrays.
    if fmt.key_kind == "fp8":
        z = np.zeros(1, np.float32)
        return z, z, z
    return fmt.signs, fmt.centroids, fmt.midpoints


def write_rows(layer: CacheLayer, k: np.ndarray, v: np.ndarray, slots: np.ndarray) -> None:
    """k, v: (N, H, D) float32 C-contiguous; slots: (N,) int64 (negative = skip)."""
    fmt = layer.fmt
    bs = layer.block_size
    p = layer.planes
    if isinstance(fmt, FP8Format):
        _kernel(_write_fp8, k.shape[0] * k.shape[1])(
            k, v, slots, bs, p["k"], p["v"], np.float32(layer.k_scale), np.float32(layer.v_scale)
        )
    elif isinstance(fmt, DenseFormat):
        keep = slots >= 0
        enc = fmt.encode(k[keep], v[keep], layer.k_scale, layer.v_scale)
        blk, off = np.divmod(slots[keep], bs)
        p["k"][blk, :, off, :] = enc["k"]
        p["v"][blk, :, off, :] = enc["v"]
    elif isinstance(fmt, NVFP4Format):
        _kernel(_write_nvfp4, k.shape[0] * k.shape[1])(
            k, v, slots, bs, p["k_data"], p["k_scale"], p["v_data"], p["v_scale"],
            np.float32(layer.k_scale), np.float32(layer.v_scale), fmt.four_over_six,
        )  # fmt: skip
    elif isinstance(fmt, TurboQuantFormat):
        signs, cents, mids = _tq_tables(fmt)
        _kernel(_write_tq, k.shape[0] * k.shape[1])(
            k, v, slots, bs, p["slots"], *_tq_args(fmt), np.float32(layer.k_scale),
            signs, cents, mids, fmt.sqrt_d, fmt.key_norm_offset, fmt.value_offset,
            fmt.value_scale_offset, fmt.value_zero_offset,
        )  # fmt: skip
    else:  # pragma: no cover - every registered format is handled above
        raise TypeError(f"no CPU write kernel for {fmt!r}")


def dequantize_rows(
    layer: CacheLayer, blocks: np.ndarray, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """blocks, offsets: (M,) int64, in range -> k, v (M, H, D) float32."""
    fmt = layer.fmt
    p = layer.planes
    m = blocks.shape[0]
    if isinstance(fmt, (DenseFormat, FP8Format)):
        planes = {name: p[name][blocks, :, offsets, :] for name in ("k", "v")}
        k, v = fmt.decode(planes, layer.k_scale, layer.v_scale)
        return np.ascontiguousarray(k, np.float32), np.ascontiguousarray(v, np.float32)
    out_k = np.empty((m, layer.num_kv_heads, fmt.head_dim), np.float32)
    out_v = np.empty_like(out_k)
    if isinstance(fmt, NVFP4Format):
        _kernel(_dequant_nvfp4, m * layer.num_kv_heads)(
            p["k_data"], p["k_scale"], p["v_data"], p["v_scale"],
            np.float32(layer.k_scale), np.float32(layer.v_scale), blocks, offsets, out_k, out_v,
        )  # fmt: skip
    elif isinstance(fmt, TurboQuantFormat):
        signs, cents, _ = _tq_tables(fmt)
        _kernel(_dequant_tq, m * layer.num_kv_heads)(
            p["slots"], *_tq_args(fmt), np.float32(layer.k_scale), signs, cents, fmt.sqrt_d,
            fmt.key_norm_offset, fmt.value_offset, fmt.value_scale_offset,
            fmt.value_zero_offset, blocks, offsets, out_k, out_v,
        )  # fmt: skip
    else:  # pragma: no cover
        raise TypeError(f"no CPU dequantize kernel for {fmt!r}")
    return out_k, out_v
