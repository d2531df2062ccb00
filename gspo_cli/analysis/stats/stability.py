"""Stability: when each run's held-out score falls apart, by one rule fixed in advance
(COLLAPSE_RULE), and collapse read as a time: each run's step of collapse or the step it was last
seen intact (censored), a Kaplan-Meier curve per arm and the log-rank test between arms, for
`report`, `compare --baseline` and `plot` (the `survival` figure).

A stress study (experiments/paper_moe_stress.yaml: routers learning 60x faster than the rest) is
meant to collapse; this says when, per seed and per arm, so arms can be compared by how long they
last rather than by a final score near zero. Reads eval.jsonl through `Run.eval_scores`; no
torch, no matplotlib, no output formatting (the report's sections: `analysis.report.collapse`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gspo_cli.analysis.rundata.runs import Group, Run
from gspo_cli.analysis.stats.exact import collapse_interval
from gspo_cli.analysis.stats.intervals import Estimate
from gspo_cli.analysis.stats.survival import KaplanMeier, kaplan_meier, logrank

# A run collapses when its held-out score falls below this share of its own step-0 score.
COLLAPSE_FRACTION = 0.5

COLLAPSE_RULE = f"""\
Collapse rule (fixed before the runs; a stability finding for every arm): a run **collapses** at
the first evaluation after step 0 whose held-out score is below {COLLAPSE_FRACTION:g} x its own step-0
score, or at its last logged step if it ended `diverged` before that. A run without a positive
step-0 score is not rated. An arm's collapse step is the median over its seeds that collapse; the
arm **collapses** when more than half of its rated seeds do. A collapse step is an evaluation
step: the score fell somewhere after the evaluation before it.
"""


@dataclass(frozen=True)
class Collapse:
    """One run under COLLAPSE_RULE. `step`: where it collapsed (None: it did not); `start`: its
    step-0 held-out score; `low`: its lowest held-out score after step 0 (NaN: none);
    `diverged`: the collapse is the run's divergence, not a held-out drop."""

    step: int | None
    start: float
    low: float
    diverged: bool = False


def task_evals(run: Run, task: str):
    """The run's evaluations on set `task` in step order, a repeated step keeping its first record."""
    ev = run.eval_scores
    return ev[ev.task == task].drop_duplicates("step").sort_values("step")


def run_collapse(run: Run, task: str, fraction: float = COLLAPSE_FRACTION) -> Collapse | None:
    """The run's collapse under COLLAPSE_RULE on evaluation set `task` (as `Run.eval_scores`
    names it); None when the run has no step-0 score above 0 there (nothing to fall from).
    Evaluations are taken in step order; a repeated step keeps its first record."""
    ev = task_evals(run, task)
    s0 = ev.score[ev.step == 0]
    if not len(s0) or not (math.isfinite(start := float(s0.iloc[0])) and start > 0):
        return None
    later = ev[ev.step > 0]
    low = float(later.score.min()) if len(later) else math.nan
    fell = later[later.score < fraction * start]
    if len(fell):
        return Collapse(int(fell.step.iloc[0]), start, low)
    if run.status == "diverged":
        return Collapse(run.last_step, start, low, diverged=True)
    return Collapse(None, start, low)


SURVIVAL_RULE = f"""\
Time to collapse (the collapse rule above, read as a time): a run that collapses is an **event**
at its collapse step; a run that never falls below {COLLAPSE_FRACTION:g} x its step-0 score is
**censored** at its last evaluation after step 0 (it was seen intact up to there and may still
collapse later; a collapse is only seen at an evaluation). Runs without a positive step-0 score are
not rated. Per arm the Kaplan-Meier curve S(t), the share of runs still intact after step t, with
Greenwood's 95% interval (log-log); the median is the first step where S(t) <= 0.5 (none: more
than half the runs outlast the observation). Between two arms the log-rank test: O − E is the
arm's collapses minus those equal hazards would give it (> 0: it collapses earlier or more
often), its p-value adjusted by Holm with every other difference. A mean of collapse steps would
have to drop the censored runs or count them as collapsing at their last step; both bias it.
Collapse steps are evaluation steps, so arms are compared on one evaluation grid.
"""


def collapse_time(run: Run, task: str) -> tuple[float, bool] | None:
    """(step, collapsed) of the run on evaluation set `task`: its collapse step and True, or its
    last evaluation step after 0 and False (censored); None when it is not rated (no positive
    step-0 score) or has no evaluation after step 0."""
    c = run_collapse(run, task)
    if c is None:
        return None
    if c.step is not None:
        return float(c.step), True
    ev = run.eval_scores
    later = ev.step[(ev.task == task) & (ev.step > 0) & ev.score.notna()]
    return (float(later.max()), False) if len(later) else None


def arm_times(group: Group, task: str) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The group's rated runs: times, events (True: collapsed), seeds."""
    rated = [(r.seed, t) for r in group.runs if (t := collapse_time(r, task)) is not None]
    times = np.array([t for _, (t, _) in rated], dtype=float)
    events = np.array([e for _, (_, e) in rated], dtype=bool)
    return times, events, [s for s, _ in rated]


def arm_curve(group: Group, task: str) -> KaplanMeier | None:
    """The group's Kaplan-Meier curve; None without a rated run."""
    times, events, _ = arm_times(group, task)
    return kaplan_meier(times, events) if len(times) else None


def any_collapse(groups: list[Group], task: str | None) -> bool:
    """Whether some rated run of `groups` collapses on `task` (without one there is nothing to test)."""
    return task is not None and any(arm_times(g, task)[1].any() for g in groups)


def survival_estimate(arm: Group, base: Group, task: str) -> Estimate:
    """arm against base by the log-rank test, as an `Estimate` (O − E with se sqrt(V)); NaN with no
    interval when a side has no rated run or no run of either collapses."""
    ta, ea, _ = arm_times(arm, task)
    tb, eb, _ = arm_times(base, task)
    if not len(ta) or not len(tb):
        return Estimate(math.nan, math.nan, math.nan, "log-rank: a side has no rated run", 0, len(ta), len(tb))
    return logrank(ta, ea, tb, eb).estimate()


COLLAPSE_PREFIX = "collapse:"  # a differences row's metric id: the log-rank test on one evaluation set


def survival_items(couples: list[tuple[Group, Group]], tasks: list[str]) -> list[tuple]:
    """Log-rank rows (arm, base, "collapse:<task>", -1, estimate) for `compare --baseline`'s family,
    one per pair and evaluation set where some run of the pair collapses (without a collapse there
    is nothing to test, and a NaN p-value would not count in Holm's m anyway). Direction -1: fewer
    collapses than expected is better."""
    return [
        (arm.name, base.name, COLLAPSE_PREFIX + task, -1, survival_estimate(arm, base, task))
        for task in tasks
        for arm, base in couples
        if any_collapse([arm, base], task)
    ]


def survival_label(metric: str) -> str:
    return f"collapses O − E (log-rank), {metric.removeprefix(COLLAPSE_PREFIX)}"


def collapse_text(arm: str, collapsed: int, seeds: int) -> str:
    """E.g. "gspo: 0 of 5 seeds collapsed: rate below 45% at 95%", "grpo: 2 of 5 seeds collapsed
    (rate 5%-85%, 95% exact interval)" (`stats.exact.collapse_interval`)."""
    if seeds <= 0:
        return f"{arm}: no seed rated for collapses"
    lo, hi = collapse_interval(collapsed, seeds)
    if collapsed == 0:
        return f"{arm}: 0 of {seeds} seeds collapsed: rate below {100 * hi:.0f}% at 95%"
    return f"{arm}: {collapsed} of {seeds} seeds collapsed (rate {100 * lo:.0f}%-{100 * hi:.0f}%, 95% exact interval)"


def collapse_counts(groups: list[Group], task: str) -> list[str]:
    """Per arm, how many rated seeds collapsed on `task` (COLLAPSE_RULE) with the exact interval;
    [] when no run is rated there."""
    out = []
    for g in groups:
        rated = [c for r in g.runs if (c := run_collapse(r, task)) is not None]
        if rated:
            out.append(collapse_text(g.name, sum(c.step is not None for c in rated), len(rated)))
    return out


__all__ = [
    "collapse_counts",
    "collapse_text",
    "COLLAPSE_FRACTION",
    "COLLAPSE_PREFIX",
    "COLLAPSE_RULE",
    "SURVIVAL_RULE",
    "Collapse",
    "any_collapse",
    "arm_curve",
    "arm_times",
    "collapse_time",
    "run_collapse",
    "survival_estimate",
    "survival_items",
    "survival_label",
    "task_evals",
]
