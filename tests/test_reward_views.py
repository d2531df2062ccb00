"""Named rewards (task.rewards) shown by every view: the spread the trainer logs beside each
reward's mean, and `gspo compare`, `gspo plot`, `gspo samples` and `gspo report` on hand-written
run directories whose values are known (no training)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from gspo_cli.metrics import describe, reward_std_key
from gspo_cli.spec.task import TaskConfig
from gspo_cli.tasks import Score
from gspo_cli.train.stats import StepStats, record_batch

# --------------------------------------------------------------------------- the metric


def test_step_logs_each_rewards_spread_beside_its_mean():
    comps = [{"a": 1.0, "b": 0.0}, {"a": 0.0}, {"a": 1.0, "b": 1.0}, {"a": 1.0}]
    scores = [Score(reward=sum(c.values()), correct=False, components=c, rewarded=True) for c in comps]
    n = len(scores)
    batch = SimpleNamespace(response_mask=torch.ones(n, 2), truncated=torch.zeros(n, dtype=torch.bool))
    stats = StepStats()
    record_batch(stats, batch, scores, torch.tensor([s.reward for s in scores]), torch.zeros(n, 2), 2, 0.1)
    m = stats.reduce(SimpleNamespace(enabled=False, world_size=1, is_main=True))
    assert m["reward/a"] == 0.75 and m["reward/b"] == 0.5
    # sample std (n - 1, as reward/std) over the rows each reward applies to: [1, 0, 1, 1] and [0, 1]
    assert m[reward_std_key("a")] == pytest.approx(0.5)
    assert m["reward/b_std"] == pytest.approx(math.sqrt(0.5))
    assert describe("reward/b_std") == ("standard deviation of reward b over the rows it applies to", "reward")
    assert describe("reward/b")[0].startswith("mean of reward b over the rows it applies to")


def test_a_reward_named_as_anothers_spread_is_refused():
    rewards = [{"function": "math_accuracy", "name": "acc"}, {"function": "math_accuracy", "name": "acc_std"}]
    with pytest.raises(ValueError, match=r"'acc_std' would be logged as reward/acc_std, the spread of reward 'acc'"):
        TaskConfig.model_validate({"name": "math", "rewards": rewards})
    TaskConfig.model_validate({"name": "math", "rewards": [rewards[1]]})  # alone it is a name like any
