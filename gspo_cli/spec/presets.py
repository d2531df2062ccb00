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
# The field's variants (docs/algorithms/zoo.md): each paper's own clip, aggregation and
# parameters over the GSPO paper's update schedule (4 mini-batches, one epoch, no KL), so they
# differ from paper-grpo only in what the variant defines.
_DAPO: dict[str, Any] = {  # arXiv:2503.14476
    **_PAPER_GRPO,
    "clip_low": 0.2,
    "clip_high": 0.28,
    "aggregation": "token_mean",
    "overlong": {"filter": True, "buffer_frac": 0.2, "penalty": 1.0},
    "dynamic_sampling": {"max_rounds": 3},
}
VARIANT_PRESETS: dict[str, dict[str, Any]] = {
    "dapo": _DAPO,
    # arXiv:2503.20783: no std scaling, token sum over a constant (max length x group)
    "dr-grpo": {
        **_PAPER_GRPO,
        "clip_low": 0.2,
        "clip_high": 0.2,
        "advantage": "mean_only",
        "aggregation": "seq_mean_token_sum_norm",
    },
    # MiniMax-M1 (arXiv:2506.13585): no lower bound; ScaleRL caps the IS weight at 5
    "cispo": {**_PAPER_GRPO, "loss": "cispo", "clip_low": 1.0, "clip_high": 4.0, "aggregation": "token_mean"},
    # arXiv:2511.20347: the gate replaces the clip (clip fields unused)
    "sapo": {**_PAPER_GRPO, "loss": "sapo", "loss_params": {"tau_pos": 1.0, "tau_neg": 1.05}},
    # arXiv:2507.20673: log-space clip (-0.4, 0.4)
    "gmpo": {**_PAPER_GRPO, "loss": "gmpo", "clip_low": 0.4, "clip_high": 0.4},
    # TRL luspo: GSPO scaled by length, clip 2e-3 / 2.5e-3
    "luspo": {**_PAPER_GSPO, "loss": "luspo", "clip_low": 2e-3, "clip_high": 2.5e-3},
    # arXiv:2505.22617 (token-mean; our clip choice: DAPO's clip-higher)
    "clip-cov": {
        **_PAPER_GRPO,
        "loss": "clip_cov",
        "clip_low": 0.2,
        "clip_high": 0.28,
        "aggregation": "token_mean",
        "loss_params": {"cov_ratio": 2e-4, "cov_lb": 1.0, "cov_ub": 5.0},
    },
    "kl-cov": {
        **_PAPER_GRPO,
        "loss": "kl_cov",
        "clip_low": 0.2,
        "clip_high": 0.28,
        "aggregation": "token_mean",
        "loss_params": {"cov_ratio": 2e-3, "kl_coef": 1.0},
    },
}
PRESETS: dict[str, dict[str, Any]] = {
    "paper-grpo": _PAPER_GRPO,
    "paper-grpo-rr": {**_PAPER_GRPO, "routing_replay": "r2"},
    "paper-gspo": _PAPER_GSPO,
    "paper-gspo-token": {**_PAPER_GSPO, "loss": "gspo_token"},
    **VARIANT_PRESETS,
}
