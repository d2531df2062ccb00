"""Stability as time to collapse: Kaplan-Meier and log-rank against hand-computed values and scipy,
and their place in `compare --baseline`, `report` and `plot`."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats
from synthetic_runs import write_run
from typer.testing import CliRunner

from gspo_cli.analysis.report.collapse import survival_lines
from gspo_cli.analysis.rundata.runs import group_runs, load_runs
from gspo_cli.analysis.stats.stability import arm_times, collapse_time
from gspo_cli.analysis.stats.survival import kaplan_meier, logrank
from gspo_cli.analysis.tables.compare import compare_runs
from gspo_cli.analysis.tables.differences import build_differences, primary_key
from gspo_cli.cli.app import app

# The small censored example, by hand (True: event, False: censored).
#   a: 1 event, 2 censored, 3 event, 4 censored      b: 2 event, 4 event, 5 censored, 5 censored
# KM of a: S(1) = 3/4 (4 at risk, 1 event); the censored run leaves 2 at risk at 3: S(3) = 3/4 x 1/2.
# Greenwood at 3: S^2 (1/(4*3) + 1/(2*1)) = (9/64)(7/12) = 63/768.
# Log-rank of a vs b at the pooled event times 1, 2, 3, 4 (at risk a/b, events):
#   t=1: 4/4, d=1 (a): E_a = 4/8, V = (4/8)(4/8)          = 1/4
#   t=2: 3/4, d=1 (b): E_a = 3/7, V = (3/7)(4/7)          = 12/49
#   t=3: 2/3, d=1 (a): E_a = 2/5, V = (2/5)(3/5)          = 6/25
#   t=4: 1/3, d=1 (b): E_a = 1/4, V = (1/4)(3/4)          = 3/16
# O_a = 2, E_a = 1/2 + 3/7 + 2/5 + 1/4 = 221/140, V = 1/4 + 12/49 + 6/25 + 3/16.
A_T, A_E = [1, 2, 3, 4], [True, False, True, False]
B_T, B_E = [2, 4, 5, 5], [True, True, False, False]


def test_kaplan_meier_hand_computed():
    km = kaplan_meier(A_T, A_E)
    assert km.times.tolist() == [1, 2, 3, 4]
    assert km.survival.tolist() == pytest.approx([0.75, 0.75, 0.375, 0.375], abs=1e-15)
    assert km.at_risk.tolist() == [4, 3, 2, 1]
    assert km.greenwood[2] == pytest.approx(63 / 768, rel=1e-12)
    assert km.median == 3.0
    assert km.at(0.5) == 1.0 and km.at(3.5) == 0.375
    assert math.isnan(kaplan_meier([1, 2, 3], [False, False, True]).median) is False
    assert math.isnan(kaplan_meier([5, 6], [False, False]).median)  # never below 0.5: no median


def test_logrank_hand_computed():
    lr = logrank(A_T, A_E, B_T, B_E)
    var = 1 / 4 + 12 / 49 + 6 / 25 + 3 / 16
    assert lr.observed == 2 and lr.expected == pytest.approx(221 / 140, rel=1e-12)
    assert lr.variance == pytest.approx(var, rel=1e-12)
    z = (2 - 221 / 140) / math.sqrt(var)
    assert lr.z == pytest.approx(z, rel=1e-12)
    assert lr.p_normal == pytest.approx(2 * stats.norm.sf(z), rel=1e-12)
    # 4 runs per arm: the exact p counts the C(8, 4) = 70 labellings with |Z| at least this one's
    assert lr.splits == 70 and lr.p_value == pytest.approx(46 / 70, rel=1e-12)
    est = lr.estimate()  # the engine's test of this estimate is the log-rank test
    assert est.p_value == pytest.approx(lr.p_value, rel=1e-12)
    lo, hi = est.ci()
    assert (lo, hi) == pytest.approx((est.delta - 1.959964 * est.se, est.delta + 1.959964 * est.se), rel=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_against_scipy(seed):
    rng = np.random.default_rng(seed)
    ta, tb = rng.integers(1, 8, 12).astype(float), rng.integers(2, 9, 11).astype(float)  # > 10 runs: the normal
    ea, eb = rng.random(12) < 0.6, rng.random(11) < 0.5
    km = kaplan_meier(ta, ea)
    ref = stats.ecdf(stats.CensoredData(uncensored=ta[ea], right=ta[~ea]))
    assert km.times.tolist() == ref.sf.quantiles.tolist()
    assert km.survival == pytest.approx(ref.sf.probabilities, rel=1e-12)
    with warnings.catch_warnings():  # scipy warns where the interval is undefined (S = 0 or 1)
        warnings.simplefilter("ignore", RuntimeWarning)
        ci = ref.sf.confidence_interval(method="log-log")
    ok = np.isfinite(ci.low.probabilities) & (km.survival < 1)
    assert km.low[ok] == pytest.approx(ci.low.probabilities[ok], rel=1e-9)
    assert km.high[ok] == pytest.approx(ci.high.probabilities[ok], rel=1e-9)
    lr = logrank(ta, ea, tb, eb)
    ref_lr = stats.logrank(
        stats.CensoredData(uncensored=ta[ea], right=ta[~ea]), stats.CensoredData(uncensored=tb[eb], right=tb[~eb])
    )
    assert abs(lr.z) == pytest.approx(abs(ref_lr.statistic), rel=1e-9)
    assert math.isnan(lr.p_exact) and lr.p_value == pytest.approx(ref_lr.pvalue, rel=1e-9)


def test_exact_logrank_for_three_runs_against_three():
    # a's three runs collapse first, b's three never: of the C(6, 3) = 20 labellings only this one
    # and its mirror (b's collapsing first) are as extreme, so p = 2/20; the normal says 0.025.
    lr = logrank([1, 2, 3], [True] * 3, [10, 10, 10], [False] * 3)
    assert lr.p_value == pytest.approx(2 / 20, abs=1e-15) and lr.splits == 20 and lr.enumerated
    assert lr.p_normal == pytest.approx(0.0246, abs=1e-4)
    est = lr.estimate()
    assert est.p_value == pytest.approx(0.10, abs=1e-15) and "exact permutation p over all 20" in est.method


@pytest.mark.parametrize("seed", range(3))
def test_exact_logrank_equals_scipy_permutation_test(seed):
    rng = np.random.default_rng(10 + seed)
    na, nb = 4, 5
    t = rng.integers(1, 6, na + nb).astype(float)
    e = rng.random(na + nb) < 0.6
    e[0] = True

    def z(ia, ib):  # |Z| of the log-rank test with the runs ia as arm a
        ia, ib = ia.astype(int), ib.astype(int)
        lr = logrank(t[ia], e[ia], t[ib], e[ib], exact=False)
        return abs(lr.z) if lr.variance > 1e-12 else 0.0

    ref = stats.permutation_test(
        (np.arange(na), np.arange(na, na + nb)), z, permutation_type="independent", alternative="greater"
    )
    lr = logrank(t[:na], e[:na], t[na:], e[na:])
    assert lr.splits == math.comb(9, 4) and lr.p_value == pytest.approx(ref.pvalue, rel=1e-12)


def test_large_arms_use_the_normal_and_monte_carlo_is_close_to_exact():
    rng = np.random.default_rng(7)
    ta, tb = rng.integers(1, 9, 40).astype(float), rng.integers(2, 10, 30).astype(float)
    ea, eb = rng.random(40) < 0.5, rng.random(30) < 0.5
    ref = stats.logrank(
        stats.CensoredData(uncensored=ta[ea], right=ta[~ea]), stats.CensoredData(uncensored=tb[eb], right=tb[~eb])
    )
    assert logrank(ta, ea, tb, eb).p_value == pytest.approx(ref.pvalue, rel=1e-9)  # 40 vs 30: asymptotic
    # 8 runs against 40: too many labellings to list, so 20,000 random ones (SE of p <= 0.0036)
    small = logrank(ta[:8], ea[:8], tb, eb)
    assert not small.enumerated and small.splits == 20_000
    assert small.p_value == pytest.approx(small.p_normal, abs=0.05)


def test_no_event_no_test():
    lr = logrank([3, 4], [False, False], [4, 5], [False, False])
    assert lr.variance == 0 and math.isnan(lr.p_value) and not lr.estimate().has_interval


def test_every_run_collapsing_at_once_is_no_difference():
    # d = n at the one event time: V = 0, O = E = 3; the engine reads it as a zero difference, p 1.
    lr = logrank([25, 25, 25], [True] * 3, [25, 25, 25], [True] * 3)
    assert (lr.observed, lr.expected, lr.variance, lr.p_value) == (3, 3, 0, 1.0)
    est = lr.estimate()
    assert est.has_interval and est.delta == 0 and est.p_value == 1.0


def test_bad_input_is_a_value_error():
    with pytest.raises(ValueError, match="one length"):
        kaplan_meier([1, 2], [True])


# --------------------------------------------------------------------------- on run directories


def _evals(scores: dict[int, float]) -> list[dict]:
    return [{"step": s, "task": "math", "n": 8, "samples": 4, "scores": {"avg@4": v}} for s, v in scores.items()]


def make_stress(root, falls: dict[str, list[int | None]], steps: int = 100):
    """root/exp/<arm>/seed<k>: held-out 0.2 at step 0, evaluations every 25 steps; a run falls to
    0.02 (below half of 0.2) at its step in `falls` and stays there, None: never."""
    for arm, at in falls.items():
        for k, fall in enumerate(at):
            scores = {s: (0.02 if fall is not None and s >= fall else 0.2) for s in range(0, steps + 1, 25)}
            recs = [
                {"step": t, "reward/mean": 0.1, "reward/std": 0.3, "time/elapsed_s": float(t)}
                for t in range(1, steps + 1)
            ]
            d = write_run(root, arm, k, recs, evals=_evals(scores))
            spec = yaml.safe_load((d / "spec.yaml").read_text())
            spec["arms"][0]["mini_batches"] = 2  # off-policy updates: GRPO and GSPO take different gradients
            (d / "spec.yaml").write_text(yaml.safe_dump(spec))
    return root / "exp"


FALLS = {"grpo": [25, 25, 25, 50, 25, 25], "gspo": [None, 75, None, None, 100, None]}


def test_collapse_times_and_censoring(tmp_path):
    exp = make_stress(tmp_path, FALLS)
    groups = group_runs(load_runs([str(exp)]), "arm")
    gspo = next(g for g in groups if g.name == "gspo")
    assert collapse_time(gspo.runs[0], "math") == (100.0, False)  # seen intact at its last evaluation
    assert collapse_time(gspo.runs[1], "math") == (75.0, True)
    t, e, seeds = arm_times(gspo, "math")
    assert t.tolist() == [100, 75, 100, 100, 100, 100] and e.tolist() == [0, 1, 0, 0, 1, 0]
    lines = "\n".join(survival_lines(groups, "math", "math avg@4"))
    assert "| grpo | 6/6 | 25 |" in lines and "| gspo | 2/6 | none |" in lines
    # Clopper-Pearson: 6 of 6, lower bound 0.025^(1/6) = 0.54; 2 of 6, 0.043 to 0.78
    assert "grpo: 6 of 6 seeds collapsed (rate 54%-100%, 95% exact interval)" in lines
    assert "gspo: 2 of 6 seeds collapsed (rate 4%-78%, 95% exact interval)" in lines


def test_compare_baseline_has_the_logrank_row_in_its_holm_family(tmp_path):
    exp = make_stress(tmp_path, FALLS)
    comp = compare_runs([str(exp)])
    table = build_differences(comp.groups, comp.columns, baseline="grpo", margin=0.5)
    row = next(d for d in table.rows if d.metric == "collapse:math")
    ref = logrank([100, 75, 100, 100, 100, 100], [0, 1, 0, 0, 1, 0], [25] * 3 + [50] + [25] * 2, [1] * 6)
    assert row.delta == pytest.approx(ref.observed - ref.expected, rel=1e-12)
    assert row.delta < 0 and row.verdict == "better"  # a huge margin gives no equivalence verdict here
    m = sum(math.isfinite(d.estimate.p_value) for d in table.rows)
    assert m == 3  # held-out final score, train reward, log-rank
    assert row.p_adjusted == pytest.approx(min(1.0, ref.p_value * m), rel=1e-9)  # smallest p: Holm x m
    assert "collapses O − E (log-rank), math" in table.labels.values()


def test_no_collapse_no_logrank_row(tmp_path):
    exp = make_stress(tmp_path, {"grpo": [None, None], "gspo": [None, None]})
    comp = compare_runs([str(exp)])
    table = build_differences(comp.groups, comp.columns, baseline="grpo")
    assert not any(d.metric.startswith("collapse:") for d in table.rows)


def test_cli_compare_report_and_plot(tmp_path):
    exp = make_stress(tmp_path, FALLS)
    runner = CliRunner()
    res = runner.invoke(app, ["compare", str(exp), "--baseline", "grpo", "-f", "json"])
    assert res.exit_code == 0, res.output
    diffs = json.loads(res.output)["differences"]
    assert [d["verdict"] for d in diffs if d["metric"] == "collapse:math"] == ["better"]
    res = runner.invoke(app, ["report", str(exp)])
    assert res.exit_code == 0, res.output
    text = (exp / "REPORT.md").read_text()
    assert "## Time to collapse" in text and "| grpo | 6/6 | 25 |" in text
    # gspo − grpo in the findings' Holm family: significant (6 early collapses against 2 late ones)
    assert "- Log-rank, `gspo` against `grpo`: collapses O − E -" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("- Log-rank"))
    assert "(significant; log-rank, 6 vs 6 runs" in line
    res = runner.invoke(app, ["plot", str(exp), "-m", "survival", "-o", str(tmp_path / "p")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "p" / "survival_math.png").exists()


def test_the_stress_study_collapse_steps_as_times(tmp_path):
    """results/paper_moe_stress/REPORT.md's collapse steps (its run directories are not committed),
    written as runs: the figures docs/guides/statistics.md quotes."""
    exp = make_stress(tmp_path, {"grpo": [25, 25, 25], "grpo_rr": [50, 50, 25], "gspo": [25, 25, 25]})
    groups = {g.name: g for g in group_runs(load_runs([str(exp)]), "arm")}
    medians = {name: kaplan_meier(*arm_times(g, "math")[:2]).median for name, g in groups.items()}
    assert medians == {"grpo": 25, "grpo_rr": 50, "gspo": 25}
    comp = compare_runs([str(exp)])
    rows = [
        d for d in build_differences(comp.groups, comp.columns, baseline="grpo").rows if d.metric == "collapse:math"
    ]
    rr, same = rows
    assert rr.delta == -1.0 and rr.ci95 == pytest.approx((-2.2396, 0.2396), abs=1e-4)
    # exact over the 20 labellings: 8 are as extreme as grpo_rr's (the normal said 0.1138)
    assert rr.estimate.p_value == pytest.approx(0.4, abs=1e-12) and rr.verdict == "not resolved"
    assert (same.arm, same.delta, same.estimate.p_value) == ("gspo", 0.0, 1.0)  # all at step 25 in both


def _with_comparison(exp, comparison: dict) -> None:
    for spec_file in exp.glob("*/seed*/spec.yaml"):
        spec = yaml.safe_load(spec_file.read_text())
        spec_file.write_text(yaml.safe_dump({**spec, "comparison": comparison}))


def test_time_to_collapse_as_the_pre_registered_primary(tmp_path):
    exp = make_stress(tmp_path, FALLS)
    _with_comparison(exp, {"baseline": "grpo", "arm": "gspo", "metric": "collapse"})
    comp = compare_runs([str(exp)])
    key = primary_key({"baseline": "grpo", "arm": "gspo", "metric": "collapse"}, "grpo", comp.columns)
    assert key == ("gspo", "grpo", "collapse:math")
    assert primary_key({"baseline": "grpo", "arm": "gspo", "metric": "collapse:code"}, "grpo", comp.columns) is None
    table = build_differences(comp.groups, comp.columns, baseline="grpo", primary=key)
    row = next(d for d in table.rows if d.metric == "collapse:math")
    ref = logrank([100, 75, 100, 100, 100, 100], [0, 1, 0, 0, 1, 0], [25] * 3 + [50] + [25] * 2, [1] * 6)
    # alone at the full alpha: the exact log-rank p itself (6 runs per arm), not Holm-multiplied
    assert (row.family, row.family_size) == ("primary", 1)
    assert row.p_adjusted == pytest.approx(ref.p_value, rel=1e-12) and row.verdict == "better"
    secondary = [d for d in table.rows if d.family == "secondary"]
    assert secondary and all(d.family_size == len(secondary) for d in secondary)
    # report: its pre-registered section shows the same row
    res = CliRunner().invoke(app, ["report", str(exp)])
    assert res.exit_code == 0, res.output
    section = (exp / "REPORT.md").read_text().split("## The pre-registered comparison")[1].split("## Findings")[0]
    assert "collapses O − E (log-rank), math" in section and "| primary (1) |" in section


def test_a_collapse_primary_without_a_collapse_says_there_is_nothing_to_test(tmp_path):
    exp = make_stress(tmp_path, {"grpo": [None, None], "gspo": [None, None]})
    comp = compare_runs([str(exp)])
    table = build_differences(comp.groups, comp.columns, baseline="grpo", primary=("gspo", "grpo", "collapse:math"))
    assert not any(d.family == "primary" for d in table.rows)
    assert table.notes[0].startswith("Primary (time to collapse on math, gspo against grpo): no run of either arm")


def test_until_decided_refuses_a_collapse_primary(tmp_path):
    from gspo_cli.cli.decide import _check_comparison
    from gspo_cli.errors import SpecError
    from gspo_cli.spec.loading import spec_from_dict

    raw = yaml.safe_load((Path(__file__).parents[1] / "experiments" / "quickstart.yaml").read_text())
    raw["comparison"] = {"baseline": "grpo", "arm": "gspo", "metric": "collapse"}
    with pytest.raises(SpecError, match="is a time to collapse"):
        _check_comparison(spec_from_dict(raw))


def test_compare_says_when_the_spec_metric_is_not_shown(tmp_path):
    exp = make_stress(tmp_path, FALLS)
    _with_comparison(exp, {"baseline": "grpo", "arm": "gspo", "metric": "reward/nosuch"})
    res = CliRunner().invoke(app, ["compare", str(exp), "-f", "markdown"])
    assert res.exit_code == 0, res.output
    assert "comparison.metric 'reward/nosuch' is not a column shown here" in " ".join(res.output.split())
