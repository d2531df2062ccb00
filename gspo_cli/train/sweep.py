"""Sweeps: expand a spec's `sweep:` section x arms x seeds into a plan of named runs,
take a stable shard of it, and train it (here with N processes, or on SLURM or Ray: train/executors/).

Each planned run is an ordinary run: its arm is renamed to say its settings
(`gspo,clip_high=0.0002,group_size=4`), so `results/<experiment>/<that name>/seed<k>/` is a
normal run directory and compare/plot group by it like any arm. Planning loads no model
(validating the arms' algorithm names imports the registries, and with them torch).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gspo_cli.errors import SpecError
from gspo_cli.runs import RunDir, format_setting, run_path
from gspo_cli.spec import ExperimentSpec
from gspo_cli.spec.comparison import names_arm
from gspo_cli.spec.loading import apply_override, read_spec_file, set_path, spec_from_dict
from gspo_cli.train.executors.base import record
from gspo_cli.train.executors.progress import RunProgress  # noqa: F401  (re-exported: the sweep's progress lines)
from gspo_cli.train.sinks import check_sinks


@dataclass(frozen=True)
class PlannedRun:
    name: str  # the run's arm name: base arm + its sweep settings
    base_arm: str
    seed: int
    settings: tuple[tuple[str, Any], ...]  # the sweep point, in grid order
    spec: ExperimentSpec  # exactly this run: one (renamed) arm, one seed
    path: Path

    def status(self) -> str:
        return RunDir(self.path).status() or "planned"


def _short_keys(keys: list[str]) -> dict[str, str]:
    """The last path component names a setting, unless two keys share it."""
    last = {k: k.replace("[*]", "").replace("[", ".").replace("]", "").split(".")[-1] for k in keys}
    clash = {v for v in last.values() if list(last.values()).count(v) > 1}
    return {k: (k.replace("[*]", "").replace("[", ".").replace("]", "") if last[k] in clash else last[k]) for k in keys}


def sweep_points(grid: dict[str, list[Any]], sets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Cartesian product of the grid, times each explicit set (or once, if none)."""
    keys = list(grid)
    combos = [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))] or [{}]
    return [{**c, **s} for c in combos for s in (sets or [{}])]


def _apply_point(raw: dict[str, Any], point: dict[str, Any]) -> dict[str, Any]:
    n_arms = len(raw.get("arms") or [])
    for key, value in point.items():
        if "[*]" in key:
            for i in range(n_arms):
                raw = set_path(raw, key.replace("[*]", f"[{i}]"), value, label="sweep")
        else:
            raw = set_path(raw, key, value, label="sweep")
    return raw


def plan(spec_path: str | Path, overrides: list[str] | None = None) -> list[PlannedRun]:
    """Every run the sweep asks for, in a stable order: seed by seed (the spec's seed order), each
    seed's runs by (point, arm), so a sweep stopped early leaves whole seeds, paired across arms."""
    raw = read_spec_file(spec_path)
    for assignment in overrides or []:
        raw = apply_override(raw, assignment)
    base = spec_from_dict(raw)  # validates the whole file, sweep section included
    check_sinks(base.train.sinks)  # a missing tracker package refuses the sweep before any run
    sweep = base.sweep
    points = sweep_points(sweep.grid, sweep.sets) if sweep else [{}]
    short = _short_keys(list(dict.fromkeys(k for p in points for k in p)))
    raw = {k: v for k, v in raw.items() if k != "sweep"}
    out: list[PlannedRun] = []
    names: set[str] = set()
    for point in points:
        try:
            variant = spec_from_dict(_apply_point(raw, point))
        except SpecError as err:
            where = ", ".join(f"{k}={format_setting(v)}" for k, v in point.items())
            raise SpecError(f"sweep point {where}: {err}") from None
        suffix = "".join(f",{short[k]}={format_setting(v)}" for k, v in point.items())
        for arm in variant.arms:
            name = f"{arm.name}{suffix}"
            if name in names:
                raise SpecError(f"sweep: two points give the same run name {name!r}")
            names.add(name)
            renamed = arm.model_copy(update={"name": name})
            for seed in variant.seeds:
                # a run keeps the comparison only when its arm is one of the two it names (a renamed
                # arm, or a third arm beside them, is not: its one-arm spec could not be loaded)
                update = {"arms": [renamed], "seeds": [seed], "sweep": None, "executor": None}
                if suffix or not names_arm(variant.comparison, arm.name):
                    update["comparison"] = None
                run = variant.model_copy(update=update)
                out.append(
                    PlannedRun(
                        name=name,
                        base_arm=arm.name,
                        seed=seed,
                        settings=tuple(point.items()),
                        spec=run,
                        path=run_path(run.output_dir, run.name, name, seed),
                    )
                )
    first = {seed: i for i, seed in reversed(list(enumerate(r.seed for r in out)))}
    return sorted(out, key=lambda r: first[r.seed])


def shard(runs: list[PlannedRun], index: int, count: int) -> list[PlannedRun]:
    """Shard `index` of `count` (0-based): round-robin over the stable plan order, so the
    shards of a job array partition the plan exactly and stay balanced."""
    if count < 1 or not 0 <= index < count:
        raise SpecError(f"--shard: need 0 <= I < N, got {index}/{count}")
    return runs[index::count]


def shard_from_env(env: dict[str, str] | None = None) -> tuple[int, int] | None:
    """(index, count) from a job array's environment (SLURM, or our own GSPO_SHARD=I/N)."""
    env = os.environ if env is None else env
    if "GSPO_SHARD" in env:
        return parse_shard(env["GSPO_SHARD"])
    if "SLURM_ARRAY_TASK_ID" in env and "SLURM_ARRAY_TASK_COUNT" in env:
        first = int(env.get("SLURM_ARRAY_TASK_MIN", "0"))
        return int(env["SLURM_ARRAY_TASK_ID"]) - first, int(env["SLURM_ARRAY_TASK_COUNT"])
    return None


def parse_shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise SpecError(f"--shard: expected I/N (e.g. 0/4), got {text!r}") from None
    if n < 1 or not 0 <= i < n:
        raise SpecError(f"--shard: need 0 <= I < N, got {text}")
    return i, n


# ---------------------------------------------------------------------------------------
# Running a plan: checks and cold starts here, the training by an executor (train/executors/)


def prebuild_models(runs: list[PlannedRun], log) -> int:
    """Cold-start the built-in models the runs need once, here, with every core, before any
    job starts: otherwise N jobs would race to build the same model, each on its share of
    the cores. Each is built on the task exactly as its runs will see it, evaluation problems
    excluded (`plan_data`), so the runs find it in the cache. Returns how many distinct
    built-in models were checked. A bad model name or evaluation set (SpecError) refuses the
    whole sweep before anything starts; a model that fails to build (RunError) is left for
    its runs to report."""
    from gspo_cli.errors import RunError
    from gspo_cli.eval.sets import plan_data
    from gspo_cli.models import resolve_model_source
    from gspo_cli.tasks import make_task

    seen = set()
    for r in runs:
        m, t = r.spec.model, r.spec.task
        key = (m.model_dump_json(), t.model_dump_json())
        if not m.name.startswith("builtin:") or key in seen:
            continue
        seen.add(key)
        task = make_task(t.name, t.params)
        plan_data(r.spec, task)  # removes the evaluation problems from `task`, as each run does
        try:
            resolve_model_source(m, task, log=log)
        except RunError:
            pass
    return len(seen)


def check_run_dirs(runs: list[PlannedRun], force: bool) -> None:
    """Refuse, before any model is built, what each run's trainer would refuse once its model
    is: a completed run of another spec, or an unfinished one with a checkpoint to resume
    (`resume.decide_start`, SpecError naming the directory and the differing fields)."""
    from gspo_cli.distributed import DistInfo
    from gspo_cli.train.resume import decide_start

    for r in runs:
        decide_start(RunDir(r.path), r.spec, force, DistInfo())


def run_plan(
    runs: list[PlannedRun], *, jobs: int = 1, force: bool, log, executor=None, stop=None
) -> list[dict[str, Any]]:
    """Train the planned runs with `executor` (`train.executors.make_executor`; None: the
    local one, `jobs` processes at a time, each with its share of the cores). Completed runs are
    skipped, interrupted ones resume (the trainer's own rules, wherever it runs), but a run
    directory of another spec refuses the whole plan before anything is built or submitted
    (SpecError), as `gspo train` does. Built-in models are cold-started here first, once, so
    that no two runs race to build one (the model cache must be shared with a cluster's nodes).
    Returns one record per run (`executors.base.record`): its status, exit code and wall time;
    exit 4 for a run stopped, or still queued when the wait was interrupted. `stop`: a caller's
    own StopFlag (a command that trains round after round keeps one for all its rounds); None:
    the executor watches SIGINT/SIGTERM itself for this plan."""
    from gspo_cli.train.executors import make_executor

    executor = executor or make_executor(None, jobs=jobs)
    todo = [r for r in runs if force or r.status() != "completed"]
    check_run_dirs(runs, force)  # a completed run is skipped only with this spec and identity (decide_start)
    records = [record(r, "completed", 0, 0.0, skipped=True) for r in runs if r not in todo]
    for r in records:
        log(f"[{r['run']}/seed{r['seed']}] already completed; skipping")
    if not todo:
        return records
    prebuild_models(todo, log)
    return records + executor.run(todo, force=force, log=log, stop=stop)


def executor_for(spec: ExperimentSpec, kind: str | None = None, jobs: int = 1):
    """The executor a spec's `executor:` section asks for, with the command line's `--executor`
    (`kind`) and `--jobs` on top; a scheduler's job files go beside the experiment's runs."""
    from gspo_cli.train.executors import make_executor

    return make_executor(spec.executor, kind=kind, jobs=jobs, root=Path(spec.output_dir) / spec.name)
