"""The paired benchmark's statistics (benchmarks/stats.py): pairing, the bootstrap interval,
drift and the thread probe's choice, on inputs whose answers are worked out by hand."""

from __future__ import annotations

import pytest

from benchmarks.stats import bootstrap_ci, drift, paired_ratios, pick_by_min, summarize_ratio


def test_paired_ratios_match_rounds_and_drop_missing():
    a = {0: 1.0, 1: 2.0, 2: None, 3: 1.0, 4: 3.0}
    b = {0: 2.0, 1: 4.0, 2: 1.0, 3: 0, 5: 1.0}
    # round 2: a missing; 3: b is 0; 4: b has no such round; 5: a has none
    assert paired_ratios(a, b) == {0: 0.5, 1: 0.5}


def test_bootstrap_ci_of_two_values_is_their_range():
    # resamples of [1, 3] have median 1 (p=1/4), 2 (1/2) or 3 (1/4): the 2.5% and 97.5% ends are 1 and 3
    assert bootstrap_ci([1.0, 3.0]) == (1.0, 3.0)


def test_bootstrap_ci_of_seven_values_is_second_to_sixth():
    # The median of 7 draws is at or below the smallest value when >= 4 draws are it:
    # P = sum_{k>=4} C(7,k) (1/7)^k (6/7)^(7-k) = 0.0101 < 0.025, while at or below the second
    # smallest P = 0.096 > 0.025. So the 95% interval runs from the 2nd to the 6th value.
    assert bootstrap_ci([7.0, 1.0, 5.0, 2.0, 6.0, 3.0, 4.0]) == (2.0, 6.0)


def test_bootstrap_ci_constant_single_empty_and_seeded():
    assert bootstrap_ci([0.5] * 7) == (0.5, 0.5)
    assert bootstrap_ci([0.8]) == (0.8, 0.8)
    vals = [0.61, 0.55, 0.72, 0.58, 0.66, 0.49, 0.7, 0.63]
    assert bootstrap_ci(vals, seed=3) == bootstrap_ci(vals, seed=3)  # the report re-renders the same
    with pytest.raises(ValueError):
        bootstrap_ci([])


def test_summarize_ratio_verdicts():
    faster = dict(enumerate([0.5, 0.6, 0.7, 0.55, 0.65, 0.58, 0.62]))
    s = summarize_ratio(faster, target=0.7)
    assert s["n"] == 7 and s["median"] == pytest.approx(0.6)
    assert s["ci"] == [0.55, 0.65]  # 2nd and 6th of the sorted ratios (see the test above)
    assert s["excludes_1"] and s["side_of_1"] == "faster"
    assert s["median_meets_target"] and s["ci_meets_target"]
    strict = summarize_ratio(faster, target=0.6)
    assert strict["median_meets_target"] and not strict["ci_meets_target"]  # median 0.6, interval up to 0.65

    straddles = summarize_ratio(dict(enumerate([0.8, 1.1, 0.9, 1.2, 0.95, 1.05, 1.0])))
    assert straddles["ci"] == [0.9, 1.1] and not straddles["excludes_1"] and straddles["side_of_1"] is None
    assert "median_meets_target" not in straddles

    slower = summarize_ratio({0: 1.2, 1: 1.3})
    assert slower["ci"] == [1.2, 1.3] and slower["side_of_1"] == "slower"
    assert summarize_ratio({})["median"] is None


def test_drift_figures():
    d = drift([1.0, 2.0, 1.5])
    assert d["n"] == 3 and d["median"] == 1.5 and d["min"] == 1.0 and d["max"] == 2.0
    assert d["max_over_min"] == 2.0
    assert d["cv"] == pytest.approx(0.5 / 1.5)  # stdev of (1, 1.5, 2) is 0.5
    assert drift([0.4])["cv"] == 0.0 and drift([]) is None


def test_pick_by_min_takes_the_fastest_round_not_the_median():
    # 1 thread: steady 0.7-0.9; 2 threads: one quiet round at 0.6, two stalled ones
    best, mins = pick_by_min({1: [0.9, 0.7, 0.8], 2: [0.6, 1.5, 2.0]})
    assert best == 2 and mins == {1: 0.7, 2: 0.6}
    assert pick_by_min({2: [0.5], 1: [0.5]})[0] == 1  # a tie goes to fewer threads
    with pytest.raises(ValueError):
        pick_by_min({1: []})
