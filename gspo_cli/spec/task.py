"""`task:` the training data (a task family, its parameters and source) and the evaluation data:
named evaluation sets, each its own task and source, or else a held-out split of the training
source (`eval_size` problems, removed from training)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from gspo_cli.metrics import METRICS, SPREAD_SUFFIX, reward_std_key
from gspo_cli.spec.base import _check_dir_name, _Problems, _Strict

# Names a reward cannot take: reward/<name> would be a metric the trainer logs already, or a
# task's own verdict (math and code log reward/correct and reward/format).
TASK_COMPONENTS = ("correct", "format")


def source_problem(source: Any) -> str | None:
    """Why `source` cannot be a dataset, found without reading it (None: it may be one): not a
    string, a local path that does not exist, cannot be read, or a directory that no
    `save_to_disk` wrote. Everything else (format, schema) is the task's loader's to say."""
    if not isinstance(source, str) or not source:
        return f"expected a file path, synthetic or hub:<id> (got {source!r})"
    if source == "synthetic" or source.startswith("hub:"):
        return None
    path = Path(source).expanduser()
    if not path.exists():
        return f"no such file {source}"
    if not os.access(path, os.R_OK):
        return f"{source}: permission denied"
    if path.is_dir() and not any((path / f).is_file() for f in ("state.json", "dataset_dict.json")):
        return f"{source}: is a directory, not a dataset file or a save_to_disk directory"
    return None


class EvalSetConfig(_Strict):
    """One named evaluation set: scored at step 0, every `every` steps and at the end of
    training, logged as eval/<name>/<score>, and re-scored by `gspo eval RUN [--set NAME]`.
    Its problems are never trained on (matched by normalised text)."""

    name: str = Field(description="the set's name in logs, tables and figures, e.g. aime24")
    task: str = Field("math", description="task family that reads and scores it: math | code")
    params: dict[str, Any] = Field(description="that task's parameters; `source` (a file or hub:<id>) required")
    samples: int | None = Field(None, ge=1, description="K completions per problem (default: train.eval_samples)")
    max_tokens: int | None = Field(
        None, ge=1, description="new tokens per completion (default: rollout.max_new_tokens)"
    )
    size: int | None = Field(None, ge=1, description="score the first N problems only (default: all)")
    every: int | None = Field(
        None, ge=0, description="steps between scorings (default: train.eval_every; 0: start/end)"
    )

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        return _check_dir_name(v, "evaluation set names")

    @model_validator(mode="after")
    def _source(self):
        if "source" not in self.params:
            raise _Problems("params.source: missing (the set's data: a file, save_to_disk directory or hub:<id>)")
        why = source_problem(self.params["source"])
        if why:
            raise _Problems(f"params.source: {why}")
        return self


def reserved_reward_names() -> list[str]:
    """What `task.rewards[].name` cannot be: every `reward/<x>` metric's x, and the tasks' own
    component names."""
    logged = [k.split("/", 1)[1] for k in METRICS if k.startswith("reward/")]
    return sorted({*logged, *TASK_COMPONENTS})


def reward_label(function: str, name: str | None = None) -> str:
    """A reward's name in logs (reward/<label>): `name`, else the function's own name (the part
    after the last `:`). Also how `gspo compare` and `gspo plot` read a stored spec's rewards."""
    return name if name is not None else str(function).rsplit(":", 1)[-1]


class RewardConfig(_Strict):
    """One reward function (TRL's convention: `fn(prompts, completions, completion_ids, **columns)`
    returning one float or None per completion). The rewards' weighted sum is what RL optimises."""

    function: str = Field(
        description="FILE.py:NAME (relative to the working directory), module:NAME, or the name of a shipped "
        "reward (math_accuracy, code_tests) or a plugin's (`gspo plugins` lists them)"
    )
    weight: float = Field(1.0, description="its weight in the sum RL optimises")
    name: str | None = Field(None, description="logged as reward/<name> (default: the function's name)")
    correct: bool = Field(False, description="this reward decides correctness (value >= 1) for pass@k; at most one")

    @field_validator("function")
    @classmethod
    def _function_form(cls, v: str) -> str:
        if not v or v != v.strip() or (":" in v and not all(v.rsplit(":", 1))):
            raise ValueError(f"expected FILE.py:NAME, module:NAME or a shipped reward's name (got {v!r})")
        target, _, name = v.rpartition(":")
        if target.endswith(".py"):  # stored absolute: sweeps, --resume and gspo eval find the same file
            return f"{Path(target).expanduser().absolute()}:{name}"
        return v

    @property
    def label(self) -> str:
        """The reward's name in logs: `name`, else the function's own name."""
        return reward_label(self.function, self.name)

    @model_validator(mode="after")
    def _label_ok(self):
        label = self.label
        if not label or "/" in label or label != label.strip():
            raise _Problems(f"name: {label!r} cannot name a metric (no '/', not empty)")
        if label in reserved_reward_names():
            raise _Problems(
                f"name: {label!r} is a metric gspo logs already (reward/{label}); reserved: "
                f"{', '.join(reserved_reward_names())}; give the reward another name"
            )
        return self


class TaskConfig(_Strict):
    """The task family that trains and evaluates the policy (see docs/guides/tasks.md)."""

    name: str = Field(
        "arithmetic",
        description="task family: math, code, arithmetic, prompts (your own data, scored by task.rewards) or "
        "a plugin's (`gspo plugins` lists them)",
    )
    params: dict[str, Any] = Field(default_factory=dict, description="task-specific settings (difficulty, ...)")
    eval_size: int = Field(
        64, ge=0, description="without eval_sets: held-out problems of the training source (removed from training)"
    )
    eval_sets: list[EvalSetConfig] = Field(
        default_factory=list, description="named evaluation sets (they replace the held-out split)"
    )
    rewards: list[RewardConfig] = Field(
        default_factory=list,
        description="reward functions whose weighted sum RL optimises (empty: the task's own reward; the "
        "prompts task needs at least one)",
    )

    @model_validator(mode="after")
    def _check(self):
        # The training source is checked by its task's loader (before any model is built);
        # evaluation sources here, so a stored spec names every file it needs.
        problems = []
        names = [s.name for s in self.eval_sets]
        for i, n in enumerate(names):
            if n in names[:i]:
                problems.append(f"eval_sets[{i}].name: duplicate name {n!r} (also eval_sets[{names.index(n)}])")
        labels = [r.label for r in self.rewards]
        for i, n in enumerate(labels):
            if n in labels[:i]:
                problems.append(f"rewards[{i}].name: duplicate name {n!r} (also rewards[{labels.index(n)}])")
            elif (stem := n.removesuffix(SPREAD_SUFFIX)) != n and stem in labels:  # reward/<stem>_std is taken
                problems.append(
                    f"rewards[{i}].name: {n!r} would be logged as {reward_std_key(stem)}, the spread of reward "
                    f"{stem!r}; give the reward another name"
                )
        if not self.rewards and "prompts" in (self.name, *(s.task for s in self.eval_sets)):
            problems.append("rewards: the prompts task is scored by reward functions only; list at least one")
        judges = [i for i, r in enumerate(self.rewards) if r.correct]
        if len(judges) > 1:
            problems.append(
                f"rewards[{judges[1]}].correct: only one reward decides correctness (also rewards[{judges[0]}])"
            )
        if problems:
            raise _Problems("\n".join(problems))
        return self
