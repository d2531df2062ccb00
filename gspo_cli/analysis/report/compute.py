"""The report's "## Compute" section: held-out score against compute, per arm: the score at an
equal compute budget (`rundata.compute`'s rule) and the ScaleRL-style saturating fit
(`stats.saturation.arm_fit`, which `plot`'s `fit` figure draws too) with seed-bootstrap intervals.
Reads files only; no torch."""

from __future__ import annotations

import math

from gspo_cli.analysis.rundata.compute import AXES, EQUAL_COMPUTE_RULE, UNITS, common_budget, eval_points, score_at
from gspo_cli.analysis.rundata.runs import Group
from gspo_cli.analysis.stats.saturation import EXTRAPOLATION, IDENTIFY_RULE, Fit, arm_fit
from gspo_cli.analysis.stats.seeds import seed_stats
from gspo_cli.errors import SpecError

REPORT_AXIS = "tokens"


def _ci(fit: Fit, key: str, fmt: str) -> str:
    lo, hi = fit.ci.get(key, (math.nan, math.nan))
    return f" [{lo:{fmt}}, {hi:{fmt}}]" if math.isfinite(lo) else ""


def fit_text(fit: Fit, unit: str) -> str:
    """One line: A, B and C_mid with their intervals, or why there is no fit."""
    if not fit.identified:
        return f"not identified: {fit.reason}"
    return (
        f"A = {fit.a:.3f}{_ci(fit, 'a', '.3f')} ({EXTRAPOLATION}; the curve reaches {fit.reached:.3f} at "
        f"{fit.c_max:.3g} {unit}), B = {fit.b:.2f}{_ci(fit, 'b', '.2f')}, "
        f"C_mid = {fit.c_mid:.3g}{_ci(fit, 'c_mid', '.3g')} {unit} (R0 = {fit.r0:.3f})"
    )


def compute_lines(groups: list[Group], task: str | None, label: str, axis: str = REPORT_AXIS) -> list[str]:
    """A "## Held-out score against compute" section: per arm, the compute it spent, its score at
    the equal-compute budget (seed mean ± 95% t half-width) and its saturating fit; the rules.
    Empty without an evaluation set."""
    runs = [r for g in groups for r in g.runs]
    try:
        budget = common_budget(runs, task, axis) if task is not None else math.nan
    except SpecError as err:  # a spec.yaml without the rollout shape: no compute to count
        return ["## Held-out score against compute", "", f"Not computed: {err}", ""]
    if not math.isfinite(budget):
        return []
    unit = UNITS[axis]
    rows = []
    for g in groups:
        spent = seed_stats([float(x[-1]) if len(x := eval_points(r, task, axis)[0]) else math.nan for r in g.runs])
        at = seed_stats([score_at(r, task, axis, budget) for r in g.runs])
        ci = f" ± {at.ci95:.3f}" if math.isfinite(at.ci95) else ""
        rows.append(
            f"| {g.name} | {spent.mean:.3g} | {at.mean:.3f}{ci} ({at.n}) | {fit_text(arm_fit(g, task, axis), unit)} |"
        )
    return [
        "## Held-out score against compute",
        "",
        f"Compute: {AXES[axis]} (gspo_cli/analysis/rundata/compute.py says which logged metrics count). "
        + EQUAL_COMPUTE_RULE.format(axis=axis, budget=budget, unit=unit),
        "",
        f"| arm | {axis} at the last evaluation (seed mean) | {label} at {budget:.3g} {unit} (seeds) | "
        "saturating fit R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B), 95% seed-bootstrap intervals |",
        "|---|---|---|---|",
        *rows,
        "",
        "`gspo compare --baseline ARM --budget tokens` tests the differences at equal compute. "
        "A: the asymptote, an extrapolation beyond the compute reached (a curve that bends again later has "
        "another); B: the efficiency exponent; C_mid: the compute at half the gain (ScaleRL, "
        "arXiv 2510.13786).",
        "",
        IDENTIFY_RULE,
    ]


__all__ = ["REPORT_AXIS", "compute_lines", "fit_text"]
