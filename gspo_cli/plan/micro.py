"""What `gspo plan` reads from the micro-batch settings (train.micro_batch_tokens and
micro_batch_rows bound the rows of every forward; rollout.sample_rows the rows sampled at once),
and the largest token budget it suggests. No torch."""

from __future__ import annotations


def forward_rows(spec, row_tokens: int) -> int | None:
    """Rows one forward holds per process under the spec's micro-batch budget, every row at its
    longest (`row_tokens`: prompt + max_new_tokens); None without a budget."""
    tokens, rows = spec.train.micro_batch_tokens, spec.train.micro_batch_rows
    bounds = [b for b in (None if tokens is None else max(1, tokens // row_tokens), rows) if b is not None]
    return min(bounds) if bounds else None


def largest_micro_batch_tokens(shape, spec, hw, prompt_tokens: int) -> int | None:
    """The largest train.micro_batch_tokens, in whole rows at their longest, whose pi_old and
    update phases fit each device of `hw` (None: no device capacity given, or one row does not
    fit). A budget of the whole local batch means it fits unsplit."""
    from gspo_cli.plan.memory import plan_memory

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
