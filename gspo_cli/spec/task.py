"""`task:` which task family trains the policy, its parameters and held-out size."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from gspo_cli.spec.base import _Strict


class TaskConfig(_Strict):
    """The task family that trains and evaluates the policy (see docs/guides/tasks.md)."""

    name: str = Field("arithmetic", description="task family: math, code or arithmetic")
    params: dict[str, Any] = Field(default_factory=dict, description="task-specific settings (difficulty, ...)")
    eval_size: int = Field(64, ge=0, description="held-out problems scored at each evaluation")
