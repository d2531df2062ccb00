"""The spec's generated reference: its JSON Schema (`gspo schema`, committed as
`gspo-spec.schema.json`) and the Markdown reference page (`docs/reference/spec.md`), both made
from the pydantic models and the algorithm registries, so neither can drift from the code.

The registries are the one list of names: `loss`, `aggregation`, `advantage` and
`mismatch.mode` list exactly what is registered (a loss registered with
`@register_policy_loss` appears with its own keyword parameters), `preset` the presets.
Regenerate both committed copies with `make reference`; a test fails when they are stale.
"""

from __future__ import annotations

import inspect
import json
import re
import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from gspo_cli.spec.arm import ArmConfig, MismatchConfig
from gspo_cli.spec.experiment import ExperimentSpec
from gspo_cli.spec.presets import PRESETS

SCHEMA_FILE = "gspo-spec.schema.json"
REFERENCE_FILE = "docs/reference/spec.md"
REGENERATE = "make reference"

# Every policy loss takes these keywords from the arm and the trainer (clip_dual: the losses
# that offer dual clip); any other keyword-only parameter of a registered loss is its own,
# shown beside its name (selected_BC: a mini-batch's selection, losses.SELECTION_KWARG).
_COMMON_LOSS_KEYWORDS = {
    *("clip_low", "clip_high", "clip_dual", "aggregation", "denominator", "weights_BC", "selected_BC")
}


def _first_line(doc: str | None) -> str:
    return (inspect.cleandoc(doc).split("\n\n")[0].replace("\n", " ") if doc else "").strip()


def loss_parameters(fn) -> dict[str, Any]:
    """A registered loss's own keyword parameters and their defaults (None: required)."""
    out = {}
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.KEYWORD_ONLY and p.name not in _COMMON_LOSS_KEYWORDS:
            out[p.name] = None if p.default is p.empty else p.default
    return out


def registered_names() -> dict[tuple[type[BaseModel], str], list[tuple[str, str]]]:
    """(model, field) -> [(name, one-line description)] for every field whose values are the
    names of a registry, in registration order. Imports the algorithms (and torch)."""
    from gspo_cli import algorithms

    def described(registry, with_params: bool = False) -> list[tuple[str, str]]:
        rows = []
        for name, fn in registry.items():
            text = _first_line(fn.__doc__)
            params = loss_parameters(fn) if with_params else {}
            if params:
                shown = ", ".join(f"{k}={v!r}" if v is not None else k for k, v in params.items())
                text = f"{text} Parameters: {shown}.".strip()
            rows.append((name, text))
        return rows

    return {
        (ArmConfig, "loss"): described(algorithms.POLICY_LOSSES, with_params=True),
        (ArmConfig, "aggregation"): described(algorithms.AGGREGATIONS),
        (ArmConfig, "advantage"): described(algorithms.ADVANTAGE_ESTIMATORS),
        (ArmConfig, "preset"): [(name, _preset_text(name)) for name in PRESETS],
        (MismatchConfig, "mode"): [("off", "no correction")] + described(algorithms.MISMATCH_CORRECTIONS),
    }


def _preset_text(name: str) -> str:
    p = PRESETS[name]
    return ", ".join(f"{k}: {v}" for k, v in p.items())


# ----------------------------------------------------------------------------- JSON Schema


def spec_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of an experiment spec as a user writes it: the pydantic
    schema, with registry-named fields restricted to the registered names (each with its
    description), and an arm's loss and clip range required only when it names no preset
    (a preset fills them in before validation)."""
    schema = ExperimentSpec.model_json_schema()
    defs = schema.get("$defs", {})
    for (model, field), names in registered_names().items():
        prop = defs[model.__name__]["properties"][field]
        choices = [{"const": n, "description": d} if d else {"const": n} for n, d in names]
        if "anyOf" in prop:  # optional (preset): a name or null
            prop["anyOf"] = [{"oneOf": choices}, {"type": "null"}]
        else:
            prop.pop("type", None)
            prop["oneOf"] = choices
    arm = defs["ArmConfig"]
    need = [f for f in arm.get("required", []) if f != "name"]
    arm["required"] = ["name"]
    arm["anyOf"] = [{"required": ["preset"], "properties": {"preset": {"type": "string"}}}, {"required": need}]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **schema,
        "title": "gspo-cli experiment spec",
        "description": "An experiment for `gspo train` and `gspo sweep`; reference: docs/reference/spec.md",
    }


def schema_text() -> str:
    """`spec_schema()` as the committed file's text: fields in spec order, two-space indents."""
    return json.dumps(spec_schema(), indent=2, ensure_ascii=False) + "\n"


# ----------------------------------------------------------------------------- Markdown

_CODE_SPAN = re.compile(r"(`+).+?\1")


def _entities(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;")


def _md(text: str) -> str:
    """Generated prose as Markdown that renders literally: `<` and `&` outside code spans become
    entities (a description's `<output_dir>/<arm>/` or `hub:<id>` is otherwise read as an HTML
    tag and vanishes from the page), and `|` is escaped for the table cell it lands in."""
    out, last = [], 0
    for m in _CODE_SPAN.finditer(text):
        out += [_entities(text[last : m.start()]), m.group(0)]
        last = m.end()
    out.append(_entities(text[last:]))
    return "".join(out).replace("|", "\\|")


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in get_args(annotation))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(annotation))
    if origin is list:
        return f"list of {_type_name(get_args(annotation)[0])}"
    if origin is dict:
        return "mapping"
    if get_origin(annotation) is not None and hasattr(annotation, "__metadata__"):
        return _type_name(get_args(annotation)[0])
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


_BOUNDS = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<", "min_length": "length ≥", "max_length": "length ≤"}


def _constraints(field) -> str:
    parts = []
    for meta in field.metadata:
        for attr, sym in _BOUNDS.items():
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(f"{sym} {value:g}" if isinstance(value, float) else f"{sym} {value}")
    return ", ".join(parts)


def _item_constraints(annotation: Any) -> str:
    """Bounds on list items (seeds: each 0 <= seed < 2**32)."""
    if get_origin(annotation) is list:
        item = get_args(annotation)[0]
        meta = getattr(item, "__metadata__", ())
        parts = []
        for m in meta:
            for f in getattr(m, "metadata", [m]):
                for attr, sym in _BOUNDS.items():
                    value = getattr(f, attr, None)
                    if value is not None:
                        parts.append(f"each {sym} {value}")
        return ", ".join(parts)
    return ""


def _default(field) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(section)"
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"`{value!r}`"
    if isinstance(value, str):
        return f"`{value}`"
    return f"`{json.dumps(value)}`"


def _nested_model(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """(model, is_list) for a field holding a section, a list of sections or an optional one."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin = get_origin(annotation)
    if origin is list:
        inner, _ = _nested_model(get_args(annotation)[0])
        return inner, True
    if origin in (Union, types.UnionType):
        for a in get_args(annotation):
            inner, is_list = _nested_model(a)
            if inner is not None:
                return inner, is_list
    return None, False


def _rows(model: type[BaseModel], prefix: str, names, sections: list) -> list[str]:
    rows = []
    for fname, field in model.model_fields.items():
        path = f"{prefix}{fname}"
        inner, is_list = _nested_model(field.annotation)
        if inner is not None:
            sections.append((path + ("[]" if is_list else ""), inner, field))
            continue
        kind = _type_name(field.annotation)
        desc = _md(field.description or "")
        registered = names.get((model, fname))
        if registered:
            kind = "one of: " + ", ".join(f"`{n}`" for n, _ in registered)
        bounds = _md(", ".join(p for p in (_constraints(field), _item_constraints(field.annotation)) if p))
        rows.append(f"| `{path}` | {kind} | {_default(field)} | {desc} | {bounds} |")
    return rows


def reference_markdown() -> str:
    """The spec reference page: one table per section, every field with its path, type,
    default, description (with its unit) and constraints, then the registered names."""
    names = registered_names()
    out = [
        "# Spec reference",
        "",
        "<!-- Generated by gspo_cli/spec/reference.py from the pydantic models and the algorithm",
        f"     registries. Do not edit: `{REGENERATE}` rewrites this page and {SCHEMA_FILE}. -->",
        "",
        "Every field of an experiment spec, section by section. A path such as `arms[].clip_high`",
        "is written in YAML as nested keys (`arms: [{clip_high: ...}]`) and on the command line as",
        "`--set arms[0].clip_high=...` (or `arms.gspo.clip_high`, by arm name). Unknown keys are",
        "refused, with a did-you-mean. An arm's `preset` fills in its other fields first; the arm's",
        "own fields win. The same information, for editors and other tools, is in",
        f"`{SCHEMA_FILE}` (`gspo schema`).",
        "",
    ]
    pending: list = [("", ExperimentSpec, None)]
    while pending:
        path, model, field = pending.pop(0)
        title = f"`{path}`" if path else "Top level"
        out += [f"## {title}", ""]
        doc = field.description if field is not None and field.description else _first_line(model.__doc__)
        if doc and model is not ExperimentSpec:
            out += [_md(doc), ""]
        sections: list = []
        rows = _rows(model, f"{path}." if path else "", names, sections)
        out += ["| field | type | default | description | constraints |", "|---|---|---|---|---|", *rows, ""]
        pending = sections + pending
    out += ["## Registered names", ""]
    out += [
        "The names these fields accept are the registries' contents (register a function to add",
        "one; see [Algorithms](../algorithms/index.md)).",
        "",
    ]
    for (model, fname), registered in names.items():
        where = "arms[].mismatch.mode" if model is MismatchConfig else f"arms[].{fname}"
        out += [f"### `{where}`", "", "| name | description |", "|---|---|"]
        out += [f"| `{n}` | {_md(d)} |" for n, d in registered]
        out += [""]
    return "\n".join(out).rstrip("\n") + "\n"
