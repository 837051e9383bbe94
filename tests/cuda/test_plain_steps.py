"""kvkit.cuda.plain_steps bookkeeping (no GPU): which calls record, lookups, eviction, a
changed layer dropping its step, and the split partials that recorded decodes share."""

from __future__ import annotations

import weakref
from types import SimpleNamespace

import numpy as np
import pytest

from kvkit.cuda import plain_steps


class _Array:
    _next = 0x1000

    def __init__(self, shape=(8, 2, 16, 64)):
        _Array._next += 0x1000
        self.data = SimpleNamespace(ptr=_Array._next)
        self.shape = shape
        self.strides = tuple(64 * n for n in (32, 16, 1, 0))


class _Layer:
    def __init__(self):
        self.fmt = "fp8_e4m3"
        self.planes = {"k": _Array(), "v": _Array()}
        self.error_flag = _Array((1,))
        self.k_scale = self.v_scale = 1.0
        self.num_blocks, self.block_size = 8, 16


def _step(layer):
    step = object.__new__(plain_steps.PlainStep)  # no launches needed for the bookkeeping
    step.state = plain_steps.layer_launch_state(layer)
    return step


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    plain_steps.clear()
    yield
    plain_steps.clear()


def test_a_signature_records_on_its_second_call():
    assert not plain_steps.worth_recording(("a",))
    assert plain_steps.worth_recording(("a",))
    assert not plain_steps.worth_recording(("b",))


def test_lookup_store_and_least_recently_used_eviction(monkeypatch):
    monkeypatch.setattr(plain_steps, "MAX_STEPS", 2)
    layer = _Layer()
    for key in ("a", "b"):
        plain_steps.store((key,), _step(layer))
    assert plain_steps.lookup(("a",), layer) is not None  # "a" is now the most recent
    plain_steps.store(("c",), _step(layer))
    assert plain_steps.lookup(("b",), layer) is None
    assert plain_steps.lookup(("a",), layer) is not None
    assert plain_steps.lookup(("c",), layer) is not None


@pytest.mark.parametrize("change", ["plane", "layout", "scale", "flag", "format"])
def test_a_changed_layer_drops_its_step(change):
    layer = _Layer()
    plain_steps.store(("k",), _step(layer))
    if change == "plane":
        layer.planes["k"] = _Array()
    elif change == "layout":
        layer.planes["k"].strides = (0, 0, 0, 0)
    elif change == "scale":
        layer.k_scale = 2.0
    elif change == "flag":
        layer.error_flag = _Array((1,))
    else:
        layer.fmt = "nvfp4"
    assert plain_steps.lookup(("k",), layer) is None
    assert not plain_steps._steps  # dropped


def test_a_layer_with_the_same_memory_and_layout_is_the_same_launch():
    layer = _Layer()
    plain_steps.store(("k",), _step(layer))
    twin = _Layer()
    twin.planes, twin.error_flag = dict(layer.planes), layer.error_flag
    assert plain_steps.lookup(("k",), twin) is not None


def test_a_cache_of_size_zero_never_records_nor_replays(monkeypatch):
    layer = _Layer()
    plain_steps.store(("a",), _step(layer))
    monkeypatch.setattr(plain_steps, "MAX_STEPS", 0)
    assert plain_steps.lookup(("a",), layer) is None
    assert not plain_steps.worth_recording(("b",))
    assert not plain_steps.worth_recording(("b",))


@pytest.mark.parametrize("fast", [True, False])
def test_the_kernel_choice_environment_is_in_the_key(monkeypatch, fast):
    """Setting, changing or removing any KERNEL_ENV variable changes the key, on the direct
    reading of os.environ's dict (fast) and on the public mapping."""
    import os

    if not fast:
        monkeypatch.setattr(plain_steps, "_ENV_KEYS", None)
    for name in plain_steps.KERNEL_ENV:
        monkeypatch.delenv(name, raising=False)
    unset = plain_steps.kernel_choice_env()
    assert unset == (None,) * len(plain_steps.KERNEL_ENV)
    seen = {unset}
    names = ("KVKIT_DECODE_SIMT", "KVKIT_ARCH", "KVKIT_DECODE_PDL", "KVKIT_WRITE_DENSE_VARIANT")
    for name in names:
        monkeypatch.setenv(name, "1")
        one = plain_steps.kernel_choice_env()
        monkeypatch.setenv(name, "0")
        zero = plain_steps.kernel_choice_env()
        assert len({one, zero} | seen) == len(seen) + 2, name
        seen |= {one, zero}
        monkeypatch.delenv(name)
        assert plain_steps.kernel_choice_env() == unset
    os.environ["KVKIT_DECODE_TQ_SLABS"] = "1"  # os.environ itself, not through monkeypatch
    try:
        assert plain_steps.kernel_choice_env() != unset
    finally:
        del os.environ["KVKIT_DECODE_TQ_SLABS"]
    assert plain_steps.kernel_choice_env() == unset


def test_every_kernel_choosing_variable_is_in_the_key():
    """A replayed plain call must not reuse a kernel built under other settings: every KVKIT_
    variable the decode and write launchers read is part of the key (the cache folder and the
    source folder only say where files are; the compile key covers the source itself)."""
    import re
    from pathlib import Path

    root = Path(plain_steps.__file__).parent
    read = set()
    for name in ("decode.py", "write.py", "compiler.py"):
        read |= set(re.findall(r"KVKIT_[A-Z0-9_]+", (root / name).read_text()))
    assert read - {"KVKIT_CACHE_DIR", "KVKIT_CUDA_SRC"} <= set(plain_steps.KERNEL_ENV)


# Shared split partials: CPU stand-ins for device arrays (NumPy memory, its address as
# data.ptr; a view keeps its base alive, as a CuPy view does).


class _DeviceArray:
    def __init__(self, host, base=None):
        self.host, self.base = host, base
        self.data = SimpleNamespace(ptr=host.__array_interface__["data"][0])
        self.shape, self.size = host.shape, host.size

    def __getitem__(self, index):
        return _DeviceArray(self.host[index], self.base or self)

    def reshape(self, *shape):
        return _DeviceArray(self.host.reshape(*shape), self.base or self)


_KERNEL = SimpleNamespace(kernel=SimpleNamespace(ptr=0xABC))


@pytest.fixture
def allocations(monkeypatch):
    """The sizes of the shared buffers allocated, in order (NumPy memory stands in)."""
    sizes = []

    def empty(size):
        sizes.append(size)
        return _DeviceArray(np.empty(size, np.float32))

    monkeypatch.setattr(plain_steps, "_device_empty", empty)
    return sizes


def _decode_step(layer, shared, rows=16, splits=4, head_dim=128):
    """A PlainStep recorded like a split decode: stage 1 (q, m, l, acc, ...) and the merge
    (m, l, acc, o, lse) over partials carved from ``shared``."""
    m, l_sum, acc = shared.carve(rows, splits, head_dim)
    q, o, lse = (_DeviceArray(np.empty(8, np.float32)) for _ in range(3))
    record = [
        (_KERNEL, (splits,), (128,), (q, m, l_sum, acc, np.int32(splits)), 0),
        (_KERNEL, (rows,), (128,), (m, l_sum, acc, o, lse), 0),
    ]
    return plain_steps.PlainStep(layer, record, dict(q=q, o=o, lse=lse), partials=shared)


def _partial_pointers(step) -> tuple[list, list]:
    """(stage 1's m, l, acc pointers, the merge's)."""
    stage1, merge = step.step.launches
    return [stage1.slot_value(i) for i in (1, 2, 3)], [merge.slot_value(i) for i in (0, 1, 2)]


def _offset(view, flat) -> int:
    return view.data.ptr - flat.data.ptr


def test_steps_of_one_stream_share_their_partials(allocations):
    first = _decode_step(_Layer(), plain_steps.shared_partials(0, 7))
    second = _decode_step(_Layer(), plain_steps.shared_partials(0, 7))
    assert first.partials is second.partials
    assert len(allocations) == 1
    first_stage1, first_merge = _partial_pointers(first)
    second_stage1, second_merge = _partial_pointers(second)
    assert first_stage1 == first_merge  # each merge reads what its stage 1 wrote
    assert first_stage1 == second_stage1 == second_merge  # the same memory for both steps
    assert len(set(first_stage1)) == 3


def test_carved_partials_are_disjoint_aligned_and_sized(allocations):
    shared = plain_steps.shared_partials(0, 7)
    m, l_sum, acc = shared.carve(3, 5, 64)  # odd row x split counts: alignment must pad
    assert (m.shape, l_sum.shape, acc.shape) == ((3, 5), (3, 5), (3, 5, 64))
    spans = sorted(
        (_offset(v, shared.flat), _offset(v, shared.flat) + 4 * v.size) for v in (m, l_sum, acc)
    )
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))  # no overlap
    assert all(start % 256 == 0 for start, _ in spans)
    assert spans[-1][1] <= 4 * shared.flat.size == 4 * allocations[0]


def test_a_smaller_need_reuses_the_buffer_and_a_larger_one_grows_it(allocations):
    shared = plain_steps.shared_partials(0, 7)
    shared.carve(16, 4, 128)
    first = shared.flat
    m, _, _ = shared.carve(8, 2, 128)
    assert shared.flat is first and len(allocations) == 1
    assert m.base is first
    shared.carve(16, 5, 128)  # 25% more: the buffer doubles
    assert len(allocations) == 2 and shared.flat is not first
    assert allocations[1] == 2 * allocations[0]
    shared.carve(64, 32, 128)  # more than double: exactly the need
    assert allocations[2] == plain_steps.partials_size(64, 32, 128) > 2 * allocations[1]


def test_a_step_keeps_the_buffer_it_points_at_after_the_pool_grows(allocations):
    shared = plain_steps.shared_partials(0, 7)
    plain_steps.store(("old",), _decode_step(_Layer(), shared))
    old_flat = weakref.ref(shared.flat)
    old_start = old_flat().data.ptr
    old_end = old_start + 4 * old_flat().size
    plain_steps.store(("new",), _decode_step(_Layer(), shared, rows=64, splits=32))
    assert shared.flat is not old_flat()
    assert old_flat() is not None  # the old step's launches hold views of it
    old_pointers, _ = _partial_pointers(plain_steps._steps[("old",)])
    assert all(old_start <= p < old_end for p in old_pointers)
    new_pointers, _ = _partial_pointers(plain_steps._steps[("new",)])
    assert not any(old_start <= p < old_end for p in new_pointers)
    del plain_steps._steps[("old",)]
    assert old_flat() is None  # freed with the last step that pointed into it
    assert plain_steps._steps[("new",)].partials is shared


def test_the_pool_is_per_device_and_stream_and_lives_with_its_steps(allocations):
    here = plain_steps.shared_partials(0, 7)
    other_stream = plain_steps.shared_partials(0, 8)
    other_device = plain_steps.shared_partials(1, 7)
    assert here is not other_stream and here is not other_device
    assert plain_steps.shared_partials(0, 7) is here
    plain_steps.store(("a",), _decode_step(_Layer(), here))
    entry = weakref.ref(here)
    del here
    assert entry() is plain_steps.shared_partials(0, 7)  # held by the recorded step
    plain_steps.clear()
    assert entry() is None  # no step left: the pool lets it (and its buffer) go


def test_a_replay_enqueues_under_the_lock():
    step = object.__new__(plain_steps.PlainStep)
    held = []
    step.step = lambda stream, arrays: held.append(plain_steps.enqueue_lock.locked())
    step.run(0, {})
    assert held == [True]
    assert not plain_steps.enqueue_lock.locked()


def _call(key, layer) -> bool:
    """What a plain call does with the cache (kvkit.ops): True when it replayed."""
    if plain_steps.lookup(key, layer) is not None:
        return True
    if plain_steps.worth_recording(key):
        plain_steps.store(key, _step(layer))
    return False


def _round_robin_hits(layers, rounds: int) -> list[int]:
    """Replays per round of one call per layer, in layer order."""
    calls = [(("decode", i), layer) for i, layer in enumerate(layers)]
    return [sum(_call(key, layer) for key, layer in calls) for _ in range(rounds)]


def test_a_hundred_layers_round_robin_replay_from_the_third_round():
    layers = [_Layer() for _ in range(100)]
    assert _round_robin_hits(layers, 4) == [0, 0, 100, 100]  # seen, recorded, replayed x2
    assert len(plain_steps._steps) == 100


def test_eighty_layers_thrash_a_cache_of_thirty_two(monkeypatch):
    # Why MAX_STEPS is large: least-recently-used eviction over a longer cycle (Llama-70B's
    # 80 layers) evicts most steps before their turn comes again.
    monkeypatch.setattr(plain_steps, "MAX_STEPS", 32)
    hits = _round_robin_hits([_Layer() for _ in range(80)], 10)
    assert sum(hits[2:]) < 80 * 8 // 3  # fewer than a third of the calls replay
    assert len(plain_steps._steps) == 32


def test_eviction_at_max_steps_drops_the_least_recently_used():
    layer = _Layer()
    n = plain_steps.MAX_STEPS
    for i in range(n):
        plain_steps.store((i,), _step(layer))
    assert plain_steps.lookup((0,), layer) is not None  # 0 is now the most recent
    plain_steps.store((n,), _step(layer))
    assert len(plain_steps._steps) == n
    assert plain_steps.lookup((1,), layer) is None
    assert plain_steps.lookup((0,), layer) is not None
    assert plain_steps.lookup((n,), layer) is not None


def test_signatures_seen_once_are_bounded_and_the_oldest_forgotten():
    n = 10 * plain_steps.MAX_STEPS
    for i in range(n):
        assert not plain_steps.worth_recording((i,))
    assert len(plain_steps._seen) == 4 * plain_steps.MAX_STEPS
    assert plain_steps.worth_recording((n - 1,))  # recent: its second call records
    assert not plain_steps.worth_recording((0,))  # forgotten: counts as a first call
