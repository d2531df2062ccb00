"""RL objectives for GRPO vs GSPO and the field's variants: advantage estimators,
aggregations, policy losses (registered by name), token/sequence filters and rollout/trainer
mismatch corrections. Importing this package registers every loss."""

from . import losses_cov, losses_gated, losses_sequence  # noqa: F401  (register their losses)
from .advantages import (
    ADVANTAGE_ESTIMATORS,
    advantages_of_scored,
    get_advantage_estimator,
    grpo_advantages,
    mean_only_advantages,
    register_advantage,
    zero_variance_group_frac,
)
from .aggregation import (
    AGGREGATIONS,
    CONSTANT_LENGTH,
    aggregate,
    aggregation_count,
    register_aggregation,
    weighs_responses_equally,
)
from .filters import TOKEN_FILTERS, entropy_top_mask, off_policy_sequence_mask, overlong_penalty, signal_groups
from .kl import LOG_RATIO_CLAMP, kl_k3_BC
from .losses import (
    LOSS_CLIPS,
    LOSS_LEVELS,
    POLICY_LOSSES,
    clip_problems,
    get_policy_loss,
    grpo_loss,
    gspo_loss,
    gspo_token_loss,
    loss_param_problems,
    loss_params,
    register_policy_loss,
    takes_dual_clip,
)
from .losses_cov import clip_cov_loss, kl_cov_loss
from .losses_gated import cispo_loss, sapo_loss
from .losses_sequence import gmpo_loss, luspo_loss
from .mismatch import (
    MISMATCH_CORRECTIONS,
    MISMATCH_LEVELS,
    Correction,
    correction_stats,
    get_mismatch_correction,
    register_mismatch,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "CONSTANT_LENGTH",
    "Correction",
    "LOG_RATIO_CLAMP",
    "LOSS_CLIPS",
    "LOSS_LEVELS",
    "MISMATCH_CORRECTIONS",
    "MISMATCH_LEVELS",
    "POLICY_LOSSES",
    "TOKEN_FILTERS",
    "advantages_of_scored",
    "aggregate",
    "aggregation_count",
    "cispo_loss",
    "clip_cov_loss",
    "clip_problems",
    "correction_stats",
    "entropy_top_mask",
    "get_advantage_estimator",
    "get_mismatch_correction",
    "get_policy_loss",
    "gmpo_loss",
    "grpo_advantages",
    "grpo_loss",
    "gspo_loss",
    "gspo_token_loss",
    "kl_cov_loss",
    "kl_k3_BC",
    "loss_param_problems",
    "loss_params",
    "luspo_loss",
    "mean_only_advantages",
    "off_policy_sequence_mask",
    "overlong_penalty",
    "register_advantage",
    "register_aggregation",
    "register_mismatch",
    "register_policy_loss",
    "sapo_loss",
    "signal_groups",
    "takes_dual_clip",
    "weighs_responses_equally",
    "zero_variance_group_frac",
]
