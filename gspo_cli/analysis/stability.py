"""Stability as a time: each run's step of collapse (report_collapse.COLLAPSE_RULE) or the step
it was last seen intact (censored), a Kaplan-Meier curve per arm and the log-rank test between
arms, for `report`, `compare --baseline` and `plot` (the `survival` figure). Reads eval.jsonl
through `Run.eval_scores`; no torch, no matplotlib."""

from __future__ import annotations

import math

import numpy as np

from gspo_cli.analysis.report_collapse import COLLAPSE_FRACTION, run_collapse
from gspo_cli.analysis.rundata import Group, Run
from gspo_cli.analysis.stats.intervals import Estimate
from gspo_cli.analysis.stats.survival import KaplanMeier, kaplan_meier, logrank

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


# The report's log-rank tests between the paper's arms (by role), in its findings' Holm family.
SURVIVAL_KEYS = [("gspo", "grpo", "collapse"), ("grpo_rr", "grpo", "collapse"), ("gspo", "grpo_rr", "collapse")]


def survival_test_line(found, roles: dict[str, Group], key: tuple[str, str, str]) -> str:
    """One report line: `a` − `b`, the log-rank O − E with its interval, Holm-adjusted p and word."""
    a, b, _ = key
    return f"- Log-rank, `{roles[a].name}` against `{roles[b].name}`: collapses O − E {found.text('+.2f')}."


def _pct(x: float) -> str:
    return "–" if not math.isfinite(x) else f"{x:.2f}"


def survival_lines(groups: list[Group], task: str | None, label: str, tests: list[str] = ()) -> list[str]:
    """A "## Time to collapse" section: per arm, runs rated and collapsed, the Kaplan-Meier S(t)
    with its 95% interval at every evaluation step where some arm has an event, and the median;
    then `tests` (the log-rank lines the caller computed in its family) and SURVIVAL_RULE. Empty
    without an evaluation set or a rated run."""
    if task is None:
        return []
    curves = [(g, arm_curve(g, task), arm_times(g, task)) for g in groups]
    curves = [(g, km, te) for g, km, te in curves if km is not None]
    if not curves:
        return []
    steps = sorted({float(t) for _, km, _ in curves for t in km.times[km.events > 0]})
    head = "| arm | collapsed / rated | median step | " + " | ".join(f"S({t:g})" for t in steps) + " |"
    rows = [head, "|" + "---|" * (3 + len(steps))]
    for g, km, (_, events, _) in curves:
        cells = []
        for t in steps:
            i = int(np.searchsorted(km.times, t, side="right")) - 1
            s = km.at(t)
            lo, hi = (km.low[i], km.high[i]) if i >= 0 else (math.nan, math.nan)
            cells.append(f"{s:.2f}" + (f" [{_pct(lo)}, {_pct(hi)}]" if math.isfinite(lo) else ""))
        med = km.median
        rows.append(
            f"| {g.name} | {int(events.sum())}/{len(events)} | {'none' if not math.isfinite(med) else f'{med:g}'} | "
            + " | ".join(cells)
            + " |"
        )
    intro = (
        f"Share of runs whose {label} has not yet collapsed, after each step where some arm has a collapse "
        "(Kaplan-Meier, 95% interval; rule below)."
    )
    if not steps:
        intro = f"No rated run collapses: every run is censored at its last evaluation ({label})."
    return ["## Time to collapse", "", intro, "", *rows, "", *tests, *([""] if tests else []), SURVIVAL_RULE]


__all__ = [
    "COLLAPSE_PREFIX",
    "SURVIVAL_KEYS",
    "SURVIVAL_RULE",
    "survival_test_line",
    "survival_estimate",
    "survival_items",
    "survival_label",
    "any_collapse",
    "arm_curve",
    "arm_times",
    "collapse_time",
    "survival_lines",
]
