"""`task:` which task family trains the policy, its parameters and held-out size."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from gspo_cli.spec.base import _Strict


class TaskConfig(_Strict):
    name: str = "arithmetic"
    params: dict[str, Any] = Field(default_factory=dict, description="task-specific settings (difficulty, ...)")
    eval_size: int = Field(64, ge=0)
