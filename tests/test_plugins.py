"""Plugins: rewards and tasks that installed packages register by entry point (groups
gspo_cli.rewards and gspo_cli.tasks). Each test installs a small distribution the way pip
leaves one, a package beside its `*.dist-info` (METADATA, entry_points.txt), in a folder put
on sys.path, so importlib.metadata finds it as it finds any installed package."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import TINY
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.errors import SpecError
from gspo_cli.rewards import registered, with_rewards
from gspo_cli.runs import RunDir
from gspo_cli.spec.loading import load_spec, spec_from_dict
from gspo_cli.spec.reference import reference_markdown, schema_text
from gspo_cli.tasks import Task, make_task

PLUGIN_CODE = '''
from gspo_cli.errors import SpecError
from gspo_cli.tasks.arithmetic import ArithmeticTask

IMPORTED = True


def short_bonus(completions, trainer_state, **kwargs):
    """1 for a completion of at most 4 characters, else 0 (TRL's convention)."""
    return [1.0 if len(c) <= 4 else 0.0 for c in completions]


class Doubles(ArithmeticTask):
    """The arithmetic task under another name, as a plugin's own task."""


def not_a_task(**params):
    return "a string"


def strict(**params):
    raise SpecError("task.params.level: must be 1, 2 or 3")


def picky(**params):
    raise ValueError("picky wants no params\\nsecond line")
'''


def install(root: Path, dist: str, package: str, entry_points: dict[str, dict[str, str]], code: str) -> Path:
    """A distribution `dist` 0.1 holding the module `package` (`code`) and registering
    `entry_points` ({group: {name: "module:attr"}}), laid out under `root` as pip installs one."""
    (root / f"{package}.py").write_text(code)
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "".join(f"[{g}]\n" + "".join(f"{n} = {v}\n" for n, v in eps.items()) + "\n" for g, eps in entry_points.items())
    )
    return root


DEMO = {
    "gspo_cli.rewards": {"short": "gspo_demo:short_bonus", "ghost": "gspo_demo_missing:fn"},
    "gspo_cli.tasks": {
        "doubles": "gspo_demo:Doubles",
        "not_a_task": "gspo_demo:not_a_task",
        "picky": "gspo_demo:picky",
        "strict": "gspo_demo:strict",
    },
}


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """gspo-demo 0.1 installed: a reward `short`, a task `doubles`, and broken entries."""
    root = tmp_path / "site"
    root.mkdir()
    install(root, "gspo-demo", "gspo_demo", DEMO, PLUGIN_CODE)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, "gspo_demo", raising=False)
    yield root
    sys.modules.pop("gspo_demo", None)


ARITH = {"num_operands": 2, "max_operand": 4, "operators": "+"}


def test_a_plugin_reward_is_usable_by_name(plugin):
    spec = spec_from_dict({**TINY, "task": {**TINY["task"], "rewards": [{"function": "short", "correct": True}]}})
    assert spec.task.rewards[0].function == "short" and spec.task.rewards[0].label == "short"
    task = with_rewards(make_task(spec.task.name, spec.task.params), spec.task.rewards)
    p = task.train_problems(random.Random(0), 1)[0]
    long, short = task.score_rollout([p, p], ["the answer is 12345", "7"])
    assert (long.reward, long.correct, short.reward, short.correct) == (0.0, False, 1.0, True)
    assert short.components == {"short": 1.0}
    assert task.rewards[0].call is sys.modules["gspo_demo"].short_bonus


def test_a_plugin_task_is_usable_by_name_and_its_params_checked(plugin):
    task = make_task("doubles", ARITH)
    assert isinstance(task, Task) and type(task).__name__ == "Doubles"
    with pytest.raises(SpecError, match=r"^task.params.max_opernd: unknown key \(did you mean 'max_operand'\?\)"):
        make_task("doubles", {"max_opernd": 3})
    with pytest.raises(SpecError) as err:
        make_task("picky", {})
    assert str(err.value) == "task.params: plugin task 'picky' refused them: ValueError: picky wants no params"
    with pytest.raises(SpecError) as err:  # a SpecError is already the one line to show
        make_task("strict", {})
    assert str(err.value) == "task.params.level: must be 1, 2 or 3"
    with pytest.raises(SpecError) as err:
        make_task("not_a_task", {})
    assert str(err.value) == "task.name: plugin task 'not_a_task' built a str, not a gspo_cli.tasks.Task"
    with pytest.raises(SpecError) as err:
        make_task("dubles", {})
    assert str(err.value).startswith("task.name: unknown task 'dubles'; known: arithmetic, code, doubles, math")


def test_plugins_are_imported_only_for_names_no_builtin_has(plugin):
    from gspo_cli.spec import RewardConfig

    task = with_rewards(make_task("arithmetic", ARITH), [RewardConfig(function="math_accuracy")])
    assert task.rewards[0].shipped and "gspo_demo" not in sys.modules
    make_task("doubles", ARITH)
    assert "gspo_demo" in sys.modules


def test_a_broken_plugin_is_one_line_naming_it(plugin, tmp_path):
    from gspo_cli.spec import RewardConfig

    with pytest.raises(SpecError) as err:
        with_rewards(make_task("arithmetic", ARITH), [RewardConfig(function="ghost")])
    assert str(err.value) == (
        "task.rewards[0].function: plugin reward 'ghost' (gspo-demo 0.1, gspo_demo_missing:fn) is broken: "
        "ModuleNotFoundError: No module named 'gspo_demo_missing'"
    )
    with pytest.raises(SpecError, match=r"'shrt' is no shipped reward \(math_accuracy, code_tests, env\) nor plugin "):
        with_rewards(make_task("arithmetic", ARITH), [RewardConfig(function="shrt")])
    # gspo train: one line, exit 2, before any model is built
    spec = {**TINY, "task": {**TINY["task"], "rewards": [{"function": "ghost"}]}, "arms": TINY["arms"][:1]}
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(spec))
    res = CliRunner().invoke(app, ["train", str(tmp_path / "exp.yaml"), "-o", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    assert "plugin reward 'ghost' (gspo-demo 0.1, gspo_demo_missing:fn) is broken" in " ".join(res.output.split())
    assert "Traceback" not in res.output and "cold start" not in res.output
    assert not (tmp_path / "out").exists()


def test_a_plugin_with_a_builtin_name_is_refused_and_the_builtin_used(tmp_path, monkeypatch):
    clash = {"gspo_cli.rewards": {"math_accuracy": "gspo_clash:fn"}, "gspo_cli.tasks": {"math": "gspo_clash:Task"}}
    root = tmp_path / "site"
    root.mkdir()
    install(root, "gspo-clash", "gspo_clash", clash, "raise RuntimeError('never imported')\n")
    monkeypatch.syspath_prepend(str(root))
    task = make_task("math", {"source": "synthetic"})
    assert type(task).__name__ == "MathTask"
    rows = {(r.kind, r.name, r.origin): r.problem for r in registered()}
    assert rows[("reward", "math_accuracy", "built-in")] is None
    assert rows[("reward", "math_accuracy", "gspo-clash 0.1")] == (
        "refused: the built-in reward math_accuracy has this name (the built-in is used)"
    )
    assert rows[("task", "math", "gspo-clash 0.1")].startswith("refused: the built-in task math")


def test_a_name_two_packages_register_is_refused(plugin, tmp_path):
    install(plugin, "gspo-other", "gspo_other", {"gspo_cli.rewards": {"short": "gspo_other:fn"}}, "fn = len\n")
    from gspo_cli.spec import RewardConfig

    with pytest.raises(SpecError) as err:
        with_rewards(make_task("arithmetic", ARITH), [RewardConfig(function="short")])
    assert str(err.value).startswith("task.rewards[0].function: plugin reward 'short' is registered by several")
    assert "gspo-demo 0.1 (gspo_demo:short_bonus)" in str(err.value) and "gspo-other 0.1" in str(err.value)


def test_gspo_plugins_lists_what_is_registered_and_where_from(plugin):
    res = CliRunner().invoke(app, ["plugins", "--json"])
    assert res.exit_code == 1  # the broken entries
    rows = {(r["kind"], r["name"]): r for r in json.loads(res.stdout)}
    assert rows[("reward", "math_accuracy")] == {
        "kind": "reward",
        "name": "math_accuracy",
        "origin": "built-in",
        "target": "gspo_cli.rewards.shipped",
        "problem": None,
    }
    assert rows[("task", "math")]["target"] == "gspo_cli.tasks.math:MathTask"
    assert rows[("reward", "short")] == {
        "kind": "reward",
        "name": "short",
        "origin": "gspo-demo 0.1",
        "target": "gspo_demo:short_bonus",
        "problem": None,
    }
    assert rows[("task", "doubles")]["problem"] is None
    assert rows[("reward", "ghost")]["problem"] == "is broken: ModuleNotFoundError: No module named 'gspo_demo_missing'"
    assert rows[("task", "not_a_task")]["problem"] is None  # callable: what it builds is checked when named
    errors = [line for line in res.stderr.splitlines() if line]
    assert errors == [
        "error: plugin reward 'ghost' (gspo-demo 0.1, gspo_demo_missing:fn) is broken: "
        "ModuleNotFoundError: No module named 'gspo_demo_missing'"
    ]
    res = CliRunner().invoke(app, ["plugins"])
    assert res.exit_code == 1 and "Traceback" not in res.output
    table = " ".join(res.stdout.split())
    assert "short │ gspo-demo 0.1 │ gspo_demo:short_bonus │ ok" in table
    assert "math │ built-in │ gspo_cli.tasks.math:MathTask │ ok" in table


def test_gspo_plugins_from_another_process(tmp_path):
    """A working plugin, found by a fresh interpreter through PYTHONPATH as an installed one is."""
    good = tmp_path / "good"
    good.mkdir()
    install(good, "gspo-good", "gspo_good", {"gspo_cli.rewards": {"short": "gspo_good:f"}}, "def f(**kw): return []\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(good), *sys.path])}
    res = subprocess.run(
        [sys.executable, "-m", "gspo_cli", "plugins", "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    assert res.returncode == 0, res.stderr
    rows = {(r["kind"], r["name"]): r for r in json.loads(res.stdout)}
    assert rows[("reward", "short")]["origin"] == "gspo-good 0.1" and rows[("reward", "short")]["problem"] is None
    assert {n for k, n in rows if k == "task"} == {"arithmetic", "code", "math", "prompts"}


def test_an_installed_plugin_changes_neither_the_reference_nor_the_schema(tmp_path, monkeypatch):
    before = reference_markdown(), schema_text()
    root = tmp_path / "site"
    root.mkdir()
    install(root, "gspo-demo", "gspo_demo", DEMO, PLUGIN_CODE)
    monkeypatch.syspath_prepend(str(root))
    registered()  # every plugin imported
    assert (reference_markdown(), schema_text()) == before
    res = CliRunner().invoke(app, ["schema"])
    assert res.exit_code == 0 and res.stdout == before[1]
    sys.modules.pop("gspo_demo", None)


@pytest.mark.slow
def test_a_spec_with_a_plugin_task_and_reward_trains(plugin, tmp_path):
    rewards = [{"function": "short"}, {"function": "math_accuracy", "correct": True}]
    spec = {
        **TINY,
        "model": {**TINY["model"], "cold_start": {"steps": 10, "batch_size": 8, "lr": 1e-2}},
        "task": {"name": "doubles", "params": ARITH, "eval_size": 4, "rewards": rewards},
        "arms": TINY["arms"][2:3],
        "train": {"steps": 2, "eval_every": 0, "eval_samples": 1},
    }
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(spec))
    res = CliRunner().invoke(app, ["train", str(tmp_path / "exp.yaml"), "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    rd = RunDir(tmp_path / "out/e2e/gspo/seed0")
    stored = load_spec(rd.spec_file).task
    assert (stored.name, stored.rewards[0].function) == ("doubles", "short")
    assert all("reward/short" in m for m in rd.metrics()) and len(rd.metrics()) == 2
