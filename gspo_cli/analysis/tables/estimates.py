"""Which per-seed numbers a difference is computed from, with nothing dropped: problem records at
a run's last (or a matched) evaluation, a held-out score of runs that end at different steps taken
at the last step they all evaluated, and a time to a threshold as the log-rank test of reaching it
(a run that never does is censored at its last step, not left out). Only what is the same is
compared: a held-out score of runs whose sets hold different problems (their run.json
fingerprints differ), or a training number of arms trained on different tasks, is not compared,
and the row says why (`not_comparable`)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from gspo_cli.analysis.rundata.runs import Group, Run
from gspo_cli.analysis.stats import Estimate, ProblemScores, problem_difference, seed_difference
from gspo_cli.analysis.stats.survival import logrank

THRESHOLD = ("threshold_step", "threshold_time")


def _task_evals(run: Run, task: str) -> list[dict]:
    return [r for r in run.evals if "step" in r and str(r.get("set") or r.get("task", "eval")) == task]


def problem_records(run: Run, task: str, step: int | None = None) -> ProblemScores | None:
    """The problem records of the run's last evaluation of `task`, or of its evaluation at `step`
    (None if that evaluation has none: a run written before they existed, or no evaluation there)."""
    recs = _task_evals(run, task)
    if step is not None:
        recs = [r for r in recs if int(r["step"]) == step]
    if not recs:
        return None
    last = max(recs, key=lambda r: int(r["step"]))
    probs, samples = last.get("problems"), last.get("samples")
    if not isinstance(probs, dict) or not isinstance(samples, int) or samples < 1:
        return None
    ids, correct = probs.get("id") or [], probs.get("correct") or []
    if not ids or len(ids) != len(correct):
        return None
    return ProblemScores(tuple(map(str, ids)), np.asarray(correct, dtype=float), samples)


def _per_seed(group: Group, value) -> dict[int, float]:
    return {r.seed: value(r) for r in group.runs}


def _eval_steps(run: Run, task: str) -> set[int]:
    ev = run.eval_scores
    return {int(s) for s in ev.step[(ev.task == task) & ev.score.notna()]}


def _score_at(run: Run, task: str, step: int) -> float:
    ev = run.eval_scores
    ev = ev[(ev.task == task) & (ev.step == step)].dropna(subset=["score"])
    return float(ev.score.iloc[0]) if len(ev) else math.nan


def matched_step(runs: list[Run], task: str) -> tuple[int | None, str]:
    """The last evaluation step every run has on `task` when the runs end at different steps (a run
    that diverged or stopped early), with the method's note; (None, "") when they end together.
    When they have no common step after 0: (None, a note that each run's last is used)."""
    steps = {r.label: _eval_steps(r, task) for r in runs}
    last = {k: max(v) if v else None for k, v in steps.items()}
    ends = {s for s in last.values() if s is not None}
    if len(ends) <= 1 or None in last.values():  # a run without this evaluation: no step to match
        return None, ""
    common = {s for s in set.intersection(*steps.values()) if s > 0}
    early = ", ".join(f"{k} at {v}" for k, v in last.items() if v is not None and v < max(ends))
    if not common:
        return None, f" (runs end at different steps, {early}; no common evaluation step: each run's last)"
    step = max(common)
    return step, f" at matched step {step} (runs end at different steps: {early})"


NOT_COMPARED = "not compared: "
_EVAL_COLUMNS = ("eval_final:", "eval_best:", "eval_budget:")


def _eval_fingerprint(run: Run, task: str) -> str | None:
    ident = run.info.get("identity") if isinstance(run.info.get("identity"), dict) else {}
    sets = (ident.get("data") or {}).get("eval") or {}
    entry = sets.get(task) if isinstance(sets, dict) else None
    return entry.get("fingerprint") if isinstance(entry, dict) else None


def _train_task(run: Run) -> str | None:
    task = run.spec.get("task") if isinstance(run.spec.get("task"), dict) else None
    if task is None:
        return None
    source = (task.get("params") or {}).get("source", "synthetic")
    return f"{task.get('name', 'math')} ({source})"


def not_comparable(arm: Group, base: Group, column) -> str | None:
    """Why `column` of `arm` and `base` is not one thing measured twice, None when it is: a held-out
    set whose problems differ between runs (run.json fingerprints), or, for a training number, arms
    trained on different tasks (spec.yaml task name and source). Runs that record neither pass."""
    runs = arm.runs + base.runs
    if column.id.startswith(_EVAL_COLUMNS):
        task = column.id.split(":", 1)[1]
        prints = {fp: r for r in runs if (fp := _eval_fingerprint(r, task))}
        if len(prints) > 1:
            return (
                f"{NOT_COMPARED}the runs' {task} sets hold different problems (run.json fingerprints "
                f"{', '.join(sorted(prints))}); pairing them would compare problems, not arms"
            )
        return None
    if column.id.startswith(("eval", "threshold")) or column.id in THRESHOLD:
        return None
    tasks = {t: 1 for r in runs if (t := _train_task(r))}
    if len(tasks) > 1:
        return (
            f"{NOT_COMPARED}the arms train on different tasks ({' vs '.join(tasks)}); their training numbers "
            "differ by task"
        )
    return None


def estimate(arm: Group, base: Group, column) -> Estimate:
    """arm - base on one compare column: from problem records for a held-out final score when every
    run has them, else from the per-seed values (paired where the seeds pair). A held-out final
    score of runs that end at different steps is taken at the last step they all evaluated
    (`matched_step`); a time to a threshold is the log-rank test of reaching it (`threshold_estimate`).
    Runs whose column is not one thing (`not_comparable`) give no estimate: its method says why."""
    if (why := not_comparable(arm, base, column)) is not None:
        return replace(seed_difference({}, {}), method=why)
    if column.id in THRESHOLD:
        return threshold_estimate(arm, base, column)
    if column.id.startswith("eval_final:"):
        task = column.id.split(":", 1)[1]
        step, note = matched_step(arm.runs + base.runs, task)
        a = {r.seed: problem_records(r, task, step) for r in arm.runs}
        b = {r.seed: problem_records(r, task, step) for r in base.runs}
        if all(v is not None for v in (*a.values(), *b.values())):
            est = problem_difference(a, b)
            if est is not None:
                return replace(est, method=est.method + note, diffs=_seed_means(a, b))
        value = column.value if step is None else (lambda r: _score_at(r, task, step))
        est = seed_difference(_per_seed(arm, value), _per_seed(base, value))
        return replace(est, method=est.method + note + (" (no problem records)" if est.n_paired else ""))
    est = seed_difference(_per_seed(arm, column.value), _per_seed(base, column.value))
    early = diverged_early(arm.runs + base.runs)
    return replace(est, method=est.method + early) if early else est


def diverged_early(runs: list[Run]) -> str:
    """The method's note when a run diverged before the others' last step: its value comes from its
    own last steps (a per-run metric has no matched step to take), and the note says so; "" when
    none did."""
    last = {r.label: int(s.index.max()) for r in runs if len(s := r.series("reward/mean").dropna())}
    end = max(last.values(), default=0)
    early = [f"{r.label} at {last[r.label]}" for r in runs if r.status == "diverged" and last.get(r.label, end) < end]
    if not early:
        return ""
    return f" ({', '.join(early)} diverged before step {end}: its value is from its own last steps, not matched)"


def _seed_means(arm: dict[int, ProblemScores], base: dict[int, ProblemScores]) -> tuple[float, ...]:
    """Per paired seed, the mean over the problems every paired evaluation has of arm - base: the
    per-seed differences the checks of `stats.exact` read (as `problem_difference` aligns them)."""
    common = sorted(set(arm) & set(base))
    ids = set.intersection(*(set(arm[s].ids) & set(base[s].ids) for s in common))

    def mean(x: ProblemScores) -> float:
        return float(np.mean([v for pid, v in zip(x.ids, x.score) if pid in ids]))

    return tuple(mean(arm[s]) - mean(base[s]) for s in common)


def _reach(run: Run, column) -> tuple[float, bool] | None:
    """(time, reached) of one run for a threshold column: its crossing, or censored at its last
    logged step (or elapsed seconds); None for a run that logged nothing."""
    value = column.value(run)
    if math.isfinite(value):
        return value, True
    s = run.series("time/elapsed_s" if column.id == "threshold_time" else "reward/mean").dropna()
    if not len(s):
        return None
    return (float(s.iloc[-1]) if column.id == "threshold_time" else float(s.index.max())), False


def threshold_estimate(arm: Group, base: Group, column) -> Estimate:
    """Time to a threshold as the log-rank test of reaching it (O − E of the arm's crossings; > 0:
    it reaches it sooner or more often): a run that never reaches it is censored at its last step,
    not dropped (dropping favours the arm that fails more often)."""
    sides = []
    for g in (arm, base):
        got = [t for r in g.runs if (t := _reach(r, column)) is not None]
        sides.append((np.array([t for t, _ in got], dtype=float), np.array([e for _, e in got], dtype=bool)))
    (ta, ea), (tb, eb) = sides
    never = int((~ea).sum() + (~eb).sum())
    note = f"; {never} never reached it: censored at their last step" if never else ""
    if not len(ta) or not len(tb):
        return Estimate(math.nan, math.nan, math.nan, "log-rank: a side has no run", 0, len(ta), len(tb))
    est = logrank(ta, ea, tb, eb).estimate()
    return replace(est, method=f"log-rank of reaching it, {len(ta)} vs {len(tb)} runs{note}")


__all__ = ["THRESHOLD", "diverged_early", "estimate", "matched_step", "problem_records", "threshold_estimate"]
