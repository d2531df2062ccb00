"""The environment's own reward (rollout/turns.py sums what step() and finish() return) enters
the RL reward as the shipped reward `env` of task.rewards: weighted and summed with the
others, logged as reward/env, one more component for GDPO's normalize_then_sum."""

from types import SimpleNamespace

import pytest
import torch
from helpers import TINY

from gspo_cli.environments import EnvCompletion
from gspo_cli.errors import SpecError
from gspo_cli.rewards import RewardedTask, resolve_rewards
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.tasks import make_task
from gspo_cli.tasks.base import Problem
from gspo_cli.train.sampling import advantages


def _spec(rewards, group_size=4, **arm):
    task = {**TINY["task"], "environment": "python", "rewards": rewards}
    arms = [{"name": "a", "preset": "paper-grpo", **arm}]
    rollout = {**TINY["rollout"], "group_size": group_size}
    return spec_from_dict({**TINY, "task": task, "rollout": rollout, "arms": arms})


def _rewarded(spec):
    task = make_task(spec.task.name, spec.task.params)
    return RewardedTask(task, resolve_rewards(spec.task.rewards, task))


def test_the_env_reward_is_weighted_and_summed_with_the_others():
    spec = _spec([{"function": "env", "weight": 2.0}, {"function": "math_accuracy", "correct": True}])
    task = _rewarded(spec)
    p = Problem(id="1+2", prompt="1+2=?\n", answer="3")
    completions = [
        EnvCompletion("\\boxed{3}", 0.75),  # 2 x 0.75 + 1
        EnvCompletion("\\boxed{4}", -0.5),  # 2 x -0.5 + 0
        EnvCompletion("\\boxed{3}", None),  # the environment gave none: env does not apply
        "\\boxed{3}",  # sampled without an environment (gspo eval --no-tools)
    ]
    scores = task.score_rollout([p] * 4, completions)
    assert [s.reward for s in scores] == [2.5, -1.0, 1.0, 1.0]
    assert [s.components for s in scores] == [
        {"env": 0.75, "math_accuracy": 1.0},
        {"env": -0.5, "math_accuracy": 0.0},
        {"math_accuracy": 1.0},
        {"math_accuracy": 1.0},
    ]
    assert [s.correct for s in scores] == [True, False, True, True]


def test_gdpo_normalises_the_env_reward_as_one_more_component():
    spec = _spec([{"function": "env"}, {"function": "math_accuracy"}], 2, multi_reward="normalize_then_sum")
    task = _rewarded(spec)
    p = Problem(id="1+2", prompt="1+2=?\n", answer="3")
    env, right = [1.0, 0.0, 0.5, 0.5], ["3", "3", "3", "4"]
    scores = task.score_rollout([p] * 4, [EnvCompletion(f"\\boxed{{{a}}}", e) for e, a in zip(env, right)])
    ctx = SimpleNamespace(arm=spec.arms[0], spec=spec, dist=SimpleNamespace(enabled=False))
    adv = advantages(ctx, None, torch.tensor([s.reward for s in scores]), scores)
    # group 1: env (1, 0) -> +-1/sqrt(2), accuracy (1, 1) -> 0; group 2: env (.5, .5) -> 0,
    # accuracy (1, 0) -> +-1/sqrt(2); sums +-0.7071, their batch std sqrt(2/3): +-sqrt(3)/2
    want = 3**0.5 / 2
    assert adv.tolist() == pytest.approx([want, -want, want, -want], abs=1e-5)


def test_the_env_reward_needs_an_environment_and_code_feedback_the_code_task():
    with pytest.raises(SpecError, match=r"rewards\[0\].function: env is the environment's reward; no task.environment"):
        spec_from_dict({**TINY, "task": {**TINY["task"], "rewards": [{"function": "env"}]}})
    with pytest.raises(SpecError, match="code_feedback runs code problems' tests; task.name is arithmetic"):
        spec_from_dict({**TINY, "task": {**TINY["task"], "environment": "code_feedback"}})


def test_evaluation_hands_a_multi_turn_engine_the_rows_problems():
    """`sample_completions` (in-run evaluation and `gspo eval`) gives an engine that takes
    problems each row's, in order, so code_feedback evaluates as it trains."""
    from gspo_cli.eval.scores import sample_completions

    class Engine:
        takes_problems, calls = True, []

        def generate(self, prompts, problems=None):
            self.calls.append((list(prompts), [p.id for p in problems]))
            return SimpleNamespace(completions=[EnvCompletion(p, 1.0) for p in prompts])

    problems = [Problem(id=str(i), prompt=f"q{i}", answer="") for i in range(3)]
    got = sample_completions(Engine(), problems, samples=2, batch_size=4)
    assert Engine.calls == [(["q0", "q0", "q1", "q1"], ["0", "0", "1", "1"]), (["q2", "q2"], ["2", "2"])]
    assert got == [["q0", "q0"], ["q1", "q1"], ["q2", "q2"]] and got[2][1].env_reward == 1.0
