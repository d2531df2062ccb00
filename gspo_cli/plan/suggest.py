"""What `gspo plan` suggests from the memory plan: the largest micro-batch token budget whose
phases fit the devices. No torch."""

from __future__ import annotations

from gspo_cli.plan.memory import plan_memory


def largest_micro_batch_tokens(shape, spec, hw, prompt_tokens: int) -> int | None:
    """The largest train.micro_batch_tokens, in whole rows at their longest, whose pi_old and
    update phases fit each device of `hw` (None: no device capacity given, or one row does not
    fit). A budget of the whole local batch means it fits unsplit."""
    if hw.gpu_bytes is None:
        return None
    T = prompt_tokens + spec.rollout.max_new_tokens
    rows = max(1, spec.rollout.batch_size // hw.world)
    for r in range(rows, 0, -1):
        train = spec.train.model_copy(update={"micro_batch_tokens": r * T, "micro_batch_rows": None})
        plan = plan_memory(shape, spec.model_copy(update={"train": train}), hw, prompt_tokens=prompt_tokens)
        if all(plan.fits(plan.phase(name))[0] for name in ("pi_old", "update")):
            return r * T
    return None
