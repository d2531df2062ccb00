"""Reduce a (B, C) tensor of per-token values to a scalar under a response mask.

The choice of reduction changes how much each response (and each token) weighs in
the loss, which is one of the knobs that differ between GRPO variants:

* ``seq_mean_token_mean``: the GRPO/GSPO paper's form, every response weighs 1/G.
* ``token_mean``: DAPO-style, every token in the batch weighs the same.
* ``seq_mean_token_sum``: token sums per response, mean over responses; longer responses weigh more.
* ``seq_mean_token_sum_norm``: Dr. GRPO (arXiv:2503.20783; verl ``seq-mean-token-sum-norm``):
  every token's loss summed and divided by a constant, responses x max length, so neither a
  response's length nor the batch's lengths rescale a token's gradient.

Masked positions are removed with ``torch.where`` instead of a multiplication so
that NaN/inf sitting in padding can neither poison the value (0 * NaN = NaN) nor
the gradient (where's backward routes exactly 0 to the unselected branch).
"""

from __future__ import annotations

from typing import Callable

import torch

# (values_BC, mask_BC) -> (total, count): the loss is total / count. Both are sums over
# responses or tokens, so a batch split across processes adds up exactly: each process
# divides its own total by the global count (see `aggregate`'s `denominator`).
AggregationFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]

AGGREGATIONS: dict[str, AggregationFn] = {}


def register_aggregation(name: str) -> Callable[[AggregationFn], AggregationFn]:
    """Decorator adding ``fn`` to ``AGGREGATIONS`` under ``name``."""

    def deco(fn: AggregationFn) -> AggregationFn:
        if name in AGGREGATIONS:
            raise ValueError(f"aggregation {name!r} registered twice")
        AGGREGATIONS[name] = fn
        return fn

    return deco


def _masked_zero(values_BC: torch.Tensor, mask_BC: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (values with masked positions set to 0, boolean mask), both (B, C)."""
    keep_BC = mask_BC > 0
    return torch.where(keep_BC, values_BC, torch.zeros_like(values_BC)), keep_BC


def _over_nonempty(per_seq_B: torch.Tensor, n_tok_B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of per_seq_B over responses with at least one token, their number).

    An empty response carries no tokens, so letting it count in the denominator
    would silently shrink the loss of every other response.
    """
    nonempty_B = n_tok_B > 0
    total = torch.where(nonempty_B, per_seq_B, torch.zeros_like(per_seq_B)).sum()
    return total, nonempty_B.sum().to(per_seq_B.dtype)


@register_aggregation("seq_mean_token_mean")
def seq_mean_token_mean(values_BC: torch.Tensor, mask_BC: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean over tokens of each response, then over responses: (sum of response means, responses)."""
    vals_BC, keep_BC = _masked_zero(values_BC, mask_BC)
    n_tok_B = keep_BC.sum(dim=-1)
    per_seq_B = vals_BC.sum(dim=-1) / n_tok_B.clamp(min=1).to(vals_BC.dtype)
    return _over_nonempty(per_seq_B, n_tok_B)


@register_aggregation("token_mean")
def token_mean(values_BC: torch.Tensor, mask_BC: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every response token of the batch weighs the same: (sum over tokens, tokens)."""
    vals_BC, keep_BC = _masked_zero(values_BC, mask_BC)
    return vals_BC.sum(), keep_BC.sum().to(vals_BC.dtype)


@register_aggregation("seq_mean_token_sum")
def seq_mean_token_sum(values_BC: torch.Tensor, mask_BC: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sum per response, mean over non-empty responses: (sum of sums, responses)."""
    vals_BC, keep_BC = _masked_zero(values_BC, mask_BC)
    return _over_nonempty(vals_BC.sum(dim=-1), keep_BC.sum(dim=-1))


@register_aggregation("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(values_BC: torch.Tensor, mask_BC: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dr. GRPO: (sum over tokens, rows x C). The constant is the maximum response length times
    the responses (every row, empty or not: Dr. GRPO divides by G); the mask's width C stands
    in for the maximum length here; the trainer passes rows x rollout.max_new_tokens as the
    ``denominator`` (``aggregation_count(..., max_len=)``), since a mini-batch's C is trimmed."""
    vals_BC, _ = _masked_zero(values_BC, mask_BC)
    B, C = values_BC.shape
    return vals_BC.sum(), torch.tensor(float(B * C), dtype=vals_BC.dtype, device=vals_BC.device)


# Aggregations whose count is a constant length x responses, not a count of the mask's tokens.
CONSTANT_LENGTH = frozenset({"seq_mean_token_sum_norm"})


def _lookup(mode: str) -> AggregationFn:
    try:
        return AGGREGATIONS[mode]
    except KeyError:
        raise ValueError(f"unknown aggregation {mode!r}; valid modes: {sorted(AGGREGATIONS)}") from None


def aggregate(
    values_BC: torch.Tensor, mask_BC: torch.Tensor, mode: str, denominator: torch.Tensor | float | None = None
) -> torch.Tensor:
    """Reduce ``values_BC`` (B, C) under ``mask_BC`` (B, C; >0 = response token) to a 0-d tensor.

    ``denominator``: what to divide this batch's total by instead of its own count (tokens
    or non-empty responses, as ``mode`` counts them). A batch split across W processes whose
    gradients are averaged passes the global count / W, so the average is the single-process
    value; it must be > 0. With no count at all (every response empty) the result is an exact 0
    that is still attached to the graph.
    """
    fn = _lookup(mode)
    if values_BC.shape != mask_BC.shape:
        raise ValueError(f"values shape {tuple(values_BC.shape)} != mask shape {tuple(mask_BC.shape)}")
    total, count = fn(values_BC, mask_BC)
    return total / (count.clamp(min=1) if denominator is None else denominator)


def weighs_responses_equally(mode: str) -> bool:
    """Whether ``mode`` gives a per-response value (every token of a response equal, as a
    sequence-level loss produces) the plain mean over responses, whatever their lengths: what
    GSPO's (1/G) sum_i means. Measured on three responses of 1, 2 and 4 tokens, not looked up
    by name, so a newly registered aggregation is classified too."""
    mask_BC = torch.tensor([[1.0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.float64)
    value_B = torch.tensor([1.0, 10.0, 100.0], dtype=torch.float64)
    got = aggregate(value_B.unsqueeze(1).expand_as(mask_BC), mask_BC, mode)
    return bool(torch.isclose(got, value_B.mean()))


def aggregation_count(mask_BC: torch.Tensor, mode: str, max_len: int | None = None) -> torch.Tensor:
    """The count ``aggregate`` divides by for ``mode`` (tokens or non-empty responses), 0-d float.
    For a ``CONSTANT_LENGTH`` mode, ``max_len`` (the longest possible response) replaces the
    mask's width: rows x max_len."""
    mask_f = (mask_BC > 0).to(torch.float64)
    if mode in CONSTANT_LENGTH and max_len is not None:
        return torch.tensor(float(mask_BC.shape[0] * max_len), dtype=torch.float64)
    return _lookup(mode)(torch.zeros_like(mask_f), mask_f)[1]
