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
(``KERNEL_ENV``). A changed layer (other planes, new scales; ``layer_launch_state``) drops
the step; a step holds none of the layer's or the caller's arrays. At most ``MAX_STEPS``
signatures are kept (least recently used out); ``MAX_STEPS = 0`` turns replays off.

Split partials, shared. A decode with several splits (or sinks) writes per-split partial
state in stage 1 (m, l: float32 (rows, S); acc: float32 (rows, S, D), rows = B * q_len * Hq)
and reads it back in stage 2 (the merge). A recorded step's launches hold the raw pointers
of those buffers, so they must outlive the step; one set per step would cost up to several
MB each (B = 1, T = 4096, Hq = 64, S = 32: 1 MB), GBs over hundreds of steps. Instead every
recorded decode of one (device, stream) carves its partials from that pair's
``SharedPartials``: one flat float32 device buffer, each recording call taking its m, l and
acc from offset 0.

Why sharing is safe: a step's partials are live only between its own stage 1 (which writes
every slot the merge reads) and its merge, two launches on one stream. Every step that
shares the buffer launches on that same stream (the stream is in the step's key, and in the
pool's), and CUDA runs one stream's kernels in order: step N's merge has finished before step
N + 1's stage 1 writes the buffer. So the only hazard is something else being enqueued on the
stream between a step's two launches, which ``enqueue_lock`` rules out: every replay and
every recording decode holds it while it enqueues (host threads sharing a stream would
otherwise interleave their launches; it also keeps two threads from rewriting one step's
pointer slots at once).

Growing: a recording call that needs more than the buffer holds gets a new one (at least
twice the old size, so a growing workload makes few of them) and the pool points at it. The
steps recorded into the old buffer keep their pointers and keep that buffer alive: their
launches hold the partial arrays (views of it; ``RecordedStep`` keeps every argument array
that is not per-call), so it is freed only when the last of them is evicted. The pool holds
its ``SharedPartials`` weakly and every decode step holds its own strongly, so a (device,
stream) whose steps are all gone frees its buffer. Device memory for partials is therefore
at most about 2x the largest need recorded on each live stream, whatever ``MAX_STEPS`` is.

Limits: a user who calls on several streams gets separate steps and buffers per stream (the
stream is in both keys); the buffer is reused only through replays and recordings, never by
other calls (first calls, ``validate=True``, DecodePlan use buffers of their own). Replayed
launches captured into a CUDA graph point at the shared buffer: launching that graph on
another stream, or concurrently with plain calls on the capture stream, races on it (use a
``DecodePlan``, whose workspace is its own, for graphs). A stream destroyed while its work
is pending and a new one created at the same address counts as the same stream.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict

from .decode import _FAMILY_SWITCHES
from .launch import RecordedStep

#: Most recorded steps kept. A model calls decode once per layer per step in round robin, so
#: the cache must hold layers x signatures in use (Llama-70B: 80 layers; a server sees a few
#: batch shapes), or every step is evicted before it is replayed. A step costs host memory
#: only, about 11 KB for a two-launch decode (tracemalloc over CPU stand-ins: ~55 ctypes
#: argument slots and their address arrays, the kept partial views, its key and layer
#: state): 512 steps ~ 6 MB. Its partial buffers are shared (module docstring), so no device
#: memory grows with this number.
MAX_STEPS = 512

_steps: OrderedDict = OrderedDict()

#: Serializes the enqueues of replays and recording decodes, so each step's launches reach
#: its stream back to back (module docstring: why sharing partials is safe).
enqueue_lock = threading.Lock()


#: Environment variables that change which kernel a decode or write launches (target,
#: stage-1 core, staging budget, the masked-softmax-only test build, TurboQuant write rows per
#: warp and launch bounds, NVFP4 write blocks per thread and 4over6 decision), then every
#: family build switch of the decode (kvkit/cuda/decode.py _FAMILY_SWITCHES, taken from there
#: so a new switch cannot be left out): part of a step's key.
KERNEL_ENV = ("KVKIT_ARCH", "KVKIT_DECODE_SIMT", "KVKIT_DECODE_STAGE_KB", "KVKIT_DECODE_MASK_ALL",
              "KVKIT_DECODE_BULK_RUNS", "KVKIT_DECODE_ROW_RUNS", "KVKIT_DECODE_ROW_RUNS_EVEN",
              "KVKIT_DECODE_MIN_BLOCKS",
              "KVKIT_DECODE_PDL", "KVKIT_DECODE_PDL_TRIGGER", "KVKIT_DECODE_SOFTCAP_BUILDS",
              "KVKIT_WRITE_TQ_RPW", "KVKIT_WRITE_TQ_MIN_CTAS", "KVKIT_WRITE_TQ_VARIANT",
              "KVKIT_WRITE_TQ_WARPS",
              "KVKIT_WRITE_NVFP4_BPT", "KVKIT_WRITE_NVFP4_46_VARIANT", "KVKIT_WRITE_NVFP4_MIN_CTAS",
              "KVKIT_WRITE_DENSE_VARIANT", "KVKIT_WRITE_EARLY_LOADS",
              *(name for name, _, _ in _FAMILY_SWITCHES))  # fmt: skip


# CPython's os.environ keeps its variables in a dict of encoded names and values (os._Environ
# ._data; every os.environ change goes through it). Reading that dict directly takes ~1 us for
# all of KERNEL_ENV where os.environ.get took ~19 us (measured on the development machine),
# on the path of every replayed plain call. Elsewhere: the public mapping.
_ENV_DATA = getattr(os.environ, "_data", None)
_ENV_KEYS = (
    tuple(os.environ.encodekey(name) for name in KERNEL_ENV)
    if isinstance(_ENV_DATA, dict) and hasattr(os.environ, "encodekey")
    else None
)


def kernel_choice_env() -> tuple:
    """The values of the KERNEL_ENV variables (None where unset; encoded or str values, one
    kind per process), for replay keys."""
    if _ENV_KEYS is not None:
        get = _ENV_DATA.get
        return tuple([get(key) for key in _ENV_KEYS])
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


#: Offsets inside a shared buffer are multiples of this many float32 (256 bytes, CuPy's
#: allocation alignment): stage 1 stores acc rows as float4, which needs 16 bytes.
_ALIGN_FLOATS = 64


def _aligned(n: int) -> int:
    return -(-n // _ALIGN_FLOATS) * _ALIGN_FLOATS


def _device_empty(size: int):
    """A new float32 (size,) device array on the current device (tests substitute NumPy)."""
    import cupy

    return cupy.empty((size,), dtype=cupy.float32)


def _partials_layout(rows: int, num_splits: int, head_dim: int) -> tuple[int, int, int]:
    """Offsets (in float32) of m and l after acc at 0, and the total, with alignment."""
    parts = rows * num_splits
    m_start = _aligned(parts * head_dim)
    l_start = m_start + _aligned(parts)
    return m_start, l_start, l_start + _aligned(parts)


def partials_size(rows: int, num_splits: int, head_dim: int) -> int:
    """float32 elements ``SharedPartials.carve`` needs for acc, m and l, with alignment."""
    return _partials_layout(rows, num_splits, head_dim)[2]


class SharedPartials:
    """The split partial state of the recorded decodes on one (device, stream): one flat
    float32 device buffer, grown on demand, that every such step carves from offset 0.

    ``flat`` is the current buffer (None before the first carve). A carve that does not fit
    replaces it by one of max(need, 2 x old) elements; the steps recorded into the old one
    keep it alive through their launches' arguments (views of it) and keep using it.
    """

    def __init__(self):
        self.flat = None

    def carve(self, rows: int, num_splits: int, head_dim: int) -> tuple:
        """(m, l, acc): float32 views (rows, S), (rows, S), (rows, S, D) of the buffer, with
        S = num_splits, each 256-byte aligned; what ``kvkit.cuda.decode.decode`` takes as
        ``partials``."""
        m_start, l_start, need = _partials_layout(rows, num_splits, head_dim)
        if self.flat is None or self.flat.size < need:
            old = 0 if self.flat is None else self.flat.size
            self.flat = _device_empty(max(need, 2 * old))
        parts = rows * num_splits
        acc = self.flat[: parts * head_dim].reshape(rows, num_splits, head_dim)
        m = self.flat[m_start : m_start + parts].reshape(rows, num_splits)
        l_sum = self.flat[l_start : l_start + parts].reshape(rows, num_splits)
        return m, l_sum, acc


#: (device, stream) -> its SharedPartials, held by the steps recorded there (weakly here).
_partials: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def shared_partials(device: int, stream: int) -> SharedPartials:
    """The partial-state buffer that decodes recorded on ``device`` / ``stream`` (a stream
    pointer) share; keep it (``PlainStep(..., partials=)``) while a step points into it."""
    shared = _partials.get((device, stream))
    if shared is None:
        shared = SharedPartials()
        _partials[(device, stream)] = shared
    return shared


class PlainStep:
    """One recorded plain call: its launches, for a decode the shapes of the o / lse it
    returns (None for a write), and the ``SharedPartials`` of the stream it was recorded on
    (None for a write; a one-split decode without sinks holds it too, unused, which keeps
    at most that stream's buffer alive)."""

    def __init__(self, layer, record, arrays: dict, partials: SharedPartials | None = None):
        # The layer's arrays are not held (the state check covers them). The partial
        # buffers are: the launches keep the views they were recorded with (and so the
        # buffer they point into, even after the pool has grown a new one), and
        # ``partials`` keeps the pool entry, so later recordings on this stream share it.
        borrowed = [*layer.planes.values(), layer.error_flag]
        self.step = RecordedStep(record, arrays, borrowed=borrowed)
        self.state = layer_launch_state(layer)
        self.partials = partials
        self.o_shape = tuple(arrays["o"].shape) if "o" in arrays else None
        self.lse_shape = tuple(arrays["lse"].shape) if "lse" in arrays else None

    def run(self, stream_ptr: int, arrays: dict) -> None:
        """Launch on the stream with ``arrays`` (name -> array) in the recorded ones' place."""
        with enqueue_lock:
            self.step(stream_ptr, arrays)


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
    # Keys seen once, oldest out: a few hundred bytes each, 2048 at MAX_STEPS = 512.
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
    """Forget every recorded step (tests; or to release their shared partial buffers)."""
    _steps.clear()
    _seen.clear()
    _partials.clear()
