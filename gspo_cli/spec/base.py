"""What every section of the spec shares: strict models (unknown keys refused, no inf/nan, no
booleans for numbers), multi-problem errors, name checks and did-you-mean hints."""

from __future__ import annotations

import difflib
from typing import Annotated, Any, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


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


def _check_dir_name(v: str, what: str) -> str:
    # Names become directories of the run layout: results/<experiment>/<arm>/seed<k>/.
    if not v or any(c in v for c in "/\\ ") or v.startswith("."):
        raise ValueError(f"{what} must be non-empty, without spaces or slashes, not starting with '.' (got {v!r})")
    return v


def _did_you_mean(word: Any, choices) -> str:
    hint = difflib.get_close_matches(str(word), list(choices), n=1)
    return f" (did you mean {hint[0]!r}?)" if hint else ""
