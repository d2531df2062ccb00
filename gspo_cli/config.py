"""The experiment spec: a typed, validated view of the YAML file.

Everything a run depends on lives here, so the resolved spec written into each run
directory is enough to reproduce it. Every axis on which GRPO and GSPO differ is an
explicit field of each arm; presets only fill those fields in.
"""

from __future__ import annotations

import copy
import difflib
import re
import warnings
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

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
        return _check_dir_name(v, "arm names")


def _check_dir_name(v: str, what: str) -> str:
    # Names become directories of the run layout: results/<experiment>/<arm>/seed<k>/.
    if not v or any(c in v for c in "/\\ ") or v.startswith("."):
        raise ValueError(f"{what} must be non-empty, without spaces or slashes, not starting with '.' (got {v!r})")
    return v


SEED_LIMIT = 2**32  # numpy's bound; torch and random accept it too


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

    @field_validator("name")
    @classmethod
    def _name_ok(cls, v: str) -> str:
        return _check_dir_name(v, "experiment names")

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


# ---------------------------------------------------------------------------------------
# Loading


def _did_you_mean(word: Any, choices) -> str:
    hint = difflib.get_close_matches(str(word), list(choices), n=1)
    return f" (did you mean {hint[0]!r}?)" if hint else ""


def _expand_presets(raw: dict[str, Any]) -> dict[str, Any]:
    """Fill each arm from its preset; the arm's own fields win. Unknown presets: all listed."""
    arms = raw.get("arms")
    if not isinstance(arms, list):
        return raw
    out, problems = [], []
    for i, arm in enumerate(arms):
        if isinstance(arm, dict) and arm.get("preset") is not None:
            preset = arm["preset"]
            if not isinstance(preset, str) or preset not in PRESETS:
                problems.append(f"arms[{i}].preset: unknown preset {preset!r}{_did_you_mean(preset, PRESETS)}; "
                                f"known: {', '.join(PRESETS)}")
                continue
            arm = {**PRESETS[preset], **arm}
        out.append(arm)
    if problems:
        raise SpecError("\n".join(problems))
    return {**raw, "arms": out}


_PATH_CHUNK = re.compile(r"([^.\[\]]+)|\[(\d+)\]|\.")


def _parse_path(path: str) -> list[str | int]:
    """'arms[0].clip_high' or 'arms.0.clip_high' -> ['arms', 0, 'clip_high']."""
    parts: list[str | int] = []
    pos, expect_key = 0, True  # a key must follow the start or a dot; nothing may follow a key directly
    while pos < len(path):
        m = _PATH_CHUNK.match(path, pos)
        if m is None or (m.group(1) is not None and not expect_key) or (m.group(0) == "." and expect_key):
            raise SpecError(f"--set {path}: malformed key path at {path[pos:]!r} "
                            "(use dots and [index], e.g. arms[0].clip_high)")
        if m.group(1) is not None:
            parts.append(int(m.group(1)) if m.group(1).isdigit() else m.group(1))
            expect_key = False
        elif m.group(2) is not None:
            if not parts:
                raise SpecError(f"--set {path}: malformed key path (an index needs a key before it)")
            parts.append(int(m.group(2)))
        else:
            expect_key = True
        pos = m.end()
    if not parts or expect_key:
        raise SpecError(f"--set {path}: malformed key path" + (" (empty)" if not parts else " (ends with '.')"))
    return parts


def apply_override(raw: dict[str, Any], assignment: str) -> dict[str, Any]:
    """Apply one `key.path=value` override; the value is parsed as YAML (so 1e-4, true, [1,2] work).

    A list of arms may also be addressed by arm name: `arms.gspo.clip_high=5e-4`. Keys that
    do not exist are created here and reported as unknown when the spec is validated.
    """
    if "=" not in assignment:
        raise SpecError(f"--set {assignment}: expected key.path=value")
    key, _, text = assignment.partition("=")
    key = key.strip()
    if not key:
        raise SpecError(f"--set {assignment}: empty key path")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    parts = _parse_path(key)
    raw = copy.deepcopy(raw)
    node: Any = raw
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        parent = ".".join(str(p) for p in parts[:depth]) or "the spec"
        where = ".".join(str(p) for p in parts[: depth + 1])
        if isinstance(node, list):
            if isinstance(part, str):  # address list items by their `name`
                names = [x.get("name") for x in node if isinstance(x, dict)]
                idx = next((i for i, x in enumerate(node) if isinstance(x, dict) and x.get("name") == part), None)
                if idx is None:
                    raise SpecError(f"--set {key}: no item named {part!r} in {parent}"
                                    f"{_did_you_mean(part, [n for n in names if isinstance(n, str)])}; "
                                    f"names: {', '.join(str(n) for n in names) or 'none'}")
                part = idx
            if not 0 <= part < len(node):
                raise SpecError(f"--set {key}: index {part} out of range at {where} ({parent} has {len(node)} items)")
        elif isinstance(node, dict):
            if isinstance(part, int):
                part = str(part)
            if not last and node.get(part) is None:
                node[part] = {}  # also fills a section left empty in the YAML (`rollout:`)
        else:
            raise SpecError(f"--set {key}: {parent} is a {type(node).__name__}, not a mapping or list")
        if last:
            node[part] = value
        else:
            node = node[part]
    return raw


def _short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ""
        for p in e["loc"]:
            loc += f"[{p}]" if isinstance(p, int) else (f".{p}" if loc else str(p))
        if isinstance(e.get("ctx", {}).get("error"), _Problems):  # model-level: one line per problem
            lines.extend(f"{loc}.{line}" if loc else line for line in str(e["ctx"]["error"]).splitlines())
            continue
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
            key = e["loc"][-1]
            parent_model = _model_at(e["loc"][:-1])
            if parent_model is not None:
                msg += _did_you_mean(key, parent_model.model_fields)
        elif e["type"] == "missing":
            msg = "required field missing"
        elif e["type"] == "too_short" and e.get("ctx", {}).get("min_length") == 1:
            msg = "must not be empty"
        elif "input" in e and e["type"] not in ("value_error",):
            msg += f" (got {_short_repr(e['input'])})"
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


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""


def _construct_mapping(loader: _SpecLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.setdefault(key, key_node.start_mark.line)
        except TypeError:  # unhashable key: SafeLoader reports it below
            continue
        if first != key_node.start_mark.line:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first given on line {first + 1})", key_node.start_mark)
    return loader.construct_mapping(node, deep=deep)


_SpecLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_spec(path: str | Path, overrides: list[str] | None = None) -> ExperimentSpec:
    path = Path(path)
    if path.is_dir():
        raise SpecError(f"{path}: is a directory, not a spec file")
    if not path.is_file():
        raise SpecError(f"{path}: spec file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a UTF-8 text file") from None
    except OSError as err:
        raise SpecError(f"{path}: cannot read: {err.strerror or err}") from None
    try:
        raw = yaml.load(text, Loader=_SpecLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise SpecError(f"{path}: YAML syntax error{where}: {problem}") from None
    if raw is None:
        raise SpecError(f"{path}: the spec file is empty")
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: the top level must be a mapping of keys to values, not a {type(raw).__name__}")
    return spec_from_dict(raw, overrides)


def dump_spec(spec: ExperimentSpec) -> str:
    return yaml.safe_dump(spec.to_dict(), sort_keys=False)
