"""Bit streams for 3- and 4-bit codes: one LSB-first stream per vector.

Element i of a vector of b-bit codes occupies bits [i*b, i*b + b) of the stream, bit k of
the stream being bit (k % 8) of byte k // 8. For b = 4 this puts element 2j in the low
nibble of byte j (the NVFP4 and vLLM nibble order); for b = 3 it puts 8 elements in 3 bytes,
element i of a group at bits [3i, 3i+3) of the little-endian 24-bit word (vLLM's order).

The scalar helpers are Numba-compatible and used by the CPU kernels as they are.
"""

from __future__ import annotations

import numpy as np


def packed_bytes(n: int, bits: int) -> int:
    """Bytes of a stream of n codes of the given width: ceil(n * bits / 8)."""
    return (n * bits + 7) // 8


def pack_array(codes: np.ndarray, bits: int) -> np.ndarray:
    """(..., n) integer codes < 2**bits -> (..., packed_bytes(n, bits)) uint8."""
    codes = np.asarray(codes)
    if codes.size and (codes.min() < 0 or codes.max() >= (1 << bits)):
        raise ValueError(f"codes do not fit in {bits} bits")
    n = codes.shape[-1]
    shifts = np.arange(bits, dtype=np.uint8)
    bit_planes = (codes.astype(np.uint8)[..., None] >> shifts) & 1  # (..., n, bits)
    stream = bit_planes.reshape(codes.shape[:-1] + (n * bits,))
    pad = packed_bytes(n, bits) * 8 - n * bits
    if pad:
        stream = np.concatenate([stream, np.zeros(stream.shape[:-1] + (pad,), np.uint8)], -1)
    return np.packbits(stream, axis=-1, bitorder="little")


def unpack_array(packed: np.ndarray, n: int, bits: int) -> np.ndarray:
    """(..., >= packed_bytes(n, bits)) uint8 -> (..., n) uint8 codes."""
    packed = np.asarray(packed, dtype=np.uint8)
    stream = np.unpackbits(packed[..., : packed_bytes(n, bits)], axis=-1, bitorder="little")
    stream = stream[..., : n * bits].reshape(packed.shape[:-1] + (n, bits))
    weights = (1 << np.arange(bits)).astype(np.uint8)
    return (stream * weights).sum(-1).astype(np.uint8)


def put_code(buf: np.ndarray, base: int, i: int, bits: int, code: int) -> None:
    """OR code into element i of the stream starting at buf[base] (buf pre-zeroed)."""
    bit = i * bits
    byte = base + (bit >> 3)
    shift = bit & 7
    word = code << shift
    # np.int64 on the stored byte: Numba types uint8 | int64 as float64, and int() keeps uint8.
    buf[byte] = np.int64(buf[byte]) | (word & 0xFF)
    if shift + bits > 8:
        buf[byte + 1] = np.int64(buf[byte + 1]) | ((word >> 8) & 0xFF)


def get_code(buf: np.ndarray, base: int, i: int, bits: int) -> int:
    """Element i of the stream starting at buf[base]."""
    bit = i * bits
    byte = base + (bit >> 3)
    shift = bit & 7
    word = np.int64(buf[byte])
    if shift + bits > 8:
        word |= np.int64(buf[byte + 1]) << 8
    return (word >> shift) & ((1 << bits) - 1)
