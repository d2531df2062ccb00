"""What `gspo plan` reads from the micro-batch settings (train.micro_batch_tokens and
micro_batch_rows bound the rows of every forward; rollout.sample_rows the rows sampled at once).
The largest token budget it suggests is in `plan.suggest`. No torch."""

from __future__ import annotations


def forward_rows(spec, row_tokens: int) -> int | None:
    """Rows one forward holds per process under the spec's micro-batch budget, every row at its
    longest (`row_tokens`: prompt + max_new_tokens); None without a budget."""
    tokens, rows = spec.train.micro_batch_tokens, spec.train.micro_batch_rows
    bounds = [b for b in (None if tokens is None else max(1, tokens // row_tokens), rows) if b is not None]
    return min(bounds) if bounds else None
