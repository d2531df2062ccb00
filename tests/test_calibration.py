"""The calibration study's arithmetic: Clopper-Pearson intervals (against their closed forms) and
the disjoint pseudo-experiment blocks."""

from __future__ import annotations

import pytest

from gspo_cli.analysis.stats.calibration import clopper_pearson, disjoint_blocks


def test_clopper_pearson_matches_closed_forms():
    # k = 0: upper bound 1 - (alpha/2)^(1/n); k = n: lower bound (alpha/2)^(1/n)
    assert clopper_pearson(0, 4) == (0.0, pytest.approx(1 - 0.025 ** (1 / 4)))
    assert clopper_pearson(8, 8) == (pytest.approx(0.025 ** (1 / 8)), 1.0)
    lo, hi = clopper_pearson(1, 20)  # the textbook 1/20: [0.0013, 0.2487]
    assert lo == pytest.approx(0.001265, abs=1e-6) and hi == pytest.approx(0.248733, abs=1e-6)
    lo, hi = clopper_pearson(0, 0)
    assert lo != lo and hi != hi  # NaN: no trials


def test_disjoint_blocks_leave_the_remainder_out():
    assert disjoint_blocks(12, 3) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert disjoint_blocks(8, 3) == [[0, 1, 2], [3, 4, 5]]
    assert disjoint_blocks(2, 3) == []
