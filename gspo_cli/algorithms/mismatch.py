"""Rollout/trainer mismatch corrections: importance weights from the engine's distribution
to the trainer's, applied per token in the policy loss.

Two log-probs of the same sampled tokens meet here, and the naming is fixed:

* ``trainer_logp_BC``: π_old as the *trainer* computes it (its own forward at the weights that
  sampled the batch). It is the denominator of the policy ratio π_θ / π_old in every loss.
* ``engine_logp_BC``: the *behaviour* policy, the distribution the rollout engine actually
  sampled from (vLLM's kernels, another precision, other MoE routes).

The samples come from the engine, the loss is written for the trainer's π_old, so each token
(or sequence) is reweighted by ρ = π_old_trainer / π_engine, the ratio TRL, verl, slime and
SkyRL use. Left untouched, ρ is unbounded where the engine under-samples a token, so every
mode bounds it: truncate (TIS: min(ρ, high)) or mask (weight 0 outside [low, high]).

Every correction is called as::

    corr = fn(trainer_logp_BC, engine_logp_BC, mask_BC, *, low, high)

with (B, C) log-probs of the sampled response tokens and ``mask_BC`` 1.0 on response tokens.
It returns a :class:`Correction` of (B, C) tensors, all detached: ``weight_BC`` the factor the
per-token loss is multiplied by (0 where masked, 0 on padding), ``masked_BC`` tokens the
correction drops, ``truncated_BC`` tokens whose weight was capped at ``high``. A mode uses the
bounds its rule names and no other (the token/sequence TIS modes have no lower bound: ``low``
is accepted, so all modes share one signature, and unused).

Rejected tokens and the loss's count: a mask mode's dropped tokens (``masked_BC``) leave the
aggregation's denominator by default (``mismatch.rejected: drop``, as verl's rejection sampling,
which removes them from the response mask), so the step does not shrink with the acceptance
rate; ``rejected: zero`` keeps them in the count at weight 0 (the earlier behaviour). Either
way the loss's statistics skip them (weight 0; ``ratios.stats_mask``).

Token modes (``token_tis``, ``token_mask``) need a token-level loss: under GSPO's sequence
ratio a token weight only rescales the response by its mean weight, and a masked token still
drives the sequence ratio and its clip decision, so the spec refuses them with sequence-level
losses and points to ``seq_tis`` / ``seq_mask`` / ``geo_mask`` or ``gspo_token``.

Sequence modes: ``seq_tis`` / ``seq_mask`` use the *product* of the token ratios over the
response (exp of the summed log-ratio, as TRL's and verl's sequence IS); ``geo_mask`` uses the
geometric mean (exp of the mean log-ratio, GSPO's length normalisation, SkyRL's and verl's
geometric rejection), which stays near 1 for long responses where the product does not.
Log-ratios are clamped to ±LOG_RATIO_CLAMP before exp, so no weight overflows to inf.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from .kl import LOG_RATIO_CLAMP
from .precision import upcast


class Correction(NamedTuple):
    """Per-token output of a mismatch correction, all (B, C), detached."""

    weight_BC: torch.Tensor  # float: the loss factor; 0 on masked tokens and on padding
    masked_BC: torch.Tensor  # bool: response tokens dropped (weight 0) by the correction
    truncated_BC: torch.Tensor  # bool: response tokens whose weight was capped at `high`


MismatchFn = Callable[..., Correction]

MISMATCH_CORRECTIONS: dict[str, MismatchFn] = {}
# "token": the weight varies within a response (needs a token-level loss to mean anything);
# "sequence": one weight per response (composes with sequence-level losses such as GSPO).
MISMATCH_LEVELS: dict[str, str] = {}


def register_mismatch(name: str, level: str = "token") -> Callable[[MismatchFn], MismatchFn]:
    """Decorator adding ``fn`` to ``MISMATCH_CORRECTIONS`` under ``name``, with its ``level``."""

    def deco(fn: MismatchFn) -> MismatchFn:
        if name in MISMATCH_CORRECTIONS:
            raise ValueError(f"mismatch correction {name!r} registered twice")
        MISMATCH_CORRECTIONS[name] = fn
        MISMATCH_LEVELS[name] = level
        return fn

    return deco


def get_mismatch_correction(name: str) -> MismatchFn:
    """Look up a registered correction; unknown names raise ValueError listing valid ones."""
    try:
        return MISMATCH_CORRECTIONS[name]
    except KeyError:
        raise ValueError(f"unknown mismatch correction {name!r}; valid: {sorted(MISMATCH_CORRECTIONS)}") from None


# ----------------------------------------------------------------------------- helpers


def _log_ratio(trainer_logp_BC, engine_logp_BC, mask_BC) -> tuple[torch.Tensor, torch.Tensor]:
    """(log ρ (B, C), exactly 0 off the response; keep_BC bool)."""
    if trainer_logp_BC.shape != engine_logp_BC.shape or trainer_logp_BC.shape != mask_BC.shape:
        raise ValueError(
            f"shape mismatch: trainer_logp {tuple(trainer_logp_BC.shape)}, engine_logp "
            f"{tuple(engine_logp_BC.shape)}, mask {tuple(mask_BC.shape)}"
        )
    keep_BC = mask_BC > 0
    diff_BC = upcast(trainer_logp_BC.detach()) - upcast(engine_logp_BC.detach())
    return torch.where(keep_BC, diff_BC, torch.zeros_like(diff_BC)), keep_BC


def _truncate(ratio_BC, keep_BC, high: float) -> Correction:
    weight_BC = torch.where(keep_BC, ratio_BC.clamp(max=high), torch.zeros_like(ratio_BC))
    return Correction(weight_BC, torch.zeros_like(keep_BC), keep_BC & (ratio_BC > high))


def _mask(ratio_BC, weight_BC, keep_BC, low: float, high: float) -> Correction:
    """Drop tokens whose `ratio_BC` lies outside [low, high]; the rest keep `weight_BC`."""
    inside_BC = (ratio_BC >= low) & (ratio_BC <= high)
    masked_BC = keep_BC & ~inside_BC
    weight_BC = torch.where(keep_BC & inside_BC, weight_BC, torch.zeros_like(weight_BC))
    return Correction(weight_BC, masked_BC, torch.zeros_like(keep_BC))


def _seq_log_ratio_BC(log_ratio_BC, keep_BC, *, mean: bool) -> torch.Tensor:
    """Per-response log-ratio (sum, or mean over its tokens), clamped, broadcast to (B, C)."""
    seq_B = log_ratio_BC.sum(-1)
    if mean:
        seq_B = seq_B / keep_BC.sum(-1).clamp(min=1).to(seq_B.dtype)
    return seq_B.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).unsqueeze(1).expand_as(log_ratio_BC)


def _token_ratio(log_ratio_BC) -> torch.Tensor:
    return log_ratio_BC.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()


# ----------------------------------------------------------------------------- corrections


@register_mismatch("token_tis")
def token_tis(trainer_logp_BC, engine_logp_BC, mask_BC, *, low: float, high: float) -> Correction:
    """Token truncated IS: w_t = min(ρ_t, high). Never masks; `low` unused."""
    del low
    lr_BC, keep_BC = _log_ratio(trainer_logp_BC, engine_logp_BC, mask_BC)
    return _truncate(_token_ratio(lr_BC), keep_BC, high)


@register_mismatch("token_mask")
def token_mask(trainer_logp_BC, engine_logp_BC, mask_BC, *, low: float, high: float) -> Correction:
    """Token mask (IcePop): w_t = ρ_t where low <= ρ_t <= high, else 0 (token dropped)."""
    lr_BC, keep_BC = _log_ratio(trainer_logp_BC, engine_logp_BC, mask_BC)
    ratio_BC = _token_ratio(lr_BC)
    return _mask(ratio_BC, ratio_BC, keep_BC, low, high)


@register_mismatch("seq_tis", level="sequence")
def seq_tis(trainer_logp_BC, engine_logp_BC, mask_BC, *, low: float, high: float) -> Correction:
    """Sequence truncated IS: every token of response i gets min(Π_t ρ_{i,t}, high). `low` unused."""
    del low
    lr_BC, keep_BC = _log_ratio(trainer_logp_BC, engine_logp_BC, mask_BC)
    return _truncate(_seq_log_ratio_BC(lr_BC, keep_BC, mean=False).exp(), keep_BC, high)


@register_mismatch("seq_mask", level="sequence")
def seq_mask(trainer_logp_BC, engine_logp_BC, mask_BC, *, low: float, high: float) -> Correction:
    """Sequence mask: response i keeps weight Π_t ρ_{i,t} if that product is in [low, high],
    else all its tokens are dropped."""
    lr_BC, keep_BC = _log_ratio(trainer_logp_BC, engine_logp_BC, mask_BC)
    ratio_BC = _seq_log_ratio_BC(lr_BC, keep_BC, mean=False).exp()
    return _mask(ratio_BC, ratio_BC, keep_BC, low, high)


@register_mismatch("geo_mask", level="sequence")
def geo_mask(trainer_logp_BC, engine_logp_BC, mask_BC, *, low: float, high: float) -> Correction:
    """Geometric-mean sequence mask (rejection): response i is dropped unless
    exp(mean_t log ρ_{i,t}) is in [low, high]; kept responses weigh 1 (no reweighting)."""
    lr_BC, keep_BC = _log_ratio(trainer_logp_BC, engine_logp_BC, mask_BC)
    ratio_BC = _seq_log_ratio_BC(lr_BC, keep_BC, mean=True).exp()
    return _mask(ratio_BC, keep_BC.to(ratio_BC.dtype), keep_BC, low, high)


def correction_stats(corr: Correction, mask_BC: torch.Tensor) -> dict[str, tuple[float, float]]:
    """This batch's correction statistics as (total, weight) pairs, so batches and processes
    add up exactly: token means are over response tokens, `*_seq_frac` over non-empty
    responses (a response counts when any of its tokens is masked / truncated). Keys are
    those of ``metrics.MISMATCH_STAT_KEYS``."""
    keep_BC = mask_BC > 0
    n_tok = float(keep_BC.sum())
    nonempty_B = keep_BC.any(-1)
    n_seq = float(nonempty_B.sum())
    return {
        "weight_mean": (float(torch.where(keep_BC, corr.weight_BC, 0.0).sum()), n_tok),
        "masked_token_frac": (float((corr.masked_BC & keep_BC).sum()), n_tok),
        "truncated_token_frac": (float((corr.truncated_BC & keep_BC).sum()), n_tok),
        "masked_seq_frac": (float(((corr.masked_BC & keep_BC).any(-1) & nonempty_B).sum()), n_seq),
        "truncated_seq_frac": (float(((corr.truncated_BC & keep_BC).any(-1) & nonempty_B).sum()), n_seq),
    }
