"""`task:` the training data (a task family, its parameters and source) and the evaluation data:
named evaluation sets, each its own task and source, or else a held-out split of the training
source (`eval_size` problems, removed from training)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from gspo_cli.spec.base import _check_dir_name, _Problems, _Strict


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


class TaskConfig(_Strict):
    """The task family that trains and evaluates the policy (see docs/guides/tasks.md)."""

    name: str = Field("arithmetic", description="task family: math, code or arithmetic")
    params: dict[str, Any] = Field(default_factory=dict, description="task-specific settings (difficulty, ...)")
    eval_size: int = Field(
        64, ge=0, description="without eval_sets: held-out problems of the training source (removed from training)"
    )
    eval_sets: list[EvalSetConfig] = Field(
        default_factory=list, description="named evaluation sets (they replace the held-out split)"
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
        if problems:
            raise _Problems("\n".join(problems))
        return self
