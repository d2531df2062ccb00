"""Arm presets: the GSPO paper's settings (arXiv:2507.18071, section 5.1). An arm names one
and may override any field; presets only fill in fields, they never change one silently."""

from __future__ import annotations

from typing import Any

# Presets: the paper's settings (arXiv:2507.18071, section 5.1). An arm extends one and
# may override any field.
_PAPER_GRPO: dict[str, Any] = {
    "loss": "grpo",
    "clip_low": 0.2,
    "clip_high": 0.27,
    "aggregation": "seq_mean_token_mean",
    "mini_batches": 4,
    "epochs": 1,
    "routing_replay": "off",
    "kl_coef": 0.0,
    "advantage": "grpo",
}
_PAPER_GSPO: dict[str, Any] = {
    **_PAPER_GRPO,
    "loss": "gspo",
    "clip_low": 3e-4,
    "clip_high": 4e-4,
    "aggregation": "seq_mean_token_mean",  # = plain mean over sequences for GSPO
}
PRESETS: dict[str, dict[str, Any]] = {
    "paper-grpo": _PAPER_GRPO,
    "paper-grpo-rr": {**_PAPER_GRPO, "routing_replay": "r2"},
    "paper-gspo": _PAPER_GSPO,
    "paper-gspo-token": {**_PAPER_GSPO, "loss": "gspo_token"},
}
