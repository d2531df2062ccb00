"""Run directories as tables: loading runs, grouping them, and smoothing a run's series.

Shared by `gspo compare`, `plot` and `report`. Like them it reads files only and never imports
torch or the trainer, so the commands work on a laptop holding nothing but results/. Statistics
over seeds live one layer up, in `analysis.stats.seeds`.
"""

from __future__ import annotations

import glob
import json
import math
import warnings
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from gspo_cli.errors import SpecError
from gspo_cli.files import read_text
from gspo_cli.metrics import no_signal
from gspo_cli.runs import RunDir, find_runs, format_setting
from gspo_cli.spec.task import stored_reward_label


@dataclass
class Run:
    """One run directory, read once. `metrics` has one row per step, indexed by step."""

    path: Path
    experiment: str
    arm: str
    seed: int
    status: str
    spec: dict[str, Any]
    info: dict[str, Any]
    metrics: pd.DataFrame
    evals: list[dict[str, Any]]

    @property
    def label(self) -> str:
        return f"{self.experiment}/{self.arm}/seed{self.seed}"

    @property
    def last_step(self) -> int:
        return int(self.metrics.index.max()) if len(self.metrics) else 0

    def series(self, key: str) -> pd.Series:
        """Float values of one metric by step; NaN where a step lacks it, empty if no step has it."""
        if key not in self.metrics.columns:
            return pd.Series(dtype=float)
        return self.metrics[key].astype(float)

    @property
    def no_signal(self) -> bool:
        """No reward signal at any logged step (`gspo_cli.metrics.no_signal`, the plot's test)."""
        return no_signal(self.series("reward/zero_var_group_frac"), self.series("reward/std"))

    @property
    def reward_names(self) -> list[str]:
        """The named rewards of its spec's task.rewards, in order (logged as reward/<name>); []
        when the task scores by its own verifier."""
        rewards = (self.spec.get("task") or {}).get("rewards") or []
        labels = [stored_reward_label(r) for r in rewards if isinstance(r, dict)]
        return [label for label in labels if label is not None]

    @property
    def correct_reward(self) -> str | None:
        """The name of the reward marked `correct: true` (it decides pass@k), None without one."""
        rewards = (self.spec.get("task") or {}).get("rewards") or []
        judge = [stored_reward_label(r) for r in rewards if isinstance(r, dict) and r.get("correct")]
        return next((label for label in judge if label is not None), None)

    def eval_series(self, task: str, score: str) -> pd.Series:
        """One score of one evaluation set (named as in `eval_scores`) by step, NaN where an
        evaluation lacks it; empty when none has it."""
        out = {
            int(rec["step"]): _float((rec.get("scores") or {}).get(score))
            for rec in self.evals
            if "step" in rec and str(rec.get("set") or rec.get("task", "eval")) == task
        }
        return pd.Series(out, dtype=float).sort_index()

    @property
    def arm_spec(self) -> dict[str, Any]:
        """This run's arm in its spec.yaml (the first arm if none has its name; {} without one)."""
        arms = [a for a in self.spec.get("arms") or [] if isinstance(a, dict)]
        return next((a for a in arms if a.get("name") == self.arm), arms[0] if arms else {})

    @cached_property
    def eval_scores(self) -> pd.DataFrame:
        """Columns step, task, key, score: one row per evaluation, scored by its first avg@K.
        `task` names the evaluation set: a record's `set` (task.eval_sets), else its task (the
        held-out split of the training source), so compare and plot show each set by name."""
        rows = []
        for rec in self.evals:
            scores = rec.get("scores") or {}
            key = next((k for k in scores if k.startswith("avg@")), next(iter(scores), None))
            if key is not None and "step" in rec:
                rows.append(
                    {
                        "step": int(rec["step"]),
                        "task": str(rec.get("set") or rec.get("task", "eval")),
                        "key": key,
                        "score": _float(scores[key]),
                    }
                )
        return pd.DataFrame(rows, columns=["step", "task", "key", "score"])


@dataclass
class Group:
    """Runs sharing one value of the group-by field (seeds of one arm, by default)."""

    name: str
    runs: list[Run]


def reward_names(runs: list[Run]) -> list[str]:
    """Every named reward of the runs' specs, in the order they first appear."""
    return list(dict.fromkeys(n for r in runs for n in r.reward_names))


def _float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


# --------------------------------------------------------------------------- loading


def expand_paths(paths: list[str]) -> list[Path]:
    """Existing paths as given; anything else is treated as a glob (quoted, so the shell left it)."""
    out: list[Path] = []
    for p in paths:
        if Path(p).exists():
            out.append(Path(p))
        elif glob.has_magic(p) and (hits := sorted(glob.glob(p))):
            out.extend(Path(h) for h in hits)
        else:
            raise SpecError(f"{p}: no such file or directory" + (" (no glob match)" if glob.has_magic(p) else ""))
    return out


def load_runs(paths: list[str]) -> list[Run]:
    """Every run directory at or under `paths`, read from disk; a run whose run.json is not a JSON
    object is left out with a warning naming it (its arm, seed and status are unknown); SpecError
    if no run is left."""
    runs = []
    for rd in find_runs(expand_paths(paths)):
        try:
            runs.append(load_run(rd))
        except CorruptRun as err:
            warnings.warn(str(err), stacklevel=2)
    if not runs:
        raise SpecError(f"no run directories (holding a readable run.json) under {', '.join(paths)}")
    return runs


class CorruptRun(SpecError):
    """A run directory whose run.json cannot say what the run is."""


def run_info(rd: RunDir) -> dict[str, Any]:
    """run.json's fields; CorruptRun (one line naming the file) when it is not a JSON object: a run
    labelled from its directory names instead would pass for an arm it is not."""
    try:
        info = json.loads(read_text(rd.info_file))
    except json.JSONDecodeError as err:
        raise CorruptRun(f"{rd.info_file}: not valid JSON ({err.msg}, line {err.lineno}); run left out") from None
    if not isinstance(info, dict):
        raise CorruptRun(f"{rd.info_file}: not a JSON object; run left out") from None
    return info


def load_run(rd: RunDir) -> Run:
    """One run, read from disk; CorruptRun when its run.json is not a JSON object."""
    info = run_info(rd) if rd.info_file.exists() else {}
    spec: dict[str, Any] = {}
    if rd.spec_file.exists():
        try:
            spec = yaml.safe_load(read_text(rd.spec_file)) or {}
        except yaml.YAMLError as err:
            raise SpecError(f"{rd.spec_file}: not valid YAML ({str(err).splitlines()[0]})") from None
    seed = info.get("seed")
    if seed is None:  # run.json written before the seed was known: fall back on the dir name
        seed = int(rd.path.name[4:]) if rd.path.name[4:].isdigit() else 0
    return Run(
        path=rd.path,
        experiment=str(info.get("experiment") or rd.path.parent.parent.name),
        arm=str(info.get("arm") or rd.path.parent.name),
        seed=int(seed),
        status=str(info.get("status") or "unknown"),
        spec=spec,
        info=info,
        metrics=_metrics_frame(rd.metrics()),
        evals=rd.evals(),
    )


def _metrics_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    records = [r for r in records if isinstance(r.get("step"), (int, float))]
    if not records:
        return pd.DataFrame(index=pd.Index([], name="step", dtype=int))
    df = pd.DataFrame.from_records(records)
    # A restarted run may have logged a step twice: the later line is the one that counts.
    df = df.drop_duplicates("step", keep="last").astype({"step": int}).set_index("step").sort_index()
    return df.apply(pd.to_numeric, errors="coerce")


def final_notes(run: Run) -> list[str]:
    """What a run's "final" numbers really are: an unfinished run's are what is on disk (its held-out
    "final" is an earlier evaluation, step 0 while it has no other), and a completed run whose
    eval.jsonl stops before its last step (a truncated file) has an earlier step as its final."""
    ev = run.eval_scores.dropna(subset=["score"])
    lasts = {task: int(g.step.max()) for task, g in ev.groupby("task")} if len(ev) else {}
    if run.status != "completed":
        total = run.info.get("total_steps", "?")
        held = "; ".join(f"held-out {t} 'final' is its step-{s} evaluation" for t, s in lasts.items())
        return [
            f"{run.label}: {run.status} at step {run.last_step}/{total}; its numbers are what is on disk"
            + (f" ({held}, not a final score)" if held else "")
            + "."
        ]
    end = run.info.get("step", run.last_step)
    if not isinstance(end, int) or isinstance(end, bool):
        return []
    return [
        f"{run.label}: completed at step {end}, but its last {t} evaluation in eval.jsonl is at step {s} "
        f"(a truncated file?): its final held-out score is step {s}'s."
        for t, s in lasts.items()
        if s < end
    ]


# --------------------------------------------------------------------------- grouping


def group_runs(runs: list[Run], group_by: str = "arm") -> list[Group]:
    """Runs grouped by arm (the default) or by a spec.yaml field, groups sorted by value.

    A field path is dotted (`rollout.group_size`, `arms.0.clip_high`); a name that is not a
    top-level spec key is looked up within the run's one arm (`clip_high`). Sorting is by
    value (numbers numerically), so colours assigned in this order are stable.
    """
    several = len({r.experiment for r in runs}) > 1
    keyed: dict[str, tuple[Any, list[Run]]] = {}
    for r in runs:
        if group_by in ("arm", "experiment"):
            value = getattr(r, group_by)
            name = f"{r.experiment}/{r.arm}" if group_by == "arm" and several else value
        else:
            value = spec_field(r, group_by)
            name = f"{group_by.split('.')[-1]}={format_setting(value)}"
        keyed.setdefault(name, (value, []))[1].append(r)
    order = sorted(keyed, key=lambda n: (_sort_key(keyed[n][0]), n))
    return [Group(n, sorted(keyed[n][1], key=lambda r: (r.experiment, r.seed))) for n in order]


def spec_field(run: Run, path: str) -> Any:
    parts = path.split(".")
    if parts[0] not in run.spec:
        parts = ["arms", "0", *parts]
    node: Any = run.spec
    for part in parts:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise SpecError(
                f"--group-by: {path!r} is not a field of {run.path / 'spec.yaml'} "
                "(e.g. arm, clip_high, arms.0.loss, rollout.group_size)"
            )
    return node


def _sort_key(v: Any) -> tuple:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return (0, float(v), "")
    return (1, 0.0, str(v))


# --------------------------------------------------------------------------- smoothing


def ema(values: np.ndarray, weight: float) -> np.ndarray:
    """Debiased exponential moving average (as TensorBoard smooths): weight 0 leaves values as
    they are; NaN entries stay NaN and do not reset the average."""
    x = np.asarray(values, dtype=float)
    if weight <= 0:
        return x.copy()
    out = np.full(len(x), np.nan)
    acc = norm = 0.0
    for i, v in enumerate(x):
        if math.isfinite(v):
            acc = weight * acc + (1 - weight) * v
            norm = weight * norm + (1 - weight)  # = 1 - weight**k: removes the pull toward 0
            out[i] = acc / norm
    return out
