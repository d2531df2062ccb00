"""The experiment spec: presets, overrides, and one line per problem for every bad input."""

from __future__ import annotations

import copy
import warnings

import pytest
import yaml
from pydantic import ValidationError

from gspo_cli.errors import SpecError
from gspo_cli.spec import PRESETS, ExperimentSpec, OnPolicyWarning
from gspo_cli.spec.loading import apply_override, dump_spec, load_spec, spec_from_dict

BASE = {
    "name": "exp",
    "rollout": {"prompts_per_step": 4, "group_size": 4},  # batch of 16
    "arms": [{"name": "grpo", "preset": "paper-grpo"}, {"name": "gspo", "preset": "paper-gspo"}],
}


def base(**changes) -> dict:
    raw = copy.deepcopy(BASE)
    raw.update(changes)
    return raw


def spec_error(raw, overrides=None) -> list[str]:
    """The lines of the SpecError that `raw` must raise."""
    with pytest.raises(SpecError) as info:
        spec_from_dict(raw, overrides)
    assert info.value.exit_code == 2
    return str(info.value).splitlines()


def write(tmp_path, text: str, name: str = "exp.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


# ---------------------------------------------------------------------------------------
# Presets


def test_paper_grpo_preset_resolves_to_the_papers_settings():
    arm = spec_from_dict(base()).arm("grpo")
    assert (arm.loss, arm.clip_low, arm.clip_high) == ("grpo", 0.2, 0.27)
    assert arm.mini_batches == 4 and arm.epochs == 1
    assert arm.aggregation == "seq_mean_token_mean"
    assert arm.routing_replay == "off"
    assert arm.kl_coef == 0.0
    assert arm.advantage == "grpo"


def test_paper_gspo_preset_resolves_to_the_papers_settings():
    arm = spec_from_dict(base()).arm("gspo")
    assert (arm.loss, arm.clip_low, arm.clip_high) == ("gspo", 3e-4, 4e-4)
    assert arm.mini_batches == 4
    assert arm.routing_replay == "off"
    assert arm.kl_coef == 0.0


def test_routing_replay_and_token_presets():
    raw = base(arms=[{"name": "rr", "preset": "paper-grpo-rr"}, {"name": "tok", "preset": "paper-gspo-token"}])
    spec = spec_from_dict(raw)
    rr, tok = spec.arm("rr"), spec.arm("tok")
    assert (rr.loss, rr.routing_replay, rr.clip_low, rr.clip_high) == ("grpo", "r2", 0.2, 0.27)
    assert (tok.loss, tok.clip_low, tok.clip_high, tok.mini_batches) == ("gspo_token", 3e-4, 4e-4, 4)


def test_every_preset_is_a_valid_off_policy_arm():
    raw = base(arms=[{"name": name, "preset": name} for name in PRESETS])
    with warnings.catch_warnings():
        warnings.simplefilter("error", OnPolicyWarning)
        spec = spec_from_dict(raw)
    assert [a.name for a in spec.arms] == list(PRESETS)
    assert all(a.kl_coef == 0 for a in spec.arms)


def test_arm_fields_beat_the_preset():
    raw = base(arms=[{"name": "gspo", "preset": "paper-gspo", "clip_high": 5e-4, "epochs": 2}])
    arm = spec_from_dict(raw).arm("gspo")
    assert arm.clip_high == 5e-4 and arm.epochs == 2
    assert arm.clip_low == 3e-4  # the rest still comes from the preset


def test_arm_without_preset_needs_its_algorithm_fields():
    lines = spec_error(base(arms=[{"name": "a"}]))
    assert lines == [
        "arms[0].loss: required field missing",
        "arms[0].clip_low: required field missing",
        "arms[0].clip_high: required field missing",
    ]


def test_arm_without_preset_gets_plain_defaults():
    arm = spec_from_dict(
        base(arms=[{"name": "a", "loss": "gspo", "clip_low": 0.1, "clip_high": 0.1, "mini_batches": 2}])
    ).arms[0]
    assert arm.kl_coef == 0.0 and arm.aggregation == "seq_mean_token_mean" and arm.routing_replay == "off"


def test_unknown_preset_suggests_the_closest():
    lines = spec_error(base(arms=[{"name": "a", "preset": "paper-gsop"}, {"name": "b", "preset": "nope"}]))
    assert len(lines) == 2
    assert lines[0].startswith("arms[0].preset: unknown preset 'paper-gsop' (did you mean 'paper-gspo'?)")
    assert lines[1].startswith("arms[1].preset: unknown preset 'nope'")
    assert "paper-grpo-rr" in lines[1]  # the known presets are listed


@pytest.mark.parametrize("preset", [3, ["paper-grpo"], {"a": 1}])
def test_non_string_preset_is_a_spec_error(preset):
    (line,) = spec_error(base(arms=[{"name": "a", "preset": preset}]))
    assert line.startswith("arms[0].preset: unknown preset")


# ---------------------------------------------------------------------------------------
# Defaults and the shape of the spec


def test_minimal_spec_defaults():
    spec = spec_from_dict({"name": "exp", "arms": [{"name": "g", "preset": "paper-gspo"}]})
    assert spec.output_dir == "results"
    assert spec.seeds == [0]
    assert spec.model.name == "builtin:tiny-moe"
    assert spec.model.router_aux_loss_coef == 0.0
    assert spec.rollout.batch_size == 16 * 8
    assert isinstance(spec, ExperimentSpec)


def test_spec_is_frozen():
    spec = spec_from_dict(base())
    with pytest.raises(ValidationError):
        spec.name = "other"


# ---------------------------------------------------------------------------------------
# Problems: one line each, naming the field path


def test_unknown_top_level_key_with_did_you_mean():
    assert spec_error(base(rollot={})) == ["rollot: unknown key (did you mean 'rollout'?)"]


def test_unknown_nested_key_with_did_you_mean():
    assert spec_error(base(rollout={"group_sise": 4})) == [
        "rollout.group_sise: unknown key (did you mean 'group_size'?)"
    ]
    raw = base(model={"builtin": {"hiden_size": 64}})
    assert spec_error(raw) == ["model.builtin.hiden_size: unknown key (did you mean 'hidden_size'?)"]


def test_unknown_arm_key_with_did_you_mean():
    raw = base()
    raw["arms"][1]["clip_hihg"] = 0.1
    assert spec_error(raw) == ["arms[1].clip_hihg: unknown key (did you mean 'clip_high'?)"]


def test_unknown_key_without_a_close_match_has_no_hint():
    assert spec_error(base(zzzzzz=1)) == ["zzzzzz: unknown key"]


def test_field_errors_in_different_arms_are_all_listed():
    raw = base()
    raw["arms"][0]["clip_low"] = 0
    raw["arms"][1]["epochs"] = "two"
    raw["arms"][1]["clip_hgh"] = 1e-3
    raw["rollout"]["group_size"] = 1
    raw["arms"].append({"name": "c", "preset": "paper-gspo", "loss": "ppo"})
    lines = spec_error(raw)
    assert len(lines) == 4, lines
    assert any(line.startswith("arms[0].clip_low: ") and "greater than 0" in line for line in lines)
    assert any(line.startswith("arms[1].epochs: ") and "'two'" in line for line in lines)
    assert "arms[1].clip_hgh: unknown key (did you mean 'clip_high'?)" in lines
    assert any(line.startswith("rollout.group_size: ") for line in lines)
    # Algorithm names are checked against the registries once every field is valid (reading
    # the registries imports torch, which a typo elsewhere should not wait for), beside the
    # spec's other cross-field problems.
    raw = base()
    raw["rollout"]["group_size"] = 3  # 4 prompts x 3 = 12 rollouts: 4 mini-batches divide them, 5 do not
    raw["arms"][0]["mini_batches"] = 5
    raw["arms"].append({"name": "c", "preset": "paper-gspo", "loss": "ppo"})
    lines = spec_error(raw)
    assert len(lines) == 2, lines
    assert lines[0].startswith("arms[2].loss: unknown policy loss 'ppo'; registered: grpo, gspo, gspo_token")
    assert lines[1].startswith("arms[0].mini_batches: 5 does not divide the rollout batch")


@pytest.mark.parametrize("field,value", [("clip_low", 0), ("clip_low", -0.1), ("clip_high", 0), ("clip_high", -1e-4)])
def test_clip_must_be_positive(field, value):
    raw = base()
    raw["arms"][1][field] = value
    (line,) = spec_error(raw)
    assert line.startswith(f"arms[1].{field}: ")
    assert "greater than 0" in line


def test_clip_low_at_most_one():
    raw = base()
    raw["arms"][0]["clip_low"] = 1.0  # no lower bound (CISPO's preset): ratios down to 0
    assert spec_from_dict(raw).arms[0].clip_low == 1.0
    raw["arms"][0]["clip_low"] = 1.5
    (line,) = spec_error(raw)
    assert line.startswith("arms[0].clip_low: ")


@pytest.mark.parametrize("group_size", [1, 0, -3])
def test_group_size_at_least_two(group_size):
    (line,) = spec_error(base(rollout={"group_size": group_size}))
    assert line.startswith("rollout.group_size: ")
    assert "greater than or equal to 2" in line


def test_mini_batches_must_divide_the_rollout_batch():
    raw = base()
    raw["arms"][1]["mini_batches"] = 3
    assert spec_error(raw) == ["arms[1].mini_batches: 3 does not divide the rollout batch (4 prompts x 4 = 16)"]


def test_preset_mini_batches_checked_against_the_batch():
    # paper presets use 4 mini-batches; 3 prompts x 3 samples = 9 is not divisible by 4
    lines = spec_error(base(rollout={"prompts_per_step": 3, "group_size": 3}))
    assert lines == [
        "arms[0].mini_batches: 4 does not divide the rollout batch (3 prompts x 3 = 9)",
        "arms[1].mini_batches: 4 does not divide the rollout batch (3 prompts x 3 = 9)",
    ]


def test_model_level_problems_are_one_line_each():
    raw = base(
        seeds=[1, 1, 2],
        arms=[{"name": "a", "preset": "paper-grpo", "mini_batches": 3}, {"name": "a", "preset": "paper-gspo"}],
    )
    assert spec_error(raw) == [
        "arms[0].mini_batches: 3 does not divide the rollout batch (4 prompts x 4 = 16)",
        "arms[1].name: duplicate arm name 'a' (also arms[0])",
        "seeds: duplicate seeds [1]",
    ]


def test_duplicate_arm_names():
    raw = base(arms=[{"name": "g", "preset": "paper-gspo"}, {"name": "g", "preset": "paper-grpo"}])
    assert spec_error(raw) == ["arms[1].name: duplicate arm name 'g' (also arms[0])"]


def test_empty_arms():
    assert spec_error(base(arms=[])) == ["arms: must not be empty"]


def test_missing_arms_and_name():
    assert spec_error({"seeds": [0]}) == ["name: required field missing", "arms: required field missing"]


def test_arms_must_be_a_list_of_mappings():
    (line,) = spec_error(base(arms={"grpo": "paper-grpo"}))
    assert line.startswith("arms: Input should be a valid list")
    (line,) = spec_error(base(arms=["grpo"]))
    assert line.startswith("arms[0]: ")


@pytest.mark.parametrize(
    "where,value,path",
    [
        ("rollout", {"prompts_per_step": "many"}, "rollout.prompts_per_step: "),
        ("optimizer", {"lr": "fast"}, "optimizer.lr: "),
        ("optimizer", {"lr": 0}, "optimizer.lr: "),
        ("train", {"steps": 2.5}, "train.steps: "),
        ("model", {"dtype": "int8"}, "model.dtype: "),
        ("rollout", 3, "rollout: "),
    ],
)
def test_wrong_types_and_values_name_the_field(where, value, path):
    (line,) = spec_error(base(**{where: value}))
    assert line.startswith(path), line


@pytest.mark.parametrize(
    "field,value",
    [
        ("loss", "ppo"),
        ("aggregation", "sum"),
        ("routing_replay", "r4"),
        ("advantage", "rloo"),
        ("kl_coef", -0.1),
        ("epochs", 0),
        ("mini_batches", 0),
    ],
)
def test_bad_arm_values(field, value):
    raw = base()
    raw["arms"][0][field] = value
    (line,) = spec_error(raw)
    assert line.startswith(f"arms[0].{field}: ")
    assert repr(value) in line or str(value) in line


@pytest.mark.parametrize("value", [True, False])
def test_booleans_are_not_numbers(value):
    # YAML 1.1 reads `yes`/`on` as true; pydantic's lax mode would read true as 1.
    raw = base()
    raw["arms"][0]["mini_batches"] = value
    (line,) = spec_error(raw)
    assert line.startswith("arms[0].mini_batches: expected a number, got a boolean")
    (line,) = spec_error(base(seeds=[value]))
    assert line.startswith("seeds: ")


@pytest.mark.parametrize("value", [float("inf"), float("nan"), "inf"])
def test_non_finite_numbers_rejected(value):
    raw = base()
    raw["arms"][1]["clip_high"] = value
    (line,) = spec_error(raw)
    assert line.startswith("arms[1].clip_high: ")
    (line,) = spec_error(base(rollout={"temperature": value}))
    assert line.startswith("rollout.temperature: ")


def test_yaml_style_exponent_strings_are_numbers():
    # PyYAML reads `3e-4` (no dot) as a string; the spec must still take it as 3e-4.
    raw = base(arms=[{"name": "g", "preset": "paper-gspo", "clip_low": "2e-4"}])
    assert spec_from_dict(raw).arms[0].clip_low == 2e-4


@pytest.mark.parametrize("name", ["", "a b", "a/b", ".hidden"])
def test_names_must_be_usable_as_directories(name):
    (line,) = spec_error(base(name=name))
    assert line.startswith("name: experiment names must be non-empty")
    raw = base()
    raw["arms"][0]["name"] = name
    (line,) = spec_error(raw)
    assert line.startswith("arms[0].name: arm names must be non-empty")


def test_seeds_range_and_emptiness():
    lines = spec_error(base(seeds=[-1, 2**40]))
    assert lines[0].startswith("seeds[0]: ") and lines[1].startswith("seeds[1]: ")
    assert spec_error(base(seeds=[])) == ["seeds: must not be empty"]


def test_builtin_model_checks_name_fields():
    raw = base(model={"builtin": {"num_experts": 2, "experts_per_token": 3}})
    assert spec_error(raw) == ["model.builtin.experts_per_token: 3 exceeds num_experts (2)"]


def test_long_inputs_are_shortened_in_messages():
    (line,) = spec_error(base(arms={"x": "y" * 500}))
    assert len(line) < 150


def test_top_level_must_be_a_mapping():
    for raw in ([1, 2], "text", 3):
        (line,) = spec_error(raw)
        assert "top level must be a mapping" in line


# ---------------------------------------------------------------------------------------
# On-policy warning


def test_on_policy_arm_is_accepted_with_a_warning():
    raw = base(arms=[{"name": "onp", "preset": "paper-gspo", "mini_batches": 1}, {"name": "g", "preset": "paper-gspo"}])
    with pytest.warns(OnPolicyWarning, match=r"\['onp'\].*on-policy"):
        spec = spec_from_dict(raw)
    assert spec.on_policy_arms() == ["onp"]


def test_two_epochs_on_one_mini_batch_is_not_on_policy():
    raw = base(arms=[{"name": "g", "preset": "paper-gspo", "mini_batches": 1, "epochs": 2}])
    with warnings.catch_warnings():
        warnings.simplefilter("error", OnPolicyWarning)
        assert spec_from_dict(raw).on_policy_arms() == []


# ---------------------------------------------------------------------------------------
# --set overrides


@pytest.mark.parametrize("key", ["arms[1].clip_high", "arms.1.clip_high", "arms.gspo.clip_high"])
def test_override_arm_field_three_ways(key):
    spec = spec_from_dict(base(), [f"{key}=5e-4"])
    assert spec.arm("gspo").clip_high == 5e-4
    assert spec.arm("gspo").clip_low == 3e-4  # the preset still fills the rest
    assert spec.arm("grpo").clip_high == 0.27


def test_override_beats_preset_and_arm_field():
    raw = base()
    raw["arms"][1]["clip_high"] = 1e-3
    spec = spec_from_dict(raw, ["arms.gspo.clip_high=6e-4"])
    assert spec.arm("gspo").clip_high == 6e-4


def test_overrides_apply_in_order_and_parse_yaml_values():
    spec = spec_from_dict(
        base(),
        [
            "rollout.group_size=8",
            "seeds=[3, 4]",
            "arms[0].routing_replay=r2",
            "optimizer.lr=1e-5",
            "rollout.group_size=2",
            "output_dir=/tmp/out",
        ],
    )
    assert spec.rollout.group_size == 2
    assert spec.seeds == [3, 4]
    assert spec.arms[0].routing_replay == "r2"
    assert spec.optimizer.lr == 1e-5
    assert spec.output_dir == "/tmp/out"


def test_override_fills_an_empty_section():
    raw = base(rollout=None)
    assert spec_from_dict(raw, ["rollout.group_size=4"]).rollout.group_size == 4


def test_override_can_switch_the_preset():
    spec = spec_from_dict(base(), ["arms.grpo.preset=paper-grpo-rr"])
    assert spec.arm("grpo").routing_replay == "r2"


def test_override_does_not_modify_its_input():
    raw = base()
    before = copy.deepcopy(raw)
    apply_override(raw, "arms.gspo.clip_high=5e-4")
    spec_from_dict(raw, ["rollout.group_size=8"])
    assert raw == before


def test_override_to_unknown_key_is_reported_as_unknown():
    assert spec_error(base(), ["rollout.gruop_size=4"]) == [
        "rollout.gruop_size: unknown key (did you mean 'group_size'?)"
    ]


def test_override_value_of_wrong_type_names_the_field():
    (line,) = spec_error(base(), ["rollout.group_size=abc"])
    assert line.startswith("rollout.group_size: ") and "'abc'" in line


def test_override_that_makes_the_batch_indivisible():
    lines = spec_error(base(), ["rollout.group_size=3", "rollout.prompts_per_step=5"])
    assert lines == [
        f"arms[{i}].mini_batches: 4 does not divide the rollout batch (5 prompts x 3 = 15)" for i in (0, 1)
    ]


@pytest.mark.parametrize(
    "assignment,expected",
    [
        ("nokey", "--set nokey: expected key.path=value"),
        ("=3", "--set =3: empty key path"),
        ("arms.nope.clip_high=1", "--set arms.nope.clip_high: no item named 'nope' in arms"),
        ("arms.gpso.clip_high=1", "(did you mean 'gspo'?)"),
        ("arms.5.clip_high=1", "--set arms.5.clip_high: index 5 out of range"),
        ("arms[9].clip_high=1", "--set arms[9].clip_high: index 9 out of range"),
        ("name.foo=1", "--set name.foo: name is a str, not a mapping or list"),
        ("rollout..group_size=1", "--set rollout..group_size: malformed key path"),
        ("rollout.=1", "--set rollout.: malformed key path"),
        ("arms[0]clip_high=1", "--set arms[0]clip_high: malformed key path"),
        ("arms[-1].clip_high=1", "--set arms[-1].clip_high: malformed key path"),
        ("[0]=1", "--set [0]: malformed key path"),
    ],
)
def test_bad_override_paths(assignment, expected):
    (line,) = spec_error(base(), [assignment])
    assert expected in line, line


def test_apply_override_directly():
    raw = apply_override({"a": {"b": 1}}, "a.c=[1, 2]")
    assert raw == {"a": {"b": 1, "c": [1, 2]}}
    assert apply_override({"a": 1}, "a=") == {"a": ""}
    assert apply_override({"a": 1}, "a=x: [") == {"a": "x: ["}  # not YAML: kept as text
    assert apply_override({"a": 1}, "a=a=b") == {"a": "a=b"}  # only the first '=' splits


# ---------------------------------------------------------------------------------------
# Files


def test_load_spec_from_file_with_overrides(tmp_path):
    path = write(tmp_path, yaml.safe_dump(BASE))
    spec = load_spec(path, ["arms.gspo.clip_high=5e-4"])
    assert spec.name == "exp" and spec.arm("gspo").clip_high == 5e-4


def test_load_spec_accepts_str_paths_and_yaml_exponents(tmp_path):
    path = write(tmp_path, "name: e\narms:\n  - {name: g, preset: paper-gspo, clip_low: 2e-4}\n")
    assert load_spec(str(path)).arms[0].clip_low == 2e-4


def test_missing_file(tmp_path):
    with pytest.raises(SpecError) as info:
        load_spec(tmp_path / "nope.yaml")
    assert str(info.value) == f"{tmp_path / 'nope.yaml'}: spec file not found"


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(SpecError, match="is a directory"):
        load_spec(tmp_path)


@pytest.mark.parametrize("text", ["", "   \n# only a comment\n"])
def test_empty_file(tmp_path, text):
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, text))
    assert str(info.value).endswith("the spec file is empty")
    assert len(str(info.value).splitlines()) == 1


@pytest.mark.parametrize("text", ["- a\n- b\n", "just text\n", "42\n"])
def test_top_level_not_a_mapping(tmp_path, text):
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, text))
    assert "top level must be a mapping" in str(info.value)
    assert str(info.value).startswith(str(tmp_path))
    assert len(str(info.value).splitlines()) == 1


def test_yaml_syntax_error_has_line_and_column(tmp_path):
    path = write(tmp_path, "name: e\nrollout:\n  group_size: [4\narms: []\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    msg = str(info.value)
    assert len(msg.splitlines()) == 1
    assert msg.startswith(f"{path}: YAML syntax error (line ")
    assert "column" in msg


def test_yaml_bad_indentation_reports_its_line(tmp_path):
    path = write(tmp_path, "name: e\nrollout:\n  group_size: 4\n bad: 1\n")
    with pytest.raises(SpecError, match=r"YAML syntax error \(line 4, column 2\)"):
        load_spec(path)


def test_duplicate_yaml_keys_are_rejected(tmp_path):
    # PyYAML would silently keep the second `rollout:` block.
    path = write(tmp_path, "name: e\nrollout: {group_size: 4}\narms: []\nrollout: {group_size: 8}\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    msg = str(info.value)
    assert "line 4" in msg and "duplicate key 'rollout'" in msg and "line 2" in msg


def test_yaml_merge_keys_still_work(tmp_path):
    text = (
        "name: e\nrollout: {prompts_per_step: 4, group_size: 4}\n"
        "common: &c {preset: paper-gspo, clip_high: 5e-4}\n"
        "arms:\n  - {<<: *c, name: a}\n  - {<<: *c, name: b}\n"
    )
    path = write(tmp_path, text)
    # `common` itself is not a spec key: reported as unknown (the nearest key as a hint), after the merge worked
    with pytest.raises(SpecError, match=r"^common: unknown key \(did you mean 'comparison'\?\)$"):
        load_spec(path)
    raw = yaml.safe_load(text)
    del raw["common"]
    assert [a.clip_high for a in spec_from_dict(raw).arms] == [5e-4, 5e-4]


def test_non_utf8_file(tmp_path):
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(SpecError, match="not a UTF-8 text file"):
        load_spec(path)


def test_errors_in_a_file_are_one_line_per_problem(tmp_path):
    text = """\
name: exp
rollout: {prompts_per_step: 4, group_size: 4}
optimizer: {lr: -1}
arms:
  - {name: grpo, preset: paper-grpo, clip_low: 0}
  - {name: gspo, preset: paper-gspo, clip_hihg: 1e-3}
"""
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, text))
    lines = str(info.value).splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("optimizer.lr: ")
    assert lines[1].startswith("arms[0].clip_low: ")
    assert lines[2] == "arms[1].clip_hihg: unknown key (did you mean 'clip_high'?)"


# ---------------------------------------------------------------------------------------
# dump_spec round trip


def test_dump_spec_round_trips(tmp_path):
    raw = base(
        seeds=[0, 7],
        arms=[
            {"name": "grpo", "preset": "paper-grpo"},
            {"name": "grpo-rr", "preset": "paper-grpo-rr"},
            {"name": "gspo", "preset": "paper-gspo", "clip_high": 5e-4, "epochs": 2},
            {"name": "tok", "preset": "paper-gspo-token", "adv_eps": 1e-8},
            {
                "name": "custom",
                "loss": "grpo",
                "clip_low": 0.1,
                "clip_high": 0.3,
                "aggregation": "token_mean",
                "mini_batches": 2,
                "kl_coef": 0.01,
                "advantage": "mean_only",
            },
        ],
        task={"name": "arithmetic", "params": {"num_operands": 3}},
    )
    spec = spec_from_dict(raw, ["optimizer.lr=3e-5"])
    text = dump_spec(spec)
    path = write(tmp_path, text, "resolved.yaml")
    again = load_spec(path)
    assert again == spec
    assert dump_spec(again) == text


def test_dump_spec_of_the_quickstart_round_trips(tmp_path):
    from pathlib import Path

    quickstart = Path(__file__).resolve().parents[1] / "experiments" / "quickstart.yaml"
    if not quickstart.is_file():
        pytest.skip("no experiments/quickstart.yaml")
    spec = load_spec(quickstart)
    assert load_spec(write(tmp_path, dump_spec(spec))) == spec


def test_run_spec_with_one_arm_round_trips(tmp_path):
    spec = spec_from_dict(base())
    one = spec.model_copy(update={"arms": [spec.arm("gspo")], "seeds": [5]})
    again = load_spec(write(tmp_path, dump_spec(one)))
    assert again == one and again.seeds == [5]


# ---------------------------------------------------------------------------------------
# Arm lookup


def test_arm_lookup_unknown_name():
    spec = spec_from_dict(base())
    with pytest.raises(SpecError) as info:
        spec.arm("gpso")
    assert str(info.value) == "--arm: no arm named 'gpso' (did you mean 'gspo'?); arms: grpo, gspo"


# --- is a stored spec.yaml this spec? ---------------------------------------------------


def test_spec_differences_name_each_changed_field_in_order(tmp_path):
    from gspo_cli.spec.loading import check_stored_spec, spec_differences

    spec = spec_from_dict(BASE)
    assert spec_differences(dump_spec(spec), spec) == []
    # Where the runs are is not what they are: a relative output_dir is the same directory given absolutely.
    assert spec_differences(dump_spec(spec_from_dict({**BASE, "output_dir": "w/relruns"})), spec) == []
    other = spec_from_dict(
        {**BASE, "optimizer": {"lr": 5e-5}, "arms": [{**BASE["arms"][0], "clip_high": 0.3}, BASE["arms"][1]]}
    )
    assert spec_differences(dump_spec(other), spec) == [
        "optimizer.lr: 5e-05 -> 0.0001",
        "arms[0].clip_high: 0.3 -> 0.27",
    ]
    assert spec_differences("arms: [", spec)[0].startswith("the stored spec.yaml is not a valid spec today")
    run = tmp_path / "exp/grpo/seed0"
    check_stored_spec(run, spec, "completed")  # no spec.yaml: nothing to compare
    run.mkdir(parents=True)
    (run / "spec.yaml").write_text(dump_spec(other))
    with pytest.raises(SpecError) as err:
        check_stored_spec(run, spec, "completed")
    assert str(err.value) == (
        f"{run} holds a completed run of a different spec (optimizer.lr: 5e-05 -> 0.0001; "
        "arms[0].clip_high: 0.3 -> 0.27); use --force to overwrite it or choose another "
        "output directory (-o) or experiment name"
    )
    many = spec_from_dict({**BASE, "seeds": [1], "optimizer": {"lr": 1, "weight_decay": 1, "grad_clip": 2}})
    (run / "spec.yaml").write_text(dump_spec(many))
    with pytest.raises(
        SpecError,
        match=r"an unfinished run of a different spec \(seeds\[0\]: 1 -> 0; .*weight_decay: 1.0 -> 0.0; and 1 more\)",
    ):
        check_stored_spec(run, spec, "unfinished")


def test_every_shipped_experiment_spec_is_valid():
    """experiments/*.yaml, the GPU ones included (they cannot run here): the validator accepts
    each, and the GPU spec asks for what its comments say."""
    from pathlib import Path

    specs = sorted((Path(__file__).resolve().parents[1] / "experiments").glob("*.yaml"))
    assert len(specs) >= 5
    loaded = {p.stem: load_spec(p) for p in specs}
    gpu = loaded["gpu_qwen3_moe"]
    assert (gpu.model.dtype, gpu.model.sharding, gpu.model.device) == ("bfloat16", "fsdp", "cuda")
    assert gpu.train.gradient_checkpointing and gpu.rollout.prompts_per_step % 8 == 0
    assert [a.routing_replay for a in gpu.arms] == ["off", "r2", "off"]
    moe = loaded["paper_moe"]  # the testbed: fine-grained routing, routers at the network's speed, 5 seeds
    b = moe.model.builtin
    assert (b.num_experts, b.experts_per_token, moe.optimizer.router_lr_scale) == (64, 8, 1.0)
    assert len(moe.seeds) == 5 and [a.routing_replay for a in moe.arms] == ["off", "r2", "off"]
    assert (moe.optimizer.decay, moe.optimizer.min_lr_ratio, moe.train.steps) == ("linear", 0.0, 100)
    stress = loaded["paper_moe_stress"]  # `make reproduce-stress`: fast routers, collapse timed every 25 steps
    b = stress.model.builtin
    assert (b.num_experts, b.experts_per_token, stress.optimizer.router_lr_scale) == (64, 8, 60.0)
    assert (stress.name, stress.train.eval_every, len(stress.seeds), stress.train.steps) == (
        "paper_moe_stress",
        25,
        3,
        100,
    )
    assert [a.routing_replay for a in stress.arms] == ["off", "r2", "off"]
    gpu_moe = loaded["paper_moe_gpu"]  # `make reproduce-gpu`: the four-arm comparison, vLLM for R3
    assert (gpu_moe.model.device, gpu_moe.rollout.engine) == ("cuda", "vllm")
    assert [a.routing_replay for a in gpu_moe.arms] == ["off", "r2", "r3", "off"]


def test_router_lr_scale_on_the_builtin_dense_model_is_refused_at_load():
    """Before the cold start, not after it: the built-in dense model has no routers to speed up.
    (Hub and local models are checked when built; tests/test_logratio_diag.py.)"""
    raw = base(model={"name": "builtin:tiny-dense"}, optimizer={"router_lr_scale": 10})
    assert spec_error(raw) == ["optimizer.router_lr_scale: 10.0 needs an MoE model; builtin:tiny-dense has no routers"]
    ok = spec_from_dict(base(model={"name": "builtin:tiny-dense"}, optimizer={"router_lr_scale": 1.0}))
    assert ok.optimizer.router_lr_scale == 1.0
