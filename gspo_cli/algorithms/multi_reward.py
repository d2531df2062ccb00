"""Several named rewards, each normalised within its group before the weighted sum (GDPO,
Liu et al., arXiv:2601.05242; TRL's ``multi_objective_aggregation: normalize_then_sum``;
verl's ``adv_estimator: gdpo``). docs/algorithms/advantage-grpo.md gives the formula.

Values arrive as a (K, B) tensor, one row per reward, NaN where a reward does not apply to a
response (its function returned None); the B responses lie in contiguous groups of
``group_size``, as for the advantage estimators.
"""

from __future__ import annotations

from typing import Callable

import torch

from gspo_cli.algorithms.advantages import ZERO_VARIANCE_STD, _grouped


def _applying_stats(v_KQG: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per reward and group, over the rows where the reward applies (not NaN): (applies_KQG,
    deviation from the mean_KQG (0 where it does not apply), unbiased std_KQ1; NaN where fewer
    than 2 rows apply)."""
    applies = ~torch.isnan(v_KQG)
    n_KQ1 = applies.sum(-1, keepdim=True)
    zeroed = torch.where(applies, v_KQG, torch.zeros_like(v_KQG))
    mean_KQ1 = zeroed.sum(-1, keepdim=True) / n_KQ1.clamp(min=1)
    dev = torch.where(applies, v_KQG - mean_KQ1, torch.zeros_like(v_KQG))
    var_KQ1 = (dev**2).sum(-1, keepdim=True) / (n_KQ1 - 1).clamp(min=1)
    std_KQ1 = torch.where(n_KQ1 >= 2, var_KQ1.sqrt(), torch.full_like(var_KQ1, float("nan")))
    return applies, dev, std_KQ1


def group_normalized(values_KB: torch.Tensor, group_size: int, *, eps: float = 1e-6) -> torch.Tensor:
    """(K, B) -> (K, B): each reward's (r - group mean) / (group std + eps), mean and unbiased
    std over the rows of the group where that reward applies. 0 where it does not apply, and in
    every row of a group where it applies to fewer than 2 rows or has a std below
    ``ZERO_VARIANCE_STD`` (no comparison within the group: no signal from this reward)."""
    if values_KB.dim() != 2 or values_KB.shape[0] == 0:
        raise ValueError(f"values must be (K, B) with K >= 1, got shape {tuple(values_KB.shape)}")
    v_KQG = torch.stack([_grouped(v, group_size) for v in values_KB])
    applies, dev, std_KQ1 = _applying_stats(v_KQG.float())
    signal = applies & (std_KQ1 >= ZERO_VARIANCE_STD)  # NaN std (< 2 rows) compares False
    out = torch.where(signal, dev / (std_KQ1 + eps), torch.zeros_like(dev))
    return out.reshape(values_KB.shape[0], -1)


def signal_groups_where_applies(values_B: torch.Tensor, group_size: int) -> torch.Tensor:
    """(Q,) bool: groups in which a reward (NaN where it does not apply) differs among the rows
    it applies to: at least 2 such rows, std at least ``ZERO_VARIANCE_STD``."""
    _, _, std_KQ1 = _applying_stats(_grouped(values_B, group_size).unsqueeze(0))
    return (std_KQ1 >= ZERO_VARIANCE_STD).reshape(-1)


def normalize_then_sum(
    values_KB: torch.Tensor,
    weights_K: list[float],
    group_size: int,
    *,
    eps: float = 1e-6,
    penalty_B: torch.Tensor | None = None,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """(K, B) reward values (NaN: does not apply) -> (B,) advantages:

        S_i = sum_k w_k * group_normalized_k,i  (+ p_i - group mean of p, when penalty_B)
        A_i = S_i / (std_batch(S) + eps)

    ``penalty_B`` (the overlong penalty, <= 0) is centred within its group over the scored rows
    but not divided by its std: its scale stays the one ``overlong.penalty`` sets. A row no
    reward applies to (unscored) gets A = 0 and stays out of the batch std, as in TRL. The batch
    std is the unbiased std of S over the scored rows of the whole batch (all ranks: ``reduce``
    sums a float64 tensor over them); the batch mean of S is 0 by construction (every term is
    centred within its group), so it is not subtracted, and a row whose terms are all 0 keeps
    A = 0 exactly. Fewer than 2 scored rows, or a batch std below ``ZERO_VARIANCE_STD``: all 0."""
    if values_KB.shape[0] != len(weights_K):
        raise ValueError(f"{values_KB.shape[0]} rewards but {len(weights_K)} weights")
    norm_KB = group_normalized(values_KB, group_size, eps=eps)
    w_K1 = torch.tensor(weights_K, dtype=norm_KB.dtype).unsqueeze(1)
    sum_B = (w_K1 * norm_KB).sum(0)
    scored_B = (~torch.isnan(values_KB)).any(0)
    if penalty_B is not None:
        p_QG = _grouped(torch.where(scored_B, penalty_B.float(), torch.full_like(sum_B, float("nan"))), group_size)
        _, dev_1QG, _ = _applying_stats(p_QG.unsqueeze(0))
        sum_B = sum_B + dev_1QG.reshape(-1)
    s_B = sum_B.double()
    sums = torch.stack([scored_B.double().sum(), s_B.sum(), (s_B**2).sum()])
    n, s1, s2 = (reduce(sums) if reduce is not None else sums).tolist()
    if n < 2:
        return torch.zeros_like(sum_B)
    std = max((s2 - s1 * s1 / n) / (n - 1), 0.0) ** 0.5
    if std < ZERO_VARIANCE_STD:
        return torch.zeros_like(sum_B)
    return sum_B / (std + eps)
