"""What every policy loss shares: masked log-ratios, sequence ratios, advantages broadcast to
tokens, the clipped surrogate, mismatch weights and the loss statistics.

Log-ratios are formed inside ``torch.where(mask, ..., 0)`` so NaN or garbage at padded
positions cannot leak into values or gradients, and are clamped to
[-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP] before ``exp`` so a stale or broken behaviour policy
cannot overflow a ratio to inf (exp(20) ~ 4.9e8 is far outside any clip range).

Statistics are taken over the tokens the loss can move: response tokens whose weight
(``weights_BC``, the mismatch correction times any token filter) is not 0. A token a
correction or filter dropped is neither "clipped" nor part of a ratio mean; the dropped
share is logged on its own (``policy/dropped_token_frac``).
"""

from __future__ import annotations

import torch

from .aggregation import aggregate
from .kl import LOG_RATIO_CLAMP, kl_k3_BC


def masked_log_ratio(logp_BC: torch.Tensor, old_logp_BC: torch.Tensor, keep_BC: torch.Tensor) -> torch.Tensor:
    """(B, C) log(pi/pi_old) on response tokens, exactly 0 elsewhere (unclamped)."""
    if logp_BC.shape != old_logp_BC.shape or logp_BC.shape != keep_BC.shape:
        raise ValueError(
            f"shape mismatch: logp {tuple(logp_BC.shape)}, old_logp {tuple(old_logp_BC.shape)}, "
            f"mask {tuple(keep_BC.shape)}"
        )
    return torch.where(keep_BC, logp_BC - old_logp_BC, torch.zeros_like(logp_BC))


def token_ratio(log_ratio_BC: torch.Tensor) -> torch.Tensor:
    """(B, C) exp of the clamped log-ratio."""
    return log_ratio_BC.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()


def seq_log_ratio(log_ratio_BC: torch.Tensor, keep_BC: torch.Tensor) -> torch.Tensor:
    """(B, C) masked log-ratio -> (B,) length-normalised sequence log-ratio, clamped.

    Empty responses get 0 (ratio 1) via the max(|y|, 1) guard.
    """
    n_tok_B = keep_BC.sum(dim=-1).clamp(min=1).to(log_ratio_BC.dtype)
    seq_B = log_ratio_BC.sum(dim=-1) / n_tok_B
    return seq_B.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def advantages_BC(advantages: torch.Tensor, keep_BC: torch.Tensor) -> torch.Tensor:
    """(B,) or (B, C) advantages -> (B, C), zeroed at masked positions."""
    if advantages.dim() == 1 and advantages.shape[0] == keep_BC.shape[0]:
        adv_BC = advantages.unsqueeze(1).expand_as(keep_BC)
    elif advantages.shape == keep_BC.shape:
        adv_BC = advantages
    else:
        raise ValueError(f"advantages must be (B,) or (B, C) = {tuple(keep_BC.shape)}, got {tuple(advantages.shape)}")
    return torch.where(keep_BC, adv_BC, torch.zeros_like(adv_BC))


def sequence_advantages(advantages_B: torch.Tensor, loss: str) -> torch.Tensor:
    """Check that a sequence-level loss got (B,) advantages; returns them."""
    if advantages_B.dim() != 1:
        raise ValueError(
            f"{loss} needs per-sequence advantages of shape (B,), got {tuple(advantages_B.shape)}; "
            "use 'gspo_token' for per-token advantages"
        )
    return advantages_B


def clipped_surrogate_loss(
    ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float, clip_dual: float | None = None
) -> torch.Tensor:
    """-min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A), elementwise, any shape.

    With ``clip_dual`` = c (> 1), dual-clip PPO (Ye et al. 2020, arXiv:1912.09729, eq. 5; verl
    ``clip_ratio_c``) also bounds the objective of a negative-advantage token from below:

        A < 0:  -max(min(ratio * A, clip(ratio) * A), c * A)

    so a ratio above c no longer makes the loss grow without bound (its gradient is 0)."""
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = -torch.minimum(ratio * adv, clipped * adv)
    if clip_dual is None:
        return loss
    return torch.where(adv < 0, torch.minimum(loss, -clip_dual * adv), loss)


def dual_clipped(ratio: torch.Tensor, adv: torch.Tensor, clip_dual: float | None) -> torch.Tensor:
    """Bool, ``ratio``'s shape: the tokens whose gradient the dual clip zeroes (A < 0, ratio > c)."""
    if clip_dual is None:
        return torch.zeros_like(ratio, dtype=torch.bool)
    return (adv < 0) & (ratio.detach() > clip_dual)


def weighted(loss_BC: torch.Tensor, weights_BC: torch.Tensor | None) -> torch.Tensor:
    """The per-token loss times the mismatch weights (None: unweighted, bit for bit)."""
    if weights_BC is None:
        return loss_BC
    if weights_BC.shape != loss_BC.shape:
        raise ValueError(f"weights shape {tuple(weights_BC.shape)} != loss shape {tuple(loss_BC.shape)}")
    return loss_BC * weights_BC.detach()


def stats_mask(mask_BC: torch.Tensor, weights_BC: torch.Tensor | None) -> torch.Tensor:
    """(B, C) bool: response tokens the loss can move (weight not 0), what statistics count."""
    keep_BC = mask_BC > 0
    return keep_BC if weights_BC is None else keep_BC & (weights_BC.detach() != 0)


def loss_stats(
    ratio_BC: torch.Tensor,
    seq_log_ratio_B: torch.Tensor,
    log_ratio_BC: torch.Tensor,
    keep_BC: torch.Tensor,
    *,
    high_BC: torch.Tensor,
    low_BC: torch.Tensor,
    dual_BC: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Detached 0-d diagnostics over the tokens in ``keep_BC`` (see ``stats_mask``).

    ``ratio_BC`` is the ratio the loss acts on; ``high_BC`` / ``low_BC`` (B, C) bool the
    tokens the loss counts as clipped on either side (its own rule: for the PPO clip,
    the clip branch of the min is active, i.e. the token's gradient is zeroed); ``dual_BC``,
    when given, those the dual clip zeroed (``clip_frac_token_dual``)."""
    with torch.no_grad():
        ratio_BC = ratio_BC.detach()
        dtype = ratio_BC.dtype
        zeros_BC = torch.zeros_like(ratio_BC)
        n_tok = keep_BC.sum().clamp(min=1).to(dtype)
        zero = torch.zeros((), dtype=dtype, device=ratio_BC.device)
        high_BC = high_BC & keep_BC
        low_BC = low_BC & keep_BC
        dual_given = dual_BC is not None
        dual_BC = dual_BC & keep_BC if dual_given else torch.zeros_like(keep_BC)
        any_BC = (high_BC | low_BC | dual_BC).to(dtype)
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
        dual = {"clip_frac_token_dual": dual_BC.to(dtype).sum() / n_tok} if dual_given else {}
        return {
            **dual,
            # per response (B,): how many of its tokens the clip zeroed the gradient of (samples.jsonl)
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


def ppo_clip_stats(
    ratio_BC,
    seq_log_ratio_B,
    log_ratio_BC,
    adv_BC,
    keep_BC,
    clip_low: float,
    clip_high: float,
    clip_dual: float | None = None,
) -> dict[str, torch.Tensor]:
    """``loss_stats`` for a PPO clip of ``ratio_BC`` to [1 - clip_low, 1 + clip_high]: a token
    counts as clipped only when clipping zeroes its gradient, i.e. the ratio left the trust
    region on the side the advantage pushes to. With ``clip_dual``, a negative-advantage token
    whose ratio exceeds it is clipped too: counted in ``clip_frac_token`` and
    ``clip_frac_token_dual`` (not in low or high, which keep their PPO meaning)."""
    r_BC = ratio_BC.detach()
    return loss_stats(
        r_BC,
        seq_log_ratio_B,
        log_ratio_BC,
        keep_BC,
        high_BC=(r_BC > 1.0 + clip_high) & (adv_BC > 0),
        low_BC=(r_BC < 1.0 - clip_low) & (adv_BC < 0),
        dual_BC=None if clip_dual is None else dual_clipped(r_BC, adv_BC, clip_dual),
    )


def sequence_clipped_loss(
    name: str,
    logp_BC: torch.Tensor,
    old_logp_BC: torch.Tensor,
    advantages_B: torch.Tensor,
    mask_BC: torch.Tensor,
    clip_low: float,
    clip_high: float,
    aggregation: str,
    denominator,
    weights_BC: torch.Tensor | None,
    scale_B: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO's clipped sequence loss, optionally times a per-response scale `scale_B` (B,) (LUSPO:
    the response length), broadcast to the response's tokens and aggregated; statistics on the
    sequence ratio. `name` names the loss in the (B,)-advantages error."""
    sequence_advantages(advantages_B, name)
    keep_BC = mask_BC > 0
    log_ratio_BC = masked_log_ratio(logp_BC, old_logp_BC, keep_BC)
    seq_lr_B = seq_log_ratio(log_ratio_BC, keep_BC)
    seq_ratio_B = seq_lr_B.exp()
    adv_BC = advantages_BC(advantages_B, keep_BC)  # validates B; used for stats
    loss_B = clipped_surrogate_loss(seq_ratio_B, advantages_B, clip_low, clip_high)
    if scale_B is not None:
        loss_B = scale_B * loss_B
    loss = aggregate(weighted(loss_B.unsqueeze(1).expand_as(logp_BC), weights_BC), mask_BC, aggregation, denominator)
    ratio_BC = seq_ratio_B.detach().unsqueeze(1).expand_as(logp_BC)
    kept_BC = stats_mask(mask_BC, weights_BC)
    return loss, ppo_clip_stats(ratio_BC, seq_lr_B, log_ratio_BC, adv_BC, kept_BC, clip_low, clip_high)
