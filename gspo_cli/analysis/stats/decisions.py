"""Verdicts over a family of differences: the families, the correction, equivalence, the checks
per-seed differences need, and what would resolve what is not resolved.

Families. The comparison's primary (one arm against the baseline on one metric, fixed in the spec
before the runs) is a family of its own, tested at the full alpha for a difference and, with a
margin, for equivalence. The other held-out sets and scores and the train reward are the secondary
family, with its own family-wise error rate at alpha (Holm within it; the families are separate, as
in the graphical approach of Bretz et al. 2009 with no alpha passed between them). Diagnostics
(clip fractions, KL, entropy, lengths, grad norm, step time, expert change) are `descriptive`:
shown with their intervals, never tested, in no family. Every row carries its family and its size.

Within a family each row has two hypotheses, "no difference" and (with a margin) "|difference| >=
margin"; at most one of them is true, so the step-down is Shaffer's (1986) refinement of Holm's:
sort all p-values, the j-th is multiplied by t_j, the number of rows that still have a hypothesis
not yet rejected (at most one true each), adjusted p_(i) = max_{j <= i} min(1, t_j p_(j)). Without
a margin that is exactly Holm (1979). So the TOST p-values are adjusted in the same family as the
difference tests (eight arms at the margin: a false `equivalent` somewhere in at most 5%).

- better / worse: the adjusted p of the t test is below alpha; the metric's direction turns
  higher/lower into better/worse. A metric without a direction says `higher` / `lower`.
- equivalent: not better or worse, and the adjusted TOST p (two one-sided tests, Schuirmann 1987)
  below alpha. No margin, no equivalence verdict.
- no spread: a zero-width interval (every seed gave the same difference) has no test and no verdict.
- per-seed differences with an outlying seed or two modes (`stats.exact`) keep a verdict only if the
  exact sign-flip test agrees too (its p times the family's size below alpha; for equivalence the
  two one-sided sign-flip tests against ±margin); it cannot go below 2 / 2^n.
- a verdict that one collapsed seed would reverse carries that warning.
- not resolved: anything else; the row then carries the seeds a paired design would need.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gspo_cli.analysis.stats.exact import one_collapse_reverses, shape_flags, sign_flip_p, smallest_sign_flip_p
from gspo_cli.analysis.stats.intervals import Estimate
from gspo_cli.analysis.stats.planning import seeds_for_effect, seeds_for_equivalence, seeds_needed

ALPHA = 0.05
DESCRIPTIVE = "descriptive"
VERDICTS = ("better", "worse", "equivalent", "not resolved", DESCRIPTIVE)
TESTED = ("better", "worse", "higher", "lower")
PLAN_NOTE = (
    "seeds needed: planned for the smallest effect of interest (the comparison's effect, else its margin) "
    "with the SD at its 80% upper confidence bound (chi-square) and 80% power, at the level Holm tests the row "
    "at first (alpha / family size); without an effect, at the observed difference (post-hoc: a pilot's own "
    "difference misleads); a plan, not a promise"
)


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


def shaffer(p_diff: list[float], p_tost: list[float]) -> tuple[list[float], list[float]]:
    """Adjusted p-values of each row's difference test and equivalence test (module docstring):
    step-down over all of them, the j-th multiplied by the number of rows with a hypothesis not yet
    rejected. NaN stays NaN and does not count; without equivalence p-values this is `holm`."""
    hyps = [(p, i, 0) for i, p in enumerate(p_diff) if math.isfinite(p)]
    hyps += [(p, i, 1) for i, p in enumerate(p_tost) if math.isfinite(p)]
    hyps.sort(key=lambda h: h[0])
    left = {}  # row -> hypotheses not yet rejected
    for _, i, _k in hyps:
        left[i] = left.get(i, 0) + 1
    out = [[math.nan] * len(p_diff), [math.nan] * len(p_tost)]
    running = 0.0
    for p, i, k in hyps:
        running = max(running, min(1.0, len(left) * p))
        out[k][i] = running
        left[i] -= 1
        if left[i] == 0:
            del left[i]
    return out[0], out[1]


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
    family: str = ""
    family_size: int = 0
    p_tost_adjusted: float = math.nan
    effect: float | None = None  # the smallest effect of interest the plan is for (None: the observed)
    seeds_observed: int | None = None  # the plan at the observed difference, when an effect is set
    sign_flip_p: float = math.nan  # the exact test, when the per-seed differences needed it
    warnings: tuple[str, ...] = ()
    why: str = ""  # why a row has no verdict although its test could have given one

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
        if self.why:
            parts.append(self.why)
        if est.no_spread:
            return "; ".join(parts)
        if not est.has_interval:
            if est.method.startswith("not compared: "):  # the runs are not comparable: more seeds will not do
                return est.method
            return "it needs a value from at least 2 seeds per arm (paired: the same seeds in both)"
        if not math.isfinite(est.sd_pairs) and est.components is None:  # a log-rank row: no per-seed spread
            return "more runs per arm, or longer runs that see more collapses, would narrow it"
        if self.seeds_needed is not None and self.effect is not None:
            parts.append(
                f"about {self.seeds_needed} paired seeds per arm would find a difference of {self.effect:+.3g} (the "
                "smallest effect of interest) with 80% power, the SD at its 80% upper bound"
                + (f"; at the observed {est.delta:+.3g}: {self.seeds_observed}" if self.seeds_observed else "")
            )
        elif self.seeds_needed is not None:
            parts.append(
                f"about {self.seeds_needed} paired seeds per arm would find a difference of {est.delta:+.3g} "
                "(at the observed difference and SD: no effect of interest was set)"
            )
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
            "family": self.family or None,
            "family_size": self.family_size,
            "p_tost_adjusted": num(self.p_tost_adjusted),
            "effect": self.effect,
            "seeds_observed": self.seeds_observed,
            "sign_flip_p": num(self.sign_flip_p),
            "warnings": list(self.warnings),
        }


def verdict(
    est: Estimate,
    p_adjusted: float,
    direction: int,
    margin: float | None,
    alpha: float = ALPHA,
    p_tost_adjusted: float | None = None,
) -> str:
    """better / worse (higher / lower without a direction), equivalent, or not resolved.
    `p_tost_adjusted`: the equivalence p adjusted in the family (None: the row's own TOST p, a
    family of one). A row without spread gets no verdict."""
    if not est.has_interval or est.no_spread:
        return "not resolved"
    if math.isfinite(p_adjusted) and p_adjusted < alpha and est.delta != 0:
        up = est.delta > 0
        if direction == 0:
            return "higher" if up else "lower"
        return "better" if up == (direction > 0) else "worse"
    p_eq = est.tost_p(margin) if p_tost_adjusted is None and margin is not None else p_tost_adjusted
    if margin is not None and p_eq is not None and math.isfinite(p_eq) and p_eq < alpha:
        return "equivalent"
    return "not resolved"


def _var_at(est: Estimate):
    comp = est.components
    return (lambda n: comp.variance(seeds=n)) if comp is not None else None


def _no_spread_why(est: Estimate) -> str:
    if est.n_paired >= 2:
        return (
            f"every seed gave the same difference ({est.delta:+.3g}): no estimate of its noise, so no test "
            "and no verdict; more seeds (or problem records) would measure it"
        )
    return "the values do not vary: no estimate of the noise, so no test and no verdict"


def _exact_check(d: tuple[float, ...], word: str, margin: float | None, size: int, alpha: float):
    """(sign-flip p, why the verdict does not stand or "") for a row whose per-seed differences have
    an outlier or two modes; the p is times the family's size (Bonferroni) against alpha."""
    flags = shape_flags(d)
    if not flags:
        return math.nan, ""
    n, what = len(d), " and ".join(flags)
    if word in TESTED:
        p = sign_flip_p(d)
        floor = smallest_sign_flip_p(n)
    elif word == "equivalent":
        x = np.asarray(d)
        p = max(sign_flip_p(x + margin, "greater"), sign_flip_p(x - margin, "less"))
        floor = smallest_sign_flip_p(n) / 2
    else:
        return math.nan, ""
    if min(1.0, size * p) < alpha:
        return p, ""
    return p, (
        f"the per-seed differences show {what}, and the exact sign-flip test does not confirm the verdict "
        f"(p {p:.3g}{f' x {size} rows' if size > 1 else ''}; the smallest p {n} seeds can give is {floor:.3g})"
    )


def decide(
    items: list[tuple[str, str, str, int, Estimate]],
    *,
    margin: float | None | list[float | None] = None,
    alpha: float = ALPHA,
    plan: bool = True,
    effect: float | None | list[float | None] = None,
    family: str = "",
    collapse: list[float | None] | None = None,
) -> list[Difference]:
    """Verdicts for one family of (arm, baseline, metric, direction, estimate), Shaffer's step-down
    over their difference and equivalence tests (module docstring). `effect`: the smallest effect of
    interest the plans are for (None: plans at the observed difference); `collapse`: per item, the
    size of a collapse in the metric's units (None: not checked), for the warning that one
    collapsed seed would reverse the verdict. `margin` and `effect` may be lists, one per item (a
    log-rank row has none in the metric's units). With `plan`, the seeds needed for the rows not
    resolved (and, with a margin, for equivalence); the verdicts do not depend on it."""
    collapse = collapse or [None] * len(items)
    margins = margin if isinstance(margin, list) else [margin] * len(items)
    effects = effect if isinstance(effect, list) else [effect] * len(items)
    # A row without spread keeps its place in the family (p 1: it cannot be rejected), so the
    # family's size is fixed by the rows, not by the data.
    p_diff = [1.0 if est.no_spread else est.p_value for *_, est in items]
    p_tost = [
        (1.0 if est.no_spread else est.tost_p(m)) if m is not None and est.has_interval else math.nan
        for (*_, est), m in zip(items, margins)
    ]
    adj_diff, adj_tost = shaffer(p_diff, p_tost)
    size = sum(math.isfinite(p) for p in p_diff)
    level = alpha / max(size, 1)  # Holm's first step: the level a plan must reach
    out = []
    for (arm, base, metric, direction, est), p_adj, p_eq, c, margin, effect in zip(
        items, adj_diff, adj_tost, collapse, margins, effects
    ):
        word = verdict(est, p_adj, direction, margin, alpha, p_eq)
        why, sf, warnings = "", math.nan, []
        if est.no_spread:
            why, p_adj, p_eq = _no_spread_why(est), math.nan, math.nan
        elif len(est.diffs) >= 3:
            sf, why = _exact_check(est.diffs, word, margin, size, alpha)
            if why:
                word = "not resolved"
        if word in TESTED and c is not None and est.diffs and one_collapse_reverses(est.diffs, c, level):
            warnings.append(f"one collapsed seed (a difference of {c:.3g} the other way) would reverse this verdict")
        need = eq = observed = None
        if plan and word == "not resolved" and est.has_interval and not est.no_spread:
            observed = seeds_needed(est.delta, est.sd_pairs, alpha=level, var_at=_var_at(est))
            need = observed
            if effect is not None:
                need = seeds_for_effect(effect, est.sd_pairs, est.df, alpha=level, var_at=_var_at(est))
        if plan and margin is not None and word not in TESTED and est.has_interval and not est.no_spread:
            eq = seeds_for_equivalence(est.delta, est.sd_pairs, margin, alpha=level, var_at=_var_at(est))
        out.append(
            Difference(
                arm, base, metric, direction, est, p_adj, word, margin, need, eq,
                family=family, family_size=size, p_tost_adjusted=p_eq, effect=effect,
                seeds_observed=observed if effect is not None else None, sign_flip_p=sf,
                warnings=tuple(warnings), why=why,
            )
        )  # fmt: skip
    return out


def describe(items: list[tuple[str, str, str, int, Estimate]]) -> list[Difference]:
    """Diagnostic rows: the difference and its interval, no test, no verdict, in no family."""
    return [
        Difference(arm, base, metric, direction, est, math.nan, DESCRIPTIVE, family="diagnostics")
        for arm, base, metric, direction, est in items
    ]


__all__ = [
    "ALPHA",
    "DESCRIPTIVE",
    "Difference",
    "PLAN_NOTE",
    "TESTED",
    "VERDICTS",
    "decide",
    "describe",
    "holm",
    "shaffer",
    "verdict",
]
