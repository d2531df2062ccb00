"""`gspo check SPEC`: the checks training makes before it loads a model (train/preflight.py), run
alone. On a corpus of bad specs, one per check that a single process can reach, `check` ends with
the same one line and exit code as `train`; on a good spec it passes and writes nothing."""

from __future__ import annotations

import copy
import json
import sys

import pytest
import yaml
from helpers import TINY, free_port
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.train import loop
from gspo_cli.train.preflight import CHECKS, preflight


def _tiny(**top) -> dict:
    raw = copy.deepcopy(TINY)
    raw.update(top)
    return raw


def _with(raw: dict, section: str, **fields) -> dict:
    raw[section] = {**raw.get(section, {}), **fields}
    return raw


def _stray_run_dir(tmp_path, raw) -> None:
    """A file gspo did not write in the first run's directory: training would have to delete it."""
    run = tmp_path / "out" / raw["name"] / raw["arms"][0]["name"] / f"seed{raw['seeds'][0]}"
    run.mkdir(parents=True)
    (run / "notes.txt").write_text("mine")


def _long_prompts(tmp_path) -> dict:
    rows = [{"prompt": f"{a}+{a}=?", "answer": str(2 * a)} for a in range(12)]
    rows.insert(3, {"prompt": "x" * 5000 + "1+1=?", "answer": "2"})
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = {
        "name": "prompts",
        "params": {"source": str(data)},
        "eval_size": 4,
        "rewards": [{"function": "math_accuracy"}],
    }
    return _tiny(task=task)


def _misspelled_reward(tmp_path) -> dict:
    (tmp_path / "r.py").write_text("def short(completions, **kw):\n    return [0.0] * len(completions)\n")
    return _with(_tiny(), "task", rewards=[{"function": f"{tmp_path}/r.py:shrot"}])


# The spec-error corpus: (id, spec builder, extra arguments, exit code, a part of the one line).
CORPUS = [
    ("unknown key", lambda t: _tiny(rollot={}), [], 2, "error: rollot: unknown key (did you mean 'rollout'?)"),
    ("bad --set", lambda t: _tiny(), ["--set", "arms.nope.clip_high=1"], 2, "error: --set arms.nope.clip_high: "),
    ("unknown --arm", lambda t: _tiny(), ["--arm", "nope"], 2, "error: "),
    ("sink", lambda t: _with(_tiny(), "train", sinks=["mlflow"]), [], 2, "error: train.sinks: mlflow needs "),
    ("task parameter", lambda t: _with(_tiny(), "task", params={"num_operandz": 2}), [], 2, "error: task.params."),
    ("reward", _misspelled_reward, [], 2, "error: task.rewards[0].function: "),
    ("prompt length", _long_prompts, [], 2, "prompts of at most 240 fit"),
    ("environment", lambda t: _with(_tiny(), "task", environment="nope.py:Env"), [], 2, "error: task.environment"),
    (
        "LoRA",
        lambda t: _with(_with(_tiny(), "model", lora={"r": 4}), "train", compile=True),
        [],
        2,
        "error: train.compile with model.lora is not supported yet",
    ),
    (
        "vLLM settings",
        lambda t: _with(_tiny(), "rollout", engine="vllm", vllm={"tensor_parallel_size": 2}),
        [],
        2,
        "error: rollout.",
    ),
    (
        "vLLM server",
        lambda t: _with(_tiny(), "rollout", engine="vllm-server", server={"url": f"http://127.0.0.1:{free_port()}"}),
        [],
        1,
        "error: vLLM server http://127.0.0.1:",
    ),
    ("run directory", lambda t: _tiny(), ["stray"], 2, "error: "),
]


def _run(tmp_path, command: str, raw: dict, extra: list[str]):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({**raw, "output_dir": str(tmp_path / "out")}))
    res = CliRunner().invoke(app, [command, str(spec), *extra])
    return res, [line for line in res.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize("name, build, extra, code, start", CORPUS, ids=[c[0] for c in CORPUS])
def test_check_refuses_each_bad_spec_as_train_does(tmp_path, monkeypatch, name, build, extra, code, start):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # the sink's package, missing
    monkeypatch.setattr(loop, "resolve_model_source", lambda *a, **k: pytest.fail("train built a model"))
    raw = build(tmp_path)
    if extra == ["stray"]:
        _stray_run_dir(tmp_path, raw)
        extra = []
    checked, check_lines = _run(tmp_path, "check", raw, extra)
    trained, train_lines = _run(tmp_path, "train", raw, extra)
    assert checked.exit_code == trained.exit_code == code, (checked.output, trained.output)
    assert len(check_lines) == 1 and check_lines[0].startswith("error: ") and start in check_lines[0], check_lines
    assert [ln for ln in train_lines if ln.startswith("error")] == check_lines
    assert "Traceback" not in checked.output + trained.output


def test_check_passes_a_good_spec_and_says_each_check(tmp_path, monkeypatch):
    monkeypatch.setattr(loop, "resolve_model_source", lambda *a, **k: pytest.fail("a model was built"))
    res, _ = _run(tmp_path, "check", _tiny(), ["--set", "rollout.group_size=2"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert [line[6:].split(" (")[0] for line in lines[:-1]] == [name for name, _ in CHECKS]
    assert lines[0] == "skip  sinks (no train.sinks)" and "ok    run directories" in lines
    assert lines[-1].endswith("every check passed for 5 runs; no model was loaded")
    assert not (tmp_path / "out").exists()  # nothing written


def test_the_documented_command(monkeypatch):
    """`gspo check experiments/quickstart.yaml --set rollout.group_size=8`, as its help shows it."""
    monkeypatch.setattr(loop, "resolve_model_source", lambda *a, **k: pytest.fail("a model was built"))
    res = CliRunner().invoke(
        app, ["check", "experiments/quickstart.yaml", "--set", "rollout.group_size=8", "-o", "/nonexistent/runs"]
    )
    assert res.exit_code == 0, res.output
    assert "every check passed" in res.stdout


def test_the_preflight_fills_in_what_training_goes_on_with():
    from gspo_cli.spec.loading import spec_from_dict

    p = preflight(spec_from_dict(_tiny(output_dir="/nonexistent/runs")), ["grpo"])
    assert [a.name for a in p.arms] == ["grpo"] and p.seeds == TINY["seeds"]
    assert p.task is not None and p.data["train_source"] and p.info.world_size == 1 and p.unshared is None
