"""The statistics engine on hand-computed values: intervals, Holm, TOST, verdicts, plans, IQM."""

import math

import numpy as np
import pytest

from gspo_cli.analysis.stats import (
    Components,
    ProblemScores,
    decide,
    holm,
    iqm,
    paired_t,
    probability_of_improvement,
    problem_difference,
    seed_difference,
    seeds_for_equivalence,
    seeds_needed,
    t975,
    welch,
)


def test_t_quantiles_come_from_scipy():
    assert t975(1) == pytest.approx(12.7062, abs=1e-4) and t975(2) == pytest.approx(4.3027, abs=1e-4)
    assert t975(30) == pytest.approx(2.0423, abs=1e-4) and t975(2.5) == pytest.approx(3.5747, abs=1e-4)
    assert math.isnan(t975(0))


def test_paired_t_on_per_seed_differences():
    est = seed_difference({0: 0.25, 1: 0.53, 2: 0.87}, {0: 0.20, 1: 0.50, 2: 0.80})
    # d = 0.05, 0.03, 0.07: mean 0.05, sd 0.02, 95% half-width 4.3027 * 0.02 / sqrt(3) = 0.04968
    assert est.method == "paired t, 3 seeds" and est.df == 2
    assert est.delta == pytest.approx(0.05) and est.sd_pairs == pytest.approx(0.02)
    lo, hi = est.ci()
    assert (lo, hi) == (pytest.approx(0.05 - 0.049683, abs=1e-5), pytest.approx(0.05 + 0.049683, abs=1e-5))
    assert est.p_value == pytest.approx(0.04941, abs=1e-5)  # t = 4.330 on 2 df


def test_unpaired_seeds_fall_back_on_welch_and_say_so():
    est = seed_difference({0: 0.40, 1: 0.42, 2: 0.44}, {3: 0.20, 4: 0.22, 5: 0.24})
    assert est.method == "Welch, 3 vs 3 seeds (no seed in common)" and est.n_paired == 0
    # equal variances (0.0004) and sizes: se = sqrt(2 * 0.0004 / 3), df = 4
    assert est.se == pytest.approx(math.sqrt(0.0008 / 3)) and est.df == pytest.approx(4.0)
    part = seed_difference({0: 0.4, 1: 0.5, 2: 0.6, 3: 0.7}, {0: 0.3, 1: 0.4, 2: 0.5})
    assert part.method == "paired t, 3 seeds (1 unpaired left out)" and part.delta == pytest.approx(0.1)
    assert math.isnan(welch([0.5], [0.1, 0.2]).se) and math.isnan(welch([], [0.1]).delta)


def test_paired_resolves_what_welch_cannot():
    """Per-seed baselines spread widely, the arm a constant shift above each: paired finds it."""
    base = {0: 0.20, 1: 0.50, 2: 0.80}
    arm = {0: 0.251, 1: 0.549, 2: 0.850}
    paired = decide([("arm", "base", "score", 1, seed_difference(arm, base))])[0]
    unpaired = decide([("arm", "base", "score", 1, welch(list(arm.values()), list(base.values())))])[0]
    assert paired.verdict == "better" and paired.ci95[0] > 0
    assert unpaired.verdict == "not resolved" and unpaired.ci95[0] < -0.5 < 0.6 < unpaired.ci95[1]


def test_holm_step_down():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    out = holm([0.02, math.nan, 0.5])
    assert out[0] == pytest.approx(0.04) and math.isnan(out[1]) and out[2] == pytest.approx(0.5)


def test_verdicts_follow_the_metric_direction_and_the_margin():
    est = paired_t(np.array([-0.05, -0.03, -0.07]), "paired t, 3 seeds", 3, 3)
    kl = decide([("gspo", "grpo", "kl", -1, est)])[0]
    assert kl.verdict == "better" and kl.p_adjusted == pytest.approx(0.04941, abs=1e-5)
    assert decide([("gspo", "grpo", "reward", 1, est)])[0].verdict == "worse"
    assert decide([("gspo", "grpo", "clip", 0, est)])[0].verdict == "lower"
    # two arms: Holm doubles the p-value, 0.097 > 0.05; the plan is at Holm's first level, 0.025
    # (d/sd = 2.5: 4 seeds at 0.05, 5 at 0.025)
    two = decide([("gspo", "grpo", "reward", 1, est), ("x", "grpo", "reward", 1, est)])
    assert [d.verdict for d in two] == ["not resolved", "not resolved"] and two[0].seeds_needed == 5
    assert seeds_needed(-0.05, 0.02) == 4 and seeds_needed(-0.05, 0.02, alpha=0.025) == 5
    assert two[0].family_size == 2
    tight = paired_t(np.array([0.001, -0.001, 0.002, 0.0, -0.002]), "paired t, 5 seeds", 5, 5)
    eq = decide([("gspo", "grpo", "reward", 1, tight)], margin=0.01)[0]
    assert eq.verdict == "equivalent" and -0.01 < tight.ci(0.90)[0] < tight.ci(0.90)[1] < 0.01
    assert decide([("gspo", "grpo", "reward", 1, tight)])[0].verdict == "not resolved"  # no margin, no equivalence


def test_seeds_needed_matches_the_paired_t_power_tables():
    # Cohen's tables, paired t, two-sided 5%, 80% power: d = 1 -> 10 pairs, d = 0.5 -> 34
    assert seeds_needed(1.0, 1.0) == 10 and seeds_needed(-0.5, 1.0) == 34
    assert seeds_needed(0.0, 1.0) is None and seeds_needed(1e-4, 1.0) is None  # beyond 1000 seeds
    assert seeds_for_equivalence(0.0, 1.0, 1.0) == 11 and seeds_for_equivalence(1.2, 1.0, 1.0) is None


def test_seeds_needed_shrinks_as_the_difference_grows_when_scipy_gives_nan():
    # scipy's noncentral t returns NaN for the far tail at a large noncentrality (cdf(-4.3, 2, 11.3));
    # that tail is ~0, so n = 3 has power 0.998 and is the answer. The calibration study's
    # handicap pilot (SD 0.0153) planned 5 seeds for a difference of 0.1 and 3 for 0.05.
    assert seeds_needed(0.1, 0.0153) == 3 and seeds_needed(-0.1, 0.0153) == 3
    assert seeds_needed(0.05, 0.0153) == 3 and seeds_needed(0.2, 0.0153) == 2
    sizes = [seeds_needed(d, 0.0153) for d in (0.01, 0.02, 0.05, 0.1, 0.2, 0.4)]
    assert sizes == sorted(sizes, reverse=True)
    assert seeds_for_equivalence(0.0, 0.0153, 0.1) == 3  # n = 2: power 0.70; n = 3: 0.99999


def test_probability_of_improvement_and_iqm():
    assert probability_of_improvement([1, 2], [0, 3]) == 0.5
    assert probability_of_improvement([1, 1], [1, 0]) == 0.75  # ties count one half
    assert probability_of_improvement([1, 2], [0, 3], direction=-1) == 0.5
    assert iqm([0, 1, 2, 3, 100]) == 2.0 and math.isnan(iqm([]))


def test_components_say_what_helps():
    comp = Components(seed=0.0, problem=0.0, resid=0.1, sampling=0.1, seeds=3, problems=50, samples=4)
    assert comp.shares()["sampling"] == pytest.approx(1.0)  # at its bound
    assert comp.variance(samples=8) == pytest.approx(comp.variance() / 2)
    # all the residual could be sampling, or none of it (common random numbers): seeds and problems
    # halve it for sure, samples per problem at most; without mean squares no intervals
    assert comp.advice() == (
        "doubling the seeds by 50%, the problems by 50% (95% intervals); doubling the samples per problem "
        "by at most 50% (a bound: the arms share their sampling draws, so part of their sampling noise "
        "cancels); seeds and problems help alike: add the cheaper"
    )
    assert comp.share_intervals()["sampling"] == (0.0, 1.0) and comp.share_intervals()["seeds"] == (0.0, 1.0)
    seedy = Components(seed=0.01, problem=0.0, resid=0.001, sampling=0.001, seeds=3, problems=50, samples=4)
    assert seedy.advice().endswith("most: more seeds") and seedy.shares()["seeds"] > 0.99
    # a sampling bound above the residual: capped at the residual (the old split could exceed it)
    over = Components(seed=0.0, problem=0.0, resid=0.05, sampling=0.1, seeds=3, problems=50, samples=4)
    assert over.variance(samples=8) == pytest.approx(over.variance() / 2)


def test_component_intervals_from_the_mean_squares():
    """With 3 seeds MS_seed has 2 degrees of freedom: its interval is wide, and every interval holds
    its point; the gains of doubling seeds and problems do not depend on the unidentified split."""
    S, P = 3, 50
    ms_seed, ms_problem, ms_resid = 0.2, 0.15, 0.1
    comp = Components(
        (ms_seed - ms_resid) / P, (ms_problem - ms_resid) / S, ms_resid, 0.06, S, P, 4, ms_seed, ms_problem, ms_resid
    )
    point, ranges = comp.shares(), comp.share_intervals()
    for k in ("seeds", "problems", "sampling"):
        assert ranges[k][0] <= point[k] <= ranges[k][1]
    assert ranges["sampling"][0] == 0.0  # common random numbers: the sampling share may be 0
    gains = comp.gains()
    for k in ("seeds", "problems"):
        assert gains[k][1] <= gains[k][0] <= gains[k][2] <= 0.5 + 1e-12
    v = comp.variance()
    assert gains["seeds"][0] == pytest.approx((comp.seed / S + ms_resid / (S * P)) / 2 / v)
    assert gains["samples per problem"][0] == pytest.approx(0.06 / (S * P) / 2 / v)  # the bound
    assert comp.share_intervals() == ranges  # seeded: the same every time


def test_problem_records_align_by_id_and_are_reproducible():
    rng = np.random.default_rng(0)
    ids = tuple(f"p{i}" for i in range(30))
    arm = {s: ProblemScores(ids, rng.binomial(4, 0.6, 30), 4) for s in range(3)}
    base = {s: ProblemScores(ids[::-1], rng.binomial(4, 0.5, 30), 4) for s in range(4)}  # other order, 1 extra
    a, b = problem_difference(arm, base), problem_difference(arm, base)
    assert a == b and a.method == "seeds t + problem bootstrap, 3 seeds x 30 problems (1 unpaired seeds left out)"
    want = np.mean([arm[s].score - base[s].score[::-1] for s in range(3)])
    assert a.delta == pytest.approx(want) and a.components.samples == 4
    assert problem_difference({0: arm[0]}, {0: base[0]}) is None  # one seed: seed-level methods instead


def test_resolution_says_when_only_more_problems_can_resolve():
    """A problem-level share that seeds cannot shrink: no seed count reaches the difference, and
    the row says to add problems (and why), then what each doubling buys now."""
    from gspo_cli.analysis.stats.decisions import Difference
    from gspo_cli.analysis.stats.intervals import Estimate

    comp = Components(seed=0.0, problem=0.05, resid=0.01, sampling=0.01, seeds=3, problems=20, samples=4)
    est = Estimate(0.001, math.sqrt(comp.variance()), 10.0, "seeds t + problem bootstrap", 3, 3, 3, 0.01, comp)
    row = Difference("gspo", "grpo", "eval_final:math", 1, est, 0.9, "not resolved", seeds_needed=None)
    text = row.resolution()
    assert text.startswith(
        "more seeds alone cannot resolve +0.001 on this held-out set (its problems' share of the variance "
        "does not shrink with seeds): add problems; doubling the seeds by"
    )
    assert text.endswith("most: more problems")
