"""The whole experiment: name, seeds, every section, the arms and an optional sweep, with
the checks that need more than one section (mini-batches vs batch size, engine needs,
registered names)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from gspo_cli.errors import SpecError, router_scale_problem
from gspo_cli.spec.arm import ArmConfig, reward_problems
from gspo_cli.spec.base import _check_dir_name, _did_you_mean, _Problems, _Strict
from gspo_cli.spec.comparison import ComparisonConfig
from gspo_cli.spec.executor import ExecutorConfig
from gspo_cli.spec.model import ModelConfig
from gspo_cli.spec.rollout import RolloutConfig
from gspo_cli.spec.same_gradient import ON_POLICY, off_policy_reasons, same_gradient_pairs
from gspo_cli.spec.task import TaskConfig
from gspo_cli.spec.training import OptimizerConfig, TrainConfig
from gspo_cli.spec.tune import TuneConfig

SEED_LIMIT = 2**32  # numpy's bound; torch and random accept it too


class SweepConfig(_Strict):
    """Variants of the experiment for `gspo sweep`: the grid's cartesian product, times each
    explicit override set. Keys are spec paths; `arms[*].x` sets x in every arm."""

    grid: dict[str, list[Any]] = Field(
        default_factory=dict, description="spec path -> values; every combination is a run"
    )
    sets: list[dict[str, Any]] = Field(
        default_factory=list, description="explicit override sets (spec path -> value), each crossed with the grid"
    )

    @model_validator(mode="after")
    def _check(self):
        for key, values in self.grid.items():
            if not values:
                raise ValueError(f"grid.{key}: needs at least one value")
        return self


class ExperimentSpec(_Strict):
    """An experiment: arms x seeds trained on one model, task and rollout set-up."""

    name: str = Field(description="experiment name: runs go to <output_dir>/<name>/<arm>/seed<k>/")
    output_dir: str = Field("results", min_length=1, description="directory of the experiments' run directories")
    seeds: list[Annotated[int, Field(ge=0, lt=SEED_LIMIT)]] = Field(
        default_factory=lambda: [0], min_length=1, description="one run per arm and seed"
    )
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    rollout: RolloutConfig = RolloutConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    train: TrainConfig = TrainConfig()
    arms: list[ArmConfig] = Field(min_length=1, description="the algorithms compared, one per arm")
    sweep: SweepConfig | None = Field(None, description="variants for gspo sweep")
    comparison: ComparisonConfig | None = Field(
        None,
        description="the primary comparison (baseline, arm, metric, margin) that analysis and "
        "gspo sweep --until-decided decide",
    )
    tune: TuneConfig | None = Field(
        None, description="per-arm grids on one budget, selected on one eval set, compared on another (gspo tune)"
    )
    executor: ExecutorConfig | None = Field(
        None,
        description="where gspo sweep and gspo tune train their runs (local processes, SLURM, Ray) and with what "
        "resources; null: local",
    )

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        return _check_dir_name(v, "experiment names")

    @model_validator(mode="after")
    def _check(self):
        b = self.rollout.batch_size
        problems = _unregistered_names(self.arms)
        for i, arm in enumerate(self.arms):
            if b % arm.mini_batches:
                problems.append(
                    f"arms[{i}].mini_batches: {arm.mini_batches} does not divide the rollout batch "
                    f"({self.rollout.prompts_per_step} prompts x {self.rollout.group_size} = {b})"
                )
            problems += _engine_problems(i, arm, self.rollout)
            rewards = self.task.rewards
            problems += reward_problems(i, arm, [r.label for r in rewards], any(r.correct for r in rewards))
        if self.optimizer.router_lr_scale != 1.0 and self.model.name == "builtin:tiny-dense":
            problems.append(router_scale_problem(self.optimizer.router_lr_scale, self.model.name))  # hub: once built
        if self.train.compile and self.model.sharding == "fsdp":
            problems.append(
                "train.compile: not supported with model.sharding: fsdp (compiled updates are built and tested "
                "for unsharded models only); use sharding ddp or compile: false"
            )
        if self.train.compile and self.train.gradient_checkpointing:
            problems.append(
                "train.compile: with train.gradient_checkpointing the decoder layers fall outside the "
                "compiled graph (it breaks at the checkpoint wrapper), so compiling would cost without "
                "paying; use one or the other"
            )
        for i, arm in enumerate(self.arms):
            if self.task.environment and arm.routing_replay == "r3" and self.rollout.engine != "hf":
                problems.append(
                    f"arms[{i}].routing_replay: r3 with task.environment needs the hf engine's routes "
                    f"(multi-turn {self.rollout.engine} rollouts record none); use r2 or rollout.engine: hf"
                )
        positions = self.model.builtin.max_positions
        if self.task.environment and self.model.name.startswith("builtin:") and self.rollout.total_tokens >= positions:
            problems.append(
                f"rollout.max_total_tokens: {self.rollout.total_tokens} response tokens (model and tool) leave no room "
                f"for the prompt in the built-in model's {positions} positions (model.builtin.max_positions)"
            )
        if self.task.environment and self.rollout.staleness:
            problems.append(
                f"task.environment: not supported with rollout.staleness: {self.rollout.staleness} yet; use staleness 0"
            )
        if self.model.dtype == "float16":
            problems.append(
                "model.dtype: float16 training needs loss scaling, which gspo-cli does not do "
                "(small gradients underflow); use bfloat16"
            )
        names = [a.name for a in self.arms]
        for i, n in enumerate(names):
            if n in names[:i]:
                problems.append(f"arms[{i}].name: duplicate arm name {n!r} (also arms[{names.index(n)}])")
        dupes = sorted({s for s in self.seeds if self.seeds.count(s) > 1})
        if dupes:
            problems.append(f"seeds: duplicate seeds {dupes}")
        problems += _comparison_problems(self.comparison, names)
        problems += _tune_problems(self.tune, names, [s.name for s in self.task.eval_sets])
        if problems:
            raise _Problems("\n".join(problems))
        return self

    def arm(self, name: str) -> ArmConfig:
        for a in self.arms:
            if a.name == name:
                return a
        names = [a.name for a in self.arms]
        raise SpecError(f"--arm: no arm named {name!r}{_did_you_mean(name, names)}; arms: {', '.join(names)}")

    def on_policy_arms(self) -> list[str]:
        """Arms whose every importance ratio is 1 (`same_gradient.off_policy_reasons` empty)."""
        rollout = self.rollout.model_dump(mode="json")
        return [a.name for a in self.arms if not off_policy_reasons(a.model_dump(mode="json"), rollout)]

    def on_policy_warning(self) -> str | None:
        """The load warning: arms that update on-policy (nothing clipped) and, among them, pairs
        that take the same gradient (`same_gradient`); None when there are none."""
        on_policy = self.on_policy_arms()
        if not on_policy:
            return None
        text = f"arms {on_policy} update on-policy ({ON_POLICY}): every importance ratio is 1, so nothing is clipped"
        pairs = same_gradient_pairs(self.to_dict())
        if pairs:
            named = ", ".join(f"{a!r} and {b!r}" for a, b, _ in pairs)
            text += (
                f"; {named} take the same gradient (they differ only in loss and clip range): "
                "comparing them measures seed noise only"
            )
        return text

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def _tune_problems(tune: TuneConfig | None, arms: list[str], sets: list[str]) -> list[str]:
    """The tune section's arms and evaluation sets must be the spec's."""
    if tune is None:
        return []
    problems = [
        f"tune.grids.{a}: no arm named {a!r}{_did_you_mean(a, arms)} (arms: {', '.join(arms)})"
        for a in tune.grids
        if a not in arms
    ]
    if tune.grids:
        problems += [
            f"tune.grids: arm {a!r} has no grid; every arm is tuned on the same budget (a one-value grid, "
            f"e.g. {{arm.clip_high: [...]}}, or remove the arm)"
            for a in arms
            if a not in tune.grids
        ]
    for field in ("selection_set", "test_set"):
        name = getattr(tune, field)
        if name not in sets:
            have = ", ".join(sets) if sets else "none"
            problems.append(f"tune.{field}: no evaluation set named {name!r} in task.eval_sets (named: {have})")
    return problems


def _engine_problems(i: int, arm: ArmConfig, rollout: RolloutConfig) -> list[str]:
    """What an arm's mismatch correction and R3 need from the rollout engine."""
    problems = []
    hf_without = rollout.engine == "hf" and not rollout.sampler_logprobs
    if arm.mismatch.mode != "off":
        if rollout.use_engine_logprobs:
            problems.append(
                f"arms[{i}].mismatch.mode: {arm.mismatch.mode} weights by pi_old(trainer) / pi(engine), "
                "but rollout.use_engine_logprobs makes pi_old the engine's (every weight 1); "
                "use one or the other"
            )
        if hf_without:
            problems.append(
                f"arms[{i}].mismatch.mode: {arm.mismatch.mode} needs the engine's log-probs: "
                "rollout.sampler_logprobs: true (hf) or rollout.engine: vllm"
            )
    if arm.mismatch.mode != "off" and rollout.staleness and arm.anchor != "proximal":
        problems.append(
            f"arms[{i}].mismatch.mode: {arm.mismatch.mode} needs the trainer's forward of the sampling "
            f"weights, which rollout.staleness: {rollout.staleness} does not keep; use staleness 0, or "
            "anchor: proximal (the correction then bounds pi_prox / pi_behav)"
        )
    if arm.dynamic_sampling.max_rounds:
        if rollout.staleness:
            problems.append(
                f"arms[{i}].dynamic_sampling.max_rounds: resampling happens inside the step, and "
                f"rollout.staleness: {rollout.staleness} samples in a worker ahead of it; use staleness 0"
            )
        if arm.routing_replay == "r3":
            problems.append(
                f"arms[{i}].dynamic_sampling.max_rounds: batches of several rounds carry no single set of "
                "engine routes for r3; use routing_replay r2"
            )
    if arm.routing_replay == "r3" and hf_without:
        problems.append(
            f"arms[{i}].routing_replay: r3 replays the routes the hf engine recorded during generate: "
            "needs rollout.sampler_logprobs: true (or use r2)"
        )
    return problems


def _unregistered_names(arms: list[ArmConfig]) -> list[str]:
    """One `arms[i].field: ...` line per loss, aggregation or advantage name that its registry
    lacks. The registries are the one list of names: registering a loss makes it selectable.

    Checked here, after every field validated, not in ArmConfig's field validators: the
    registries live beside their torch code, and importing them costs ~2 s of torch import
    that a spec with a typo elsewhere should not wait for. Importing this module stays
    torch-free (compare, plot, eval --completions)."""
    from gspo_cli import algorithms

    registries = {
        "loss": (algorithms.POLICY_LOSSES, "policy loss"),
        "aggregation": (algorithms.AGGREGATIONS, "aggregation"),
        "advantage": (algorithms.ADVANTAGE_ESTIMATORS, "advantage estimator"),
    }
    problems = []
    for i, arm in enumerate(arms):
        for field, (registry, what) in registries.items():
            name = getattr(arm, field)
            if name not in registry:
                problems.append(
                    f"arms[{i}].{field}: unknown {what} {name!r}{_did_you_mean(name, registry)}; "
                    f"registered: {', '.join(registry)}"
                )
        modes = ["off", *algorithms.MISMATCH_CORRECTIONS]  # off: no correction, not a registered one
        if arm.mismatch.mode not in modes:
            problems.append(
                f"arms[{i}].mismatch.mode: unknown mismatch correction {arm.mismatch.mode!r}"
                f"{_did_you_mean(arm.mismatch.mode, modes)}; known: {', '.join(modes)}"
            )
        if arm.loss in algorithms.POLICY_LOSSES:
            problems += [
                f"arms[{i}].loss_params.{p}" for p in algorithms.loss_param_problems(arm.loss, arm.loss_params)
            ]
            problems += _composition_problems(i, arm, algorithms)
            problems += [f"arms[{i}].{p}" for p in algorithms.clip_problems(arm.loss, arm.clip_low, arm.clip_dual)]
    return problems


def _composition_problems(i: int, arm: ArmConfig, algorithms) -> list[str]:
    """What does not compose with a sequence-level loss (GSPO, LUSPO, GMPO): a response's tokens
    share one ratio there, so a per-token weight only rescales the whole response by its mean
    and a dropped token still drives the ratio and its clip decision."""
    if algorithms.LOSS_LEVELS[arm.loss] != "sequence":
        return []
    why = (
        f"{arm.loss} couples a response's tokens through one sequence ratio, so a token cannot be dropped or reweighted"
    )
    problems = []
    if algorithms.MISMATCH_LEVELS.get(arm.mismatch.mode) == "token":
        problems.append(
            f"arms[{i}].mismatch.mode: {arm.mismatch.mode} weights single tokens and {why}; "
            "use seq_tis, seq_mask or geo_mask, or loss gspo_token"
        )
    if arm.token_filter.entropy_top is not None:
        problems.append(f"arms[{i}].token_filter.entropy_top: {why}; use a token-level loss (gspo_token, grpo, ...)")
    return problems


def _comparison_problems(comparison: ComparisonConfig | None, names: list[str]) -> list[str]:
    """The comparison must name arms of the experiment. A run's own spec.yaml holds one arm and
    keeps the section when its arm is one of the two (the comparison it belongs to)."""
    if comparison is None:
        return []
    if len(names) == 1 and names[0] in (comparison.baseline, comparison.arm):
        return []
    return [
        f"comparison.{field}: no arm named {value!r}{_did_you_mean(value, names)}; arms: {', '.join(names)}"
        for field, value in (("baseline", comparison.baseline), ("arm", comparison.arm))
        if value not in names
    ]


class OnPolicyWarning(UserWarning):
    """A comparison whose arms cannot differ."""
