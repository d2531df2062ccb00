"""The working precision of log-probabilities, ratios and router weights."""

from __future__ import annotations

import torch


def upcast(x: torch.Tensor) -> torch.Tensor:
    """`x` in float32 when it is a lower precision (bf16/fp16 logits, router scores), unchanged in
    float32 and float64. Log-softmax, ratios and their sums need at least float32; a float64
    computation (the equality tests run the model in float64) must stay float64."""
    return x if x.dtype == torch.float64 else x.float()
