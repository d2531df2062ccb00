"""The report's stability sections: whether each arm ended above where it started (LEARNING_RULE:
its last held-out score against its own step-0 score), when each arm's held-out score falls apart
("## Collapse", by `stats.stability`'s COLLAPSE_RULE) and the time to collapse ("## Time to
collapse": Kaplan-Meier curves and log-rank tests). Reads eval.jsonl through `Run.eval_scores`;
no torch."""

from __future__ import annotations

import math

import numpy as np

from gspo_cli.analysis.rundata.runs import Group
from gspo_cli.analysis.stats.seeds import seed_stats
from gspo_cli.analysis.stats.stability import (
    COLLAPSE_FRACTION,
    COLLAPSE_RULE,
    SURVIVAL_RULE,
    arm_curve,
    arm_times,
    collapse_counts,
    run_collapse,
    task_evals,
)


def collapse_lines(groups: list[Group], task: str | None, label: str = "held-out score") -> list[str]:
    """A "## Collapse" section: per arm, how many rated seeds collapse, each seed's collapse step
    and the median, the step-0 and lowest held-out scores (seed means); then one line naming the
    arms that collapse, earliest first. Empty without an evaluation set or a rated run."""
    if task is None:
        return []
    rows, verdicts = [], []
    for g in groups:
        rated = [(r.seed, c) for r in g.runs if (c := run_collapse(r, task)) is not None]
        if not rated:
            continue
        steps = [c.step for _, c in rated if c.step is not None]
        by_seed = ", ".join(
            f"s{seed}: " + ("–" if c.step is None else f"{c.step}" + (" (diverged)" if c.diverged else ""))
            for seed, c in rated
        )
        median = float(np.median(steps)) if steps else math.nan
        collapses = 2 * len(steps) > len(rated)
        if collapses:
            verdicts.append((median, g.name))
        lows = [c.low for _, c in rated if math.isfinite(c.low)]
        rows.append(
            f"| {g.name} | {len(steps)}/{len(rated)} | {by_seed} | "
            + (f"{median:g}" if steps else "–")
            + f" | {np.mean([c.start for _, c in rated]):.3f} | "
            + (f"{np.mean(lows):.3f}" if lows else "n/a")
            + " |"
        )
    if not rows:
        return []
    verdicts.sort()
    summary = (
        "Arms that collapse (median step, earliest first): "
        + ", ".join(f"`{name}` at step {m:g}" for m, name in verdicts)
        + "."
        if verdicts
        else "No arm collapses: in none do more than half of the rated seeds fall below the threshold."
    )
    return [
        "## Collapse",
        "",
        f"When each run's {label} first falls below {COLLAPSE_FRACTION:g} x its step-0 score "
        "(rule below); `–`: never within the run.",
        "",
        f"| arm | seeds collapsed | collapse step by seed | median step | {label} at step 0 | lowest after |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        summary,
        "",
        COLLAPSE_RULE,
    ]


LEARNING_RULE = """\
Learning rule (added after the first runs it rated, `paper_moe` of 2026-12-04; the same for every
arm and report): a seed's **change** is its last held-out score minus its own step-0 score (the
arms of a seed share the cold-started model, so the same step-0 score). An arm **ends above step
0** when its mean change over seeds is above 0, **significantly** when the 95% t interval of that
mean excludes 0, and **ends below step 0** when the mean change is below 0. The train reward's
change (the last steps against the first) is given beside it without a verdict: its batches
differ between the two windows.
"""


def learning_lines(groups: list[Group], task: str | None, label: str = "held-out score", window: int = 25) -> list[str]:
    """A "## Did each arm learn?" section (LEARNING_RULE): per arm, the held-out score at step 0 and at the end
    (seed means), the mean change with its 95% t interval, how many seeds ended above their start,
    and the train reward's first-`window` and last-`window` step means. Empty without an
    evaluation set or a run with both scores."""
    if task is None:
        return []
    rows, notes = [], []
    for g in groups:
        starts, ends, first, last, broken = [], [], [], [], []
        for r in g.runs:
            ev = task_evals(r, task)
            s0, later = ev.score[ev.step == 0], ev[ev.step > 0]
            if not len(s0) or not len(later):
                continue
            if not (math.isfinite(float(s0.iloc[0])) and math.isfinite(float(later.score.iloc[-1]))):
                broken.append(f"seed {r.seed}")  # a NaN/inf score is no score: never a mean of inf
                continue
            starts.append(float(s0.iloc[0]))
            ends.append(float(later.score.iloc[-1]))
            rew = r.metrics["reward/mean"].dropna() if "reward/mean" in r.metrics else []
            if len(rew) >= 2 * window:
                first.append(float(rew.iloc[:window].mean()))
                last.append(float(rew.iloc[-window:].mean()))
        if broken:
            notes.append(f"{g.name}: {', '.join(broken)} left out (a non-finite {label} at step 0 or at the end).")
        if not starts:
            continue
        change = [e - s for s, e in zip(starts, ends)]
        st = seed_stats(change)
        mean, half = st.mean, st.ci95
        verdict = "ends above step 0" if mean > 0 else "ends below step 0" if mean < 0 else "no change"
        if mean != 0 and math.isfinite(half) and half < abs(mean):
            verdict += ", significantly"
        up = sum(c > 0 for c in change)
        reward = f"{np.mean(first):.3f} → {np.mean(last):.3f}" if first else "n/a"
        ci = f" ± {half:.3f}" if math.isfinite(half) else ""
        rows.append(
            f"| {g.name} | {np.mean(starts):.3f} → {np.mean(ends):.3f} | {mean:+.3f}{ci} | "
            f"{up}/{len(change)} | {reward} | {verdict} |"
        )
    if not rows:
        return []
    return [
        "## Did each arm learn?",
        "",
        f"{label}: step 0 → the last evaluation (seed means); change: mean ± 95% t half-width over seeds.",
        "",
        f"| arm | {label}, step 0 → end | change | seeds above step 0 | "
        f"train reward, first {window} → last {window} steps | verdict |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        *([*notes, ""] if notes else []),
        LEARNING_RULE,
    ]


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
    then each arm's collapse rate with its exact interval (none collapsed: the rate the seeds cannot
    exclude), `tests` (the log-rank lines the caller computed in its family) and SURVIVAL_RULE. Empty
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
    rates = "Collapse rate per arm (Clopper-Pearson): " + "; ".join(collapse_counts(groups, task)) + "."
    return ["## Time to collapse", "", intro, "", *rows, "", rates, "", *tests, *([""] if tests else []), SURVIVAL_RULE]


__all__ = ["LEARNING_RULE", "SURVIVAL_KEYS", "collapse_lines", "learning_lines", "survival_lines", "survival_test_line"]
