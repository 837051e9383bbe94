"""The error measures of kvkit.testing.tolerance, on values worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from kvkit.testing.tolerance import lse_error, rel_error


def test_lse_error_absolute_below_one_relative_above():
    # |ref| <= 1: the absolute difference; above: relative to |ref|.
    assert lse_error([0.5], [0.5 + 2e-6]) == pytest.approx(2e-6, rel=1e-9)
    assert lse_error([100.0 + 1e-3], [100.0]) == pytest.approx(1e-5, rel=1e-6)
    assert lse_error([-300.0], [-301.5]) == pytest.approx(1.5 / 301.5, rel=1e-12)


def test_lse_error_empty_rows_and_non_finite():
    assert lse_error([-np.inf, 0.0], [-np.inf, 0.0]) == 0.0  # both empty: exact
    assert lse_error([-np.inf], [0.25]) == np.inf  # one-sided -inf
    assert lse_error([np.nan], [0.0]) == np.inf
    assert lse_error(np.zeros((0, 3)), np.zeros((0, 3))) == 0.0
    with pytest.raises(ValueError, match="shape"):
        lse_error([0.0, 1.0], [0.0])


def test_rel_error_is_row_normwise():
    ref = np.array([[1.0, -4.0], [0.0, 0.0]])
    out = np.array([[1.5, -4.0], [0.0, 1e-3]])
    # row 0: 0.5 / 4; row 1 (all-zero reference): absolute 1e-3
    assert rel_error(out, ref) == pytest.approx(0.125)
