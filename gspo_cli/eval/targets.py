"""What `gspo eval` evaluates: the target (a run, checkpoint, model or built-in model), the task
it is scored on and with which rewards, and the tokenizer that gives reward functions their
`completion_ids` when completions were made elsewhere.

Imports neither torch nor transformers unless a tokenizer must be loaded."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gspo_cli.errors import SpecError
from gspo_cli.rewards import with_rewards
from gspo_cli.runs import RunDir
from gspo_cli.spec import ExperimentSpec, RewardConfig
from gspo_cli.spec.loading import load_spec
from gspo_cli.spec.task import check_reward_names
from gspo_cli.tasks import TASKS, Task, make_task, task_names


@dataclass
class Target:
    source: str  # what load_model loads: a model directory, hub id or builtin:<kind>
    run_dir: Path | None = None  # the run it belongs to, if any
    checkpoint: str | None = None  # step_XXXXXX, for checkpoints of a run
    spec: ExperimentSpec | None = None  # the run's resolved spec, if any


def resolve_target(target: str, checkpoint: str | None = None) -> Target:
    """What `target` names. SpecError (one line) for a path that is neither a run, a checkpoint
    nor a model directory, or a `checkpoint` the run does not have."""
    path = Path(target).expanduser()
    if path.is_dir() and (path / "spec.yaml").is_file():
        rd = RunDir(path)
        dirs = rd.checkpoint_dirs()
        if checkpoint is not None:
            name = f"step_{int(checkpoint):06d}" if checkpoint.isdigit() else checkpoint
            chosen = rd.checkpoints / name
            if chosen not in dirs:
                have = ", ".join(d.name for d in dirs) or "none"
                raise SpecError(f"--checkpoint: {target} has no checkpoint {name!r} (it has: {have})")
        elif not dirs:
            raise SpecError(f"TARGET: run directory {target} has no checkpoints (checkpoints/step_*/)")
        else:
            chosen = dirs[-1]
        return Target(str(rd.hf_weights(chosen)), path, chosen.name, load_spec(rd.spec_file))
    if checkpoint is not None:
        raise SpecError(f"--checkpoint: {target} is not a run directory (no spec.yaml)")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SpecError(
                f"TARGET: {target} is neither a run directory (spec.yaml) nor a model directory (config.json)"
            )
        run = path.parent.parent
        if path.parent.name == "checkpoints" and (run / "spec.yaml").is_file():
            return Target(str(RunDir(run).hf_weights(path)), run, path.name, load_spec(run / "spec.yaml"))
        return Target(str(path))
    if path.exists():
        raise SpecError(f"TARGET: {target} is a file; expected a run, checkpoint or model directory, or a model id")
    if target.startswith((".", "/", "~")):
        raise SpecError(f"TARGET: no such directory {target}")
    return Target(target)  # a hub id or builtin:<kind>; load_model says if it cannot be had


def resolve_run(target: str) -> Target:
    """A run directory, for its task only (scoring completions made elsewhere for it)."""
    path = Path(target).expanduser()
    if not (path / "spec.yaml").is_file():
        raise SpecError(
            f"TARGET: with --completions, TARGET must be a run directory (spec.yaml), for its task; got {target}"
        )
    return Target(source="", run_dir=path, spec=load_spec(path / "spec.yaml"))


def resolve_task(
    spec: ExperimentSpec | None, name: str | None, dataset: str | None, rewards: list[RewardConfig] | None = None
) -> Task:
    """The task to score on: the run's, or `name`; `dataset` replaces its `source` and drops
    the knobs only the synthetic generator uses. Scored by `rewards` (--reward) when given,
    else by the run's task.rewards for the run's task, else by its own verifier; every reward
    function loaded now, before any model. SpecError for a prompts task without rewards."""
    if name is None and spec is None:
        raise SpecError("--task: needed when TARGET is not a run directory (known: " + ", ".join(task_names()) + ")")
    name = name or spec.task.name
    params: dict[str, Any] = dict(spec.task.params) if spec is not None and spec.task.name == name else {}
    if dataset is not None:
        synthetic_only = getattr(TASKS.get(name), "synthetic_params", ())
        params = {k: v for k, v in params.items() if k not in synthetic_only}
        params["source"] = dataset
    flag = rewards is not None
    if not flag:  # the run's rewards, for the run's task
        rewards = list(spec.task.rewards) if spec is not None and spec.task.name == name else []
    if name == "prompts" and not rewards:
        raise SpecError(
            "--reward: the prompts task is scored by reward functions only: give --reward FILE.py:NAME "
            "(repeatable), or a run trained on prompts as TARGET"
        )
    try:
        # a reward model takes the run's model.device and model.dtype, as in training
        return with_rewards(make_task(name, params), rewards, spec.model if spec is not None else None)
    except SpecError as err:  # --reward's entries speak of themselves, not of a spec's task.rewards
        raise SpecError(str(err).replace("task.rewards[", "--reward[", 1) if flag else str(err)) from None


def parse_rewards(items: list[str] | None) -> list[RewardConfig] | None:
    """`--reward` values as RewardConfigs (None: none given). Each is a function as task.rewards
    names one (FILE.py:NAME, module:NAME, a shipped or plugin reward), or a YAML mapping of a
    task.rewards entry, e.g. `{function: r.py:acc, correct: true, weight: 2}`. SpecError naming
    --reward[i] for an entry the spec would refuse (duplicate names, two `correct`, ...)."""
    if not items:
        return None
    import yaml
    from pydantic import ValidationError

    out = []
    for i, item in enumerate(items):
        try:
            value = yaml.safe_load(item)
        except yaml.YAMLError:
            value = item
        entry = value if isinstance(value, dict) else {"function": item}
        try:
            out.append(RewardConfig(**entry))
        except ValidationError as err:
            first = err.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise SpecError(
                f"--reward[{i}]{'.' + loc if loc else ''}: {first['msg'].removeprefix('Value error, ')}"
            ) from None
        except TypeError:
            raise SpecError(f"--reward[{i}]: expected FILE.py:NAME or a mapping such as {{function: ..}}") from None
    problems = check_reward_names(out, "--reward")
    if problems:
        raise SpecError(problems[0])
    return out


def completions_tokenizer(task: Task, given: str | None, run: Target | None, log: Callable[[str], None]):
    """The tokenizer whose ids reward functions get as `completion_ids` when scoring completions
    made elsewhere: `given` (--tokenizer: a model directory or hub id), else the run's (its
    latest checkpoint's, else its model's when that is a directory or a cached hub id). None when
    the task needs none (scored by its own verifier or shipped rewards only) or none is known;
    then the reward functions' `completion_ids` refuse to be read (see `eval.scores.NoTokenIds`).
    SpecError (one line) for a --tokenizer that cannot be loaded."""
    if given is None and not any(not r.shipped for r in getattr(task, "rewards", ())):
        return None
    candidates: list[tuple[str, bool]] = []  # (source, local files only)
    if given is not None:
        candidates.append((given, False))
    elif run is not None and run.run_dir is not None:
        ckpts = RunDir(run.run_dir).checkpoint_dirs()
        if ckpts:
            candidates.append((str(ckpts[-1]), True))
        if run.spec is not None and not run.spec.model.name.startswith("builtin:"):
            candidates.append((run.spec.model.name, True))
    if not candidates:
        return None
    from gspo_cli.models.loading import quiet_transformers

    quiet_transformers()
    from transformers import AutoTokenizer

    for source, local in candidates:
        try:
            tok = AutoTokenizer.from_pretrained(source, local_files_only=local)
        except Exception as err:  # noqa: BLE001 - not a tokenizer: the next candidate, or one line
            if given is not None:
                first = (str(err).strip().splitlines() or [type(err).__name__])[0]
                raise SpecError(f"--tokenizer: cannot load a tokenizer from {given!r}: {first}") from None
            continue
        log(f"completion_ids: token ids of the tokenizer of {source}")
        return tok
    return None
