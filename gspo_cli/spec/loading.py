"""Loading a spec: YAML with clear errors, presets, `--set` overrides, one line per problem."""

from __future__ import annotations

import copy
import re
import warnings
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from gspo_cli.errors import SpecError
from gspo_cli.files import read_text
from gspo_cli.spec.arm import AggregationWarning, aggregation_warning
from gspo_cli.spec.base import _did_you_mean, _Problems
from gspo_cli.spec.experiment import ExperimentSpec, OnPolicyWarning
from gspo_cli.spec.presets import PRESETS


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
                problems.append(
                    f"arms[{i}].preset: unknown preset {preset!r}{_did_you_mean(preset, PRESETS)}; "
                    f"known: {', '.join(PRESETS)}"
                )
                continue
            base = PRESETS[preset]
            # A section the arm sets (loss_params, overlong, ...) extends the preset's, key by key.
            merged = {
                k: {**base[k], **v} if isinstance(base.get(k), dict) and isinstance(v, dict) else v
                for k, v in arm.items()
            }
            arm = {**base, **merged}
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
            raise SpecError(
                f"--set {path}: malformed key path at {path[pos:]!r} (use dots and [index], e.g. arms[0].clip_high)"
            )
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
    return set_path(raw, key, value)


def set_path(raw: dict[str, Any], key: str, value: Any, label: str = "--set") -> dict[str, Any]:
    """A copy of `raw` with `value` at `key` ('a.b', 'arms[0].x', 'arms.NAME.x')."""
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
                    raise SpecError(
                        f"{label} {key}: no item named {part!r} in {parent}"
                        f"{_did_you_mean(part, [n for n in names if isinstance(n, str)])}; "
                        f"names: {', '.join(str(n) for n in names) or 'none'}"
                    )
                part = idx
            if not 0 <= part < len(node):
                raise SpecError(f"{label} {key}: index {part} out of range at {where} ({parent} has {len(node)} items)")
        elif isinstance(node, dict):
            if isinstance(part, int):
                part = str(part)
            if not last and node.get(part) is None:
                node[part] = {}  # also fills a section left empty in the YAML (`rollout:`)
        else:
            raise SpecError(f"{label} {key}: {parent} is a {type(node).__name__}, not a mapping or list")
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
    if note := spec.on_policy_warning():
        warnings.warn(note, OnPolicyWarning, stacklevel=2)
    for i, arm in enumerate(spec.arms):
        if line := aggregation_warning(i, arm):
            warnings.warn(line, AggregationWarning, stacklevel=2)
    return spec


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
                None, None, f"duplicate key {key!r} (first given on line {first + 1})", key_node.start_mark
            )
    return loader.construct_mapping(node, deep=deep)


_SpecLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_spec(path: str | Path, overrides: list[str] | None = None) -> ExperimentSpec:
    return spec_from_dict(read_spec_file(path), overrides)


def read_spec_file(path: str | Path) -> dict[str, Any]:
    """The YAML mapping in `path`, unvalidated; every problem reading it is a SpecError."""
    path = Path(path)
    if path.is_dir():
        raise SpecError(f"{path}: is a directory, not a spec file")
    if not path.is_file():
        raise SpecError(f"{path}: spec file not found")
    text = read_text(path)
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
    return raw


def dump_spec(spec: ExperimentSpec) -> str:
    return yaml.safe_dump(spec.to_dict(), sort_keys=False)


# ---------------------------------------------------------------------------------------
# Is a run directory's spec.yaml this spec? (resume, skip-if-completed, sweeps)


def spec_differences(stored_text: str, spec: ExperimentSpec) -> list[str]:
    """How a run directory's spec.yaml (`stored_text`) differs from `spec`, one
    `path: stored -> new` item per differing leaf field in spec order; [] when it is the same
    spec. The stored text is resolved with today's defaults first, so a field added in a later
    gspo-cli version (at its default) is no difference. Text that is no longer a valid spec
    gives one item saying so.

    `output_dir` is not compared: it says where the run directory was, as written (a relative
    one against the directory training ran from), and the run directory is found through the
    new spec's own output_dir. So `results` and the same directory given absolutely, or from
    another working directory, or a results tree moved elsewhere, are the same run."""
    own = dump_spec(spec)
    if stored_text == own:
        return []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            stored = spec_from_dict(yaml.safe_load(stored_text))
    except (SpecError, yaml.YAMLError) as err:
        first = (str(err).strip().splitlines() or ["invalid"])[0]
        return [f"the stored spec.yaml is not a valid spec today ({first})"]
    # output_dir: where the runs are found, not what they are (a relative one as written); the
    # comparison is analysis, not training, and the executor says where a run trains: changing
    # any of them leaves the runs what they were.
    old = {**stored.to_dict(), "output_dir": spec.output_dir}
    old, new = ({k: v for k, v in d.items() if k not in ("comparison", "executor")} for d in (old, spec.to_dict()))
    return _leaf_differences(old, new, "")


def same_spec(stored_text: str, spec: ExperimentSpec) -> bool:
    """Whether a run directory's spec.yaml describes `spec` (see `spec_differences`)."""
    return not spec_differences(stored_text, spec)


def _leaf_differences(old: Any, new: Any, path: str) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            d
            for k in dict.fromkeys([*old, *new])
            for d in _leaf_differences(old.get(k), new.get(k), f"{path}.{k}" if path else str(k))
        ]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in _leaf_differences(a, b, f"{path}[{i}]")]
    return [] if old == new else [f"{path}: {_short_repr(old, 30)} -> {_short_repr(new, 30)}"]


def check_stored_spec(run_dir: Path, spec: ExperimentSpec, state: str) -> None:
    """SpecError (exit 2, one line) when `run_dir` holds a `state` ("completed",
    "unfinished") run whose spec.yaml is not `spec`: the first differing fields and the
    two ways out. A run directory without spec.yaml passes (nothing to compare)."""
    spec_file = Path(run_dir) / "spec.yaml"
    if not spec_file.is_file():
        return
    diffs = spec_differences(read_text(spec_file), spec)
    if diffs:
        shown = "; ".join(diffs[:3]) + (f"; and {len(diffs) - 3} more" if len(diffs) > 3 else "")
        raise SpecError(
            f"{run_dir} holds {'an' if state[0] in 'aeiou' else 'a'} {state} run of a different spec "
            f"({shown}); use --force to overwrite it or choose another output directory (-o) "
            "or experiment name"
        )
