"""kvkit.cuda.plain_steps bookkeeping (no GPU): which calls record, lookups, eviction, and a
changed layer dropping its step."""

from __future__ import annotations

from types import SimpleNamespace

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


def test_the_kernel_choice_environment_is_in_the_key(monkeypatch):
    monkeypatch.delenv("KVKIT_DECODE_SIMT", raising=False)
    before = plain_steps.kernel_choice_env()
    monkeypatch.setenv("KVKIT_DECODE_SIMT", "1")
    assert plain_steps.kernel_choice_env() != before
