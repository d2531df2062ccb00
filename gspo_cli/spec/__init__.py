"""The experiment spec: typed pydantic models, one module per section (`model`, `task`,
`rollout`, `training`, `arm`, `experiment`), named presets (`presets`), and YAML loading with
`--set` overrides and stored-spec comparison (`loading`). The public names are re-exported here:
`from gspo_cli.spec import ExperimentSpec`."""

from gspo_cli.spec.arm import AggregationWarning, ArmConfig, MismatchConfig
from gspo_cli.spec.comparison import ComparisonConfig
from gspo_cli.spec.executor import ExecutorConfig, RayConfig, SlurmConfig
from gspo_cli.spec.experiment import SEED_LIMIT, ExperimentSpec, OnPolicyWarning, SweepConfig
from gspo_cli.spec.model import BuiltinModelConfig, ColdStartConfig, LoraSpec, ModelConfig
from gspo_cli.spec.presets import PRESETS
from gspo_cli.spec.rollout import VLLM_RESERVED_KWARGS, RolloutConfig
from gspo_cli.spec.task import EvalSetConfig, RewardConfig, TaskConfig
from gspo_cli.spec.training import DivergenceConfig, OptimizerConfig, TrainConfig
from gspo_cli.spec.tune import TuneConfig

__all__ = [
    "PRESETS",
    "SEED_LIMIT",
    "VLLM_RESERVED_KWARGS",
    "AggregationWarning",
    "ArmConfig",
    "BuiltinModelConfig",
    "ColdStartConfig",
    "ComparisonConfig",
    "DivergenceConfig",
    "EvalSetConfig",
    "ExecutorConfig",
    "RewardConfig",
    "ExperimentSpec",
    "MismatchConfig",
    "LoraSpec",
    "ModelConfig",
    "OnPolicyWarning",
    "OptimizerConfig",
    "RayConfig",
    "RolloutConfig",
    "SlurmConfig",
    "SweepConfig",
    "TaskConfig",
    "TrainConfig",
    "TuneConfig",
]
