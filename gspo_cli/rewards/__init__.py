"""Reward functions named in `task.rewards`, called with TRL's convention.

A function is `FILE.py:NAME`, `module:NAME`, the name of a reward we ship (`SHIPPED`) or of
one an installed package registers (`gspo_cli.plugins`, group gspo_cli.rewards). User and plugin
functions are called exactly as TRL's GRPOTrainer calls them, so one written for TRL runs
unchanged:

    fn(prompts=[...], completions=[...], completion_ids=[[...], ...], trainer_state=state, **columns)

one value per completion, `columns` every other dataset column by name (one value per row).
A value is a number or None ("does not apply to this row"). The reward RL optimises is the
weighted sum over the rewards that apply (TRL's nansum); a row none applies to gets 0 (advantage 0).

The modules: `shipped` (the rewards we ship), `sources` (user code and plugins), `resolve`
(`task.rewards` to callables; `with_rewards`), `rewarded` (the task scored by them), `calls`
(one batch's calls and the check of what they return), `pool` and `user_functions` (the worker
pool and what a call of user code may do), `model` (reward models), `judge` (LLM judges).
"""

from gspo_cli.rewards.resolve import file_fingerprints, resolve_rewards, with_rewards
from gspo_cli.rewards.rewarded import RewardedTask
from gspo_cli.rewards.shipped import SHIPPED
from gspo_cli.rewards.sources import load_source, registered

__all__ = [
    "SHIPPED",
    "RewardedTask",
    "file_fingerprints",
    "load_source",
    "registered",
    "resolve_rewards",
    "with_rewards",
]
