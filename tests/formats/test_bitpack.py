"""Bit streams: round trips, the published nibble and 3-bit orders, scalar vs array forms."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from numba import njit

from kvkit.formats import bitpack

put_jit = njit(bitpack.put_code)
get_jit = njit(bitpack.get_code)

HEAD_DIMS = (16, 32, 48, 64, 80, 96, 128, 160, 192, 256, 512)


@st.composite
def code_vectors(draw):
    bits = draw(st.sampled_from([3, 4]))
    d = draw(st.sampled_from(HEAD_DIMS))
    rows = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**32 - 1))
    codes = np.random.default_rng(seed).integers(0, 1 << bits, size=(rows, d), dtype=np.uint8)
    return bits, codes


@given(code_vectors())
def test_pack_unpack_round_trip(case):
    bits, codes = case
    packed = bitpack.pack_array(codes, bits)
    assert packed.shape == (codes.shape[0], bitpack.packed_bytes(codes.shape[1], bits))
    np.testing.assert_array_equal(bitpack.unpack_array(packed, codes.shape[1], bits), codes)


@given(code_vectors(), st.integers(0, 3))
def test_scalar_put_get_agree_with_array_form(case, base):
    bits, codes = case
    d = codes.shape[1]
    buf = np.zeros(base + bitpack.packed_bytes(d, bits) + 2, np.uint8)
    for i in range(d):
        put_jit(buf, base, i, bits, int(codes[0, i]))
    np.testing.assert_array_equal(
        buf[base : base + bitpack.packed_bytes(d, bits)], bitpack.pack_array(codes[0], bits)
    )
    assert buf[:base].sum() == 0 and buf[base + bitpack.packed_bytes(d, bits) :].sum() == 0
    np.testing.assert_array_equal([get_jit(buf, base, i, bits) for i in range(d)], codes[0])


def test_four_bit_order_puts_even_elements_in_the_low_nibble():
    codes = np.array([0x1, 0x2, 0x3, 0xF], np.uint8)
    np.testing.assert_array_equal(bitpack.pack_array(codes, 4), [0x21, 0xF3])


def test_three_bit_order_is_lsb_first_over_a_24_bit_little_endian_word():
    codes = np.arange(8, dtype=np.uint8)  # element i = i
    word = sum(int(c) << (3 * i) for i, c in enumerate(codes))
    expect = [(word >> (8 * j)) & 0xFF for j in range(3)]
    np.testing.assert_array_equal(bitpack.pack_array(codes, 3), expect)
