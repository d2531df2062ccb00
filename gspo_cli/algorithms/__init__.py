"""RL objectives for GRPO vs GSPO: advantage estimators, aggregations, policy losses and
rollout/trainer mismatch corrections."""

from .advantages import (
    ADVANTAGE_ESTIMATORS,
    get_advantage_estimator,
    grpo_advantages,
    mean_only_advantages,
    register_advantage,
    zero_variance_group_frac,
)
from .aggregation import AGGREGATIONS, aggregate, aggregation_count, register_aggregation
from .kl import kl_k3_BC
from .losses import (
    LOG_RATIO_CLAMP,
    POLICY_LOSSES,
    get_policy_loss,
    grpo_loss,
    gspo_loss,
    gspo_token_loss,
    register_policy_loss,
)
from .mismatch import MISMATCH_CORRECTIONS, Correction, correction_stats, get_mismatch_correction, register_mismatch

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "Correction",
    "LOG_RATIO_CLAMP",
    "MISMATCH_CORRECTIONS",
    "POLICY_LOSSES",
    "aggregate",
    "aggregation_count",
    "correction_stats",
    "get_advantage_estimator",
    "get_mismatch_correction",
    "get_policy_loss",
    "kl_k3_BC",
    "grpo_advantages",
    "grpo_loss",
    "gspo_loss",
    "gspo_token_loss",
    "mean_only_advantages",
    "register_advantage",
    "register_aggregation",
    "register_mismatch",
    "register_policy_loss",
    "zero_variance_group_frac",
]
