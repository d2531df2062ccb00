"""Micro-batches of a training step (`train.micro_batch_tokens`, `train.micro_batch_rows`): the
spec's budget and the step's no-grad forwards in it. The packing and the chunked forward live in
rollout/micro_batches.py, where the staleness worker's sampler reads them too."""

from __future__ import annotations

from gspo_cli.rollout.micro_batches import Split, forward_logprobs, padded_count, row_tokens, split_rows

__all__ = ["Split", "batch_logprobs", "budget", "forward_logprobs", "padded_count", "row_tokens", "split_rows"]


def budget(spec) -> tuple[int | None, int | None]:
    """(micro_batch_tokens, micro_batch_rows) of an ExperimentSpec."""
    return spec.train.micro_batch_tokens, spec.train.micro_batch_rows


def batch_logprobs(ctx, model, batch, *, with_entropy: bool = False, replay_BT=None, record: bool = False):
    """(LogProbs, routes (L, B, T, k) or None) of a no-grad forward of `model` over the step's
    whole `batch` (pi_old, the KL reference, the log-prob checks), in micro-batches of the
    spec's budget: `forward_logprobs` with a train.step.Ctx's settings."""
    max_tokens, max_rows = budget(ctx.spec)
    return forward_logprobs(
        model,
        batch,
        ctx.spec.rollout.temperature,
        max_tokens,
        max_rows,
        routing=ctx.routing,
        info=ctx.dist,
        with_entropy=with_entropy,
        replay_BT=replay_BT,
        record=record,
        packed=ctx.packed,
    )
