"""Verdicts over a family of differences: Holm's correction, equivalence, and what would resolve
what is not resolved.

- better / worse: the Holm-adjusted p-value of the t test is below alpha (so the 95% interval
  excludes 0); the metric's direction turns higher/lower into better/worse. A metric without a
  direction (clip fraction, length) says `higher` / `lower`.
- equivalent: not better or worse, and the 90% interval lies inside (-margin, +margin): two one-
  sided tests at 5% each (Schuirmann 1987). No margin, no equivalence verdict.
- not resolved: anything else; the row then carries the seeds a paired design would need.
Holm's step-down (Holm 1979): sort the m p-values, p_(i) adjusted = max_{j <= i} min(1, (m - j + 1) p_(j)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gspo_cli.analysis.stats.intervals import Estimate
from gspo_cli.analysis.stats.planning import seeds_for_equivalence, seeds_needed

ALPHA = 0.05
VERDICTS = ("better", "worse", "equivalent", "not resolved")
PLAN_NOTE = "seeds needed: a plan from this small pilot (observed difference and SD, 80% power), not a promise"


def holm(p_values: list[float]) -> list[float]:
    """Holm-adjusted p-values, in the input order; NaN stays NaN and does not count in m."""
    p = np.asarray(p_values, dtype=float)
    out = np.full(len(p), math.nan)
    idx = np.nonzero(np.isfinite(p))[0]
    m = len(idx)
    if m == 0:
        return out.tolist()
    order = idx[np.argsort(p[idx], kind="stable")]
    adjusted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out[order] = adjusted
    return out.tolist()


@dataclass(frozen=True)
class Difference:
    """One row of a differences table: arm - baseline on one metric, with its verdict."""

    arm: str
    baseline: str
    metric: str
    direction: int  # +1 higher is better, -1 lower is better, 0 no direction
    estimate: Estimate
    p_adjusted: float
    verdict: str
    margin: float | None = None
    seeds_needed: int | None = None
    seeds_equivalence: int | None = None
    prob_improvement: float = math.nan
    iqm_arm: float = math.nan
    iqm_base: float = math.nan

    @property
    def delta(self) -> float:
        return self.estimate.delta

    @property
    def ci95(self) -> tuple[float, float]:
        return self.estimate.ci(0.95)

    @property
    def method(self) -> str:
        return self.estimate.method

    def resolution(self) -> str:
        """What would resolve a `not resolved` row (empty otherwise)."""
        if self.verdict != "not resolved":
            return ""
        est, parts = self.estimate, []
        if not est.has_interval:
            return "it needs a value from at least 2 seeds per arm (paired: the same seeds in both)"
        if not math.isfinite(est.sd_pairs) and est.components is None:  # a log-rank row: no per-seed spread
            return "more runs per arm, or longer runs that see more collapses, would narrow it"
        if self.seeds_needed is not None:
            parts.append(f"about {self.seeds_needed} paired seeds per arm would find a difference of {est.delta:+.3g}")
        elif math.isfinite(est.delta) and est.delta != 0:
            comp = est.components
            if comp is not None and comp.problem > 0:
                parts.append(
                    f"more seeds alone cannot resolve {est.delta:+.3g} on this held-out set (its problems' share "
                    "of the variance does not shrink with seeds): add problems"
                )
            else:
                parts.append(f"a difference of {est.delta:+.3g} needs more than 1000 seeds")
        if self.seeds_equivalence is not None:
            parts.append(f"about {self.seeds_equivalence} would show equivalence within ±{self.margin:g}")
        if est.components is not None:
            parts.append(est.components.advice())
        return "; ".join(parts)

    def to_dict(self) -> dict:
        lo, hi = self.ci95
        num = lambda x: x if x is not None and math.isfinite(x) else None  # noqa: E731
        comp = self.estimate.components
        return {
            "arm": self.arm,
            "baseline": self.baseline,
            "metric": self.metric,
            "direction": {1: "higher is better", -1: "lower is better", 0: "none"}[self.direction],
            "delta": num(self.delta),
            "ci_low": num(lo),
            "ci_high": num(hi),
            "method": self.method,
            "verdict": self.verdict,
            "p_adjusted": num(self.p_adjusted),
            "seeds_needed": self.seeds_needed,
            "seeds_equivalence": self.seeds_equivalence,
            "margin": self.margin,
            "n_paired": self.estimate.n_paired,
            "prob_improvement": num(self.prob_improvement),
            "iqm_arm": num(self.iqm_arm),
            "iqm_baseline": num(self.iqm_base),
            "variance_shares": comp.shares() if comp is not None else None,
            "variance_share_intervals": comp.share_intervals() if comp is not None else None,
            "resolve": self.resolution() or None,
        }


def verdict(est: Estimate, p_adjusted: float, direction: int, margin: float | None, alpha: float = ALPHA) -> str:
    """better / worse (higher / lower without a direction), equivalent, or not resolved."""
    if not est.has_interval:
        return "not resolved"
    if math.isfinite(p_adjusted) and p_adjusted < alpha and est.delta != 0:
        up = est.delta > 0
        if direction == 0:
            return "higher" if up else "lower"
        return "better" if up == (direction > 0) else "worse"
    if margin is not None and est.tost_p(margin) < alpha:
        return "equivalent"
    return "not resolved"


def _var_at(est: Estimate):
    comp = est.components
    return (lambda n: comp.variance(seeds=n)) if comp is not None else None


def decide(
    items: list[tuple[str, str, str, int, Estimate]],
    *,
    margin: float | None = None,
    alpha: float = ALPHA,
    plan: bool = True,
) -> list[Difference]:
    """Verdicts for one family of (arm, baseline, metric, direction, estimate), Holm over all of
    them; with `plan`, the seeds needed for the rows not resolved (and, with a margin, for
    equivalence); the verdicts do not depend on it."""
    adjusted = holm([est.p_value for *_, est in items])
    out = []
    for (arm, base, metric, direction, est), p_adj in zip(items, adjusted):
        word = verdict(est, p_adj, direction, margin, alpha)
        need = eq = None
        if plan and word == "not resolved" and est.has_interval:
            need = seeds_needed(est.delta, est.sd_pairs, alpha=alpha, var_at=_var_at(est))
        if plan and margin is not None and word not in ("better", "worse", "higher", "lower") and est.has_interval:
            eq = seeds_for_equivalence(est.delta, est.sd_pairs, margin, alpha=alpha, var_at=_var_at(est))
        out.append(Difference(arm, base, metric, direction, est, p_adj, word, margin, need, eq))
    return out


__all__ = ["ALPHA", "Difference", "PLAN_NOTE", "VERDICTS", "decide", "holm", "verdict"]
