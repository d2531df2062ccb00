"""Environments of multi-turn rollouts (`task.environment`): the protocol (`protocol`), the
built-ins `python` (`python`) and `code_feedback` (`code_feedback`), and the user's own
(FILE.py:NAME or module:NAME), resolved by name here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gspo_cli.environments.code_feedback import CodeFeedback
from gspo_cli.environments.protocol import (
    PY_BLOCK,
    RAW_WRAP,
    EnvCompletion,
    Observation,
    as_observation,
    as_reward,
    as_start,
    env_reward,
    last_python_block,
    split_tool_output,
    takes_problem,
)
from gspo_cli.environments.python import PythonTool
from gspo_cli.errors import SpecError
from gspo_cli.user_code import load_function, output_to_stderr

ENVIRONMENTS: dict[str, Callable[..., Any]] = {"python": PythonTool, "code_feedback": CodeFeedback}


def resolve_environment(name: str, params: dict | None = None) -> Callable[[], Any]:
    """A factory of fresh environments for `task.environment` = `name` (a registered name or
    FILE.py:NAME / module:NAME), checked now, before any model is built: the file imports, NAME
    is defined and callable, and the objects it makes have `start` and `step`. SpecError in one
    line naming task.environment otherwise."""
    where = "task.environment"
    params = dict(params or {})
    if name in ENVIRONMENTS:
        factory = ENVIRONMENTS[name]
    elif ":" in name:
        factory, _ = load_function(name, where)  # the same loading and messages as reward functions
    else:
        raise SpecError(
            f"{where}: {name!r} is no built-in environment ({', '.join(ENVIRONMENTS)}); yours: FILE.py:NAME"
        )
    try:
        with output_to_stderr():  # what its __init__ prints is no part of the command's output
            probe = factory(**params)
    except Exception as err:  # noqa: BLE001 - the user's class: one line, naming it
        raise SpecError(f"{where}: {name}(**task.environment_params) fails ({type(err).__name__}: {err})") from None
    missing = [m for m in ("start", "step") if not callable(getattr(probe, m, None))]
    if missing:
        raise SpecError(
            f"{where}: {name} makes objects without {' and '.join(missing)}(); an environment defines "
            "start(prompt) and step(turn) -> (observation, done, reward) (docs/guides/tools.md)"
        )

    def fresh() -> Any:
        with output_to_stderr():
            return factory(**params)

    return fresh


def environment_file(name: str | None) -> str | None:
    """The absolute path of a FILE.py environment (fingerprinted with the run), else None."""
    if not name or ":" not in name or not name.rsplit(":", 1)[0].endswith(".py"):
        return None
    from pathlib import Path

    return str(Path(name.rsplit(":", 1)[0]).expanduser().resolve())


__all__ = [
    "ENVIRONMENTS",
    "PY_BLOCK",
    "RAW_WRAP",
    "EnvCompletion",
    "Observation",
    "as_observation",
    "as_reward",
    "as_start",
    "env_reward",
    "environment_file",
    "last_python_block",
    "resolve_environment",
    "split_tool_output",
    "takes_problem",
]
