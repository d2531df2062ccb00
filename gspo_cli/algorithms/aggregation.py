"""Reduce a (B, C) tensor of per-token values to a scalar under a response mask.

The choice of reduction changes how much each response (and each token) weighs in
the loss, which is one of the knobs that differ between GRPO variants:

* ``seq_mean_token_mean``: the GRPO/GSPO paper's form, every response weighs 1/G.
* ``token_mean``: DAPO-style, every token in the batch weighs the same.
* ``seq_mean_token_sum``: Dr. GRPO-style sums, longer responses weigh more.

Masked positions are removed with ``torch.where`` instead of a multiplication so
that NaN/inf sitting in padding can neither poison the value (0 * NaN = NaN) nor
the gradient (where's backward routes exactly 0 to the unselected branch).
"""

from __future__ import annotations

from typing import Callable

import torch

AggregationFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

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


def _mean_over_nonempty(per_seq_B: torch.Tensor, n_tok_B: torch.Tensor) -> torch.Tensor:
    """Mean of per_seq_B over responses that have at least one token.

    An empty response carries no tokens, so letting it count in the denominator
    would silently shrink the loss of every other response. If all responses are
    empty the result is an exact 0 that is still attached to the graph.
    """
    nonempty_B = n_tok_B > 0
    total = torch.where(nonempty_B, per_seq_B, torch.zeros_like(per_seq_B)).sum()
    return total / nonempty_B.sum().clamp(min=1).to(per_seq_B.dtype)


@register_aggregation("seq_mean_token_mean")
def seq_mean_token_mean(values_BC: torch.Tensor, mask_BC: torch.Tensor) -> torch.Tensor:
    """(B, C), (B, C) -> scalar: mean over tokens of each response, then over responses."""
    vals_BC, keep_BC = _masked_zero(values_BC, mask_BC)
    n_tok_B = keep_BC.sum(dim=-1)
    per_seq_B = vals_BC.sum(dim=-1) / n_tok_B.clamp(min=1).to(vals_BC.dtype)
    return _mean_over_nonempty(per_seq_B, n_tok_B)


@register_aggregation("token_mean")
def token_mean(values_BC: torch.Tensor, mask_BC: torch.Tensor) -> torch.Tensor:
    """(B, C), (B, C) -> scalar: sum(values * mask) / sum(mask) over the whole batch."""
    vals_BC, keep_BC = _masked_zero(values_BC, mask_BC)
    return vals_BC.sum() / keep_BC.sum().clamp(min=1).to(vals_BC.dtype)


@register_aggregation("seq_mean_token_sum")
def seq_mean_token_sum(values_BC: torch.Tensor, mask_BC: torch.Tensor) -> torch.Tensor:
    """(B, C), (B, C) -> scalar: token sum per response, mean over non-empty responses.

    Empty responses are excluded from the mean, as in ``seq_mean_token_mean``.
    """
    vals_BC, keep_BC = _masked_zero(values_BC, mask_BC)
    return _mean_over_nonempty(vals_BC.sum(dim=-1), keep_BC.sum(dim=-1))


def aggregate(values_BC: torch.Tensor, mask_BC: torch.Tensor, mode: str) -> torch.Tensor:
    """Reduce ``values_BC`` (B, C) under ``mask_BC`` (B, C; >0 = response token) to a 0-d tensor."""
    try:
        fn = AGGREGATIONS[mode]
    except KeyError:
        raise ValueError(
            f"unknown aggregation {mode!r}; valid modes: {sorted(AGGREGATIONS)}"
        ) from None
    if values_BC.shape != mask_BC.shape:
        raise ValueError(f"values shape {tuple(values_BC.shape)} != mask shape {tuple(mask_BC.shape)}")
    return fn(values_BC, mask_BC)
