"""The policy-loss registry and the GSPO paper's two losses: GRPO (token ratio) and GSPO
(sequence ratio), plus GSPO-token. The field's other variants live beside them by concept:
``losses_sequence`` (LUSPO, GMPO), ``losses_gated`` (CISPO, SAPO), ``losses_cov``
(Clip-Cov, KL-Cov).

Every loss is called as::

    loss, stats = fn(logp_BC, old_logp_BC, adv, mask_BC, *, clip_low, clip_high,
                     aggregation="seq_mean_token_mean", denominator=None, weights_BC=None,
                     **params)

with ``logp_BC`` / ``old_logp_BC`` the (B, C) log-probs of the sampled tokens
under the current / behaviour policy, ``mask_BC`` (B, C) 1.0 on response tokens,
and ``adv`` either (B,) or (B, C). ``loss`` is minus the objective, aggregated over
response tokens (``denominator``: see ``aggregate``; None for a batch on one process);
``stats`` holds detached 0-d diagnostics, means over the tokens the loss can move
(``*_token``, ratio, approx_kl: response tokens of non-zero weight) or its non-empty
responses (``*_seq``). ``weights_BC`` (B, C), when given, multiplies the per-token loss
before aggregation: the rollout/trainer mismatch correction (``mismatch.py``) times any token
filter (``filters.py``); 0 drops a token from the gradient and the statistics, the
aggregation's count is unchanged (a caller that wants a dropped token out of the count
removes it from ``mask_BC``). It must be detached and finite.

The token-level PPO-clipped losses (``grpo``, ``gspo_token``, ``clip_cov``) also take
``clip_dual=None``: dual-clip PPO (``ratios.clipped_surrogate_loss``); the trainer passes it only
when the arm sets it, and ``takes_dual_clip(name)`` says whether a loss offers it. What
``clip_low`` / ``clip_high`` mean (ratio space, log space, unused) is registered beside each loss
(``LOSS_CLIPS``), and ``clip_problems`` checks an arm's values against it.

``params`` are the loss's own keyword arguments (e.g. SAPO's ``tau_pos``), with the paper's
defaults; ``loss_params(name)`` lists them, so a spec can refuse another loss's parameter.
Each loss also declares its ``level``: ``token`` losses weigh each token's gradient on its
own, ``sequence`` losses (GSPO, LUSPO, GMPO) couple a response's tokens through one
sequence ratio, so a per-token weight cannot drop or correct one token (see
``token_level_only``).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Literal

import torch

from .aggregation import aggregate
from .ratios import (
    advantages_BC,
    clipped_surrogate_loss,
    masked_log_ratio,
    ppo_clip_stats,
    seq_log_ratio,
    sequence_clipped_loss,
    stats_mask,
    token_ratio,
    weighted,
)

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]

POLICY_LOSSES: dict[str, PolicyLossFn] = {}
LOSS_LEVELS: dict[str, str] = {}
# What clip_low / clip_high mean for each loss: "ratio": the ratio is clipped to
# [1 - clip_low, 1 + clip_high], so clip_low is at most 1 (1.0: no lower bound); "log": the
# log-ratio is clipped to [-clip_low, clip_high] (any positive bound); "none": not used.
LOSS_CLIPS: dict[str, str] = {}

# The keyword arguments every loss takes; anything else in its signature is its own parameter,
# except the ones the trainer fills from an arm field only some losses take (DUAL_CLIP_KWARG).
COMMON_KWARGS = frozenset({"clip_low", "clip_high", "aggregation", "denominator", "weights_BC"})
# Dual-clip PPO (arms[].clip_dual): a loss offers it by taking this keyword (default None).
DUAL_CLIP_KWARG = "clip_dual"
# A loss whose token selection is nonlinear over the mini-batch (Clip-Cov, KL-Cov) takes the
# selection made over the whole mini-batch under this keyword when the trainer runs it in
# micro-batches (``MINIBATCH_SELECTIONS``); None: it selects over the batch it is given.
SELECTION_KWARG = "selected_BC"
ARM_KWARGS = COMMON_KWARGS | {DUAL_CLIP_KWARG, SELECTION_KWARG}
# name -> fn(logp_BC, old_logp_BC, advantages, mask_BC, *, clip_low, clip_high, weights_BC,
# **params) -> (B, C) bool: the tokens the loss selects over the batch it is given, what
# the loss takes as ``selected_BC`` (consuming the same random draws as the loss itself).
MINIBATCH_SELECTIONS: dict[str, Callable[..., torch.Tensor]] = {}


def register_policy_loss(
    name: str, level: Literal["token", "sequence"] = "token", clip: Literal["ratio", "log", "none"] = "ratio"
) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator adding ``fn`` to ``POLICY_LOSSES`` under ``name``, with its ratio ``level`` and
    what its clip bounds mean (``clip``, see ``LOSS_CLIPS``)."""

    def deco(fn: PolicyLossFn) -> PolicyLossFn:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} registered twice")
        POLICY_LOSSES[name] = fn
        LOSS_LEVELS[name] = level
        LOSS_CLIPS[name] = clip
        return fn

    return deco


def clip_problems(name: str, clip_low: float, clip_dual: float | None) -> list[str]:
    """One ``field: why`` line per clip setting loss ``name`` cannot take: a ``clip_low`` above 1
    where the ratio is clipped at 1 - clip_low (a negative bound), a ``clip_dual`` for a loss
    without dual clip."""
    problems = []
    if LOSS_CLIPS[name] == "ratio" and clip_low > 1:
        problems.append(
            f"clip_low: {clip_low} is above 1; {name} clips the ratio at 1 - clip_low, so 1.0 already "
            "means no lower bound"
        )
    if clip_dual is not None and not takes_dual_clip(name):
        offered = ", ".join(n for n in POLICY_LOSSES if takes_dual_clip(n))
        problems.append(f"clip_dual: {name} has no dual clip (the token-level PPO-clipped losses do: {offered})")
    return problems


def get_policy_loss(name: str) -> PolicyLossFn:
    """Look up a registered loss; unknown names raise ValueError listing valid ones."""
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown policy loss {name!r}; valid: {sorted(POLICY_LOSSES)}") from None


def loss_params(name: str) -> dict[str, Any]:
    """The loss's own keyword parameters and their defaults (the paper's), from its signature."""
    sig = inspect.signature(get_policy_loss(name))
    return {
        p.name: p.default
        for p in sig.parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in ARM_KWARGS
    }


def takes_dual_clip(name: str) -> bool:
    """Whether loss ``name`` offers dual-clip PPO (takes ``clip_dual``): the token-level
    PPO-clipped losses."""
    return DUAL_CLIP_KWARG in inspect.signature(get_policy_loss(name)).parameters


def loss_param_problems(name: str, params: dict[str, Any]) -> list[str]:
    """One ``name: why`` line per parameter that ``name`` does not take; a parameter of another
    registered loss says whose it is."""
    own = loss_params(name)
    owners: dict[str, list[str]] = {}
    for other in POLICY_LOSSES:
        for p in loss_params(other):
            owners.setdefault(p, []).append(other)
    takes = ", ".join(own) or "no parameters"
    problems = []
    for key in params:
        if key in own:
            continue
        if key in owners:
            problems.append(f"{key}: a parameter of {', '.join(owners[key])}, not of {name} ({name} takes {takes})")
        else:
            problems.append(f"{key}: unknown parameter of {name} ({name} takes {takes})")
    return problems


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
    clip_dual: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO: token ratio w_{i,t} = exp(logp - old_logp), PPO-clipped per token.

    loss_{i,t} = -min(w A, clip(w, 1 - clip_low, 1 + clip_high) A) (DeepSeekMath,
    arXiv:2402.03300; with clip_high > clip_low it is DAPO's clip-higher, arXiv:2503.14476).
    ``clip_dual`` (> 1, None: off): dual-clip PPO, see ``ratios.clipped_surrogate_loss``.
    Shapes: logp_BC, old_logp_BC, mask_BC (B, C); advantages (B,) or (B, C).
    """
    keep_BC = mask_BC > 0
    log_ratio_BC = masked_log_ratio(logp_BC, old_logp_BC, keep_BC)
    ratio_BC = token_ratio(log_ratio_BC)
    adv_BC = advantages_BC(advantages, keep_BC)
    loss_BC = clipped_surrogate_loss(ratio_BC, adv_BC, clip_low, clip_high, clip_dual)
    loss = aggregate(weighted(loss_BC, weights_BC), mask_BC, aggregation, denominator)
    # Sequence ratio is not used by GRPO but is logged to compare with GSPO runs.
    seq_lr_B = seq_log_ratio(log_ratio_BC, keep_BC)
    kept_BC = stats_mask(mask_BC, weights_BC)
    return loss, ppo_clip_stats(ratio_BC, seq_lr_B, log_ratio_BC, adv_BC, kept_BC, clip_low, clip_high, clip_dual)


@register_policy_loss("gspo", level="sequence")
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
    """GSPO: sequence ratio s_i = exp(mean_t log(pi/pi_old)), PPO-clipped per sequence
    (arXiv:2507.18071): loss_i = -min(s_i A_i, clip(s_i, 1 - clip_low, 1 + clip_high) A_i).

    Shapes: logp_BC, old_logp_BC, mask_BC (B, C); advantages_B (B,) only, since the
    objective is defined per sequence. The per-sequence loss is broadcast to every
    response token and then aggregated, so the default aggregation gives the
    paper's (1/G) sum_i, and other modes weight sequences like their tokens.
    A token-varying ``weights_BC`` only rescales a response by its mean weight: a
    per-token mismatch correction is refused by the spec (``token_level_only``).
    """
    return sequence_clipped_loss(
        "gspo", logp_BC, old_logp_BC, advantages_B, mask_BC, clip_low, clip_high, aggregation, denominator, weights_BC
    )


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
    clip_dual: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO-token: s_{i,t} = sg[s_i] * exp(logp - sg[logp]), clipped per token (arXiv:2507.18071).

    Value of s_{i,t} equals s_i and its gradient is s_i * grad(logp_{i,t}), so with
    (B,) advantages this matches ``gspo`` in value, clipping and gradient while
    also allowing (B, C) per-token advantages and per-token weights (a token-level loss).
    ``clip_dual`` (> 1, None: off): dual-clip PPO on s_{i,t}, see ``ratios.clipped_surrogate_loss``.
    """
    keep_BC = mask_BC > 0
    log_ratio_BC = masked_log_ratio(logp_BC, old_logp_BC, keep_BC)
    seq_lr_B = seq_log_ratio(log_ratio_BC, keep_BC)
    # logp - sg[logp] is 0 in value but carries d logp; masked via where for NaN safety.
    grad_carrier_BC = masked_log_ratio(logp_BC, logp_BC.detach(), keep_BC)
    ratio_BC = seq_lr_B.detach().exp().unsqueeze(1) * grad_carrier_BC.exp()
    adv_BC = advantages_BC(advantages, keep_BC)
    loss_BC = clipped_surrogate_loss(ratio_BC, adv_BC, clip_low, clip_high, clip_dual)
    loss = aggregate(weighted(loss_BC, weights_BC), mask_BC, aggregation, denominator)
    kept_BC = stats_mask(mask_BC, weights_BC)
    return loss, ppo_clip_stats(ratio_BC, seq_lr_B, log_ratio_BC, adv_BC, kept_BC, clip_low, clip_high, clip_dual)
