"""Prepared kernel launches: arguments packed once, a few pointer slots rewritten per call.

CuPy's ``RawKernel.__call__`` converts every argument on every call; a decode stage 1 has 44
of them. A ``PreparedLaunch`` packs them once into the array of argument addresses that
``cuLaunchKernel`` takes (the driver copies the values at launch, so slots can be rewritten
right after), and launches through the driver: the per-call cost is a few slot writes and
one driver call. Used by ``kvkit.DecodePlan`` for its fixed-shape steps.
"""

from __future__ import annotations

import ctypes

import numpy as np


def launch_and_record(record, kernel, grid, block, args, shared_mem: int = 0) -> None:
    """Launch a CuPy RawKernel on the current stream and, when ``record`` is a list, append
    ``(kernel, grid, block, args, shared_mem)``: the form ``RecordedStep`` replays (the
    decode and write wrappers record through here for DecodePlan and plain-call replays)."""
    kernel(grid, block, args, shared_mem=shared_mem)
    if record is not None:
        record.append((kernel, grid, block, args, shared_mem))


# NumPy scalar types a kernel argument may have -> the ctypes type of the same bytes.
_SCALARS = {
    np.dtype(np.int32): ctypes.c_int32,
    np.dtype(np.int64): ctypes.c_int64,
    np.dtype(np.uint32): ctypes.c_uint32,
    np.dtype(np.uint64): ctypes.c_uint64,
    np.dtype(np.float32): ctypes.c_float,
}


def pack_argument(value):
    """The ctypes object holding one kernel argument's bytes: a device array's pointer
    (anything with ``.data.ptr``, e.g. a CuPy array) or a NumPy int32 / int64 / uint32 /
    uint64 / float32 scalar. Python ints and floats are refused: their C type would be a guess."""
    data = getattr(value, "data", None)
    if data is not None and hasattr(data, "ptr"):
        return ctypes.c_void_p(int(data.ptr))
    if isinstance(value, np.generic) and value.dtype in _SCALARS:
        return _SCALARS[value.dtype](value.item())
    raise TypeError(f"cannot pack kernel argument of type {type(value).__name__}")


# cuLaunchKernelEx's configuration (cuda.h, CUDA 12+): the attribute value is a 64-byte union
# (8-byte aligned), the attribute id an enum padded to 8 bytes.
_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


class _LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4),
                ("value", ctypes.c_int64 * 8)]  # fmt: skip


class _LaunchConfig(ctypes.Structure):
    _fields_ = [
        ("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
        ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint),
    ]  # fmt: skip


_libcuda = None


def _cu_launch_kernel_ex():
    global _libcuda
    if _libcuda is None:
        _libcuda = ctypes.CDLL("libcuda.so.1")
        _libcuda.cuLaunchKernelEx.restype = ctypes.c_int
        _libcuda.cuLaunchKernelEx.argtypes = [
            ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p
        ]  # fmt: skip
    return _libcuda.cuLaunchKernelEx


class ProgrammaticKernel:
    """A CuPy RawKernel that is launched with programmatic stream serialization
    (``cuLaunchKernelEx``): the driver may start its CTAs before the kernel ahead of it in the
    stream has finished. Only for kernels that wait for their predecessor themselves
    (``kv_grid_dep_wait`` in cuda_src/common/arch.cuh, sm_90+).

    Called like the RawKernel, ``(grid, block, args, shared_mem=0)``, on the current stream.
    """

    programmatic = True

    def __init__(self, raw):
        self.raw = raw
        self.kernel = raw.kernel  # the function handle PreparedLaunch takes

    def __call__(self, grid, block, args, shared_mem: int = 0) -> None:
        import cupy

        PreparedLaunch(self, grid, block, args, shared_mem)(cupy.cuda.get_current_stream().ptr)


class PreparedLaunch:
    """One kernel launch with its arguments packed.

    Args:
        kernel: a CuPy ``RawKernel`` (its function handle is ``kernel.kernel.ptr``), already
            configured (dynamic shared memory limit set).
        grid, block: 1- to 3-tuples of positive ints.
        args: the kernel's arguments in order (see ``pack_argument``).
        shared_mem: dynamic shared memory bytes.
    """

    def __init__(self, kernel, grid, block, args, shared_mem: int = 0):
        self._kernel = kernel  # keeps the module (and so the function handle) alive
        self._func = int(kernel.kernel.ptr)
        self._programmatic = bool(getattr(kernel, "programmatic", False))
        self._grid = tuple(grid) + (1,) * (3 - len(grid))
        self._block = tuple(block) + (1,) * (3 - len(block))
        self._shared = int(shared_mem)
        self._slots = [pack_argument(a) for a in args]
        self._arrays = [a for a in args if getattr(getattr(a, "data", None), "ptr", None)]
        self._params = (ctypes.c_void_p * len(self._slots))(
            *(ctypes.addressof(s) for s in self._slots)
        )
        if self._programmatic:
            # cuLaunchKernelEx's configuration, built once: a call only sets the stream (the
            # structures cost ~3 us of Python per launch when built per call).
            self._attr = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
            self._attr.value[0] = 1  # programmaticStreamSerializationAllowed
            self._config = _LaunchConfig(
                (ctypes.c_uint * 3)(*self._grid), (ctypes.c_uint * 3)(*self._block),
                self._shared, None, ctypes.pointer(self._attr), 1,
            )  # fmt: skip
            self._ex_args = (
                ctypes.byref(self._config), ctypes.c_void_p(self._func),
                ctypes.c_void_p(ctypes.addressof(self._params)), None,
            )  # fmt: skip

    def slot_value(self, index: int):
        """The packed value of argument ``index`` (an int for pointers and integers)."""
        return self._slots[index].value

    def set_pointer(self, index: int, array) -> None:
        """Argument ``index`` (a pointer) now names ``array``'s memory."""
        slot = self._slots[index]
        if not isinstance(slot, ctypes.c_void_p):
            raise TypeError(f"argument {index} is not a pointer")
        slot.value = int(array.data.ptr)

    def __call__(self, stream_ptr: int) -> None:
        from cupy_backends.cuda.api import driver

        if self._programmatic:
            self._config.stream = int(stream_ptr)
            status = _cu_launch_kernel_ex()(*self._ex_args)
            if status != 0:
                raise RuntimeError(f"cuLaunchKernelEx failed: CUresult {status}")
            return
        driver.launchKernel(
            self._func, *self._grid, *self._block, self._shared, int(stream_ptr),
            ctypes.addressof(self._params), 0,
        )  # fmt: skip


class RecordedStep:
    """The launches of one full call, packed, and where that call's per-call arrays sit
    among their arguments, so a later call with new arrays of the same layout rewrites those
    pointers and launches again, with none of the call's Python work.

    Args:
        record: ``(kernel, grid, block, args, shared_mem)`` per launch, in launch order (what
            ``kvkit.cuda.decode.decode(..., record=...)`` appends).
        per_call: name -> the array object the recorded call passed (found among each
            launch's arguments by identity; a name may sit in several launches, or in none).
        borrowed: further arrays among the arguments that the step must not keep alive (the
            caller checks they are still there before each run).
    """

    def __init__(self, record, per_call: dict, borrowed=()):
        self.launches = [PreparedLaunch(k, g, b, a, sm) for k, g, b, a, sm in record]
        self.slots = {
            name: [
                (i, j)
                for i, (_, _, _, args, _) in enumerate(record)
                for j, arg in enumerate(args)
                if arg is array
            ]
            for name, array in per_call.items()
            if array is not None
        }
        # The launches keep the other arrays among their arguments alive (e.g. buffers the
        # recorded call allocated); per-call and borrowed ones are the caller's.
        foreign = [a for a in (*per_call.values(), *borrowed) if a is not None]
        for launch in self.launches:
            launch._arrays = [a for a in launch._arrays if not any(a is f for f in foreign)]

    def rewrite(self, arrays: dict) -> None:
        """Put ``arrays`` (name -> array, names as at recording) in the recorded ones' slots."""
        for name, array in arrays.items():
            for i, j in self.slots.get(name, ()):
                self.launches[i].set_pointer(j, array)

    def __call__(self, stream_ptr: int, arrays: dict) -> None:
        """Launch on the stream with ``arrays`` in place of the recorded ones."""
        self.rewrite(arrays)
        for launch in self.launches:
            launch(stream_ptr)
