"""Per-token loss weights and the loss mask of a step: the arm's mismatch correction, its token
filter (80/20 entropy) and the tokens that leave the loss's count (rejections under
`mismatch.rejected: drop`, DAPO's overlong filter). The off-policy sequence mask needs
pi_theta: step._update applies it per mini-batch (`off_policy_weights`)."""

from __future__ import annotations

from functools import partial
from typing import Callable

from gspo_cli import distributed
from gspo_cli.algorithms import correction_stats, entropy_top_mask, off_policy_sequence_mask
from gspo_cli.errors import SpecError
from gspo_cli.metrics import MISMATCH_STAT_KEYS
from gspo_cli.rollout import RolloutBatch
from gspo_cli.spec import ArmConfig
from gspo_cli.train.stats import StepStats


def token_weights(
    arm: ArmConfig, stats: StepStats, correct, old_logp_BC, entropy_BC, batch: RolloutBatch, dist_info=None
):
    """(weights_BC or None, loss_mask_BC), both (B, C): the per-token loss factor (mismatch
    correction x 80/20 entropy filter; 0 drops a token from the gradient and the statistics)
    and the mask the loss aggregates over: the response mask without the tokens that leave
    the loss's count (a mask correction's rejections under `mismatch.rejected: drop`,
    truncated responses under `overlong.filter`). `dist_info` (a DistInfo; None: one process):
    the 80/20 threshold is taken over every process's trained tokens."""
    mask_BC = batch.model_mask  # the model's tokens (multi-turn: tool output never trains)
    weights_BC, loss_mask_BC = None, mask_BC
    if correct is not None:
        corr = mismatch_weights(stats, correct, arm, old_logp_BC, batch, mask_BC)
        weights_BC = corr.weight_BC
        if arm.mismatch.rejected == "drop":
            loss_mask_BC = loss_mask_BC * ~corr.masked_BC
    if arm.overlong.filter:
        loss_mask_BC = loss_mask_BC * ~batch.truncated.unsqueeze(1)
    if arm.token_filter.entropy_top is not None:
        # The share is of the tokens the loss trains: a truncated response under the overlong
        # filter or a rejected token (drop or zero) neither sets the threshold nor is kept.
        trained_BC = loss_mask_BC if weights_BC is None else loss_mask_BC * (weights_BC != 0)
        gather = partial(distributed.gather_values, info=dist_info) if dist_info is not None else None
        keep_BC = entropy_top_mask(entropy_BC, trained_BC, arm.token_filter.entropy_top, gather).to(mask_BC.dtype)
        weights_BC = keep_BC if weights_BC is None else weights_BC * keep_BC
    return weights_BC, loss_mask_BC


def off_policy_weights(delta: float, stats: StepStats, batch: RolloutBatch, rows, logp_bc, old_logp_bc, adv_B, mask_bc):
    """(b, c) 0/1 weights of DeepSeek-V3.2's off-policy sequence mask for mini-batch `rows` (its
    trimmed width c = logp_bc's): pi_theta (`logp_bc`) against the sampler's log-probs when the
    batch has them (`batch.engine_logp`; TRL and ms-swift do the same), else against pi_old
    (`old_logp_bc`). Against the trainer's pi_old alone the mask saw only the drift of the
    step's updates, never the engine/trainer mismatch, and could not fire in mini-batch 0.
    Logs which it used: `policy/off_policy_mask_sampler` (1: the sampler's)."""
    sampler = batch.engine_logp is not None
    c = logp_bc.shape[1]
    behaviour_bc = batch.engine_logp[rows][:, :c].to(logp_bc.device) if sampler else old_logp_bc
    keep_b = off_policy_sequence_mask(logp_bc, behaviour_bc, adv_B[rows], mask_bc, delta)
    stats.same("policy/off_policy_mask_sampler", float(sampler))
    return keep_b.unsqueeze(1).to(mask_bc.dtype).expand_as(mask_bc)


def mismatch_weights(
    stats: StepStats, correct: Callable, arm: ArmConfig, trainer_logp_BC, batch: RolloutBatch, mask_BC
):
    """The arm's mismatch correction (a Correction of (B, C) tensors): the engine sampled
    (behaviour policy `batch.engine_logp`), the loss's ratios are taken against the trainer's
    pi_old (`trainer_logp_BC`), so each token is reweighted by pi_old / pi_engine, bounded
    as the mode says. Its statistics go into `stats`."""
    if batch.engine_logp is None:
        raise SpecError(
            f"arms.{arm.name}.mismatch.mode: {arm.mismatch.mode} needs the engine's log-probs and this "
            "batch has none (the hf engine returns them only within its logits budget, "
            "rollout/hf.py LOGITS_BUDGET)"
        )
    corr = correct(trainer_logp_BC, batch.engine_logp, mask_BC, low=arm.mismatch.low, high=arm.mismatch.high)
    for k, (total, weight) in correction_stats(corr, mask_BC).items():  # weights: tokens or responses
        stats.mean(MISMATCH_STAT_KEYS[k][0], total, weight)
    return corr
