"""Compute axes: what a run spent by each step, from the metrics it already logs, so curves and
held-out scores can be compared at equal compute rather than at equal steps (arms that sample more
per step, with dynamic sampling's extra rounds, longer responses or tool calls, spend more).

Per step, cumulative over the run (metrics.jsonl keys):
- step: the step.
- samples: responses generated: `rollout/sampled_groups` x `rollout.group_size` where the run logs
  it (dynamic sampling: every round, every process), else `rollout.prompts_per_step` x group size.
- tokens: response tokens generated: `response/length_mean` (the model's own tokens of the trained
  responses; tool output not counted) x the samples above. The trained tokens are the same count
  over prompts_per_step x group_size responses; with dynamic sampling the discarded groups are
  counted at the trained batch's mean length (their own lengths are not logged).
- wall: training seconds, `time/elapsed_s` (else the sum of `time/step_s`).
An evaluation at step s sits at the compute of step s; step 0 (before training) at 0.

Equal-compute rule (EQUAL_COMPUTE_RULE): the budget is the largest compute every run reached at an
evaluation, the smallest over runs of the compute at its last evaluation; each run's score there is
interpolated linearly in compute between its two evaluations around the budget. No run is
extrapolated. Reads files only; no torch.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from gspo_cli.analysis.rundata.runs import Run
from gspo_cli.errors import SpecError

AXES = {
    "step": "step (rollout batches)",
    "samples": "responses sampled",
    "tokens": "response tokens sampled",
    "wall": "training wall time [s]",
}
ALIASES = {"time": "wall"}  # the name `plot --x` had before `wall`
UNITS = {"step": "steps", "samples": "responses", "tokens": "tokens", "wall": "s"}

EQUAL_COMPUTE_RULE = (
    "At equal compute ({axis}): the budget is the largest every run reached at an evaluation (the "
    "smallest, over runs, of the {axis} at its last evaluation: {budget:.4g} {unit}); each run's score "
    "there is interpolated linearly in {axis} between its evaluations around the budget."
)


def axis_name(axis: str, option: str = "--x") -> str:
    """The canonical axis name (`time` is `wall`); SpecError naming `option` for an unknown one."""
    axis = ALIASES.get(axis, axis)
    if axis not in AXES:
        raise SpecError(f"{option}: unknown axis {axis!r} (known: {', '.join(AXES)})")
    return axis


def compute_series(run: Run, axis: str) -> pd.Series:
    """The run's cumulative compute by logged step on `axis` (module docstring); SpecError when
    its spec lacks the rollout shape samples and tokens need."""
    axis = axis_name(axis)
    idx = run.metrics.index
    if axis == "step":
        return pd.Series(idx.to_numpy(float), index=idx)
    if axis == "wall":
        t = run.series("time/elapsed_s")
        return t if t.notna().any() else run.series("time/step_s").cumsum()
    rollout = run.spec.get("rollout") or {}
    if not {"prompts_per_step", "group_size"} <= rollout.keys():
        raise SpecError(f"--x {axis}: {run.path / 'spec.yaml'} lacks rollout.prompts_per_step/group_size")
    G = rollout["group_size"]
    samples = pd.Series(float(rollout["prompts_per_step"] * G), index=idx)
    if "rollout/sampled_groups" in run.metrics:
        samples = (run.series("rollout/sampled_groups") * G).fillna(samples)
    if axis == "tokens":
        samples = samples * run.series("response/length_mean").fillna(0)
    return samples.cumsum()


def eval_points(run: Run, task: str, axis: str) -> tuple[np.ndarray, np.ndarray]:
    """(compute, score) of each evaluation of `task` in step order (step 0 at compute 0; a repeated
    step keeps its last record); empty arrays without one."""
    ev = run.eval_scores
    ev = ev[ev.task == task].dropna(subset=["score"]).drop_duplicates("step", keep="last").sort_values("step")
    if ev.empty:
        return np.zeros(0), np.zeros(0)
    xv = compute_series(run, axis).dropna()
    x = np.interp(ev.step.to_numpy(float), [0.0, *xv.index.to_numpy(float)], [0.0, *xv.to_numpy(float)])
    return x, ev.score.to_numpy(float)


def common_budget(runs: list[Run], task: str, axis: str) -> float:
    """The equal-compute budget (EQUAL_COMPUTE_RULE) over `runs` with an evaluation of `task` after
    compute 0; NaN when none has one."""
    ends = [x[-1] for r in runs if len(x := eval_points(r, task, axis)[0]) and x[-1] > 0]
    return float(min(ends)) if ends else math.nan


def score_at(run: Run, task: str, axis: str, budget: float) -> float:
    """The run's held-out score at `budget`, interpolated linearly in compute; NaN when the run
    did not reach it (or has no evaluation)."""
    x, y = eval_points(run, task, axis)
    if not len(x) or not math.isfinite(budget) or x[-1] < budget:
        return math.nan
    return float(np.interp(budget, x, y))


def budget_columns(runs: list[Run], axis: str) -> tuple[list[tuple], list[str]]:
    """For `compare --budget AXIS`: per evaluation set, (id, label, unit, value of a run) of the
    held-out score at the equal-compute budget, and the notes stating each budget and the rule."""
    axis = axis_name(axis, "--budget")
    tasks = sorted({t for r in runs for t in r.eval_scores.task})
    cols, notes = [], []
    for task in tasks:
        try:
            budget = common_budget(runs, task, axis)
        except SpecError as err:  # said as the option given here
            raise SpecError(str(err).replace(f"--x {axis}:", f"--budget {axis}:", 1)) from None
        if not math.isfinite(budget):
            continue
        key = next((k for r in runs for k in r.eval_scores.key[r.eval_scores.task == task]), "score")
        label = f"{task} {key} at {budget:.3g} {UNITS[axis]}"
        cols.append((f"eval_budget:{task}", label, "score", lambda r, t=task, b=budget: score_at(r, t, axis, b)))
        notes.append(f"{task}: " + EQUAL_COMPUTE_RULE.format(axis=axis, budget=budget, unit=UNITS[axis]))
    return cols, notes


def unequal_compute_note(groups, axis: str = "tokens", ratio: float = 1.1) -> str | None:
    """A note for `compare` without --budget when the groups spent unequal compute: the seed-mean
    `axis` at the last logged step differs by more than `ratio` between the most and least
    spending group. None otherwise, or when a run's spec lacks the rollout shape."""
    try:
        spent = {g.name: float(np.mean([compute_series(r, axis).dropna().iloc[-1] for r in g.runs])) for g in groups}
    except (SpecError, IndexError):
        return None
    spent = {k: v for k, v in spent.items() if math.isfinite(v) and v > 0}
    if len(spent) < 2 or max(spent.values()) <= ratio * min(spent.values()):
        return None
    most, least = max(spent, key=spent.get), min(spent, key=spent.get)
    return (
        f"Unequal compute: {most} sampled {spent[most] / spent[least]:.2g}x the {axis} of {least} "
        f"({spent[most]:.3g} vs {spent[least]:.3g}); --budget {axis} compares held-out scores at equal {axis}."
    )


__all__ = [
    "ALIASES",
    "AXES",
    "EQUAL_COMPUTE_RULE",
    "UNITS",
    "axis_name",
    "budget_columns",
    "common_budget",
    "compute_series",
    "eval_points",
    "score_at",
    "unequal_compute_note",
]
