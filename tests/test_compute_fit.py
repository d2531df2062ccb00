"""Curves matched on compute: the compute axes, scores at an equal compute budget, and the
saturating fit (recovers known parameters within its interval; no fit for a straight line)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from synthetic_runs import BATCH, write_run
from typer.testing import CliRunner

from gspo_cli.analysis.report.compute import compute_lines, fit_text
from gspo_cli.analysis.rundata.compute import common_budget, compute_series, score_at
from gspo_cli.analysis.rundata.runs import group_runs, load_runs
from gspo_cli.analysis.stats.saturation import EXTRAPOLATION, IDENTIFY_RULE, arm_fit, fit_saturation, saturating
from gspo_cli.cli.app import app

TRUE = {"r0": 0.1, "a": 0.6, "b": 1.5, "c_mid": 1500.0}


def make_compute_experiment(root, *, arms: dict[str, float], seeds=5, steps=40, every=2, curve=None, noise=0.01):
    """root/exp/<arm>/seed<k>: response length `arms[arm]` + k tokens at every step, so tokens after
    step t = 8 (length) t; held-out score at every `every` steps = curve(tokens) + N(0, noise)
    (step 0: R0 + N(0, noise / 2)). Default curve: the saturating one with TRUE's parameters."""
    curve = curve or (lambda c: saturating(c, *TRUE.values()))
    rng = np.random.default_rng(0)
    for arm, length in arms.items():
        for k in range(seeds):
            L = length + k
            recs = [
                {"step": t, "reward/mean": 0.1, "response/length_mean": L, "time/elapsed_s": 3.0 * t}
                for t in range(1, steps + 1)
            ]
            evals = [
                {
                    "step": s,
                    "task": "math",
                    "n": 64,
                    "samples": 4,
                    "scores": {"avg@4": float(curve(BATCH * L * s)) + rng.normal(0, noise / (2 if s == 0 else 1))},
                }
                for s in range(0, steps + 1, every)
            ]
            write_run(root, arm, k, recs, evals=evals)
    return root / "exp"


def test_compute_axes(tmp_path):
    recs = [
        {"step": 1, "response/length_mean": 10.0, "time/elapsed_s": 2.0},
        {"step": 2, "response/length_mean": 20.0, "rollout/sampled_groups": 10, "time/elapsed_s": 5.0},
    ]
    write_run(tmp_path, "gspo", 0, recs)
    (run,) = load_runs([str(tmp_path / "exp")])
    assert compute_series(run, "step").tolist() == [1, 2]
    # step 1: 4 prompts x 2 = 8 responses; step 2: 10 groups (dynamic sampling's rounds) x 2 = 20.
    assert compute_series(run, "samples").tolist() == [8, 28]
    assert compute_series(run, "tokens").tolist() == [80, 80 + 400]
    assert compute_series(run, "wall").tolist() == [2, 5] == compute_series(run, "time").tolist()


def test_equal_budget_interpolates_and_never_extrapolates(tmp_path):
    # short: length 10 -> 80 tokens a step, last evaluation at step 40: 3200 tokens;
    # long: length 30 -> 240 a step. The budget is the short arm's seed 0's 3200 tokens.
    exp = make_compute_experiment(tmp_path, arms={"short": 10, "long": 30}, seeds=1, noise=0.0)
    runs = load_runs([str(exp)])
    assert common_budget(runs, "math", "tokens") == 3200
    long = next(r for r in runs if r.arm == "long")
    # 3200 tokens of the long arm: between its evaluations at step 12 (2880) and 14 (3360), 320/480 of the way.
    want = (
        saturating(2880, *TRUE.values()) + (saturating(3360, *TRUE.values()) - saturating(2880, *TRUE.values())) * 2 / 3
    )
    assert score_at(long, "math", "tokens", 3200) == pytest.approx(want, rel=1e-12)
    assert math.isnan(score_at(long, "math", "tokens", 1e9))


def test_compare_budget_column_and_difference(tmp_path):
    exp = make_compute_experiment(tmp_path, arms={"short": 10, "long": 30}, seeds=3)
    res = CliRunner().invoke(app, ["compare", str(exp), "--budget", "tokens", "--baseline", "short", "-f", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    col = next(c for c in doc["columns"] if c["id"] == "eval_budget:math")
    assert "at 3.2e+03 tokens" in col["label"]
    assert any("largest every run reached" in n for n in doc["notes"])
    (row,) = [d for d in doc["differences"] if d["metric"] == "eval_budget:math"]
    # At equal steps the long arm is far ahead (3x the tokens); at equal tokens the two share one curve.
    (final,) = [d for d in doc["differences"] if d["metric"] == "eval_final:math"]
    assert final["delta"] > 0.05 and abs(row["delta"]) < 0.03
    # without --budget, a note: tokens at step 40 = 8 x mean length x 40, lengths 30-32 against 10-12
    res = CliRunner().invoke(app, ["compare", str(exp), "-f", "json"])
    notes = json.loads(res.output)["notes"]
    assert "Unequal compute: long sampled 2.8x the tokens of short (9.92e+03 vs 3.52e+03)" in " ".join(notes)
    res = CliRunner().invoke(app, ["compare", str(exp), "--budget", "flops"])
    assert res.exit_code == 2 and "--budget: unknown axis 'flops'" in res.output


def test_fit_recovers_known_parameters_within_its_interval(tmp_path):
    exp = make_compute_experiment(tmp_path, arms={"gspo": 10}, seeds=6)
    (group,) = group_runs(load_runs([str(exp)]), "arm")
    fit = arm_fit(group, "math", "tokens", bootstrap=100)
    assert fit.identified, fit.reason
    for k in ("a", "b", "c_mid"):
        lo, hi = fit.ci[k]
        assert lo <= TRUE[k] <= hi, (k, lo, TRUE[k], hi)
        assert hi - lo < 0.3 * TRUE[k]  # and the interval is informative
    assert fit.r0 == pytest.approx(TRUE["r0"], abs=0.01)
    text = fit_text(fit, "tokens")
    assert (
        text.startswith(f"A = {fit.a:.3f} [") and f"({EXTRAPOLATION}; the curve reaches {fit.reached:.3f} at " in text
    )


def test_no_fit_for_a_straight_line(tmp_path):
    exp = make_compute_experiment(tmp_path, arms={"gspo": 10}, seeds=4, curve=lambda c: 0.1 + 0.4 * c / 6000)
    groups = group_runs(load_runs([str(exp)]), "arm")
    fit = arm_fit(groups[0], "math", "tokens", bootstrap=20)
    assert not fit.identified and fit.reason
    text = "\n".join(compute_lines(groups, "math", "math avg@4"))
    assert "not identified" in text and "A = " not in text


def test_too_few_points_and_no_step0():
    x, y = np.array([0.0, 1, 2, 3]), np.array([0.1, 0.3, 0.4, 0.45])
    fit = fit_saturation([(x, y)])
    assert not fit.identified and fit.reason.startswith("too few points: 3")
    fit = fit_saturation([(x[1:], y[1:])])
    assert not fit.identified and "step-0" in fit.reason


def test_plot_compute_axes_and_fit_figure(tmp_path):
    exp = make_compute_experiment(tmp_path, arms={"short": 10, "long": 30}, seeds=2, steps=20)
    runner = CliRunner()
    for x in ("tokens", "wall"):  # samples: test_compute_axes
        res = runner.invoke(app, ["plot", str(exp), "--x", x, "-m", "eval,fit", "-o", str(tmp_path / x), "--no-panel"])
        assert res.exit_code == 0, res.output
        assert (tmp_path / x / "fit_math.png").exists() and (tmp_path / x / "eval_math.png").exists()
    res = runner.invoke(app, ["plot", str(exp), "--x", "flops"])
    assert res.exit_code == 2 and "--x: unknown axis 'flops'" in res.output
    res = runner.invoke(app, ["report", str(exp)])
    assert res.exit_code == 0, res.output
    text = (exp / "REPORT.md").read_text()
    assert "## Held-out score against compute" in text and "![fit_math](figures/fit_math.png)" in text
    assert "gspo plot " + str(exp) + " --x tokens -m fit --no-panel" in text


def _simulated(rng, curve, top: float, seeds: int = 5):
    """Five seeds of 21 evaluations from 0 to `top` compute units (spaced as length 10 + k runs),
    noise 0.01."""
    out = []
    for k in range(seeds):
        c = np.linspace(0.0, top * (10 + k) / 10, 21)
        out.append((c, curve(c) + rng.normal(0, 0.01, len(c))))
    return out


@pytest.mark.slow
def test_fit_calibration_by_simulation():
    """The figures docs/guides/statistics.md quotes (40 experiments each; about 3 min on 2 cores)."""
    true = lambda c: saturating(c, *TRUE.values())  # noqa: E731
    covered, identified = dict.fromkeys(("a", "b", "c_mid"), 0), 0
    for e in range(40):
        fit = fit_saturation(_simulated(np.random.default_rng(1000 + e), true, 3200.0), rng_seed=e)
        identified += fit.identified
        for k in covered:
            covered[k] += fit.identified and fit.ci[k][0] <= TRUE[k] <= fit.ci[k][1]
    print(f"identified {identified}/40, covered {covered}")
    assert identified == 40
    assert all(v >= 36 for v in covered.values()), covered  # >= 90% for a 95% interval, 40 draws
    line = lambda c: 0.1 + 0.4 * c / 6000  # noqa: E731
    early = [fit_saturation(_simulated(np.random.default_rng(3000 + e), true, 750.0), bootstrap=100) for e in range(40)]
    lines = [
        fit_saturation(_simulated(np.random.default_rng(2000 + e), line, 3200.0), bootstrap=100) for e in range(40)
    ]
    n_early, n_line = sum(f.identified for f in early), sum(f.identified for f in lines)
    print(f"identified: seen up to C_mid / 2 {n_early}/40, a line {n_line}/40")
    assert n_early == 0 and n_line == 0


def test_a_line_whose_seeds_curve_their_own_way_is_not_identified_and_a_is_an_extrapolation():
    """Per-seed slopes and curvatures around a straight line (the case where an F test on the
    pooled points called a curve): no fit. An identified fit labels A an extrapolation and gives
    the score the curve reaches at the largest compute."""
    rng = np.random.default_rng(41)
    for e in range(3):
        curves = []
        for _ in range(3):
            c = np.linspace(0.0, 3200.0, 11)
            bend = rng.normal(0, 0.05) * (c / 3200.0) ** 2
            curves.append((c, 0.1 + rng.uniform(0.3, 0.5) * c / 3200.0 + bend + rng.normal(0, 0.01, len(c))))
        assert not fit_saturation(curves, bootstrap=30, rng_seed=e).identified
    true = lambda c: saturating(c, *TRUE.values())  # noqa: E731
    fit = fit_saturation(_simulated(np.random.default_rng(5), true, 3200.0), bootstrap=30)
    assert fit.identified and fit.c_max == pytest.approx(3200.0 * 14 / 10)
    assert fit.reached == pytest.approx(float(fit.predict(fit.c_max))) and fit.reached < fit.a
    assert EXTRAPOLATION in IDENTIFY_RULE and "F test" not in IDENTIFY_RULE


def test_the_fit_figure_claims_no_overlap_from_a_shared_step_0_and_no_fit_it_does_not_draw(tmp_path):
    """Two arms with the same step-0 score (the same start) but different compute per step: they share
    one x (0) only, so they are not "on top of each other"; neither fit is identified (straight
    lines), so the legend lists no fit and no asymptote."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from gspo_cli.analysis.figures.plot import build_plot, make_figures

    line = lambda c: 0.1 + 0.4 * c / 6000  # noqa: E731
    exp = make_compute_experiment(tmp_path, arms={"short": 10, "long": 30}, seeds=2, steps=20, curve=line, noise=0.0)
    plot = build_plot(group_runs(load_runs([str(exp)]), "arm"), ["fit"], x="tokens")
    fig = make_figures(plot)["fit_math"]
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    notes = " ".join(t.get_text() for t in ax.texts)
    assert "on top of each other" not in notes
    assert "long: no fit" in notes and "short: no fit" in notes
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["long (n=2)", "short (n=2)"]
