"""Token and sequence filters and reward shaping that sit beside any policy loss: which
tokens carry gradient (80/20 entropy), which sequences are dropped (DeepSeek-V3.2's
off-policy sequence mask, DAPO's overlong filter), DAPO's soft overlong punishment, and the
groups dynamic sampling keeps. Pure functions of tensors; the trainer applies them.

Every filter returns a (B, C) or (B,) bool "keep"; the trainer turns a dropped token into a
weight of 0 in the loss (``weights_BC``), so the loss's statistics skip it, and says per
filter whether it also leaves the aggregation's count.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from .advantages import ZERO_VARIANCE_STD, _group_std, _grouped
from .kl import LOG_RATIO_CLAMP
from .precision import upcast

TOKEN_FILTERS = ("entropy_top",)


def entropy_top_mask(
    entropy_BC: torch.Tensor,
    mask_BC: torch.Tensor,
    top: float,
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """80/20 rule (arXiv:2506.01939, "Beyond the 80/20 Rule"; TRL ``top_entropy_quantile``):
    keep only the tokens of ``mask_BC`` whose entropy is at or above the (1 - top) quantile of
    their entropies, so only the ``top`` share of highest-entropy "forking" tokens carries
    gradient (paper: top = 0.2). ``mask_BC`` must hold the tokens the loss trains (the caller's
    loss mask without weight-0 tokens): a token outside it neither sets the threshold nor is
    kept. (B, C) entropies (nats) and mask -> (B, C) bool. ``top`` in (0, 1]; 1 keeps every
    token. Ties at the threshold are kept.

    The threshold is torch.quantile's (linear interpolation), found by selection
    (``kthvalue``) instead: keeping ``entropy >= quantile`` keeps exactly the entropies at or
    above the ceil((1 - top)(n - 1))-th smallest (0-based), and ``torch.quantile`` refuses more
    than 2^24 values (a DAPO-sized batch per process).

    ``gather``: every process's masked entropies (1-D) -> all of them concatenated, the same on
    every process (``distributed.gather_values``; None: this process's batch is the whole). The
    threshold is taken over the gathered entropies, as TRL does, so the kept tokens do not depend
    on how the batch is split over processes. Every process calls it (a process without trained
    tokens too)."""
    if not 0 < top <= 1:
        raise ValueError(f"entropy_top must be in (0, 1], got {top}")
    keep_BC = mask_BC > 0
    if top >= 1:
        return keep_BC
    ent = upcast(entropy_BC.detach()[keep_BC])
    if gather is not None:
        ent = gather(ent)
    n = ent.numel()
    if n == 0:
        return keep_BC
    # 1e-9: (1 - top)(n - 1) lands a hair above an integer in float64 for some top and n
    rank = math.ceil((1.0 - top) * (n - 1) - 1e-9)
    threshold = ent.kthvalue(rank + 1).values
    return keep_BC & (entropy_BC.detach() >= threshold)


def off_policy_sequence_mask(
    logp_BC: torch.Tensor, old_logp_BC: torch.Tensor, advantages_B: torch.Tensor, mask_BC: torch.Tensor, delta: float
) -> torch.Tensor:
    """DeepSeek-V3.2's off-policy sequence mask (DeepSeek-V3.2 report, eq. for M_{i};
    TRL ``off_policy_mask_threshold``): drop response i when A_i < 0 and its mean
    log(pi_old / pi_theta) over tokens exceeds ``delta``: negative samples the current policy
    already finds much less likely than the sampler did teach mostly noise. (B, C) log-probs
    (current, sampling policy) and mask, (B,) advantages -> (B,) bool keep. Detached."""
    keep_BC = mask_BC > 0
    lr_BC = torch.where(keep_BC, old_logp_BC.detach() - logp_BC.detach(), torch.zeros_like(logp_BC))
    mean_B = (lr_BC.sum(-1) / keep_BC.sum(-1).clamp(min=1)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return ~((advantages_B < 0) & (mean_B > delta))


def overlong_penalty(lengths_B: torch.Tensor, max_len: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (arXiv:2503.14476, eq. 13), added to the reward:

        0                                  if |y| <= max_len - buffer
        factor * ((max_len - buffer) - |y|) / buffer   if max_len - buffer < |y| <= max_len
        -factor                            if |y| > max_len

    (B,) lengths in tokens -> (B,) float. ``buffer`` 0 gives zeros (off)."""
    L = lengths_B.float()
    if buffer <= 0:
        return torch.zeros_like(L)
    start = max_len - buffer
    ramp = (start - L) / buffer
    out = torch.where(L <= start, torch.zeros_like(L), ramp)
    return factor * torch.where(L > max_len, torch.full_like(L, -1.0), out)


def signal_groups(rewards_B: torch.Tensor, group_size: int) -> torch.Tensor:
    """(Q,) bool: groups whose rewards differ (DAPO's dynamic sampling keeps these; the rest
    have all-zero advantages and teach nothing). Same tolerance as the advantage estimators."""
    return _group_std(_grouped(rewards_B, group_size)) >= ZERO_VARIANCE_STD
