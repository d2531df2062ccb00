"""Held-out evaluation: avg@k and the unbiased pass@k estimator."""

from __future__ import annotations

from math import comb

import torch

from gspo_cli.tasks import Problem, Task


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al., 2021):
    1 - C(n-c, k) / C(n, k). Requires 1 <= k <= n."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n (k={k}, n={n})")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def evaluate_samples(task: Task, problems: list[Problem], completions: list[list[str]]) -> dict[str, float]:
    """Scores for `completions[i]` (k samples) of `problems[i]`: avg@k (mean correctness over
    all samples) and pass@j for j in 1, k."""
    if not problems:
        return {}
    k = len(completions[0])
    correct = [[task.score(p, c).correct for c in cs] for p, cs in zip(problems, completions)]
    out = {f"avg@{k}": sum(map(sum, correct)) / (len(problems) * k)}
    for j in sorted({1, k}):
        out[f"pass@{j}"] = sum(pass_at_k(len(c), sum(c), j) for c in correct) / len(problems)
    return out


@torch.no_grad()
def evaluate_policy(engine, task: Task, problems: list[Problem], samples: int) -> dict[str, float]:
    """Sample `samples` responses per problem with `engine` and score them."""
    prompts = [p.prompt for p in problems for _ in range(samples)]
    completions = engine.generate(prompts).completions if prompts else []
    grouped = [completions[i * samples:(i + 1) * samples] for i in range(len(problems))]
    return evaluate_samples(task, problems, grouped)
