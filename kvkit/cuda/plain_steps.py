"""Plain ``kvkit.decode`` and ``kvkit.write_kv`` calls on CUDA, replayed from a small cache.

A plain decode spends most of its ~150-230 us of host time in Python: argument checks, the
launch arguments (planes, strides, scales), the split heuristic and CuPy's per-argument
launch processing. The kernels' arguments depend only on the call's signature (shapes,
dtypes, options, the layer's planes and scales) and on a few arrays: q, block_tables,
seq_lens, sinks and the new o / lse (a write: k, v and slot_mapping). So the second call of
a signature runs the full path and records its launches (``kvkit.cuda.launch.RecordedStep``);
later calls with that signature allocate o / lse, rewrite those pointers and launch through
the driver.

The key includes the current device and stream and the kernel-choice environment
(``KERNEL_ENV``): the partial-state buffers of a recorded decode are reused by its later
calls, which is safe in stream order only. A changed layer (other planes, new scales;
``layer_launch_state``) drops the step; a step holds none of the layer's or the caller's
arrays, only its partial buffers. At most ``MAX_STEPS`` signatures are kept (least
recently used out); ``MAX_STEPS = 0`` turns replays off.
"""

from __future__ import annotations

import os
from collections import OrderedDict

from .launch import RecordedStep

MAX_STEPS = 32

_steps: OrderedDict = OrderedDict()


#: Environment variables that change which kernel a decode launches (target, stage-1 core,
#: staging budget): part of a step's key.
KERNEL_ENV = ("KVKIT_ARCH", "KVKIT_DECODE_SIMT", "KVKIT_DECODE_STAGE_KB")


def kernel_choice_env() -> tuple:
    return tuple(os.environ.get(name) for name in KERNEL_ENV)


def layer_launch_state(layer) -> tuple:
    """What recorded launch arguments took from a layer: its format, its planes' and error
    flag's addresses and layouts, scales and sizes. Equal states give equal arguments, so a
    step need not keep the layer's arrays alive (a later layer that happens to get the same
    memory and layout is the same launch)."""
    return (
        layer.fmt,
        tuple((int(a.data.ptr), a.shape, a.strides) for a in layer.planes.values()),
        int(layer.error_flag.data.ptr), layer.k_scale, layer.v_scale, layer.num_blocks,
        layer.block_size,
    )  # fmt: skip


class PlainStep:
    """One recorded plain call: its launches, and for a decode the shapes of the o / lse it
    returns (None for a write)."""

    def __init__(self, layer, record, arrays: dict):
        # The layer's arrays are not held (the state check covers them); the partial-state
        # buffers a decode allocated are, since later calls reuse them.
        borrowed = [*layer.planes.values(), layer.error_flag]
        self.step = RecordedStep(record, arrays, borrowed=borrowed)
        self.state = layer_launch_state(layer)
        self.o_shape = tuple(arrays["o"].shape) if "o" in arrays else None
        self.lse_shape = tuple(arrays["lse"].shape) if "lse" in arrays else None


def lookup(key: tuple, layer) -> PlainStep | None:
    """The recorded step of a signature, or None (none yet, the cache is off, or the layer
    changed since: then the step is dropped)."""
    if MAX_STEPS <= 0:  # the cache is off
        return None
    step = _steps.get(key)
    if step is None:
        return None
    if step.state != layer_launch_state(layer):
        del _steps[key]
        return None
    _steps.move_to_end(key)
    return step


_seen: OrderedDict = OrderedDict()


def worth_recording(key: tuple) -> bool:
    """A signature is recorded the second time it runs: packing a step costs about as much
    as the Python it saves once, so signatures that never repeat (or a cache of size 0) do
    not pay for it."""
    if MAX_STEPS <= 0:
        return False
    if key in _seen:
        del _seen[key]
        return True
    _seen[key] = None
    while len(_seen) > 4 * MAX_STEPS:
        _seen.popitem(last=False)
    return False


def store(key: tuple, step: PlainStep) -> None:
    """Keep a recorded step (the least recently used beyond ``MAX_STEPS`` go)."""
    _steps[key] = step
    _steps.move_to_end(key)
    while len(_steps) > MAX_STEPS:
        _steps.popitem(last=False)


def clear() -> None:
    """Forget every recorded step (tests; or to release their partial buffers)."""
    _steps.clear()
    _seen.clear()
