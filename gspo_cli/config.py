"""The experiment spec: a typed, validated view of the YAML file.

Everything a run depends on lives here, so the resolved spec written into each run
directory is enough to reproduce it. Every axis on which GRPO and GSPO differ is an
explicit field of each arm; presets only fill those fields in. Reading YAML, `--set`
overrides and error messages live one layer up, in `gspo_cli.spec_loading`.
"""

from __future__ import annotations

import difflib
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from gspo_cli.errors import SpecError, router_scale_problem
from gspo_cli.presets import PRESETS  # noqa: F401 - part of the spec vocabulary


class _Problems(ValueError):
    """Raised by a model-level check: one `field: message` line per problem, paths relative
    to the model that raised it (the error formatter prefixes the model's own location)."""


def _is_numeric(annotation: Any) -> bool:
    """int, float, or a list of them (Annotated constraints unwrapped)."""
    if get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if get_origin(annotation) is list:
        annotation = get_args(annotation)[0]
        if get_origin(annotation) is Annotated:
            annotation = get_args(annotation)[0]
    return annotation in (int, float)


class _Strict(BaseModel):
    # No inf/nan anywhere: no field of a spec has a meaningful infinite value.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bools_for_numbers(cls, v: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode reads `true` as 1; in YAML 1.1 so are `yes` and `on`. A number
        # field given a boolean is a typo, never an intent.
        field = cls.model_fields.get(info.field_name or "")
        if field is not None and _is_numeric(field.annotation):
            if isinstance(v, bool) or (isinstance(v, list) and any(isinstance(x, bool) for x in v)):
                raise ValueError(f"expected a number, got a boolean ({v!r})")
        return v


class BuiltinModelConfig(_Strict):
    """Size of a built-in tiny model (Qwen3 / Qwen3-MoE architecture)."""

    hidden_size: int = Field(128, ge=8)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int = Field(2, ge=1)
    intermediate_size: int = Field(256, ge=8)
    num_experts: int = Field(8, ge=2)
    experts_per_token: int = Field(2, ge=1)
    moe_intermediate_size: int = Field(128, ge=8)
    max_positions: int = Field(256, ge=16)

    @model_validator(mode="after")
    def _check(self):
        problems = []
        if self.experts_per_token > self.num_experts:
            problems.append(f"experts_per_token: {self.experts_per_token} exceeds num_experts ({self.num_experts})")
        if self.hidden_size % self.num_heads:
            problems.append(f"hidden_size: {self.hidden_size} is not divisible by num_heads ({self.num_heads})")
        if self.num_heads % self.num_kv_heads:
            problems.append(f"num_heads: {self.num_heads} is not divisible by num_kv_heads ({self.num_kv_heads})")
        if problems:
            raise _Problems("\n".join(problems))
        return self


class ColdStartConfig(_Strict):
    """Supervised warm start of a built-in model on the task's reference solutions."""

    steps: int = Field(300, ge=0)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(3e-3, gt=0)
    seed: int = 0


class ModelConfig(_Strict):
    name: str = Field("builtin:tiny-moe", description="builtin:tiny-moe, builtin:tiny-dense, a hub id or a local path")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    builtin: BuiltinModelConfig = BuiltinModelConfig()
    cold_start: ColdStartConfig = ColdStartConfig()
    # The router load-balancing loss moves weights even when every advantage is 0, so it is
    # an explicit choice, off for the paper's presets.
    router_aux_loss_coef: float = Field(0.0, ge=0)
    # How MoE expert layers run in the trainer. grouped_mm: one grouped matmul per layer
    # (same forward as eager, ~16% faster updates on the tiny MoE); eager: a Python loop over
    # experts; batched_mm is not offered (it ran a 24 GB box out of memory on the tiny MoE).
    experts_implementation: Literal["grouped_mm", "eager"] = "grouped_mm"
    # Under torchrun: ddp keeps a whole copy of the model per process; fsdp (PyTorch FSDP2)
    # shards parameters, gradients and optimizer state across processes.
    sharding: Literal["ddp", "fsdp"] = "ddp"


class TaskConfig(_Strict):
    name: str = "arithmetic"
    params: dict[str, Any] = Field(default_factory=dict, description="task-specific settings (difficulty, ...)")
    eval_size: int = Field(64, ge=0)


# vllm.LLM arguments the vLLM engine sets itself: changing them breaks what the trainer assumes.
VLLM_RESERVED_KWARGS = (
    "model",
    "tokenizer",
    "skip_tokenizer_init",
    "logprobs_mode",
    "dtype",
    "seed",
    "generation_config",
)


class RolloutConfig(_Strict):
    engine: Literal["hf", "vllm"] = Field(
        "hf",
        description="hf: the trainer's own model.generate; vllm: an in-process vLLM engine, weights synced every step",
    )
    prompts_per_step: int = Field(16, ge=1)
    group_size: int = Field(8, ge=2)
    max_new_tokens: int = Field(48, ge=1)
    temperature: float = Field(1.0, gt=0)
    use_engine_logprobs: bool = Field(
        False,
        description="vllm only: take pi_old's log-probs from the engine "
        "instead of a trainer forward (paper section 5.4)",
    )
    sampler_logprobs: bool = Field(
        True,
        description="hf only: take pi_old's log-probs, entropy and MoE routes "
        "from generate's own forward passes instead of a second "
        "no-grad pass (~13% less per step; they differ from a full "
        "forward by ~1e-5 nats at most)",
    )
    vllm: dict[str, Any] = Field(
        default_factory=dict, description="extra vllm.LLM(...) arguments, e.g. gpu_memory_utilization"
    )
    logprob_check_every: int = Field(
        10,
        ge=0,
        description="hf engine with sampler_logprobs: every N steps (and at "
        "step 1) compare the sampler's log-probs with one full "
        "trainer forward (rollout/logprob_diff_*); 0: never",
    )
    staleness: int = Field(
        0,
        ge=0,
        le=1,
        description="0: each step samples from the current policy; 1: a separate worker process "
        "samples step k+1's batch from the weights after step k-1 while step k trains (pi_old is "
        "that sampling policy; hf engine, one process)",
    )
    # Prompts as the checkpoint defines them (gspo_cli.models.prompts), in training and evaluation.
    chat_template: Literal["auto", "none"] = Field(
        "auto",
        description="auto: task prompts go through the "
        "tokenizer's chat template as the user "
        "message when it has one; none: raw text",
    )
    system_prompt: str | None = Field(
        None, description="a system message before each prompt (needs a chat template); none: no system turn"
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="extra variables for the chat template, e.g. enable_thinking: false"
    )

    @model_validator(mode="after")
    def _check(self):
        problems = []
        if self.engine != "vllm":
            if self.use_engine_logprobs:
                problems.append("use_engine_logprobs: needs engine: vllm (the hf engine returns no log-probs)")
            if self.vllm:
                problems.append("vllm: engine arguments given but engine is not vllm")
        elif self.temperature > 2:
            problems.append(f"temperature: {self.temperature} is above 2, the most vLLM samples at")
        if self.engine == "vllm" and self.staleness:
            problems.append("staleness: 1 runs an hf sampler in a worker process; not supported with engine: vllm")
        if self.chat_template == "none":
            if self.system_prompt is not None:
                problems.append("system_prompt: needs a chat template, but chat_template is none")
            if self.chat_template_kwargs:
                problems.append("chat_template_kwargs: given but chat_template is none")
        for key in self.vllm:
            if key in VLLM_RESERVED_KWARGS:
                problems.append(f"vllm.{key}: set by gspo-cli itself (from the model and rollout settings)")
        if problems:
            raise _Problems("\n".join(problems))
        return self

    @property
    def batch_size(self) -> int:
        return self.prompts_per_step * self.group_size


class OptimizerConfig(_Strict):
    lr: float = Field(1e-4, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.999, ge=0, lt=1)
    grad_clip: float = Field(1.0, gt=0)
    warmup_steps: int = Field(0, ge=0)
    router_lr_scale: float = Field(
        1.0,
        gt=0,
        description="MoE only: the routers' learning rate is lr x this (1: one rate for all weights); "
        "a router that moves faster than the rest of the network flips more expert choices per update",
    )


class DivergenceConfig(_Strict):
    """When a run is declared diverged. NaN/Inf in the loss, gradients or log-probs always
    counts; the collapse detectors are off unless given a threshold."""

    skip_bad_batches: bool = Field(
        False,
        description="skip a mini-batch with a non-finite loss or gradient instead of stopping (isolated bad batches)",
    )
    max_skipped: int = Field(3, ge=0, description="with skip_bad_batches: diverge after this many skips in a run")
    reward_below: float | None = Field(None, description="collapse: mean reward below this for `patience` steps")
    entropy_below: float | None = Field(None, ge=0, description="collapse: entropy below this for `patience` steps")
    patience: int = Field(10, ge=1)


class TrainConfig(_Strict):
    steps: int = Field(20, ge=1)
    checkpoint_every: int = Field(
        50, ge=0, description="steps between checkpoints (resume points); 0: only the final one"
    )
    keep_checkpoints: int = Field(2, ge=1)
    eval_every: int = Field(0, ge=0, description="0: evaluate only at the end")
    eval_samples: int = Field(1, ge=1, description="samples per eval problem (avg@k)")
    sinks: list[Literal["tensorboard", "wandb"]] = Field(
        default_factory=list, description="extra metric sinks besides metrics.jsonl (gspo_cli.sinks)"
    )
    divergence: DivergenceConfig = DivergenceConfig()
    gradient_checkpointing: bool = Field(
        False,
        description="recompute each decoder layer's activations in "
        "backward instead of keeping them (less memory, "
        "~1 extra forward per update)",
    )


class MismatchConfig(_Strict):
    """Correction for the gap between the rollout engine's and the trainer's probabilities of
    the sampled tokens: each token's loss is weighted by rho = pi_old(trainer) / pi(engine),
    truncated or masked (gspo_cli.algorithms.mismatch)."""

    mode: str = Field("off", description="off, or a correction registered in gspo_cli.algorithms.MISMATCH_CORRECTIONS")
    low: float = Field(0.5, ge=0, le=1, description="mask modes: drop below this ratio")
    high: float = Field(2.0, ge=1, description="truncate modes: cap; mask modes: drop above this ratio")

    @model_validator(mode="after")
    def _check(self):
        if self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        return self


class ArmConfig(_Strict):
    """One arm of the experiment: an algorithm with every setting that defines it."""

    name: str
    preset: str | None = None
    loss: str = Field(description="a policy loss registered in gspo_cli.algorithms.POLICY_LOSSES")
    clip_low: float = Field(gt=0, lt=1)
    clip_high: float = Field(gt=0)
    aggregation: str = Field("seq_mean_token_mean", description="registered in gspo_cli.algorithms.AGGREGATIONS")
    mini_batches: int = Field(1, ge=1)
    epochs: int = Field(1, ge=1)
    # r2: replay pi_old's routes (the trainer's); r3: the rollout engine's routes
    routing_replay: Literal["off", "r2", "r3"] = "off"
    kl_coef: float = Field(0.0, ge=0)
    advantage: str = Field("grpo", description="registered in gspo_cli.algorithms.ADVANTAGE_ESTIMATORS")
    adv_eps: float = Field(1e-6, ge=0)
    mismatch: MismatchConfig = MismatchConfig()

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        return _check_dir_name(v, "arm names")


def _check_dir_name(v: str, what: str) -> str:
    # Names become directories of the run layout: results/<experiment>/<arm>/seed<k>/.
    if not v or any(c in v for c in "/\\ ") or v.startswith("."):
        raise ValueError(f"{what} must be non-empty, without spaces or slashes, not starting with '.' (got {v!r})")
    return v


SEED_LIMIT = 2**32  # numpy's bound; torch and random accept it too


class SweepConfig(_Strict):
    """Variants of the experiment for `gspo sweep`: the grid's cartesian product, times each
    explicit override set. Keys are spec paths; `arms[*].x` sets x in every arm."""

    grid: dict[str, list[Any]] = Field(default_factory=dict)
    sets: list[dict[str, Any]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self):
        for key, values in self.grid.items():
            if not values:
                raise ValueError(f"grid.{key}: needs at least one value")
        return self


class ExperimentSpec(_Strict):
    name: str
    output_dir: str = Field("results", min_length=1)
    seeds: list[Annotated[int, Field(ge=0, lt=SEED_LIMIT)]] = Field(default_factory=lambda: [0], min_length=1)
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    rollout: RolloutConfig = RolloutConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    train: TrainConfig = TrainConfig()
    arms: list[ArmConfig] = Field(min_length=1)
    sweep: SweepConfig | None = None

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
        if self.optimizer.router_lr_scale != 1.0 and self.model.name == "builtin:tiny-dense":
            problems.append(router_scale_problem(self.optimizer.router_lr_scale, self.model.name))  # hub: once built
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
        return [a.name for a in self.arms if a.mini_batches == 1 and a.epochs == 1]

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


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
    if arm.mismatch.mode != "off" and rollout.staleness:
        problems.append(
            f"arms[{i}].mismatch.mode: {arm.mismatch.mode} needs the trainer's forward of the sampling "
            "weights, which rollout.staleness: 1 does not keep; use staleness 0"
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
    return problems


def _did_you_mean(word: Any, choices) -> str:
    hint = difflib.get_close_matches(str(word), list(choices), n=1)
    return f" (did you mean {hint[0]!r}?)" if hint else ""


class OnPolicyWarning(UserWarning):
    """A comparison whose arms cannot differ."""
