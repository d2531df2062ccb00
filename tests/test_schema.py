"""The generated reference: `gspo schema`, the committed gspo-spec.schema.json and
docs/reference/spec.md are current, list the registries' names, and every example spec
validates against the schema with a standard JSON Schema validator."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from gspo_cli import algorithms
from gspo_cli.cli.app import app
from gspo_cli.spec import PRESETS
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.spec.reference import (
    REFERENCE_FILE,
    REGENERATE,
    SCHEMA_FILE,
    loss_parameters,
    reference_markdown,
    schema_text,
    spec_schema,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "experiments").glob("*.yaml"))
SCHEMA_LINE = "# yaml-language-server: $schema=../gspo-spec.schema.json"


@pytest.fixture(scope="module")
def validator():
    schema = spec_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def errors(validator, raw) -> list[str]:
    return sorted(f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(raw))


@pytest.mark.parametrize("name, text", [(SCHEMA_FILE, schema_text), (REFERENCE_FILE, reference_markdown)])
def test_committed_copies_are_current(name, text):
    committed = (ROOT / name).read_text(encoding="utf-8")
    assert committed == text(), f"{name} is stale: run `{REGENERATE}` and commit the result"


def test_gspo_schema_prints_the_committed_schema():
    res = CliRunner().invoke(app, ["schema"])
    assert res.exit_code == 0 and json.loads(res.stdout) == spec_schema()
    md = CliRunner().invoke(app, ["schema", "--markdown"])
    assert md.exit_code == 0 and md.stdout == reference_markdown()


def test_schema_write_writes_both_files_and_refuses_a_folder_that_is_no_checkout(tmp_path):
    (tmp_path / "docs").mkdir()
    res = CliRunner().invoke(app, ["schema", "--write", "--root", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert (tmp_path / SCHEMA_FILE).read_text() == schema_text()
    assert (tmp_path / REFERENCE_FILE).read_text() == reference_markdown()
    bad = CliRunner().invoke(app, ["schema", "--write", "--root", str(tmp_path / "docs")])
    assert bad.exit_code == 2 and "not a gspo-cli checkout" in bad.output


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_spec_points_at_the_schema_and_validates(path, validator):
    text = path.read_text()
    assert text.splitlines()[0] == SCHEMA_LINE
    assert errors(validator, yaml.safe_load(text)) == []


def test_the_readme_spec_validates_and_loads(validator):
    block = re.search(r"## A spec\n\n```yaml\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    raw = yaml.safe_load(block)
    assert errors(validator, raw) == []
    spec = spec_from_dict(raw)
    assert [a.loss for a in spec.arms] == ["grpo", "gspo"] and spec.arms[1].clip_high == 5e-4


def test_every_whole_spec_in_the_docs_validates_and_loads(validator):
    """A `yaml` block of README.md or docs/ that is a whole spec (name and arms) is one a user
    can copy: the schema accepts it and so does the loader."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    whole = []
    for page in pages:
        for block in re.findall(r"^```yaml\n(.*?)^```", page.read_text(encoding="utf-8"), re.S | re.M):
            raw = yaml.safe_load(block)
            if isinstance(raw, dict) and {"name", "arms"} <= set(raw):
                whole.append(page.name)
                assert errors(validator, raw) == [], page
                spec_from_dict(raw)
    assert len(whole) >= 2


def test_registry_fields_list_exactly_the_registered_names():
    defs = spec_schema()["$defs"]
    arm = defs["ArmConfig"]["properties"]

    def consts(prop):
        choices = prop.get("oneOf") or prop["anyOf"][0]["oneOf"]
        return [c["const"] for c in choices]

    assert consts(arm["loss"]) == list(algorithms.POLICY_LOSSES)
    assert consts(arm["aggregation"]) == list(algorithms.AGGREGATIONS)
    assert consts(arm["advantage"]) == list(algorithms.ADVANTAGE_ESTIMATORS)
    assert consts(arm["preset"]) == list(PRESETS)
    assert consts(defs["MismatchConfig"]["properties"]["mode"]) == ["off", *algorithms.MISMATCH_CORRECTIONS]


def test_schema_agrees_with_the_loader_on_typical_mistakes(validator):
    """What the spec loader refuses, the schema refuses too (an editor flags it as you type)."""
    ok = {"name": "x", "arms": [{"name": "a", "preset": "paper-gspo"}]}
    assert errors(validator, ok) == []
    assert errors(validator, {**ok, "rollout": {"group_sise": 4}}) == [
        "rollout: Additional properties are not allowed ('group_sise' was unexpected)"
    ]
    assert errors(validator, {**ok, "arms": [{"name": "a", "preset": "paper-gspo", "loss": "gspoo"}]}) == [
        "arms.0.loss: 'gspoo' is not valid under any of the given schemas"
    ]
    # Without a preset an arm needs its loss and clip range; with one, nothing else.
    assert len(errors(validator, {**ok, "arms": [{"name": "a", "loss": "grpo"}]})) == 1
    assert errors(validator, {**ok, "arms": [{"name": "a", "loss": "grpo", "clip_low": 0.2, "clip_high": 0.3}]}) == []
    assert errors(validator, {**ok, "rollout": {"group_size": 1}}) == [
        "rollout.group_size: 1 is less than the minimum of 2"
    ]


def test_a_registered_loss_appears_with_its_own_keyword_parameters():
    """The registry is the one list of names: a loss registered at run time shows up in the
    schema and the reference, with the keyword parameters the common signature lacks."""

    def scaled_gspo(logp_BC, old_logp_BC, adv_B, mask_BC, *, clip_low, clip_high, scale=0.5, **rest):
        """GSPO with its advantages scaled."""
        return algorithms.gspo_loss(logp_BC, old_logp_BC, adv_B * scale, mask_BC, clip_low=clip_low,
                                    clip_high=clip_high, **rest)  # fmt: skip

    assert loss_parameters(algorithms.gspo_loss) == {}
    assert loss_parameters(scaled_gspo) == {"scale": 0.5}
    algorithms.register_policy_loss("scaled_gspo_schema_test")(scaled_gspo)
    try:
        choices = spec_schema()["$defs"]["ArmConfig"]["properties"]["loss"]["oneOf"]
        assert choices[-1] == {
            "const": "scaled_gspo_schema_test",
            "description": "GSPO with its advantages scaled. Parameters: scale=0.5.",
        }
        assert "| `scaled_gspo_schema_test` | GSPO with its advantages scaled. Parameters: scale=0.5. |" in (
            reference_markdown()
        )
    finally:
        del algorithms.POLICY_LOSSES["scaled_gspo_schema_test"]


def test_reference_lists_every_field_with_default_and_constraints():
    md = reference_markdown()
    assert (
        "| `rollout.group_size` | int | `8` | responses per prompt (G); advantages are relative to the group | ≥ 2 |"
        in md
    )
    assert "| `arms[].clip_low` | float | required |" in md
    assert "| `arms[].mismatch.high` | float | `2.0` |" in md
    assert (
        "| `seeds` | list of int | `[0]` | one run per arm and seed "
        "| length ≥ 1, each ≥ 0, each &lt; 4294967296 |" in md
    )
    # every leaf field of the schema is a row of the page
    defs = spec_schema()["$defs"]
    for model, body in defs.items():
        for field, prop in body["properties"].items():
            if "$ref" not in json.dumps(prop):
                assert f".{field}` |" in md or f"| `{field}` |" in md, (model, field)
