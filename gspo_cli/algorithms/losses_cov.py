"""Covariance-selected token losses (arXiv:2505.22617, "The Entropy Mechanism of Reinforcement
Learning for Reasoning Language Models"; verl ``clip_cov`` / ``kl_cov``): the tokens whose
centred advantage x centred log-prob product is largest are the ones that drive entropy
down; Clip-Cov detaches a few of them, KL-Cov puts a KL penalty on them.

    cov_{i,t} = (A_{i,t} - mean A) * (log pi(y_{i,t}) - mean log pi)    (means over the trained
                                                                         tokens, detached)

Tokens are selected among those the loss trains: response tokens of non-zero weight
(``weights_BC``; the entropy filter, the off-policy mask and ``mismatch.rejected: zero`` give
weight 0), which also set the means and the budget floor(ratio x N) (at least 1). Both act on
the mini-batch a process holds, in one call per mini-batch. verl calls its loss once per
*micro-batch* instead: its covariance, candidates and budget are per micro-batch, so it
selects at least one token in every micro-batch (more in all than our floor(ratio x N) when a
mini-batch holds many micro-batches of fewer than 1/ratio tokens each). Ours, run in
micro-batches (``train.micro_batch_tokens``), select once over the whole mini-batch
(``MINIBATCH_SELECTIONS``, from a no-grad forward of it) and each micro-batch's call takes its
rows of that selection (``selected_BC``): the same tokens as one call over the mini-batch.
Same call contract as ``losses.py``; both are token-level.
"""

from __future__ import annotations

import torch

from .aggregation import aggregate
from .losses import MINIBATCH_SELECTIONS, register_policy_loss
from .ratios import (
    advantages_BC,
    clipped_surrogate_loss,
    dual_clipped,
    loss_stats,
    masked_log_ratio,
    ppo_clip_stats,
    seq_log_ratio,
    stats_mask,
    token_ratio,
    weighted,
)


def token_covariance_BC(adv_BC: torch.Tensor, logp_BC: torch.Tensor, keep_BC: torch.Tensor) -> torch.Tensor:
    """(B, C) cov(A, log pi) per token of ``keep_BC`` (centred over its tokens), detached; -inf
    elsewhere so no other token is ever selected."""
    with torch.no_grad():
        n = keep_BC.sum().clamp(min=1)
        lp_BC = torch.where(keep_BC, logp_BC.detach(), torch.zeros_like(logp_BC))
        a_BC = torch.where(keep_BC, adv_BC.detach(), torch.zeros_like(lp_BC))
        cov_BC = (a_BC - a_BC.sum() / n) * (lp_BC - lp_BC.sum() / n)
        return torch.where(keep_BC, cov_BC, torch.full_like(cov_BC, -torch.inf))


def _n_selected(keep_BC: torch.Tensor, ratio: float) -> int:
    """max(1, floor(ratio * trained tokens)), 0 when none is trained (verl's count)."""
    n = int(keep_BC.sum())
    return max(int(n * ratio), 1) if n else 0


def _token_terms(logp_BC, old_logp_BC, advantages, mask_BC, weights_BC):
    """What both losses start from, each (B, C): (keep: response tokens, trained: those of
    non-zero weight, log-ratio, ratio, advantage, cov over the trained tokens)."""
    keep_BC = mask_BC > 0
    trained_BC = stats_mask(mask_BC, weights_BC)
    log_ratio_BC = masked_log_ratio(logp_BC, old_logp_BC, keep_BC)
    adv_BC = advantages_BC(advantages, keep_BC)
    cov_BC = token_covariance_BC(adv_BC, logp_BC, trained_BC)
    return keep_BC, trained_BC, log_ratio_BC, token_ratio(log_ratio_BC), adv_BC, cov_BC


def _selection_BC(flat_indices: torch.Tensor, keep_BC: torch.Tensor) -> torch.Tensor:
    """(B, C) bool: True at `flat_indices` (into keep_BC flattened), on response tokens only."""
    selected_N = torch.zeros(keep_BC.numel(), dtype=torch.bool, device=keep_BC.device)
    selected_N[flat_indices] = True
    return selected_N.reshape(keep_BC.shape) & keep_BC


def _selected_frac(selected_BC: torch.Tensor, kept_BC: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``cov_frac``: the share of the statistics' tokens that were selected (0-d)."""
    return (selected_BC & kept_BC).sum().to(dtype) / kept_BC.sum().clamp(min=1).to(dtype)


def _clip_cov_pick(r_BC, adv_BC, kept_BC, cov_BC, clip_low, clip_high, clip_dual, cov_ratio, cov_lb, cov_ub):
    """Clip-Cov's tokens: floor(cov_ratio x trained) drawn among the unclipped candidates."""
    ppo_clipped_BC = ((r_BC > 1.0 + clip_high) & (adv_BC > 0)) | ((r_BC < 1.0 - clip_low) & (adv_BC < 0))
    ppo_clipped_BC |= dual_clipped(r_BC, adv_BC, clip_dual)
    cand = (kept_BC & ~ppo_clipped_BC & (cov_BC > cov_lb) & (cov_BC < cov_ub)).reshape(-1).nonzero().squeeze(-1)
    chosen = cand[torch.randperm(cand.numel(), device=cand.device)[: _n_selected(kept_BC, cov_ratio)]]
    return _selection_BC(chosen, kept_BC)


def clip_cov_selection(
    logp_BC, old_logp_BC, advantages, mask_BC, *, clip_low, clip_high, weights_BC=None, clip_dual=None, **params
) -> torch.Tensor:
    """(B, C) bool: the tokens ``clip_cov_loss`` would detach in one call over this batch."""
    p = {"cov_ratio": 2e-4, "cov_lb": 1.0, "cov_ub": 5.0, **params}
    _, kept_BC, _, ratio_BC, adv_BC, cov_BC = _token_terms(logp_BC, old_logp_BC, advantages, mask_BC, weights_BC)
    r_BC = ratio_BC.detach()
    return _clip_cov_pick(
        r_BC, adv_BC, kept_BC, cov_BC, clip_low, clip_high, clip_dual, p["cov_ratio"], p["cov_lb"], p["cov_ub"]
    )


def kl_cov_selection(logp_BC, old_logp_BC, advantages, mask_BC, *, clip_low, clip_high, weights_BC=None, **params):
    """(B, C) bool: the tokens ``kl_cov_loss`` would penalise in one call over this batch."""
    del clip_low, clip_high
    _, kept_BC, _, _, _, cov_BC = _token_terms(logp_BC, old_logp_BC, advantages, mask_BC, weights_BC)
    n = _n_selected(kept_BC, params.get("cov_ratio", 2e-3))
    return _selection_BC(cov_BC.reshape(-1).topk(n).indices, kept_BC)


@register_policy_loss("clip_cov")
def clip_cov_loss(
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
    clip_dual: float | None = None,
    cov_ratio: float = 2e-4,
    cov_lb: float = 1.0,
    cov_ub: float = 5.0,
    selected_BC: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clip-Cov: GRPO's PPO-clipped token loss, with floor(cov_ratio x trained tokens) (at least
    1) tokens drawn at random (torch's global RNG) among the trained tokens not already clipped
    whose cov lies in (cov_lb, cov_ub) detached: their loss and gradient become 0.

    Paper defaults: cov_ratio 2e-4, cov_lb 1, cov_ub 5, token-mean. Clip fractions are PPO's
    (and the dual clip's); ``cov_frac`` (``policy/cov_selected_frac``) is the share of the
    trained tokens detached. ``clip_dual`` (> 1, None: off): dual-clip PPO as in ``grpo``
    (verl's clip_cov has none); a dual-clipped token is not a candidate.
    """
    keep_BC, kept_BC, log_ratio_BC, ratio_BC, adv_BC, cov_BC = _token_terms(
        logp_BC, old_logp_BC, advantages, mask_BC, weights_BC
    )
    loss_BC = clipped_surrogate_loss(ratio_BC, adv_BC, clip_low, clip_high, clip_dual)
    r_BC = ratio_BC.detach()
    if selected_BC is None:
        selected_BC = _clip_cov_pick(
            r_BC, adv_BC, kept_BC, cov_BC, clip_low, clip_high, clip_dual, cov_ratio, cov_lb, cov_ub
        )
    selected_BC = selected_BC & kept_BC
    loss_BC = torch.where(selected_BC, torch.zeros_like(loss_BC), loss_BC)
    loss = aggregate(weighted(loss_BC, weights_BC), mask_BC, aggregation, denominator)
    stats = ppo_clip_stats(
        ratio_BC, seq_log_ratio(log_ratio_BC, keep_BC), log_ratio_BC, adv_BC, kept_BC, clip_low, clip_high, clip_dual
    )
    stats["cov_frac"] = _selected_frac(selected_BC, kept_BC, r_BC.dtype)
    return loss, stats


@register_policy_loss("kl_cov", clip="none")
def kl_cov_loss(
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
    cov_ratio: float = 2e-3,
    kl_coef: float = 1.0,
    selected_BC: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL-Cov: the unclipped token surrogate -r A everywhere, plus kl_coef x |log r| on the
    floor(cov_ratio x trained tokens) (at least 1) trained tokens of largest cov:

        loss_{i,t} = -r_{i,t} A_{i,t} + kl_coef * |log r_{i,t}| * [t in top-k cov]

    Paper defaults (its Qwen2.5-7B recipe as we read it): cov_ratio 2e-3, kl_coef 1, token-mean.
    ``clip_low`` / ``clip_high`` are not used (no PPO clip; accepted for the shared
    signature), so clip fractions are 0; ``cov_frac`` is the share of penalised tokens.
    """
    del clip_low, clip_high
    keep_BC, kept_BC, log_ratio_BC, ratio_BC, adv_BC, cov_BC = _token_terms(
        logp_BC, old_logp_BC, advantages, mask_BC, weights_BC
    )
    if selected_BC is None:
        selected_BC = _selection_BC(cov_BC.reshape(-1).topk(_n_selected(kept_BC, cov_ratio)).indices, kept_BC)
    selected_BC = selected_BC & kept_BC
    loss_BC = -ratio_BC * adv_BC + torch.where(selected_BC, kl_coef * log_ratio_BC.abs(), torch.zeros_like(ratio_BC))
    loss = aggregate(weighted(loss_BC, weights_BC), mask_BC, aggregation, denominator)
    none_BC = torch.zeros_like(keep_BC)
    r_BC = ratio_BC.detach()
    stats = loss_stats(
        r_BC, seq_log_ratio(log_ratio_BC, keep_BC), log_ratio_BC, kept_BC, high_BC=none_BC, low_BC=none_BC
    )
    stats["cov_frac"] = _selected_frac(selected_BC, kept_BC, r_BC.dtype)
    return loss, stats


MINIBATCH_SELECTIONS.update(clip_cov=clip_cov_selection, kl_cov=kl_cov_selection)
