"""The `gspo` command line on error paths: exit code 2, one `error:` line per problem, no traceback.

Nothing here trains. Where a test needs `gspo train` to get past validation, the trainer
module is replaced by a fake that records its call, so no model is ever built.
"""

from __future__ import annotations

import sys
import types
import warnings

import pytest
import yaml
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.errors import SpecError
from gspo_cli.spec import ModelConfig

runner = CliRunner()

SPEC = {
    "name": "exp",
    "rollout": {"prompts_per_step": 4, "group_size": 4},
    "arms": [{"name": "grpo", "preset": "paper-grpo"}, {"name": "gspo", "preset": "paper-gspo"}],
}


@pytest.fixture(autouse=True)
def _restore_showwarning(monkeypatch):
    # `gspo train` installs its own warning printer; keep it from leaking into other tests.
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)


@pytest.fixture
def fake_train(monkeypatch):
    """Stand-in for gspo_cli.train.loop: records the call instead of building models."""
    calls = []
    fake = types.ModuleType("gspo_cli.train.loop")

    def train_experiment(spec, *, arms=None, seeds=None, reporter=None, force=False, setup_lines=()):
        calls.append({"spec": spec, "arms": arms, "seeds": seeds, "force": force})
        return []

    fake.train_experiment = train_experiment
    monkeypatch.setitem(sys.modules, "gspo_cli.train.loop", fake)
    return calls


@pytest.fixture
def no_train(monkeypatch):
    """Any call into the trainer fails the test: the error must come before it."""
    fake = types.ModuleType("gspo_cli.train.loop")

    def train_experiment(*args, **kwargs):
        raise AssertionError("train_experiment reached: the error should have been raised before")

    fake.train_experiment = train_experiment
    monkeypatch.setitem(sys.modules, "gspo_cli.train.loop", fake)


def spec_file(tmp_path, raw=None, text=None):
    path = tmp_path / "exp.yaml"
    path.write_text(text if text is not None else yaml.safe_dump(raw if raw is not None else SPEC))
    return path


def gspo(*args):
    return runner.invoke(app, [str(a) for a in args])


def error_lines(result) -> list[str]:
    """The problem lines of a failed command (stderr), after checking its shape."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.splitlines()
    assert lines, result.output
    assert lines[0].startswith("error: ")
    assert all(line.startswith("       ") for line in lines[1:]), lines
    assert result.stdout == ""
    return [line.removeprefix("error: ").strip() for line in lines]


# ---------------------------------------------------------------------------------------
# Help


def test_help():
    result = gspo("--help")
    assert result.exit_code == 0
    assert "train" in result.output


def test_train_help():
    result = gspo("train", "--help")
    assert result.exit_code == 0
    for option in ("--set", "--arm", "--seed", "--output-dir"):
        assert option in result.output


# ---------------------------------------------------------------------------------------
# Spec files


def test_missing_file(tmp_path, no_train):
    path = tmp_path / "nope.yaml"
    assert error_lines(gspo("train", path)) == [f"{path}: spec file not found"]


def test_directory_instead_of_a_file(tmp_path, no_train):
    (line,) = error_lines(gspo("train", tmp_path))
    assert "is a directory" in line


def test_malformed_yaml(tmp_path, no_train):
    path = spec_file(tmp_path, text="name: exp\narms: [\n  {name: a\n")
    (line,) = error_lines(gspo("train", path))
    assert line.startswith(f"{path}: YAML syntax error (line ")
    assert "column" in line


def test_empty_file(tmp_path, no_train):
    path = spec_file(tmp_path, text="")
    assert error_lines(gspo("train", path)) == [f"{path}: the spec file is empty"]


def test_top_level_list(tmp_path, no_train):
    path = spec_file(tmp_path, text="- name: exp\n")
    (line,) = error_lines(gspo("train", path))
    assert "top level must be a mapping" in line


def test_unknown_key_lists_path_and_suggestion(tmp_path, no_train):
    raw = {**SPEC, "rollout": {"prompts_per_step": 4, "group_sise": 4}}
    assert error_lines(gspo("train", spec_file(tmp_path, raw))) == [
        "rollout.group_sise: unknown key (did you mean 'group_size'?)"
    ]


def test_unknown_preset(tmp_path, no_train):
    raw = {**SPEC, "arms": [{"name": "g", "preset": "paper-gspo-tokn"}]}
    (line,) = error_lines(gspo("train", spec_file(tmp_path, raw)))
    assert line.startswith("arms[0].preset: unknown preset 'paper-gspo-tokn' (did you mean 'paper-gspo-token'?)")


def test_several_problems_one_line_each_never_wrapped(tmp_path, no_train):
    raw = {
        **SPEC,
        "rollout": {"prompts_per_step": 3, "group_size": 3},
        "arms": [
            {"name": "a-rather-long-arm-name-that-pushes-the-line-well-past-eighty-columns", "preset": "paper-grpo"},
            {"name": "b", "preset": "paper-gspo", "mini_batches": 2},
        ],
    }
    lines = error_lines(gspo("train", spec_file(tmp_path, raw)))
    assert lines == [
        "arms[0].mini_batches: 4 does not divide the rollout batch (3 prompts x 3 = 9)",
        "arms[1].mini_batches: 2 does not divide the rollout batch (3 prompts x 3 = 9)",
    ]


def test_field_errors_in_two_arms(tmp_path, no_train):
    raw = {
        **SPEC,
        "arms": [
            {"name": "a", "preset": "paper-grpo", "clip_low": 0},
            {"name": "b", "preset": "paper-gspo", "clip_high": -1},
        ],
    }
    lines = error_lines(gspo("train", spec_file(tmp_path, raw)))
    assert [line.split(":")[0] for line in lines] == ["arms[0].clip_low", "arms[1].clip_high"]


def test_long_line_is_not_wrapped(tmp_path, no_train):
    raw = {**SPEC, "arms": [{"name": "g", "preset": "paper-gspo", "clip_hgh" + "x" * 100: 1}]}
    (line,) = error_lines(gspo("train", spec_file(tmp_path, raw)))
    assert line.startswith("arms[0].clip_hgh") and line.endswith("unknown key")


# ---------------------------------------------------------------------------------------
# Options


@pytest.mark.parametrize(
    "assignment,expected",
    [
        ("arms.nope.clip_high=1", "--set arms.nope.clip_high: no item named 'nope' in arms"),
        ("arms[7].clip_high=1", "--set arms[7].clip_high: index 7 out of range"),
        ("novalue", "--set novalue: expected key.path=value"),
        ("rollout..group_size=4", "--set rollout..group_size: malformed key path"),
        ("rollout.group_size=abc", "rollout.group_size: Input should be a valid integer"),
        ("arms.gspo.clip_hihg=1", "arms[1].clip_hihg: unknown key (did you mean 'clip_high'?)"),
    ],
)
def test_bad_set(tmp_path, no_train, assignment, expected):
    (line,) = error_lines(gspo("train", spec_file(tmp_path), "--set", assignment))
    assert line.startswith(expected), line


def test_unknown_arm_fails_before_any_model_is_built(tmp_path, no_train):
    lines = error_lines(gspo("train", spec_file(tmp_path), "--arm", "gspo", "--arm", "gpso"))
    assert lines == ["--arm: no arm named 'gpso' (did you mean 'gspo'?); arms: grpo, gspo"]


def test_negative_seed(tmp_path, no_train):
    (line,) = error_lines(gspo("train", spec_file(tmp_path), "--seed", "-1"))
    assert line.startswith("--seed: -1 is out of range")


def test_set_and_options_reach_the_trainer(tmp_path, fake_train):
    """--set/--arm/--seed/--output-dir arrive as documented (the trainer is a fake)."""
    result = gspo(
        "train",
        spec_file(tmp_path),
        "--set",
        "arms.gspo.clip_high=5e-4",
        "-s",
        "seeds=[0, 1]",
        "--arm",
        "gspo",
        "--arm",
        "gspo",
        "--seed",
        "7",
        "--output-dir",
        "2024",
        "--force",
    )
    assert result.exit_code == 0, result.output
    (call,) = fake_train
    assert call["spec"].arm("gspo").clip_high == 5e-4
    assert call["spec"].seeds == [0, 1]
    assert call["arms"] == ["gspo"]  # repeated --arm runs once
    assert call["seeds"] == [7]  # a seed outside the spec's list is allowed
    assert call["spec"].output_dir == "2024"  # a string, even when it reads as a YAML number
    assert call["force"] is True


@pytest.mark.parametrize("out", ["null", "runs #2", "a: b"])
def test_output_dir_is_taken_literally(tmp_path, fake_train, out):
    result = gspo("train", spec_file(tmp_path), "--output-dir", out)
    assert result.exit_code == 0, result.output
    assert fake_train[0]["spec"].output_dir == out


def test_on_policy_spec_runs_with_one_warning_line(tmp_path, fake_train):
    raw = {**SPEC, "arms": [{"name": "g", "preset": "paper-gspo", "mini_batches": 1}]}
    result = gspo("train", spec_file(tmp_path, raw))
    assert result.exit_code == 0, result.output
    warning_lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(warning_lines) == 1
    assert warning_lines[0].startswith("warning: arms ['g'] update on-policy")


def test_missing_spec_argument_is_a_usage_error():
    result = gspo("train")
    assert result.exit_code == 2
    assert "Traceback" not in result.output


# ---------------------------------------------------------------------------------------
# Unknown models: load_model must fail fast with a one-line SpecError (offline here).


@pytest.fixture
def hf_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    # The constant is read when huggingface_hub is first imported; another test may have
    # imported it already, and without this the hub client retries the network for ~20 s.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.mark.parametrize("name", ["no/such-model", "./nope"])
def test_unknown_model_is_a_one_line_spec_error(hf_offline, name):
    from gspo_cli.models import load_model

    with pytest.raises(SpecError) as info:
        load_model(name, ModelConfig(name=name))
    msg = str(info.value)
    assert info.value.exit_code == 2
    assert msg.startswith("model.name: ")
    assert name in msg
    assert len(msg.splitlines()) == 1


def test_directory_without_config_is_not_a_model(hf_offline, tmp_path):
    from gspo_cli.models import load_model

    with pytest.raises(SpecError, match="is not a model directory"):
        load_model(str(tmp_path), ModelConfig(name=str(tmp_path)))
