"""The experiment spec: a typed, validated view of the YAML file.

Everything a run depends on lives here, so the resolved spec written into each run
directory is enough to reproduce it. Every axis on which GRPO and GSPO differ is an
explicit field of each arm; presets only fill those fields in.
"""

from __future__ import annotations

import copy
import difflib
import warnings
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gspo_cli.errors import SpecError

# ---------------------------------------------------------------------------------------
# Presets: the paper's settings (arXiv:2507.18071, section 5.1). An arm extends one and
# may override any field.
PRESETS: dict[str, dict[str, Any]] = {
    "paper-grpo": {
        "loss": "grpo",
        "clip_low": 0.2,
        "clip_high": 0.27,
        "aggregation": "seq_mean_token_mean",
        "mini_batches": 4,
        "epochs": 1,
        "routing_replay": "off",
        "kl_coef": 0.0,
        "advantage": "grpo",
    },
    "paper-grpo-rr": {
        "loss": "grpo",
        "clip_low": 0.2,
        "clip_high": 0.27,
        "aggregation": "seq_mean_token_mean",
        "mini_batches": 4,
        "epochs": 1,
        "routing_replay": "r2",
        "kl_coef": 0.0,
        "advantage": "grpo",
    },
    "paper-gspo": {
        "loss": "gspo",
        "clip_low": 3e-4,
        "clip_high": 4e-4,
        "aggregation": "seq_mean_token_mean",  # = plain mean over sequences for GSPO
        "mini_batches": 4,
        "epochs": 1,
        "routing_replay": "off",
        "kl_coef": 0.0,
        "advantage": "grpo",
    },
    "paper-gspo-token": {
        "loss": "gspo_token",
        "clip_low": 3e-4,
        "clip_high": 4e-4,
        "aggregation": "seq_mean_token_mean",
        "mini_batches": 4,
        "epochs": 1,
        "routing_replay": "off",
        "kl_coef": 0.0,
        "advantage": "grpo",
    },
}

LOSS_NAMES = ("grpo", "gspo", "gspo_token")
AGGREGATION_NAMES = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum")
ADVANTAGE_NAMES = ("grpo", "mean_only")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
        if self.experts_per_token > self.num_experts:
            raise ValueError("experts_per_token must not exceed num_experts")
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be divisible by num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be divisible by num_kv_heads")
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


class TaskConfig(_Strict):
    name: str = "arithmetic"
    params: dict[str, Any] = Field(default_factory=dict, description="task-specific settings (difficulty, ...)")
    eval_size: int = Field(64, ge=0)


class RolloutConfig(_Strict):
    engine: Literal["hf"] = "hf"
    prompts_per_step: int = Field(16, ge=1)
    group_size: int = Field(8, ge=2)
    max_new_tokens: int = Field(48, ge=1)
    temperature: float = Field(1.0, gt=0)

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


class TrainConfig(_Strict):
    steps: int = Field(20, ge=1)
    checkpoint_every: int = Field(0, ge=0, description="0: only the final checkpoint")
    keep_checkpoints: int = Field(2, ge=1)
    eval_every: int = Field(0, ge=0, description="0: evaluate only at the end")
    eval_samples: int = Field(1, ge=1, description="samples per eval problem (avg@k)")


class ArmConfig(_Strict):
    """One arm of the experiment: an algorithm with every setting that defines it."""

    name: str
    preset: str | None = None
    loss: Literal["grpo", "gspo", "gspo_token"]
    clip_low: float = Field(gt=0, lt=1)
    clip_high: float = Field(gt=0)
    aggregation: Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum"] = "seq_mean_token_mean"
    mini_batches: int = Field(1, ge=1)
    epochs: int = Field(1, ge=1)
    routing_replay: Literal["off", "r2"] = "off"
    kl_coef: float = Field(0.0, ge=0)
    advantage: Literal["grpo", "mean_only"] = "grpo"
    adv_eps: float = Field(1e-6, ge=0)

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        if not v or any(c in v for c in "/\\ ") or v.startswith("."):
            raise ValueError("arm names must be non-empty, without spaces or slashes")
        return v


class ExperimentSpec(_Strict):
    name: str
    output_dir: str = "results"
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    rollout: RolloutConfig = RolloutConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    train: TrainConfig = TrainConfig()
    arms: list[ArmConfig] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self):
        b = self.rollout.batch_size
        problems = []
        for i, arm in enumerate(self.arms):
            if b % arm.mini_batches:
                problems.append(
                    f"arms[{i}].mini_batches: {arm.mini_batches} does not divide the rollout batch "
                    f"({self.rollout.prompts_per_step} prompts x {self.rollout.group_size} = {b})"
                )
        names = [a.name for a in self.arms]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            problems.append(f"arms: duplicate arm names {dupes}")
        if len(set(self.seeds)) != len(self.seeds):
            problems.append("seeds: duplicate seeds")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def arm(self, name: str) -> ArmConfig:
        for a in self.arms:
            if a.name == name:
                return a
        raise SpecError(f"--arm: no arm named {name!r} (arms: {', '.join(a.name for a in self.arms)})")

    def on_policy_arms(self) -> list[str]:
        return [a.name for a in self.arms if a.mini_batches == 1 and a.epochs == 1]

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


# ---------------------------------------------------------------------------------------
# Loading


def _expand_presets(raw: dict[str, Any]) -> dict[str, Any]:
    arms = raw.get("arms")
    if not isinstance(arms, list):
        return raw
    out = []
    for i, arm in enumerate(arms):
        if isinstance(arm, dict) and arm.get("preset") is not None:
            preset = arm["preset"]
            if preset not in PRESETS:
                hint = difflib.get_close_matches(str(preset), PRESETS, n=1)
                extra = f" (did you mean {hint[0]!r}?)" if hint else ""
                raise SpecError(f"arms[{i}].preset: unknown preset {preset!r}{extra}; known: {', '.join(PRESETS)}")
            arm = {**PRESETS[preset], **arm}
        out.append(arm)
    return {**raw, "arms": out}


def _parse_path(path: str) -> list[str | int]:
    """'arms[0].clip_high' or 'arms.0.clip_high' -> ['arms', 0, 'clip_high']."""
    parts: list[str | int] = []
    for chunk in path.replace("[", ".").replace("]", "").split("."):
        if chunk == "":
            raise SpecError(f"--set {path}: malformed key path")
        parts.append(int(chunk) if chunk.isdigit() else chunk)
    return parts


def apply_override(raw: dict[str, Any], assignment: str) -> dict[str, Any]:
    """Apply one `key.path=value` override; the value is parsed as YAML (so 1e-4, true, [1,2] work).

    A list of arms may also be addressed by arm name: `arms.gspo.clip_high=5e-4`.
    """
    if "=" not in assignment:
        raise SpecError(f"--set {assignment}: expected key.path=value")
    key, _, text = assignment.partition("=")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    parts = _parse_path(key.strip())
    raw = copy.deepcopy(raw)
    node: Any = raw
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        where = ".".join(str(p) for p in parts[: depth + 1])
        if isinstance(node, list):
            if isinstance(part, str):  # address list items by their `name`
                idx = next((i for i, x in enumerate(node) if isinstance(x, dict) and x.get("name") == part), None)
                if idx is None:
                    raise SpecError(f"--set {key}: no item named {part!r} at {where}")
                part = idx
            if not 0 <= part < len(node):
                raise SpecError(f"--set {key}: index {part} out of range at {where}")
        elif isinstance(node, dict):
            if isinstance(part, int):
                part = str(part)
            if not last and part not in node:
                node[part] = {}
        else:
            raise SpecError(f"--set {key}: {where} is not a mapping or list")
        if last:
            node[part] = value
        else:
            node = node[part]
    return raw


def _format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ""
        for p in e["loc"]:
            loc += f"[{p}]" if isinstance(p, int) else (f".{p}" if loc else str(p))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
            key = e["loc"][-1]
            parent_model = _model_at(e["loc"][:-1])
            if parent_model is not None:
                hint = difflib.get_close_matches(str(key), list(parent_model.model_fields), n=1)
                if hint:
                    msg += f" (did you mean {hint[0]!r}?)"
        elif e["type"] == "missing":
            msg = "required field missing"
        elif "input" in e and e["type"] not in ("value_error",):
            msg += f" (got {e['input']!r})"
        lines.append(f"{loc or 'spec'}: {msg}")
    return "\n".join(lines)


def _model_at(loc: tuple) -> type[BaseModel] | None:
    model: type[BaseModel] | None = ExperimentSpec
    for p in loc:
        if isinstance(p, int) or model is None:
            continue
        field = model.model_fields.get(p)
        if field is None:
            return None
        ann = field.annotation
        inner = getattr(ann, "__args__", None)
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        elif inner and isinstance(inner[0], type) and issubclass(inner[0], BaseModel):
            model = inner[0]
        else:
            return None
    return model


def spec_from_dict(raw: Any, overrides: list[str] | None = None) -> ExperimentSpec:
    if not isinstance(raw, dict):
        raise SpecError("spec: the top level must be a mapping of keys to values")
    for assignment in overrides or []:
        raw = apply_override(raw, assignment)
    raw = _expand_presets(raw)
    try:
        spec = ExperimentSpec.model_validate(raw)
    except ValidationError as err:
        raise SpecError(_format_validation_error(err)) from None
    on_policy = spec.on_policy_arms()
    if on_policy:
        warnings.warn(
            f"arms {on_policy} update on-policy (1 mini-batch, 1 epoch): every importance ratio is 1, "
            "so GRPO and GSPO give the same gradient and nothing is clipped",
            OnPolicyWarning,
            stacklevel=2,
        )
    return spec


class OnPolicyWarning(UserWarning):
    """A comparison whose arms cannot differ."""


def load_spec(path: str | Path, overrides: list[str] | None = None) -> ExperimentSpec:
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"{path}: spec file not found")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise SpecError(f"{path}: YAML syntax error{where}: {problem}") from None
    if raw is None:
        raise SpecError(f"{path}: the spec file is empty")
    return spec_from_dict(raw, overrides)


def dump_spec(spec: ExperimentSpec) -> str:
    return yaml.safe_dump(spec.to_dict(), sort_keys=False)
