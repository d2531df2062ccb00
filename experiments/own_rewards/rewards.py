"""Reward functions in TRL's style (GRPOTrainer's `reward_funcs`), used unchanged by
experiments/own_rewards.yaml. Each takes the completions and, by keyword, any dataset column
it needs (`answer` here), plus `completion_ids` and `trainer_state`; it returns one float per
completion, or None where it does not apply."""

import re

from math_verify import parse, verify

BOXED = re.compile(r"\\boxed\{[^{}]*\}")


def format_reward(completions, **kwargs):
    """1.0 when the completion puts its answer in \\boxed{}, else 0.0."""
    return [1.0 if BOXED.search(completion) else 0.0 for completion in completions]


def accuracy_reward(completions, answer, **kwargs):
    """1.0 when math-verify finds the completion's answer equal to the `answer` column, else 0.0;
    None (does not apply) for a row whose answer math-verify cannot read."""
    rewards = []
    for completion, gold in zip(completions, answer):
        gold_parsed = parse(f"${gold}$")
        if not gold_parsed:
            rewards.append(None)
            continue
        rewards.append(float(verify(gold_parsed, parse(completion))))
    return rewards


def length_penalty(completion_ids, trainer_state=None, **kwargs):
    """The completion's length in tokens (the spec gives it a negative weight). Off for the
    first 10 steps, to show `trainer_state.global_step` (None: not applied yet)."""
    if trainer_state is not None and trainer_state.global_step < 10:
        return [None] * len(completion_ids)
    return [float(len(ids)) for ids in completion_ids]
