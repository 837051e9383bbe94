"""kvkit.cuda.plain_steps bookkeeping (no GPU): which calls record, lookups, eviction, and a
changed layer dropping its step."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvkit.cuda import plain_steps


class _Layer:
    def __init__(self):
        self.planes = {"k": object(), "v": object()}
        self.error_flag = object()
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


@pytest.mark.parametrize("change", ["plane", "scale", "flag"])
def test_a_changed_layer_drops_its_step(change):
    layer = _Layer()
    plain_steps.store(("k",), _step(layer))
    if change == "plane":
        layer.planes["k"] = object()
    elif change == "scale":
        layer.k_scale = 2.0
    else:
        layer.error_flag = object()
    assert plain_steps.lookup(("k",), layer) is None
    assert plain_steps.lookup(("k",), SimpleNamespace(**vars(_Layer()))) is None  # gone


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
