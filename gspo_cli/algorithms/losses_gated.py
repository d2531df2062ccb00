"""Token-level losses that bound the importance weight without zeroing gradients: CISPO
(a clipped, stop-gradient IS weight on REINFORCE) and SAPO (a soft sigmoid gate instead of
the hard clip). Same call contract as ``losses.py``."""

from __future__ import annotations

import torch

from .aggregation import aggregate
from .losses import register_policy_loss
from .ratios import advantages_BC, loss_stats, masked_log_ratio, seq_log_ratio, stats_mask, token_ratio, weighted


@register_policy_loss("cispo")
def cispo_loss(
    logp_BC: torch.Tensor,
    old_logp_BC: torch.Tensor,
    advantages: torch.Tensor,
    mask_BC: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    aggregation: str = "token_mean",
    denominator: torch.Tensor | float | None = None,
    weights_BC: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO, clipped IS-weight policy optimisation (MiniMax-M1, arXiv:2506.13585; TRL and verl
    ``cispo``): REINFORCE with a stop-gradient, clipped token IS weight,

        loss_{i,t} = -sg(clip(r_{i,t}, 1 - clip_low, 1 + clip_high)) * A_{i,t} * log pi(y_{i,t}),

    token-mean over the batch in the paper. Every token keeps its gradient (the clip caps the
    weight, it never zeroes a token as PPO's does); the paper sets no lower bound
    (``clip_low`` 1.0: weights in [0, 1 + clip_high]) and ScaleRL caps the weight at 5
    (``clip_high`` 4.0): the preset's values. The value is not a ratio objective (it contains
    log pi), only its gradient sg(w) A grad log pi matters. Clip fractions here count tokens
    whose weight was *capped* (r > 1 + clip_high: high, r < 1 - clip_low: low), whatever A's
    sign, since no gradient is zeroed. Shapes as ``grpo_loss``.
    """
    keep_BC = mask_BC > 0
    log_ratio_BC = masked_log_ratio(logp_BC, old_logp_BC, keep_BC)
    ratio_BC = token_ratio(log_ratio_BC)
    w_BC = ratio_BC.detach().clamp(1.0 - clip_low, 1.0 + clip_high)
    adv_BC = advantages_BC(advantages, keep_BC)
    logp_masked_BC = torch.where(keep_BC, logp_BC, torch.zeros_like(logp_BC))
    loss_BC = -w_BC * adv_BC * logp_masked_BC
    loss = aggregate(weighted(loss_BC, weights_BC), mask_BC, aggregation, denominator)
    r_BC = ratio_BC.detach()
    stats = loss_stats(
        r_BC,
        seq_log_ratio(log_ratio_BC, keep_BC),
        log_ratio_BC,
        stats_mask(mask_BC, weights_BC),
        high_BC=r_BC > 1.0 + clip_high,
        low_BC=r_BC < 1.0 - clip_low,
    )
    return loss, stats


@register_policy_loss("sapo", clip="none")
def sapo_loss(
    logp_BC: torch.Tensor,
    old_logp_BC: torch.Tensor,
    advantages: torch.Tensor,
    mask_BC: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    aggregation: str = "seq_mean_token_mean",
    denominator: torch.Tensor | float | None = None,
    weights_BC: torch.Tensor | None = None,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SAPO, soft adaptive policy optimisation (arXiv:2511.20347; TRL ``sapo``): a sigmoid gate
    on the token ratio replaces the hard clip,

        f(r) = sigmoid(tau * (r - 1)) * 4 / tau,   loss_{i,t} = -f(r_{i,t}) * A_{i,t},
        tau = tau_pos (1.0) where A > 0, tau_neg (1.05) where A < 0,

    sequence-mean of token-means (the default aggregation). df/dr = 4 s (1 - s) with
    s = sigmoid(tau (r - 1)): exactly 1 at r = 1 (on-policy the gradient is the vanilla
    policy gradient), fading smoothly as r leaves 1; tau_neg > tau_pos fades negative
    tokens faster. ``clip_low`` / ``clip_high`` are not used by the gate (accepted so every
    loss shares one signature); no token is ever clipped, so the clip fractions are 0.
    Shapes as ``grpo_loss``.
    """
    del clip_low, clip_high
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"sapo: tau_pos and tau_neg must be > 0, got {tau_pos}, {tau_neg}")
    keep_BC = mask_BC > 0
    log_ratio_BC = masked_log_ratio(logp_BC, old_logp_BC, keep_BC)
    ratio_BC = token_ratio(log_ratio_BC)
    adv_BC = advantages_BC(advantages, keep_BC)
    tau_BC = torch.where(adv_BC > 0, torch.full_like(ratio_BC, tau_pos), torch.full_like(ratio_BC, tau_neg))
    gate_BC = torch.sigmoid(tau_BC * (ratio_BC - 1.0)) * 4.0 / tau_BC
    loss_BC = -gate_BC * adv_BC
    loss = aggregate(weighted(loss_BC, weights_BC), mask_BC, aggregation, denominator)
    none_BC = torch.zeros_like(keep_BC)
    stats = loss_stats(
        ratio_BC,
        seq_log_ratio(log_ratio_BC, keep_BC),
        log_ratio_BC,
        stats_mask(mask_BC, weights_BC),
        high_BC=none_BC,
        low_BC=none_BC,
    )
    return loss, stats
