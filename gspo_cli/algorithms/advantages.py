"""Group-relative advantage estimators.

Rewards arrive as a flat (B,) tensor laid out in contiguous groups of
``group_size`` responses to the same prompt: indices [0, G) are prompt 0,
[G, 2G) prompt 1, and so on. Every estimator returns one advantage per response.
"""

from __future__ import annotations

from typing import Callable

import torch

AdvantageFn = Callable[..., torch.Tensor]

ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {}

# Below this group std the rewards are treated as identical: float noise such as
# 0.1 + 0.2 vs 0.3 must give exact zeros, not noise amplified by 1 / (std + eps).
ZERO_VARIANCE_STD = 1e-8


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator adding ``fn`` to ``ADVANTAGE_ESTIMATORS`` under ``name``."""

    def deco(fn: AdvantageFn) -> AdvantageFn:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} registered twice")
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return deco


def get_advantage_estimator(name: str) -> AdvantageFn:
    """Look up a registered estimator; unknown names raise ValueError listing valid ones."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {name!r}; valid: {sorted(ADVANTAGE_ESTIMATORS)}") from None


def _grouped(rewards_B: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) -> (Q, G) float view, Q = B // G groups; validates shape and divisibility."""
    if rewards_B.dim() != 1:
        raise ValueError(f"rewards must be 1-D (B,), got shape {tuple(rewards_B.shape)}")
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if rewards_B.shape[0] % group_size != 0:
        raise ValueError(f"batch size {rewards_B.shape[0]} is not divisible by group_size {group_size}")
    rewards_B = rewards_B if rewards_B.is_floating_point() else rewards_B.float()
    return rewards_B.reshape(-1, group_size)


def _group_std(groups_QG: torch.Tensor) -> torch.Tensor:
    """(Q, G) -> (Q,) unbiased sample std; 0 for G == 1 (a single sample has no spread)."""
    if groups_QG.shape[1] == 1:
        return torch.zeros(groups_QG.shape[0], dtype=groups_QG.dtype, device=groups_QG.device)
    return groups_QG.std(dim=1, correction=1)


@register_advantage("grpo")
def grpo_advantages(rewards_B: torch.Tensor, group_size: int, *, eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantage: (r - group mean) / (group std + eps), shape (B,) -> (B,).

    The std is the unbiased sample std (divide by G - 1), as in common GRPO
    implementations that call ``torch.std``. Groups whose std is below
    ``ZERO_VARIANCE_STD`` (all rewards equal, up to float noise) get exactly 0:
    they carry no learning signal and must never produce NaN.
    """
    groups_QG = _grouped(rewards_B, group_size)
    mean_Q1 = groups_QG.mean(dim=1, keepdim=True)
    std_Q1 = _group_std(groups_QG).unsqueeze(1)
    flat_Q1 = std_Q1 < ZERO_VARIANCE_STD
    adv_QG = torch.where(flat_Q1, torch.zeros_like(groups_QG), (groups_QG - mean_Q1) / (std_Q1 + eps))
    return adv_QG.reshape(-1)


@register_advantage("mean_only")
def mean_only_advantages(rewards_B: torch.Tensor, group_size: int, *, eps: float = 1e-6) -> torch.Tensor:
    """Dr. GRPO advantage: r - group mean, shape (B,) -> (B,).

    No std division (it biases towards low-variance prompts); ``eps`` is accepted
    only so all estimators share one call signature and is unused.
    """
    del eps
    groups_QG = _grouped(rewards_B, group_size)
    adv_QG = groups_QG - groups_QG.mean(dim=1, keepdim=True)
    # Identical rewards must give exact zeros even if the mean rounds.
    flat_Q1 = (_group_std(groups_QG) < ZERO_VARIANCE_STD).unsqueeze(1)
    return torch.where(flat_Q1, torch.zeros_like(adv_QG), adv_QG).reshape(-1)


def advantages_of_scored(
    adv_fn: AdvantageFn, rewards_B: torch.Tensor, scored_B: torch.Tensor, group_size: int, *, eps: float = 1e-6
) -> torch.Tensor:
    """(B,) ``adv_fn``'s advantages with the rows ``scored_B`` marks False (no reward function
    applied to them) left out: within each group the scored rows form a group of their own (its
    mean and std are theirs), and an unscored row gets exactly 0, as TRL does. Every row scored:
    ``adv_fn(rewards_B, group_size)`` unchanged. ``scored_B``: (B,) bool."""
    if bool(scored_B.all()):
        return adv_fn(rewards_B, group_size, eps=eps)
    rewards_QG = _grouped(rewards_B, group_size)
    scored_QG = scored_B.reshape(rewards_QG.shape)
    adv_QG = torch.zeros_like(rewards_QG)
    for q in range(rewards_QG.shape[0]):
        keep_G = scored_QG[q]
        n = int(keep_G.sum())
        if n:  # a lone scored row has nothing to compare with: the estimators give it 0
            adv_QG[q, keep_G] = adv_fn(rewards_QG[q, keep_G], n, eps=eps).to(adv_QG.dtype)
    return adv_QG.reshape(-1)


def zero_variance_group_frac(rewards_B: torch.Tensor, group_size: int) -> float:
    """Share of groups whose rewards are all equal (same tolerance as ``grpo``)."""
    groups_QG = _grouped(rewards_B, group_size)
    if groups_QG.shape[0] == 0:
        return 0.0
    flat_Q = _group_std(groups_QG) < ZERO_VARIANCE_STD
    return flat_Q.float().mean().item()
