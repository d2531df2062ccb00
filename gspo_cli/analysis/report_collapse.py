"""The report's per-arm findings: whether each arm ended above where it started (LEARNING_RULE:
its last held-out score against its own step-0 score), and when each arm's held-out score falls
apart, by one rule fixed in advance (COLLAPSE_RULE). A stress study
(experiments/paper_moe_stress.yaml: routers learning 60x faster than the rest) is meant to
collapse; this says when, per seed and per arm, so arms can be compared by how long they last
rather than by a final score near zero. Reads eval.jsonl through `Run.eval_scores`; no torch."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gspo_cli.analysis.rundata import Group, Run, seed_stats

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


def _task_evals(run: Run, task: str):
    """The run's evaluations on set `task` in step order, a repeated step keeping its first record."""
    ev = run.eval_scores
    return ev[ev.task == task].drop_duplicates("step").sort_values("step")


def run_collapse(run: Run, task: str, fraction: float = COLLAPSE_FRACTION) -> Collapse | None:
    """The run's collapse under COLLAPSE_RULE on evaluation set `task` (as `Run.eval_scores`
    names it); None when the run has no step-0 score above 0 there (nothing to fall from).
    Evaluations are taken in step order; a repeated step keeps its first record."""
    ev = _task_evals(run, task)
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
    rows = []
    for g in groups:
        starts, ends, first, last = [], [], [], []
        for r in g.runs:
            ev = _task_evals(r, task)
            s0, later = ev.score[ev.step == 0], ev[ev.step > 0]
            if not len(s0) or not len(later):
                continue
            starts.append(float(s0.iloc[0]))
            ends.append(float(later.score.iloc[-1]))
            rew = r.metrics["reward/mean"].dropna() if "reward/mean" in r.metrics else []
            if len(rew) >= 2 * window:
                first.append(float(rew.iloc[:window].mean()))
                last.append(float(rew.iloc[-window:].mean()))
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
        LEARNING_RULE,
    ]


__all__ = [
    "COLLAPSE_FRACTION",
    "COLLAPSE_RULE",
    "LEARNING_RULE",
    "Collapse",
    "collapse_lines",
    "learning_lines",
    "run_collapse",
]
