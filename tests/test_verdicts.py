"""Verdicts on RL-shaped data, on hand-computed values: no verdict without spread, the exact
sign-flip test, outliers and two modes, collapse rates, Shaffer's step-down over difference and
equivalence tests, families, and plans for the smallest effect of interest."""

import math

import numpy as np
import pytest
from scipy import stats

from gspo_cli.analysis.stats import (
    DESCRIPTIVE,
    collapse_interval,
    decide,
    describe,
    holm,
    one_collapse_reverses,
    paired_t,
    sd_upper,
    seeds_for_effect,
    seeds_needed,
    shaffer,
    shape_flags,
    sign_flip_p,
    smallest_sign_flip_p,
)
from gspo_cli.spec.comparison import ComparisonConfig


def _est(d):
    return paired_t(np.asarray(d, dtype=float), f"paired t, {len(d)} seeds", len(d), len(d))


def test_no_spread_gets_no_verdict_and_says_why():
    """Three seeds all +1/16 (16 problems x 1 sample): a zero-width interval. The t test has no
    noise estimate, so no p, no `better`, and with a margin no `equivalent` either."""
    est = _est([1 / 16] * 3)
    assert est.no_spread and est.ci() == (0.0625, 0.0625)
    assert math.isnan(est.p_value) and math.isnan(est.tost_p(0.1))
    row = decide([("gspo", "grpo", "reward", 1, est)], margin=0.1)[0]
    assert row.verdict == "not resolved" and math.isnan(row.p_adjusted) and math.isnan(row.p_tost_adjusted)
    assert row.resolution().startswith("every seed gave the same difference (+0.0625): no estimate of its noise")
    assert row.seeds_needed is None and row.seeds_equivalence is None
    # it keeps its place in the family: a second row is adjusted for 2 rows, not 1
    other = _est([0.05, 0.03, 0.07])
    pair = decide([("gspo", "grpo", "reward", 1, est), ("x", "grpo", "reward", 1, other)])
    assert pair[1].p_adjusted == pytest.approx(2 * other.p_value) and pair[1].family_size == 2
    assert not _est([0.05, 0.03, 0.07]).no_spread and _est([0.0, 0.0, 0.0]).p_value == 1.0


def test_sign_flip_counts_every_sign_pattern():
    # [1, 2, 3]: |sum| 6 is reached only by +++ and ---: 2 of 8
    assert sign_flip_p([1, 2, 3]) == 0.25 == smallest_sign_flip_p(3)
    # [1, 2, 3, 4]: |sum| >= 10 by 2 patterns, >= 8 (flip the 1) by 2 more: 4 of 16
    assert sign_flip_p([1, 2, 3, 4]) == 0.125
    assert sign_flip_p([2, 1, 3, 4]) == 0.125 and sign_flip_p([1, 2, 3, 4], "greater") == 1 / 16
    assert sign_flip_p([1, 2, -3]) == 1.0 and sign_flip_p([1, 2, 3], "less") == 1.0
    assert smallest_sign_flip_p(5) == 0.0625 and smallest_sign_flip_p(10) == pytest.approx(0.001953125)
    d = np.random.default_rng(3).normal(0.5, 1, 8)
    ref = stats.permutation_test((d,), np.mean, permutation_type="samples", n_resamples=np.inf)
    assert sign_flip_p(d) == pytest.approx(ref.pvalue)


def test_outliers_and_two_modes_are_flagged_and_ordinary_spread_is_not():
    assert shape_flags([0.03, 0.031, 0.029, 0.03, -0.3]) == ["an outlying seed (-0.3)"]
    assert shape_flags([0.03, 0.03, 0.03, -0.3]) == ["an outlying seed (-0.3)"]  # 3 others agree exactly
    assert shape_flags([0.3, 0.3, 0.25]) == []  # two equal values of three prove nothing
    assert shape_flags([0.1, 0.11, 0.105, 0.5, 0.51, 0.52]) == ["two modes"]
    assert shape_flags([0.05, 0.03, 0.07, 0.04, 0.06]) == [] and shape_flags([1 / 16] * 3) == []
    rng = np.random.default_rng(4)  # normal differences: flagged rarely (at most ~2%: 1% per rule)
    assert np.mean([bool(shape_flags(x)) for x in rng.normal(size=(1000, 5))]) < 0.04


def test_a_flagged_row_keeps_its_verdict_only_if_the_sign_flip_test_agrees():
    # t test: mean 0.14, sd sqrt(0.0322 / 4) = 0.0897, t 3.49 on 4 df, p 0.0251: `better` by t; 0.30 an outlier
    five = _est([0.10, 0.11, 0.09, 0.10, 0.30])
    assert five.p_value == pytest.approx(0.0251, abs=1e-4)
    row = decide([("gspo", "grpo", "reward", 1, five)])[0]
    assert row.verdict == "not resolved" and row.sign_flip_p == 0.0625
    assert "an outlying seed (+0.3)" in row.resolution()
    assert "the smallest p 5 seeds can give is 0.0625" in row.resolution()
    six = decide([("gspo", "grpo", "reward", 1, _est([0.10, 0.11, 0.09, 0.10, 0.105, 0.30]))])[0]
    assert six.verdict == "better" and six.sign_flip_p == 2 / 64
    plain = decide([("gspo", "grpo", "reward", 1, _est([0.05, 0.03, 0.07]))])[0]
    assert plain.verdict == "better" and math.isnan(plain.sign_flip_p)  # not flagged: no exact test needed


def test_a_verdict_one_collapsed_seed_would_reverse_says_so():
    d = [0.030, 0.035, 0.032, 0.031, 0.034]
    assert one_collapse_reverses(d, 0.3, 0.05) and not one_collapse_reverses(d, 0.001, 0.05)
    row = decide([("gspo", "grpo", "reward", 1, _est(d))], collapse=[0.3])[0]
    assert row.verdict == "better"
    assert row.warnings == ("one collapsed seed (a difference of 0.3 the other way) would reverse this verdict",)
    assert decide([("gspo", "grpo", "reward", 1, _est(d))])[0].warnings == ()  # not asked


def test_collapse_rates_are_exact():
    lo, hi = collapse_interval(0, 5)
    assert lo == 0 and hi == pytest.approx(1 - 0.05 ** (1 / 5)) and hi == pytest.approx(0.4507, abs=1e-4)
    ref = stats.binomtest(2, 5).proportion_ci(method="exact")
    assert collapse_interval(2, 5) == (pytest.approx(ref.low), pytest.approx(ref.high))
    assert collapse_interval(5, 5)[1] == 1.0 and math.isnan(collapse_interval(0, 0)[0])


def test_shaffer_adjusts_equivalence_in_the_family_and_is_holm_without_it():
    p = [0.01, 0.04, 0.03]
    assert shaffer(p, [math.nan] * 3)[0] == pytest.approx(holm(p))
    # rows 0 and 1; row 1 has both tests. Sorted: d0 0.01 (2 rows open: 0.02), e1 0.02 (row 1 only
    # open: 0.02), d1 0.5 (0.5). Plain Holm over the three p-values would give 0.03, 0.04, 0.5.
    diff, eq = shaffer([0.01, 0.5], [math.nan, 0.02])
    assert diff == pytest.approx([0.02, 0.5]) and math.isnan(eq[0]) and eq[1] == pytest.approx(0.02)
    # eight arms, each TOST p 0.02: alone each would be `equivalent`; in the family 8 x 0.02 = 0.16
    tight = _est([0.001, -0.001, 0.002, 0.0, -0.002])
    one = decide([("a", "b", "m", 1, tight)], margin=0.01)[0]
    assert one.verdict == "equivalent" and one.p_tost_adjusted == pytest.approx(tight.tost_p(0.01))
    _, adj = shaffer([0.5] * 8, [0.02] * 8)
    assert adj == pytest.approx([0.16] * 8)


def test_families_state_their_size_and_diagnostics_are_not_tested():
    est = _est([0.05, 0.03, 0.07])
    primary = decide([("gspo", "grpo", "eval_final:math", 1, est)], family="primary")[0]
    assert (primary.family, primary.family_size, primary.verdict) == ("primary", 1, "better")
    assert primary.p_adjusted == pytest.approx(est.p_value)  # the full alpha
    diag = describe([("gspo", "grpo", "kl", 0, est)])[0]
    assert diag.verdict == DESCRIPTIVE and diag.family == "diagnostics" and math.isnan(diag.p_adjusted)
    assert diag.ci95 == est.ci() and diag.to_dict()["family_size"] == 0


def test_plans_for_the_effect_of_interest_use_the_sd_upper_bound_and_the_rows_level():
    # 80% upper bound with 2 df: sqrt(2 / chi2_0.2(2)), chi2_0.2(2) = -2 ln 0.8
    assert sd_upper(1.0, 2) == pytest.approx(math.sqrt(2 / (-2 * math.log(0.8))))
    assert sd_upper(1.0, math.inf) == 1.0 and math.isnan(sd_upper(math.nan, 2))
    # an effect of 1 at an upper-bound SD of 1 is Cohen's d = 1: 10 pairs
    assert seeds_for_effect(1.0, 1 / sd_upper(1.0, 2), 2) == seeds_needed(1.0, 1.0) == 10
    assert seeds_for_effect(1.0, 0.0, 2) is None  # no noise measured: nothing to plan from
    est = _est([0.01, -0.01, 0.03])  # mean 0.01, sd 0.02: not resolved
    row = decide([("gspo", "grpo", "reward", 1, est)], effect=0.02)[0]
    assert row.verdict == "not resolved" and row.effect == 0.02
    assert row.seeds_needed == seeds_for_effect(0.02, 0.02, 2)
    assert row.seeds_observed == seeds_needed(0.01, 0.02)
    assert "would find a difference of +0.02 (the smallest effect of interest)" in row.resolution()
    two = decide([("gspo", "grpo", "reward", 1, est), ("x", "grpo", "reward", 1, est)], effect=0.02)
    assert two[0].seeds_needed == seeds_for_effect(0.02, 0.02, 2, alpha=0.025)  # Holm's first level
    assert two[0].seeds_needed > row.seeds_needed


def test_the_spec_names_the_smallest_effect_of_interest():
    c = ComparisonConfig(baseline="grpo", arm="gspo", margin=0.02, effect=0.03)
    assert c.effect == 0.03 and ComparisonConfig(baseline="grpo", arm="gspo").effect is None
    with pytest.raises(ValueError):
        ComparisonConfig(baseline="grpo", arm="gspo", effect=0)
