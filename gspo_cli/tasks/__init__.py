"""Task families behind one interface (see `base.Task`)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ValidationError

from gspo_cli.errors import SpecError
from gspo_cli.spec.base import _did_you_mean
from gspo_cli.tasks.arithmetic import ArithmeticTask
from gspo_cli.tasks.base import Problem, Score, Task, extract_boxed
from gspo_cli.tasks.code import CodeTask
from gspo_cli.tasks.math import MathTask
from gspo_cli.tasks.prompts import PromptsTask
from gspo_cli.tasks.rewards import RewardedTask, resolve_rewards

# `arithmetic` is the synthetic generator on its own (the problems of `math` with source:
# synthetic); older specs name it directly.
TASKS: dict[str, Callable[..., Task]] = {
    "arithmetic": ArithmeticTask,
    "math": MathTask,
    "code": CodeTask,
    "prompts": PromptsTask,
}


def make_task(name: str, params: dict[str, Any], rewards: Sequence[Any] = ()) -> Task:
    """The task `name` with `params`, scored by `rewards` (`task.rewards`, RewardConfigs) when
    there are any (each function loaded now), else by its own verifier (a prompts task has
    none: the spec refuses it without rewards). SpecError naming the field on a bad parameter
    or an unloadable reward function."""
    task = _build_task(name, params)
    return RewardedTask(task, resolve_rewards(rewards, task)) if rewards else task


def _build_task(name: str, params: dict[str, Any]) -> Task:
    if name not in TASKS:
        raise SpecError(f"task.name: unknown task {name!r}; known: {', '.join(sorted(TASKS))}")
    try:
        return TASKS[name](**params)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        if first["type"] == "extra_forbidden":
            msg = "unknown key" + _did_you_mean(first["loc"][-1], _param_names(TASKS[name], err.title))
        else:
            msg = first["msg"].removeprefix("Value error, ")
        raise SpecError(f"task.params.{loc}: {msg}") from None


def _param_names(task_cls: type, model_name: str) -> list[str]:
    """The keys the task's parameter model (`model_name`, as the ValidationError titles it,
    defined or imported in the task's module) accepts; [] when it cannot be found."""
    model = vars(sys.modules[task_cls.__module__]).get(model_name)
    return list(getattr(model, "model_fields", {}))


__all__ = ["Problem", "Score", "Task", "TASKS", "extract_boxed", "make_task"]
