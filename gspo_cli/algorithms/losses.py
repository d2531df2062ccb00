"""Clipped policy-gradient losses: GRPO (token ratio) and GSPO (sequence ratio).

Every loss is called as::

    loss, stats = fn(logp_BC, old_logp_BC, adv, mask_BC, *, clip_low, clip_high,
                     aggregation="seq_mean_token_mean", denominator=None, weights_BC=None)

with ``logp_BC`` / ``old_logp_BC`` the (B, C) log-probs of the sampled tokens
under the current / behaviour policy, ``mask_BC`` (B, C) 1.0 on response tokens,
and ``adv`` either (B,) or (B, C). ``loss`` is minus the clipped objective,
aggregated over response tokens (``denominator``: see ``aggregate``; None for a batch
on one process); ``stats`` holds detached 0-d diagnostics, means over this batch's
response tokens (``*_token``, ratio, approx_kl) or its non-empty responses (``*_seq``), and
one per-response entry, ``clipped_tokens_B`` (B,): how many of each response's tokens the
clip zeroed the gradient of (GSPO: all or none of them), for samples.jsonl.
``weights_BC`` (B, C), when given, multiplies the per-token loss before aggregation: the
rollout/trainer mismatch correction (``mismatch.py``; 0 drops a token, the aggregation's count
is unchanged). It must be detached and finite; the statistics ignore it. A weight that is
constant within each response keeps GSPO-token equal to GSPO; token-varying weights make them
differ in gradient (GSPO weights the response's loss by its tokens' mean weight, GSPO-token
weights each token's gradient).

Log-ratios are formed inside ``torch.where(mask, ..., 0)`` so NaN or garbage at
padded positions cannot leak into values or gradients, and are clamped to
[-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] before ``exp`` so a stale or broken
behaviour policy cannot overflow the ratio to inf (exp(20) ~ 4.9e8 is far outside
any clip range, so the clamp never changes a clipping decision).
"""

from __future__ import annotations

from typing import Callable

import torch

from .aggregation import aggregate
from .kl import LOG_RATIO_CLAMP, kl_k3_BC

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]

POLICY_LOSSES: dict[str, PolicyLossFn] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator adding ``fn`` to ``POLICY_LOSSES`` under ``name``."""

    def deco(fn: PolicyLossFn) -> PolicyLossFn:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} registered twice")
        POLICY_LOSSES[name] = fn
        return fn

    return deco


def get_policy_loss(name: str) -> PolicyLossFn:
    """Look up a registered loss; unknown names raise ValueError listing valid ones."""
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown policy loss {name!r}; valid: {sorted(POLICY_LOSSES)}") from None


# ----------------------------------------------------------------------------- helpers


def _masked_log_ratio(logp_BC: torch.Tensor, old_logp_BC: torch.Tensor, keep_BC: torch.Tensor) -> torch.Tensor:
    """(B, C) log(pi/pi_old) on response tokens, exactly 0 elsewhere (unclamped)."""
    if logp_BC.shape != old_logp_BC.shape or logp_BC.shape != keep_BC.shape:
        raise ValueError(
            f"shape mismatch: logp {tuple(logp_BC.shape)}, old_logp {tuple(old_logp_BC.shape)}, "
            f"mask {tuple(keep_BC.shape)}"
        )
    return torch.where(keep_BC, logp_BC - old_logp_BC, torch.zeros_like(logp_BC))


def _seq_log_ratio(log_ratio_BC: torch.Tensor, keep_BC: torch.Tensor) -> torch.Tensor:
    """(B, C) masked log-ratio -> (B,) length-normalised sequence log-ratio, clamped.

    Empty responses get 0 (ratio 1) via the max(|y|, 1) guard.
    """
    n_tok_B = keep_BC.sum(dim=-1).clamp(min=1).to(log_ratio_BC.dtype)
    seq_B = log_ratio_BC.sum(dim=-1) / n_tok_B
    return seq_B.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _advantages_BC(advantages: torch.Tensor, keep_BC: torch.Tensor) -> torch.Tensor:
    """(B,) or (B, C) advantages -> (B, C), zeroed at masked positions."""
    if advantages.dim() == 1 and advantages.shape[0] == keep_BC.shape[0]:
        adv_BC = advantages.unsqueeze(1).expand_as(keep_BC)
    elif advantages.shape == keep_BC.shape:
        adv_BC = advantages
    else:
        raise ValueError(f"advantages must be (B,) or (B, C) = {tuple(keep_BC.shape)}, got {tuple(advantages.shape)}")
    return torch.where(keep_BC, adv_BC, torch.zeros_like(adv_BC))


def _clipped_surrogate_loss(ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float) -> torch.Tensor:
    """-min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A), elementwise, any shape."""
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return -torch.minimum(ratio * adv, clipped * adv)


def _stats(
    ratio_BC: torch.Tensor,
    seq_log_ratio_B: torch.Tensor,
    log_ratio_BC: torch.Tensor,
    adv_BC: torch.Tensor,
    keep_BC: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> dict[str, torch.Tensor]:
    """Detached 0-d diagnostics; ``ratio_BC`` is the ratio the loss clips on."""
    with torch.no_grad():
        ratio_BC = ratio_BC.detach()
        dtype = ratio_BC.dtype
        zeros_BC = torch.zeros_like(ratio_BC)
        n_tok = keep_BC.sum().clamp(min=1).to(dtype)
        zero = torch.zeros((), dtype=dtype, device=ratio_BC.device)

        # A token counts as clipped only when clipping actually zeroes its gradient,
        # i.e. the ratio left the trust region on the side the advantage pushes to.
        high_BC = keep_BC & (ratio_BC > 1.0 + clip_high) & (adv_BC > 0)
        low_BC = keep_BC & (ratio_BC < 1.0 - clip_low) & (adv_BC < 0)
        any_BC = (high_BC | low_BC).to(dtype)
        mask_f = keep_BC.to(dtype)

        resp_ratio = ratio_BC[keep_BC]
        # k3 estimate of KL(pi_old || pi_theta) from pi_old's samples: kl_k3_BC with pi_old in
        # the first place and pi_theta in the second; only log(pi_theta / pi_old) matters.
        lr_BC = log_ratio_BC.detach()
        k3_BC = torch.where(keep_BC, kl_k3_BC(torch.zeros_like(lr_BC), lr_BC), zeros_BC)
        nonempty_B = keep_BC.any(dim=-1)
        seq_ratio_B = seq_log_ratio_B.detach().exp()
        n_seq = nonempty_B.sum().clamp(min=1).to(dtype)

        has_tok = resp_ratio.numel() > 0
        return {
            "clipped_tokens_B": any_BC.sum(-1),
            "clip_frac_token": any_BC.sum() / n_tok,
            "clip_frac_token_low": low_BC.to(dtype).sum() / n_tok,
            "clip_frac_token_high": high_BC.to(dtype).sum() / n_tok,
            "clip_frac_seq": aggregate(any_BC, mask_f, "seq_mean_token_mean"),
            "ratio_mean": torch.where(keep_BC, ratio_BC, zeros_BC).sum() / n_tok,
            "ratio_min": resp_ratio.min() if has_tok else zero.clone(),
            "ratio_max": resp_ratio.max() if has_tok else zero.clone(),
            "seq_ratio_mean": torch.where(nonempty_B, seq_ratio_B, torch.zeros_like(seq_ratio_B)).sum() / n_seq,
            "approx_kl": k3_BC.sum() / n_tok,
        }


def _weighted(loss_BC: torch.Tensor, weights_BC: torch.Tensor | None) -> torch.Tensor:
    """The per-token loss times the mismatch weights (None: unweighted, bit for bit)."""
    if weights_BC is None:
        return loss_BC
    if weights_BC.shape != loss_BC.shape:
        raise ValueError(f"weights shape {tuple(weights_BC.shape)} != loss shape {tuple(loss_BC.shape)}")
    return loss_BC * weights_BC.detach()


# ----------------------------------------------------------------------------- losses


@register_policy_loss("grpo")
def grpo_loss(
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
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO: token ratio w_{i,t} = exp(logp - old_logp), PPO-clipped per token.

    Shapes: logp_BC, old_logp_BC, mask_BC (B, C); advantages (B,) or (B, C).
    """
    keep_BC = mask_BC > 0
    log_ratio_BC = _masked_log_ratio(logp_BC, old_logp_BC, keep_BC)
    ratio_BC = log_ratio_BC.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    adv_BC = _advantages_BC(advantages, keep_BC)
    loss_BC = _clipped_surrogate_loss(ratio_BC, adv_BC, clip_low, clip_high)
    loss = aggregate(_weighted(loss_BC, weights_BC), mask_BC, aggregation, denominator)
    # Sequence ratio is not used by GRPO but is logged to compare with GSPO runs.
    seq_lr_B = _seq_log_ratio(log_ratio_BC, keep_BC)
    return loss, _stats(ratio_BC, seq_lr_B, log_ratio_BC, adv_BC, keep_BC, clip_low, clip_high)


@register_policy_loss("gspo")
def gspo_loss(
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
    """GSPO: sequence ratio s_i = exp(mean_t log(pi/pi_old)), PPO-clipped per sequence.

    Shapes: logp_BC, old_logp_BC, mask_BC (B, C); advantages_B (B,) only, since the
    objective is defined per sequence. The per-sequence loss is broadcast to every
    response token and then aggregated, so the default aggregation gives the
    paper's (1/G) sum_i, and other modes weight sequences like their tokens.
    """
    if advantages_B.dim() != 1:
        raise ValueError(
            f"gspo needs per-sequence advantages of shape (B,), got {tuple(advantages_B.shape)}; "
            "use 'gspo_token' for per-token advantages"
        )
    keep_BC = mask_BC > 0
    log_ratio_BC = _masked_log_ratio(logp_BC, old_logp_BC, keep_BC)
    seq_lr_B = _seq_log_ratio(log_ratio_BC, keep_BC)
    seq_ratio_B = seq_lr_B.exp()
    adv_BC = _advantages_BC(advantages_B, keep_BC)  # validates B; used for stats
    loss_B = _clipped_surrogate_loss(seq_ratio_B, advantages_B, clip_low, clip_high)
    loss_BC = loss_B.unsqueeze(1).expand_as(logp_BC)
    loss = aggregate(_weighted(loss_BC, weights_BC), mask_BC, aggregation, denominator)
    ratio_BC = seq_ratio_B.detach().unsqueeze(1).expand_as(logp_BC)
    return loss, _stats(ratio_BC, seq_lr_B, log_ratio_BC, adv_BC, keep_BC, clip_low, clip_high)


@register_policy_loss("gspo_token")
def gspo_token_loss(
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
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO-token: s_{i,t} = sg[s_i] * exp(logp - sg[logp]), clipped per token.

    Value of s_{i,t} equals s_i and its gradient is s_i * grad(logp_{i,t}), so with
    (B,) advantages this matches ``gspo`` in value, clipping and gradient while
    also allowing (B, C) per-token advantages.
    """
    keep_BC = mask_BC > 0
    log_ratio_BC = _masked_log_ratio(logp_BC, old_logp_BC, keep_BC)
    seq_lr_B = _seq_log_ratio(log_ratio_BC, keep_BC)
    # logp - sg[logp] is 0 in value but carries d logp; masked via where for NaN safety.
    grad_carrier_BC = _masked_log_ratio(logp_BC, logp_BC.detach(), keep_BC)
    ratio_BC = seq_lr_B.detach().exp().unsqueeze(1) * grad_carrier_BC.exp()
    adv_BC = _advantages_BC(advantages, keep_BC)
    loss_BC = _clipped_surrogate_loss(ratio_BC, adv_BC, clip_low, clip_high)
    loss = aggregate(_weighted(loss_BC, weights_BC), mask_BC, aggregation, denominator)
    return loss, _stats(ratio_BC, seq_lr_B, log_ratio_BC, adv_BC, keep_BC, clip_low, clip_high)
