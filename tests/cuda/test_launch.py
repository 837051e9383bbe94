"""kvkit.cuda.launch: argument packing for driver launches (no GPU needed to check the bytes)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from kvkit.cuda import launch as launch_mod
from kvkit.cuda.launch import PreparedLaunch, pack_argument


class _Buffer:
    def __init__(self, ptr):
        self.ptr = ptr


class _FakeArray:
    def __init__(self, ptr):
        self.data = _Buffer(ptr)


class _FakeKernel:
    class kernel:  # noqa: N801 - mirrors cupy RawKernel.kernel
        ptr = 0xABC


def _read(launch, index, ctype):
    # The launch's parameter array holds the address of each argument's bytes.
    return ctypes.cast(launch._params[index], ctypes.POINTER(ctype)).contents.value


def test_arguments_are_packed_with_their_c_types():
    args = [_FakeArray(0x7F00_0000_1000), np.int32(-7), np.int64(2**40 + 3), np.float32(1.5),
            np.uint64(0), np.uint32(0xFFFF_FFF0)]  # fmt: skip
    launch = PreparedLaunch(_FakeKernel(), (4, 2), (128,), args, 1024)
    assert _read(launch, 0, ctypes.c_uint64) == 0x7F00_0000_1000
    assert _read(launch, 1, ctypes.c_int32) == -7
    assert _read(launch, 2, ctypes.c_int64) == 2**40 + 3
    assert _read(launch, 3, ctypes.c_float) == 1.5
    assert _read(launch, 4, ctypes.c_uint64) == 0
    assert _read(launch, 5, ctypes.c_uint32) == 0xFFFF_FFF0  # the write's magic divisors
    assert launch._grid == (4, 2, 1) and launch._block == (128, 1, 1)
    assert launch._func == 0xABC and launch._shared == 1024


def test_a_pointer_slot_is_rewritten_in_place():
    launch = PreparedLaunch(_FakeKernel(), (1,), (32,), [_FakeArray(16), np.int32(1)])
    address = launch._params[0]
    launch.set_pointer(0, _FakeArray(0x5000))
    assert launch._params[0] == address  # same slot, new value
    assert _read(launch, 0, ctypes.c_uint64) == 0x5000 == launch.slot_value(0)
    with pytest.raises(TypeError, match="not a pointer"):
        launch.set_pointer(1, _FakeArray(0x6000))


@pytest.mark.parametrize("value", [3, 2.5, np.float64(1.0), np.int16(2), "x", None])
def test_ambiguous_arguments_are_refused(value):
    with pytest.raises(TypeError, match="cannot pack"):
        pack_argument(value)


def test_a_recorded_step_rewrites_its_per_call_arrays_wherever_they_sit():
    from kvkit.cuda.launch import RecordedStep

    q, o, plane, part = (_FakeArray(p) for p in (0x1000, 0x2000, 0x3000, 0x4000))
    record = [
        (_FakeKernel(), (2,), (128,), [q, plane, np.int32(5), part, o], 512),
        (_FakeKernel(), (8,), (64,), [part, o, np.float32(0.5)], 0),
    ]
    step = RecordedStep(record, {"q": q, "o": o, "sinks": None}, borrowed=[plane])
    assert step.slots == {"q": [(0, 0)], "o": [(0, 4), (1, 1)]}
    # Only the step's own buffers are kept alive, not the caller's per-call or borrowed ones.
    assert [launch._arrays for launch in step.launches] == [[part], [part]]
    first, second = step.launches
    for i, j in [(0, 0), (0, 4), (1, 1)]:
        step.launches[i].set_pointer(j, _FakeArray(0))  # scribble, then rewrite below
    step.rewrite({"q": _FakeArray(0x9000), "o": _FakeArray(0xA000)})
    assert _read(first, 0, ctypes.c_uint64) == 0x9000
    assert _read(first, 4, ctypes.c_uint64) == 0xA000 == _read(second, 1, ctypes.c_uint64)
    assert _read(first, 1, ctypes.c_uint64) == 0x3000  # the plane is the recorded one
    assert _read(first, 3, ctypes.c_uint64) == 0x4000 == _read(second, 0, ctypes.c_uint64)


class _FakeProgrammatic(_FakeKernel):
    programmatic = True


def test_programmatic_launch_passes_its_configuration_to_cu_launch_kernel_ex(monkeypatch):
    """A programmatic launch (stage 2 on sm_90+) hands cuLaunchKernelEx the layout of cuda.h's
    CUlaunchConfig: grid, block, shared bytes, the call's stream and one attribute
    (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6, value 1), with the function
    and the parameter array; the configuration is built once and each call sets its stream."""
    seen = []

    def fake_launch(config_ref, func, params, extra):
        config = ctypes.cast(config_ref, ctypes.POINTER(launch_mod._LaunchConfig)).contents
        attr = config.attrs.contents
        seen.append((tuple(config.grid), tuple(config.block), config.shared, config.stream,
                     config.num_attrs, attr.id, attr.value[0], func.value, params.value,
                     extra))  # fmt: skip
        return 0

    monkeypatch.setattr(launch_mod, "_cu_launch_kernel_ex", lambda: fake_launch)
    launch = PreparedLaunch(_FakeProgrammatic(), (7, 3), (256, 2), [_FakeArray(0x40), np.int32(5)],
                            4096)  # fmt: skip
    params = ctypes.addressof(launch._params)
    launch(0x1234)
    launch(0x5678)
    assert seen == [((7, 3, 1), (256, 2, 1), 4096, s, 1, 6, 1, 0xABC, params, None)
                    for s in (0x1234, 0x5678)]  # fmt: skip
    # cuda.h: CUlaunchConfig is 3 + 3 uints, the shared bytes, the stream, the attribute
    # pointer and their count (56 bytes on 64-bit hosts); CUlaunchAttribute an 8-byte id
    # slot and a 64-byte value union.
    assert ctypes.sizeof(launch_mod._LaunchConfig) == 56
    assert launch_mod._LaunchConfig.stream.offset == 32
    assert launch_mod._LaunchConfig.attrs.offset == 40
    assert ctypes.sizeof(launch_mod._LaunchAttribute) == 72


def test_a_failed_programmatic_launch_raises(monkeypatch):
    monkeypatch.setattr(launch_mod, "_cu_launch_kernel_ex", lambda: lambda *args: 1)
    launch = PreparedLaunch(_FakeProgrammatic(), (1,), (32,), [np.int32(1)])
    with pytest.raises(RuntimeError, match="CUresult 1"):
        launch(0)
