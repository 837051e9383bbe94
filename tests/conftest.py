"""Suite-wide test configuration: Hypothesis profiles and the ``gpu`` marker.

Hypothesis profiles (pick one with ``HYPOTHESIS_PROFILE``; default ``ci`` when ``CI`` is set,
else ``dev``):

* ``dev``  - quick local runs, random examples, failures replayed from the local database;
* ``ci``   - derandomized (same examples on every run) and moderate, the profile ``.ci/run`` uses;
* ``deep`` - many examples, for fuzzing sessions.

No profile has a deadline: the first example of a test often pays for Numba JIT compilation.

Tests marked ``@pytest.mark.gpu`` are skipped when CuPy is not importable or no CUDA device is
visible. ``KVKIT_REQUIRE_GPU=1`` turns that skip into an error (for runs on the GPU machine,
where a silent skip would hide a broken setup).
"""

from __future__ import annotations

import functools
import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=30, deadline=None)
settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "deep",
    max_examples=2000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)


@functools.cache
def cuda_unavailable_reason() -> str | None:
    """None when CuPy imports and sees at least one CUDA device, else why not."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install raising something else
        return f"cupy is not importable ({type(exc).__name__}: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"no usable CUDA device ({type(exc).__name__}: {exc})"
    if count < 1:
        return "no CUDA device visible"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = cuda_unavailable_reason()
    if reason is None:
        return
    if os.environ.get("KVKIT_REQUIRE_GPU", "") not in ("", "0"):
        raise pytest.UsageError(f"KVKIT_REQUIRE_GPU is set but {reason}")
    skip = pytest.mark.skip(reason=f"gpu test: {reason}")
    for item in gpu_items:
        item.add_marker(skip)
