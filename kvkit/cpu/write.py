"""CPU (Numba) quantize-on-write kernels, one per quantized family.

Inputs are float32 (the front door converts fp16/bf16 exactly) and already validated; every
kernel follows the operation order documented in the corresponding ``kvkit.formats`` module,
so its bytes equal the NumPy reference quantizer's and, later, the CUDA kernels'.
Planes may be any strided view with (block, head, token, byte) axes. Negative slots are
padding and skipped.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..formats import codecs, nvfp4, turboquant
from ..formats.hadamard import REDUCTION_LANES
from .jit import e2m1_encode, e4m3_encode, f16_bits, fwht_inplace, put_code, sum_squares

_E2M1_VALUES = codecs.E2M1_VALUES
_E4M3_VALUES = codecs.E4M3_VALUES
_BLOCK = nvfp4.BLOCK
_TARGET = nvfp4.TARGET
_ALT_TARGET = nvfp4.ALT_TARGET
_V_SCALE_FLOOR = turboquant.V_SCALE_FLOOR


@njit(cache=True)
def _nvfp4_candidate(x, base, amax, target, g, q):
    """Codes of one 16-block for one target into q; returns (sf code, sf value)."""
    sfc = e4m3_encode(amax / (np.float32(target) * g))
    sfv = _E4M3_VALUES[sfc]
    den = sfv * g
    inv = np.float32(0.0)
    if den != 0:
        inv = np.float32(1.0) / den
    for i in range(_BLOCK):
        q[i] = e2m1_encode(x[base + i] * inv)
    return sfc, sfv


@njit(cache=True)
def _nvfp4_sq_error(x, base, q, sfv, g):
    err = np.float32(0.0)
    for i in range(_BLOCK):
        d = x[base + i] - (_E2M1_VALUES[q[i]] * sfv) * g
        if i == 0:
            err = d * d
        else:
            err = err + d * d
    return err


@njit(cache=True)
def nvfp4_encode_row(x, g, four_over_six, data, sf, q, q_alt):
    """x (D,) float32 -> data (D/2,) uint8 and sf (D/16,) uint8; q, q_alt: (16,) scratch."""
    for b in range(x.shape[0] // _BLOCK):
        base = b * _BLOCK
        amax = abs(x[base])
        for i in range(1, _BLOCK):
            a = abs(x[base + i])
            if a > amax or amax != amax:  # fmaxf: a NaN operand loses
                amax = a
        sfc, sfv = _nvfp4_candidate(x, base, amax, _TARGET, g, q)
        if four_over_six:
            sfc4, sfv4 = _nvfp4_candidate(x, base, amax, _ALT_TARGET, g, q_alt)
            if _nvfp4_sq_error(x, base, q_alt, sfv4, g) < _nvfp4_sq_error(x, base, q, sfv, g):
                sfc = sfc4
                for i in range(_BLOCK):
                    q[i] = q_alt[i]
        sf[b] = sfc
        for j in range(_BLOCK // 2):
            data[base // 2 + j] = np.int64(q[2 * j]) | (np.int64(q[2 * j + 1]) << 4)


@njit(parallel=True, cache=True)
def write_nvfp4(k, v, slot_mapping, block_size, k_data, k_sf, v_data, v_sf, gk, gv, four_over_six):
    """k, v: (N, H, D) float32; slot_mapping: (N,) int64; planes (blocks, H, bs, width)."""
    n_tok, n_head = k.shape[0], k.shape[1]
    for t in prange(n_tok):
        slot = slot_mapping[t]
        if slot < 0:
            continue
        blk = slot // block_size
        off = slot % block_size
        q = np.empty(_BLOCK, np.uint8)
        q_alt = np.empty(_BLOCK, np.uint8)
        for h in range(n_head):
            nvfp4_encode_row(
                k[t, h], gk, four_over_six, k_data[blk, h, off], k_sf[blk, h, off], q, q_alt
            )
            nvfp4_encode_row(
                v[t, h], gv, four_over_six, v_data[blk, h, off], v_sf[blk, h, off], q, q_alt
            )


@njit(cache=True)
def _store_f16(slot, offset, x):
    bits = f16_bits(x, True)
    slot[offset] = bits & 0xFF
    slot[offset + 1] = (bits >> 8) & 0xFF


@njit(cache=True)
def tq_encode_mse_key(k, slot, signs, centroids, midpoints, sqrt_d, bits, norm_offset, buf, lanes):
    """MSE key of one token-head into the slot (pre-zeroed); buf: (D,), lanes: (32,) scratch."""
    d = k.shape[0]
    n = np.float32(np.sqrt(sum_squares(k, lanes)))
    for i in range(d):
        buf[i] = k[i] * signs[i]
    fwht_inplace(buf)
    den = sqrt_d * n
    for i in range(d):
        y = np.float32(0.0)
        if den != 0:
            y = buf[i] / den
        idx = 0
        for j in range(midpoints.shape[0]):
            if midpoints[j] <= y:
                idx += 1
        put_code(slot, 0, i, bits, idx)
        buf[i] = centroids[idx]
    cn = np.float32(np.sqrt(sum_squares(buf, lanes)))
    ratio = np.float32(0.0)
    if cn != 0:
        ratio = n / cn
    _store_f16(slot, norm_offset, ratio)


@njit(cache=True)
def tq_encode_value(v, slot, bits, offset, scale_offset, zero_offset):
    """Asymmetric uniform V quantization of one token-head into the slot (pre-zeroed)."""
    d = v.shape[0]
    lo = v[0]
    hi = v[0]
    for i in range(1, d):
        x = v[i]
        if x < lo or lo != lo:  # fminf / fmaxf: a NaN operand loses
            lo = x
        if x > hi or hi != hi:
            hi = x
    top = np.float32((1 << bits) - 1)
    scale = (hi - lo) / top
    if not scale >= np.float32(_V_SCALE_FLOOR):
        scale = np.float32(_V_SCALE_FLOOR)
    for i in range(d):
        q = np.floor((v[i] - lo) / scale + np.float32(0.5))
        if not q >= 0:
            q = np.float32(0.0)
        if q > top:
            q = top
        put_code(slot, offset, i, bits, int(q))
    _store_f16(slot, scale_offset, scale)
    _store_f16(slot, zero_offset, lo)


@njit(parallel=True, cache=True)
def write_turboquant(
    k, v, slot_mapping, block_size, slots,
    key_fp8, key_bits, value_bits, gk, signs, centroids, midpoints, sqrt_d,
    norm_offset, value_offset, value_scale_offset, value_zero_offset,
):  # fmt: skip
    """k, v: (N, H, D) float32; slot_mapping: (N,) int64; slots: (blocks, H, bs, slot_bytes)."""
    n_tok, n_head, d = k.shape
    for t in prange(n_tok):
        slot_id = slot_mapping[t]
        if slot_id < 0:
            continue
        blk = slot_id // block_size
        off = slot_id % block_size
        buf = np.empty(d, np.float32)
        lanes = np.empty(REDUCTION_LANES, np.float32)
        for h in range(n_head):
            slot = slots[blk, h, off]
            slot[:] = 0
            if key_fp8:
                for i in range(d):
                    slot[i] = e4m3_encode(k[t, h, i] / gk)
            else:
                tq_encode_mse_key(
                    k[t, h],
                    slot,
                    signs,
                    centroids,
                    midpoints,
                    sqrt_d,
                    key_bits,
                    norm_offset,
                    buf,
                    lanes,
                )
            tq_encode_value(
                v[t, h], slot, value_bits, value_offset, value_scale_offset, value_zero_offset
            )


@njit(parallel=True, cache=True)
def write_fp8(k, v, slot_mapping, block_size, k_plane, v_plane, gk, gv):
    """fp8_e4m3: byte = e4m3_satfinite(x / scale). k, v: (N, H, D) float32; planes (.., D)."""
    n_tok, n_head, d = k.shape
    for t in prange(n_tok):
        slot = slot_mapping[t]
        if slot < 0:
            continue
        blk = slot // block_size
        off = slot % block_size
        for h in range(n_head):
            for i in range(d):
                k_plane[blk, h, off, i] = e4m3_encode(k[t, h, i] / gk)
                v_plane[blk, h, off, i] = e4m3_encode(v[t, h, i] / gv)
