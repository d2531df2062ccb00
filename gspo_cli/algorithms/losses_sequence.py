"""Sequence-level relatives of GSPO: LUSPO (GSPO scaled by length) and GMPO (geometric mean of
token ratios clipped in log space). Same call contract as ``losses.py``; both are
``sequence``-level losses: a response's tokens share one ratio."""

from __future__ import annotations

import torch

from .aggregation import aggregate
from .losses import register_policy_loss
from .ratios import (
    advantages_BC,
    loss_stats,
    masked_log_ratio,
    seq_log_ratio,
    sequence_advantages,
    sequence_clipped_loss,
    stats_mask,
    token_ratio,
    weighted,
)


@register_policy_loss("luspo", level="sequence")
def luspo_loss(
    logp_BC: torch.Tensor,
    old_logp_BC: torch.Tensor,
    advantages_B: torch.Tensor,
    mask_BC: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    aggregation: str = "seq_mean_token_mean",
    denominator: torch.Tensor | float | None = None,
    weights_BC: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """LUSPO (length-unbiased sequence policy optimisation; TRL ``loss_type="luspo"``): GSPO's
    clipped sequence loss scaled by the response's length,

        loss_i = -|y_i| * min(s_i A_i, clip(s_i, 1 - clip_low, 1 + clip_high) A_i),
        s_i = exp(mean_t log(pi/pi_old)),

    then aggregated (default: mean over responses), so a long response weighs as much as
    its tokens would under a token sum: GSPO's sequence mean favours short responses.
    Clip decisions are GSPO's. Preset clip: 2e-3 / 2.5e-3. Shapes as ``gspo_loss``;
    advantages (B,) only.
    """
    length_B = (mask_BC > 0).sum(-1).to(logp_BC.dtype)
    return sequence_clipped_loss(
        "luspo",
        logp_BC,
        old_logp_BC,
        advantages_B,
        mask_BC,
        clip_low,
        clip_high,
        aggregation,
        denominator,
        weights_BC,
        scale_B=length_B,
    )


@register_policy_loss("gmpo", level="sequence", clip="log")
def gmpo_loss(
    logp_BC: torch.Tensor,
    old_logp_BC: torch.Tensor,
    advantages_B: torch.Tensor,
    mask_BC: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    aggregation: str = "seq_mean_token_mean",
    denominator: torch.Tensor | float | None = None,
    weights_BC: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GMPO, geometric-mean policy optimisation (arXiv:2507.20673; verl ``geo_mean``): the
    geometric mean of token ratios, each clipped in *log* space, times A per sequence:

        l_{i,t} = log(pi/pi_old),  c_{i,t} = clamp(l_{i,t}, -clip_low, clip_high)
        m_{i,t} = min(l, c) if A_i > 0 else max(l, c)      (sgn(A) picks the pessimistic side)
        loss_i = -A_i * exp(mean_t m_{i,t})

    ``clip_low`` / ``clip_high`` are log-space bounds here (paper: 0.4 / 0.4, i.e. ratios
    in (e^-0.4, e^0.4)). A clipped token stops carrying gradient; the others still do, each
    weighted by the sequence's geometric-mean ratio / |y_i|. When no token is clipped the
    value and gradient equal GSPO's for either sign of A (test). Token clip fractions:
    l > clip_high with A > 0 (high), l < -clip_low with A < 0 (low). advantages (B,) only.
    """
    sequence_advantages(advantages_B, "gmpo")
    keep_BC = mask_BC > 0
    log_ratio_BC = masked_log_ratio(logp_BC, old_logp_BC, keep_BC)
    clamped_BC = log_ratio_BC.clamp(-clip_low, clip_high)
    pos_BC = (advantages_B > 0).unsqueeze(1).expand_as(log_ratio_BC)
    chosen_BC = torch.where(pos_BC, torch.minimum(log_ratio_BC, clamped_BC), torch.maximum(log_ratio_BC, clamped_BC))
    geo_lr_B = seq_log_ratio(torch.where(keep_BC, chosen_BC, torch.zeros_like(chosen_BC)), keep_BC)
    loss_B = -advantages_B * geo_lr_B.exp()
    loss = aggregate(weighted(loss_B.unsqueeze(1).expand_as(logp_BC), weights_BC), mask_BC, aggregation, denominator)
    adv_BC = advantages_BC(advantages_B, keep_BC)
    kept_BC = stats_mask(mask_BC, weights_BC)
    lr_BC = log_ratio_BC.detach()
    stats = loss_stats(
        token_ratio(lr_BC),
        seq_log_ratio(lr_BC, keep_BC),
        lr_BC,
        kept_BC,
        high_BC=(lr_BC > clip_high) & (adv_BC > 0),
        low_BC=(lr_BC < -clip_low) & (adv_BC < 0),
    )
    return loss, stats
