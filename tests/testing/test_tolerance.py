"""The error measures of kvkit.testing.tolerance, on values worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from kvkit.testing.tolerance import lse_error, merge_error, rel_error


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


def test_merge_error_is_relative_to_the_weighted_magnitude():
    # Two parts with equal lse (weights 1, 1): exact merge (1 + -1.002) / 2 = -0.001; the
    # scale is (|1| + |-1.002|) / 2 = 1.001, so an output off by 1e-6 scores 1e-6 / 1.001.
    o = np.array([[[1.0]], [[-1.002]]])
    lse = np.array([[0.5], [0.5]])
    assert merge_error([[-0.001]], o, lse) == pytest.approx(0.0, abs=1e-12)
    assert merge_error([[-0.001 + 1e-6]], o, lse) == pytest.approx(1e-6 / 1.001, rel=1e-6)
    # lse 0 and ln 3: weights 1/3 and 1 after the max shift: o = (2/3 * 1 + ... ) by hand
    o2 = np.array([[[3.0, 0.0]], [[-1.0, 2.0]]])
    lse2 = np.array([[0.0], [np.log(3.0)]])
    exact = np.array([[(3.0 / 3 - 1.0) / (4 / 3), (2.0) / (4 / 3)]])
    assert merge_error(exact, o2, lse2) == pytest.approx(0.0, abs=1e-12)


def test_merge_error_empty_rows_and_non_finite():
    o = np.full((2, 1, 3), np.nan)  # empty parts' o is ignored
    lse = np.full((2, 1), -np.inf)
    assert merge_error(np.zeros((1, 3)), o, lse) == 0.0
    assert merge_error(np.full((1, 3), 1e-3), o, lse) == pytest.approx(1e-3)
    o1 = np.ones((1, 1, 2))
    assert merge_error([[np.nan, 1.0]], o1, np.zeros((1, 1))) == np.inf
    with pytest.raises(ValueError, match="shape"):
        merge_error(np.zeros((2, 2)), o1, np.zeros((1, 1)))
