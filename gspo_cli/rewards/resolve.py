"""The `task.rewards` entries (`RewardConfig`s) as callables (`resolve_rewards`), a task scored by
them (`with_rewards`), and the fingerprints of the files they come from."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gspo_cli.rewards.calls import Reward, row_columns
from gspo_cli.rewards.judge import make_judge
from gspo_cli.rewards.rewarded import RewardedTask
from gspo_cli.rewards.shipped import SHIPPED
from gspo_cli.rewards.sources import plugin_reward
from gspo_cli.tasks.base import Task
from gspo_cli.user_code import load_function


def with_rewards(task: Task, rewards: Sequence[Any] = (), model: Any = None) -> Task:
    """`task` scored by `rewards` (`task.rewards`, RewardConfigs) when there are any (each
    function loaded now), else `task` itself, scored by its own verifier (a prompts task has
    none: the spec refuses it without rewards). SpecError naming the field on an unloadable
    reward function. `model`: the spec's ModelConfig, whose device and dtype a reward model
    takes unless it names its own."""
    return RewardedTask(task, resolve_rewards(rewards, task, model)) if rewards else task


def resolve_rewards(configs: Sequence[Any], task: Task, model: Any = None) -> list[Reward]:
    """The `task.rewards` entries (`RewardConfig`s) as callables, each file, module and name
    checked now (before any model is built). SpecError naming `task.rewards[i].function` and
    what was found when one cannot be loaded. `model`: the spec's ModelConfig (a reward model's
    default device and dtype)."""
    out = []
    for i, cfg in enumerate(configs):
        where = f"task.rewards[{i}].function"
        if cfg.kind == "model":  # loaded now, before the policy (rewards/model.py)
            from gspo_cli.rewards.model import RewardModel

            defaults = (model.device, model.dtype) if model is not None else (None, None)
            rm = RewardModel(cfg.model, f"task.rewards[{i}].model.path", *defaults)
            out.append(Reward(cfg.label, cfg.weight, cfg.correct, rm, file=rm.what, digest=rm.digest))
            continue
        if cfg.kind == "judge":  # an LLM judge (judge.py): its template and server checked now
            judge = make_judge(cfg.judge, cfg.label, f"task.rewards[{i}].judge", _column_names(task))
            out.append(Reward(cfg.label, cfg.weight, cfg.correct, judge))
            continue
        if cfg.function in SHIPPED:
            call, shipped, file = SHIPPED[cfg.function](task), True, None
        elif ":" not in cfg.function:
            call, shipped, file = plugin_reward(cfg.function, where), False, None
        else:
            call, file = load_function(cfg.function, where)
            shipped = False
        source = (
            None
            if shipped or cfg.function is None
            else f"{file}:{cfg.function.rsplit(':', 1)[1]}"
            if file
            else cfg.function
        )
        out.append(Reward(cfg.label, cfg.weight, cfg.correct, call, shipped, file, source=source))
    return out


def _column_names(task: Task) -> set[str]:
    """Every dataset column the rows of `task` hand a reward (`row_columns`)."""
    rows = task.train_pool if task.train_pool is not None else task.eval_problems(1)
    return {k for p in rows for k in row_columns(p)}


def file_fingerprints(rewards: Sequence[Reward]) -> dict[str, str]:
    """{absolute path: 16 hex digits of sha256 of its content} of every FILE.py reward, and
    {a reward model's path: its weights' digest}."""
    return {
        r.file: r.digest or hashlib.sha256(Path(r.file).read_bytes()).hexdigest()[:16]
        for r in rewards
        if r.file is not None
    }
