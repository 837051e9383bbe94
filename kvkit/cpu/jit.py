"""Numba-compiled forms of the spec's scalar functions, shared by the CPU kernels.

The bodies live in ``kvkit.formats`` (the spec); this module only compiles them, so the
CPU backend cannot drift from the spec's arithmetic.
"""

from __future__ import annotations

import types

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


def serial_twin(kernel):
    """A non-parallel, separately cached copy of a ``parallel=True`` kernel.

    Waking Numba's thread pool costs from a fraction of a millisecond to over ten on a busy
    2-core machine, far more than a one-token write or a short decode step takes serially,
    so the backends pick the twin for small calls. The copy gets its own qualified name,
    which keeps its on-disk cache apart from the parallel kernel's.
    """
    f = kernel.py_func
    g = types.FunctionType(f.__code__, f.__globals__, f.__name__ + "_serial", f.__defaults__,
                           f.__closure__)  # fmt: skip
    g.__qualname__ = f.__qualname__ + "_serial"
    g.__module__ = f.__module__
    return njit(cache=True)(g)


def pick(kernel, twin, work: int, threshold: int):
    """The parallel kernel when ``work`` (a size of the call) reaches ``threshold``."""
    return kernel if work >= threshold else twin
