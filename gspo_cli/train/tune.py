"""`gspo tune`: plan the tuning runs of a spec's `tune:` section (every arm's grid on one budget)
and, once each arm's setting is selected, the final runs on fresh seeds.

Layout under <output_dir>/<experiment>/: `tuning/<arm>,<settings>/seed<k>/` (each grid point on
tune.seeds for tune.steps), `final/<arm>/seed<k>/` (the selected setting on tune.final_seeds for
train.steps), REPORT.md and tune.json. Every run is an ordinary run directory trained by the sweep
runner (`sweep.run_plan`, through the command's executor): completed runs are kept, interrupted
ones resume, a run of another spec is refused. Planning loads no model.

`tune_state.json` beside them is written after each round (the tuning runs, the final runs): how
each round's runs ended, the selection once the tuning round completed, and the round a rerun
with --resume starts from. The selection a rerun computes from the tuning runs must be the one
recorded there: the final runs trained on it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from gspo_cli.errors import SpecError
from gspo_cli.jsonl import write_json_atomic
from gspo_cli.runs import format_setting, run_path
from gspo_cli.spec import ExperimentSpec
from gspo_cli.spec.loading import apply_override, read_spec_file, set_path, spec_from_dict
from gspo_cli.train.sweep import PlannedRun, _short_keys

TUNING, FINAL = "tuning", "final"
STATE_FILE = "tune_state.json"


def load(spec_path: str | Path, overrides: list[str] | None = None) -> tuple[dict[str, Any], ExperimentSpec]:
    """The raw mapping (overrides applied) and the validated spec; SpecError without a tune section."""
    raw = read_spec_file(spec_path)
    for assignment in overrides or []:
        raw = apply_override(raw, assignment)
    spec = spec_from_dict(raw)
    if spec.tune is None:
        raise SpecError(f"{spec_path}: no tune: section (per-arm grids, selection_set, test_set): see gspo schema")
    return raw, spec


def check_budgets(spec: ExperimentSpec, unequal: bool) -> dict[str, int]:
    """Each arm's tuning budget in training steps; SpecError when they differ and not `unequal`."""
    tune = spec.tune
    budgets = {arm: tune.budget(arm, spec.train.steps) for arm in tune.grids}
    if len(set(budgets.values())) > 1 and not unequal:
        seeds, steps = len(tune.seeds), tune.steps or spec.train.steps
        parts = ", ".join(f"{a} {len(tune.points(a))} settings ({b} steps)" for a, b in budgets.items())
        raise SpecError(
            f"tune: unequal budgets ({seeds} seed(s) x {steps} steps per setting): {parts}; give every arm as many "
            "settings, or pass --unequal to compare them anyway (the report says so)"
        )
    return budgets


def selection_metric(spec: ExperimentSpec) -> str:
    """tune.metric (default avg@K, K the selection set's samples); SpecError, before any run trains,
    for a score the selection set's evaluation never writes."""
    import re

    from gspo_cli.eval.scores import FAILURE_COMPONENTS, pass_ks

    tune = spec.tune
    cfg = next(c for c in spec.task.eval_sets if c.name == tune.selection_set)
    K = cfg.samples or spec.train.eval_samples
    if tune.metric is None:
        return f"avg@{K}"
    known = [f"avg@{K}", *(f"pass@{k}" for k in pass_ks(K)), f"maj@{K}", "rating", "reward_mean"]
    known += [f"{c}_frac" for c in FAILURE_COMPONENTS]
    if tune.metric in known or re.fullmatch(r"reward_\w+", tune.metric):
        return tune.metric
    raise SpecError(
        f"tune.metric: {tune.metric!r} is not a score of {tune.selection_set} ({K} samples per problem): "
        f"one of {', '.join(known)} or reward_<name>"
    )


def check_disjoint(spec: ExperimentSpec) -> tuple[int, int]:
    """The selection and test sets' sizes; SpecError when they share a problem (matched as training
    exclusion matches them: normalised statement text)."""
    from gspo_cli.eval.sets import named_set
    from gspo_cli.tasks.base import problem_key

    tune = spec.tune
    index = {c.name: i for i, c in enumerate(spec.task.eval_sets)}
    sel, test = (named_set(spec.task.eval_sets[index[n]], index[n], spec) for n in (tune.selection_set, tune.test_set))
    keys = {problem_key(p) for p in sel.problems}
    shared = [p for p in test.problems if problem_key(p) in keys]
    if shared:
        example = shared[0].prompt.strip().splitlines()[0][:60]
        raise SpecError(
            f"tune: the selection set {sel.name} and the test set {test.name} share {len(shared)} of "
            f"{len(test.problems)} problems (e.g. {example!r}); selecting on problems you compare on decides the "
            "comparison: make them disjoint (task.eval_sets[].skip splits one source)"
        )
    return len(sel.problems), len(test.problems)


def root(spec: ExperimentSpec) -> Path:
    return Path(spec.output_dir) / spec.name


def point_name(arm: str, point: dict[str, Any]) -> str:
    short = _short_keys(list(point))
    return arm + "".join(f",{short[k]}={format_setting(v)}" for k, v in point.items())


def _variant(
    raw: dict[str, Any], arm: str, point: dict[str, Any], hidden: str | None = None, **fields
) -> ExperimentSpec:
    """`raw` with only `arm`, `point` applied (`arm.X` on that arm) and `fields` set; the evaluation
    set named `hidden` is not scored."""
    # a run's spec says what it is, never where it trains (as a sweep's runs)
    base = {k: v for k, v in raw.items() if k not in ("tune", "sweep", "comparison", "executor")}
    if hidden:  # kept out of training, never scored: no test-set number exists before the selection
        task = dict(base["task"])
        task["eval_sets"] = [{**c, "scored": False} if c.get("name") == hidden else c for c in task["eval_sets"]]
        base["task"] = task
    base["arms"] = [a for a in raw["arms"] if a.get("name") == arm]
    for key, value in point.items():
        path = "arms[0]." + key[4:] if key.startswith("arm.") else key
        base = set_path(base, path, value, label=f"tune.grids.{arm}")
    for key, value in fields.items():
        base = set_path(base, key, value, label="tune")
    try:
        return spec_from_dict(base)
    except SpecError as err:
        where = ", ".join(f"{k}={format_setting(v)}" for k, v in point.items())
        raise SpecError(f"tune.grids.{arm} at {where}: {err}") from None


def tuning_runs(raw: dict[str, Any], spec: ExperimentSpec) -> list[PlannedRun]:
    """Every grid point of every arm on tune.seeds, in a stable order (arm, point, seed). The test set
    stays out of their training and is never scored by them (the selection sees no test number)."""
    tune, out = spec.tune, []
    where = str(root(spec))
    for arm in tune.grids:
        for point in tune.points(arm):
            name = point_name(arm, point)
            steps = tune.steps or spec.train.steps
            variant = _variant(
                raw, arm, point, hidden=tune.test_set, output_dir=where, name=TUNING, **{"train.steps": steps}
            )
            renamed = variant.arms[0].model_copy(update={"name": name})
            for seed in tune.seeds:
                run = variant.model_copy(update={"arms": [renamed], "seeds": [seed]})
                out.append(PlannedRun(name, arm, seed, tuple(point.items()), run, run_path(where, TUNING, name, seed)))
    return out


def final_runs(raw: dict[str, Any], spec: ExperimentSpec, selected: dict[str, dict[str, Any]]) -> list[PlannedRun]:
    """Each arm at its selected point, under its own name, on tune.final_seeds for train.steps."""
    out, where = [], str(root(spec))
    for arm, point in selected.items():
        variant = _variant(raw, arm, point, output_dir=where, name=FINAL)
        for seed in spec.tune.final_seeds:
            run = variant.model_copy(update={"seeds": [seed]})
            out.append(PlannedRun(arm, arm, seed, tuple(point.items()), run, run_path(where, FINAL, arm, seed)))
    return out


def read_state(spec: ExperimentSpec) -> dict[str, Any] | None:
    """The tune's `tune_state.json`; None when there is none (or it cannot be read)."""
    try:
        state = json.loads((root(spec) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def write_state(
    spec: ExperimentSpec, phase: str, records: list[dict[str, Any]], selected: dict[str, dict] | None = None
) -> Path:
    """Record that round `phase` (tuning, final) ended with `records` (one per run: run, seed, status,
    exit) in `tune_state.json`, with the selection once known (arm -> settings); `next` says where a
    rerun with --resume starts: the same round while one of its runs did not complete, else the
    next round (final, then report). Written atomically; earlier rounds' entries are kept."""
    state = read_state(spec) or {}
    done = all(r["status"] in ("completed", "diverged") for r in records)
    following = {TUNING: FINAL, FINAL: "report"}[phase]
    state.update(experiment=spec.name, updated_at=time.strftime("%Y-%m-%dT%H:%M:%S"), next=following if done else phase)
    state[phase] = [{k: r.get(k) for k in ("run", "seed", "status", "exit")} for r in records]
    if selected is not None:
        state["selected"] = selected
    path = root(spec) / STATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, state)
    return path


def check_selection(state: dict[str, Any] | None, selected: dict[str, dict]) -> None:
    """SpecError when an earlier session recorded another selection than `selected` (the tuning
    runs changed since: the final runs trained on the recorded one)."""
    recorded = (state or {}).get("selected")
    if recorded is None:
        return
    if json.loads(json.dumps(selected)) != recorded:
        raise SpecError(
            f"tune: the tuning runs now select {_settings(selected)}, but {STATE_FILE} recorded "
            f"{_settings(recorded)} (the final runs train on that): a tuning run changed since; restore it, or "
            "remove the final runs and tune_state.json to select again"
        )


def _settings(selected: dict[str, dict]) -> str:
    return "; ".join(
        f"{arm} " + ", ".join(f"{k}={format_setting(v)}" for k, v in p.items()) for arm, p in selected.items()
    )


__all__ = [
    "FINAL",
    "STATE_FILE",
    "TUNING",
    "check_budgets",
    "check_disjoint",
    "check_selection",
    "final_runs",
    "load",
    "point_name",
    "read_state",
    "selection_metric",
    "root",
    "tuning_runs",
    "write_state",
]
