"""Task families behind one interface (see `base.Task`): problem sources and their verifiers,
the built-ins in `TASKS`, and those installed packages register (`gspo_cli.plugins`, group
gspo_cli.tasks). A task scored by reward functions instead of its verifier is made by
`gspo_cli.rewards.with_rewards`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from gspo_cli.errors import SpecError
from gspo_cli.plugins import TASKS_GROUP, load_plugin, plugin_names
from gspo_cli.spec.base import _did_you_mean
from gspo_cli.tasks.arithmetic import ArithmeticTask
from gspo_cli.tasks.base import Problem, Score, Task, extract_boxed
from gspo_cli.tasks.code import CodeTask
from gspo_cli.tasks.math import MathTask
from gspo_cli.tasks.prompts import PromptsTask

# `arithmetic` is the synthetic generator on its own (the problems of `math` with source:
# synthetic); older specs name it directly.
TASKS: dict[str, Callable[..., Task]] = {
    "arithmetic": ArithmeticTask,
    "math": MathTask,
    "code": CodeTask,
    "prompts": PromptsTask,
}


def make_task(name: str, params: dict[str, Any]) -> Task:
    """The task `name` with `params`, scored by its own verifier (`gspo_cli.rewards.with_rewards`
    scores it by `task.rewards` instead). SpecError naming the field on a bad parameter."""
    return _build_task(name, params)


def task_names() -> list[str]:
    """Every name `task.name` may take: the built-ins' and the installed plugins' (not imported)."""
    return sorted({*TASKS, *plugin_names(TASKS_GROUP)})


def task_factory(name: str) -> Callable[..., Task]:
    """What builds the task `name` from its params: a built-in, else the plugin that registers
    it (imported now). SpecError naming task.name for an unknown name or a broken plugin."""
    if name in TASKS:
        return TASKS[name]
    try:
        factory = load_plugin(TASKS_GROUP, name)
    except SpecError as err:
        raise SpecError(f"task.name: {err}") from None
    if factory is None:
        raise SpecError(f"task.name: unknown task {name!r}; known: {', '.join(task_names())}")
    return factory


def _build_task(name: str, params: dict[str, Any]) -> Task:
    factory = task_factory(name)
    try:
        task = factory(**params)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        if first["type"] == "extra_forbidden":
            msg = "unknown key" + _did_you_mean(first["loc"][-1], _param_names(factory, err.title))
        else:
            msg = first["msg"].removeprefix("Value error, ")
        raise SpecError(f"task.params.{loc}: {msg}") from None
    except SpecError:
        raise  # a built-in task's message (a plugin may derive from one), already one line
    except Exception as err:
        if name in TASKS:
            raise  # ours: a bug
        # A plugin's own check of its params: one line naming it, never a traceback.
        first_line = (str(err).splitlines() or [""])[0]
        raise SpecError(f"task.params: plugin task {name!r} refused them: {type(err).__name__}: {first_line}") from None
    if not isinstance(task, Task):
        raise SpecError(f"task.name: plugin task {name!r} built a {type(task).__name__}, not a gspo_cli.tasks.Task")
    return task


def _param_names(task_cls: type, model_name: str) -> list[str]:
    """The keys the task's parameter model (`model_name`, as the ValidationError titles it,
    defined or imported in the module of the task or of a class it derives from, as a plugin's
    task may) accepts; [] when it cannot be found."""
    for cls in getattr(task_cls, "__mro__", (task_cls,)):
        model = vars(sys.modules.get(cls.__module__, sys)).get(model_name)
        if hasattr(model, "model_fields"):
            return list(model.model_fields)
    return []


__all__ = ["Problem", "Score", "Task", "TASKS", "extract_boxed", "make_task", "task_factory", "task_names"]
