"""Numba-compiled forms of the spec's scalar functions, shared by the CPU kernels.

The bodies live in ``kvkit.formats`` (the spec); this module only compiles them, so the
CPU backend cannot drift from the spec's arithmetic.
"""

from __future__ import annotations

from numba import njit

from ..formats import bitpack, codecs, hadamard

e2m1_encode = njit(cache=True)(codecs.e2m1_encode)
e4m3_encode = njit(cache=True)(codecs.e4m3_encode)
f16_bits = njit(cache=True)(codecs.f16_bits)
f16_value = njit(cache=True)(codecs.f16_value)
put_code = njit(cache=True)(bitpack.put_code)
get_code = njit(cache=True)(bitpack.get_code)
fwht_inplace = njit(cache=True)(hadamard.fwht_inplace)
sum_squares = njit(cache=True)(hadamard.sum_squares)
