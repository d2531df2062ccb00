"""What the user's code prints (a reward file's module-level print, an environment's __init__,
start and step) goes to standard error: standard output is the command's own (`--json`); and
an environment's error line names the rollout's prompt."""

from __future__ import annotations

import pytest

from gspo_cli.environments import as_observation, resolve_environment
from gspo_cli.errors import RunError
from gspo_cli.rollout.env_calls import EnvironmentCalls
from gspo_cli.user_code import load_function

ENV = """
print("env module loaded")


class Env:
    def __init__(self):
        print("env made")

    def start(self, prompt):
        print("start", prompt)

    def step(self, turn):
        print("step", turn)
        return "obs", True, 1.0
"""


def test_a_module_level_print_in_a_reward_file_goes_to_stderr(tmp_path, capfd):
    f = tmp_path / "reward.py"
    f.write_text(
        'import os\nprint("loading my reward")\nos.system("echo from a shell")\ndef r(**kw):\n    return 1.0\n'
    )
    fn, _ = load_function(f"{f}:r", "task.rewards[0]")
    out, err = capfd.readouterr()
    assert out == "" and "loading my reward" in err and "from a shell" in err
    assert fn() == 1.0


def test_an_environments_prints_go_to_stderr(tmp_path, capfd):
    f = tmp_path / "env.py"
    f.write_text(ENV)
    make = resolve_environment(f"{f}:Env")
    env = make()
    calls = EnvironmentCalls(timeout_s=5)
    calls.run("start()", [lambda: env.start("2+2?")], ["2+2?"])
    assert calls.run("step()", [lambda: as_observation(env.step("4"), "task.environment")], ["2+2?"])[0].done
    out, err = capfd.readouterr()
    assert out == ""
    assert [x for x in err.splitlines() if x] == ["env module loaded", "env made", "env made", "start 2+2?", "step 4"]


def test_an_environments_bad_return_names_the_rollouts_prompt():
    calls = EnvironmentCalls(timeout_s=5)
    with pytest.raises(RunError) as err:
        calls.run("step()", [lambda: as_observation(("obs", False, "abc"), "task.environment")], ["What is 17*23?"])
    assert str(err.value) == (
        "task.environment: step() returned a reward str 'abc', not a number or None "
        "(the rollout whose prompt starts 'What is 17*23?')"
    )
