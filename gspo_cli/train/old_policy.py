"""pi_old for a rollout batch: the log-probs (with entropy) every update's ratio is taken
against, and, for an MoE, the routes every pi_theta forward replays or compares with. `ctx` is
the trainer's `train.step.Ctx`."""

from __future__ import annotations

import torch

from gspo_cli.algorithms.anchors import uses_proximal
from gspo_cli.errors import SpecError
from gspo_cli.rollout import RolloutBatch
from gspo_cli.rollout.base import LogProbs
from gspo_cli.train.micro import batch_logprobs


def old_policy(ctx, batch: RolloutBatch):
    """(pi_old's LogProbs with entropy, the routes (L, B, T, k) every pi_theta forward replays
    or compares with (None for a dense model), whether the log-probs came from the sampler).

    With the hf engine they came from generate's own forwards already (rollout.sampler_logprobs)
    unless the arm's mismatch correction needs the trainer's; otherwise one no-grad pass computes them: r2
    (and no replay) records the routes it takes, r3 replays the engine's routes in it, so
    pi_old is the trainer's probability of the very sub-network the engine sampled with."""
    r3 = ctx.arm.routing_replay == "r3"
    if r3 and batch.engine_routes is None:
        raise SpecError(
            f"arms.{ctx.arm.name}.routing_replay: r3 needs the rollout engine's routes and this "
            "batch has none (the hf engine records them with rollout.sampler_logprobs; vLLM only "
            "when started to return them)"
        )
    # The correction compares the trainer's pi_old with the engine; a proximal anchor
    # (algorithms/anchors.py) is the trainer's forward of its weights before this step's updates.
    own_forward = ctx.arm.mismatch.mode != "off" or uses_proximal(ctx.arm.anchor, ctx.spec.rollout.staleness)
    if (
        not own_forward
        and batch.engine_entropy is not None
        and (ctx.routing is None or batch.engine_routes is not None)
    ):
        return LogProbs(logp=batch.engine_logp, entropy=batch.engine_entropy), batch.engine_routes, True
    with torch.no_grad(), ctx.compute():  # in micro-batches under train.micro_batch_tokens / _rows
        if ctx.routing is None:
            return batch_logprobs(ctx, ctx.model, batch, with_entropy=True)[0], None, False
        if r3:
            old, _ = batch_logprobs(ctx, ctx.model, batch, with_entropy=True, replay_BT=batch.engine_routes)
            return old, batch.engine_routes, False
        old, routes = batch_logprobs(ctx, ctx.model, batch, with_entropy=True, record=True)
    return old, routes, False
