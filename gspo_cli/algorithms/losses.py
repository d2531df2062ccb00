"""Clipped policy-gradient losses: GRPO (token ratio) and GSPO (sequence ratio).

Every loss is called as::

    loss, stats = fn(logp_BT, old_logp_BT, adv, mask_BT, *, clip_low, clip_high,
                     aggregation="seq_mean_token_mean")

with ``logp_BT`` / ``old_logp_BT`` the (B, T) log-probs of the sampled tokens
under the current / behaviour policy, ``mask_BT`` (B, T) 1.0 on response tokens,
and ``adv`` either (B,) or (B, T). ``loss`` is minus the clipped objective,
aggregated over response tokens; ``stats`` holds detached 0-d diagnostics.

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

LOG_RATIO_CLAMP = 20.0

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


def _masked_log_ratio(logp_BT: torch.Tensor, old_logp_BT: torch.Tensor, keep_BT: torch.Tensor) -> torch.Tensor:
    """(B, T) log(pi/pi_old) on response tokens, exactly 0 elsewhere (unclamped)."""
    if logp_BT.shape != old_logp_BT.shape or logp_BT.shape != keep_BT.shape:
        raise ValueError(
            f"shape mismatch: logp {tuple(logp_BT.shape)}, old_logp {tuple(old_logp_BT.shape)}, "
            f"mask {tuple(keep_BT.shape)}"
        )
    return torch.where(keep_BT, logp_BT - old_logp_BT, torch.zeros_like(logp_BT))


def _seq_log_ratio(log_ratio_BT: torch.Tensor, keep_BT: torch.Tensor) -> torch.Tensor:
    """(B, T) masked log-ratio -> (B,) length-normalised sequence log-ratio, clamped.

    Empty responses get 0 (ratio 1) via the max(|y|, 1) guard.
    """
    n_tok_B = keep_BT.sum(dim=-1).clamp(min=1).to(log_ratio_BT.dtype)
    seq_B = log_ratio_BT.sum(dim=-1) / n_tok_B
    return seq_B.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _advantages_BT(advantages: torch.Tensor, keep_BT: torch.Tensor) -> torch.Tensor:
    """(B,) or (B, T) advantages -> (B, T), zeroed at masked positions."""
    if advantages.dim() == 1 and advantages.shape[0] == keep_BT.shape[0]:
        adv_BT = advantages.unsqueeze(1).expand_as(keep_BT)
    elif advantages.shape == keep_BT.shape:
        adv_BT = advantages
    else:
        raise ValueError(
            f"advantages must be (B,) or (B, T) = {tuple(keep_BT.shape)}, got {tuple(advantages.shape)}"
        )
    return torch.where(keep_BT, adv_BT, torch.zeros_like(adv_BT))


def _clipped_surrogate_loss(
    ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float
) -> torch.Tensor:
    """-min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A), elementwise, any shape."""
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return -torch.minimum(ratio * adv, clipped * adv)


def _stats(
    ratio_BT: torch.Tensor,
    seq_log_ratio_B: torch.Tensor,
    log_ratio_BT: torch.Tensor,
    adv_BT: torch.Tensor,
    keep_BT: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> dict[str, torch.Tensor]:
    """Detached 0-d diagnostics; ``ratio_BT`` is the ratio the loss clips on."""
    with torch.no_grad():
        ratio_BT = ratio_BT.detach()
        dtype = ratio_BT.dtype
        zeros_BT = torch.zeros_like(ratio_BT)
        n_tok = keep_BT.sum().clamp(min=1).to(dtype)
        zero = torch.zeros((), dtype=dtype, device=ratio_BT.device)

        # A token counts as clipped only when clipping actually zeroes its gradient,
        # i.e. the ratio left the trust region on the side the advantage pushes to.
        high_BT = keep_BT & (ratio_BT > 1.0 + clip_high) & (adv_BT > 0)
        low_BT = keep_BT & (ratio_BT < 1.0 - clip_low) & (adv_BT < 0)
        any_BT = (high_BT | low_BT).to(dtype)
        mask_f = keep_BT.to(dtype)

        resp_ratio = ratio_BT[keep_BT]
        lr_BT = log_ratio_BT.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        # k3 estimator of KL(old || new): r - 1 - log r, r = pi/pi_old; expm1 for precision.
        k3_BT = torch.where(keep_BT, torch.expm1(lr_BT) - lr_BT, zeros_BT)
        nonempty_B = keep_BT.any(dim=-1)
        seq_ratio_B = seq_log_ratio_B.detach().exp()
        n_seq = nonempty_B.sum().clamp(min=1).to(dtype)

        has_tok = resp_ratio.numel() > 0
        return {
            "clip_frac_token": any_BT.sum() / n_tok,
            "clip_frac_token_low": low_BT.to(dtype).sum() / n_tok,
            "clip_frac_token_high": high_BT.to(dtype).sum() / n_tok,
            "clip_frac_seq": aggregate(any_BT, mask_f, "seq_mean_token_mean"),
            "ratio_mean": torch.where(keep_BT, ratio_BT, zeros_BT).sum() / n_tok,
            "ratio_min": resp_ratio.min() if has_tok else zero.clone(),
            "ratio_max": resp_ratio.max() if has_tok else zero.clone(),
            "seq_ratio_mean": torch.where(nonempty_B, seq_ratio_B, torch.zeros_like(seq_ratio_B)).sum()
            / n_seq,
            "approx_kl": k3_BT.sum() / n_tok,
        }


# ----------------------------------------------------------------------------- losses


@register_policy_loss("grpo")
def grpo_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    advantages: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    aggregation: str = "seq_mean_token_mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO: token ratio w_{i,t} = exp(logp - old_logp), PPO-clipped per token.

    Shapes: logp_BT, old_logp_BT, mask_BT (B, T); advantages (B,) or (B, T).
    """
    keep_BT = mask_BT > 0
    log_ratio_BT = _masked_log_ratio(logp_BT, old_logp_BT, keep_BT)
    ratio_BT = log_ratio_BT.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    adv_BT = _advantages_BT(advantages, keep_BT)
    loss_BT = _clipped_surrogate_loss(ratio_BT, adv_BT, clip_low, clip_high)
    loss = aggregate(loss_BT, mask_BT, aggregation)
    # Sequence ratio is not used by GRPO but is logged to compare with GSPO runs.
    seq_lr_B = _seq_log_ratio(log_ratio_BT, keep_BT)
    return loss, _stats(ratio_BT, seq_lr_B, log_ratio_BT, adv_BT, keep_BT, clip_low, clip_high)


@register_policy_loss("gspo")
def gspo_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    advantages_B: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    aggregation: str = "seq_mean_token_mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO: sequence ratio s_i = exp(mean_t log(pi/pi_old)), PPO-clipped per sequence.

    Shapes: logp_BT, old_logp_BT, mask_BT (B, T); advantages_B (B,) only, since the
    objective is defined per sequence. The per-sequence loss is broadcast to every
    response token and then aggregated, so the default aggregation gives the
    paper's (1/G) sum_i, and other modes weight sequences like their tokens.
    """
    if advantages_B.dim() != 1:
        raise ValueError(
            f"gspo needs per-sequence advantages of shape (B,), got {tuple(advantages_B.shape)}; "
            "use 'gspo_token' for per-token advantages"
        )
    keep_BT = mask_BT > 0
    log_ratio_BT = _masked_log_ratio(logp_BT, old_logp_BT, keep_BT)
    seq_lr_B = _seq_log_ratio(log_ratio_BT, keep_BT)
    seq_ratio_B = seq_lr_B.exp()
    adv_BT = _advantages_BT(advantages_B, keep_BT)  # validates B; used for stats
    loss_B = _clipped_surrogate_loss(seq_ratio_B, advantages_B, clip_low, clip_high)
    loss_BT = loss_B.unsqueeze(1).expand_as(logp_BT)
    loss = aggregate(loss_BT, mask_BT, aggregation)
    ratio_BT = seq_ratio_B.detach().unsqueeze(1).expand_as(logp_BT)
    return loss, _stats(ratio_BT, seq_lr_B, log_ratio_BT, adv_BT, keep_BT, clip_low, clip_high)


@register_policy_loss("gspo_token")
def gspo_token_loss(
    logp_BT: torch.Tensor,
    old_logp_BT: torch.Tensor,
    advantages: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    aggregation: str = "seq_mean_token_mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO-token: s_{i,t} = sg[s_i] * exp(logp - sg[logp]), clipped per token.

    Value of s_{i,t} equals s_i and its gradient is s_i * grad(logp_{i,t}), so with
    (B,) advantages this matches ``gspo`` in value, clipping and gradient while
    also allowing (B, T) per-token advantages.
    """
    keep_BT = mask_BT > 0
    log_ratio_BT = _masked_log_ratio(logp_BT, old_logp_BT, keep_BT)
    seq_lr_B = _seq_log_ratio(log_ratio_BT, keep_BT)
    # logp - sg[logp] is 0 in value but carries d logp; masked via where for NaN safety.
    grad_carrier_BT = _masked_log_ratio(logp_BT, logp_BT.detach(), keep_BT)
    ratio_BT = seq_lr_B.detach().exp().unsqueeze(1) * grad_carrier_BT.exp()
    adv_BT = _advantages_BT(advantages, keep_BT)
    loss_BT = _clipped_surrogate_loss(ratio_BT, adv_BT, clip_low, clip_high)
    loss = aggregate(loss_BT, mask_BT, aggregation)
    return loss, _stats(ratio_BT, seq_lr_B, log_ratio_BT, adv_BT, keep_BT, clip_low, clip_high)
