"""task.rewards: reward functions from the user's code, called with TRL's convention, and the
`prompts` task."""

from __future__ import annotations

import json
import pickle
import random
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from helpers import TINY, edited_model_copy, tiny_model_dir
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.errors import RunError, SpecError
from gspo_cli.eval.scores import reward_means
from gspo_cli.eval.sets import EvalSet, score_and_log
from gspo_cli.models.prompts import PromptFormat
from gspo_cli.rewards import with_rewards
from gspo_cli.runs import RunDir, identity_changes, reward_changes
from gspo_cli.spec import RewardConfig
from gspo_cli.spec.loading import load_spec, spec_from_dict
from gspo_cli.tasks import make_task
from gspo_cli.tasks.base import Conversation
from gspo_cli.tasks.math import MathTask
from gspo_cli.train.stats import StepStats, record_batch

ROOT = Path(__file__).resolve().parents[1]

# Written as TRL's documentation writes reward functions: the columns they need by keyword.
TRL_STYLE = '''
import re

def format_reward(completions, **kwargs):
    return [1.0 if re.search(r"<answer>.*</answer>", c) else 0.0 for c in completions]

def accuracy_reward(completions, answer, **kwargs):
    return [1.0 if f"<answer>{a}</answer>" in c else 0.0 for c, a in zip(completions, answer)]

def long_reward(completion_ids, **kwargs):
    return [float(len(ids)) for ids in completion_ids]

def step_reward(prompts, completions, trainer_state, **kwargs):
    return [float(trainer_state.global_step) for _ in completions]

def picky(completions, kind, **kwargs):
    # applies to rows of kind "a" only; NaN is "does not apply" too (TRL's nansum)
    return [1.0 if k == "a" else (None if k == "b" else float("nan")) for k in kind]

def boom(completions, prompts, **kwargs):
    for p in prompts:
        if p.startswith("Second"):
            raise ValueError("cannot judge this one\\nsecond line")
    return [0.0] * len(completions)

def infinite(completions, **kwargs):
    return [float("inf") for _ in completions]

def tensors(completions, **kwargs):
    import torch
    return [torch.tensor(0.5) for _ in completions]

def short(completions, **kwargs):
    return [0.0]

def words(completions, **kwargs):
    return ["yes" for _ in completions]
'''

ROWS = [
    {"prompt": "First: 2+2?", "answer": "4", "kind": "a", "solution": "<answer>4</answer>"},
    {"prompt": "Second: 3+3?", "answer": "6", "kind": "b", "solution": "<answer>6</answer>"},
    {"prompt": "Third: 1+1?", "answer": "2", "kind": "c", "solution": "<answer>2</answer>"},
]


@pytest.fixture
def data(tmp_path):
    (tmp_path / "rewards.py").write_text(TRL_STYLE)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return tmp_path


def rewards(tmp_path, *entries) -> list[RewardConfig]:
    return [RewardConfig(function=f"{tmp_path / 'rewards.py'}:{e[0]}", **e[1]) for e in entries]


def task_of(tmp_path, *entries):
    return with_rewards(make_task("prompts", {"source": str(tmp_path / "train.jsonl")}), rewards(tmp_path, *entries))


def test_a_trl_style_reward_file_runs_unchanged(data):
    task = task_of(
        data,
        ("format_reward", {"weight": 0.5}),
        ("accuracy_reward", {"correct": True}),
        ("long_reward", {"weight": -0.1, "name": "length"}),
        ("step_reward", {"weight": 0.01}),
    )
    problems = task.eval_problems(3)
    completions = ["<answer>4</answer>", "<answer>5</answer>", "no idea"]
    scores = task.score_rollout(problems, completions, [[1, 2, 3], [4], []], step=7)
    # format 0.5*1, accuracy 1, length -0.1*3, step 0.01*7
    assert scores[0].components == {"format_reward": 1.0, "accuracy_reward": 1.0, "length": 3.0, "step_reward": 7.0}
    assert scores[0].reward == pytest.approx(0.5 + 1.0 - 0.3 + 0.07)
    assert scores[1].reward == pytest.approx(0.5 + 0.0 - 0.1 + 0.07)
    assert scores[2].reward == pytest.approx(0.07)
    assert [s.correct for s in scores] == [True, False, False]
    assert all(s.rewarded for s in scores)


def test_evaluations_hand_rewards_the_step_they_score(data):
    task = task_of(data, ("step_reward", {}), ("long_reward", {"correct": True}))
    problems = task.eval_problems(2)
    engine = SimpleNamespace(
        generate=lambda prompts: SimpleNamespace(completions=["ab"] * len(prompts)),
        tokenizer=lambda text, add_special_tokens: SimpleNamespace(input_ids=[7] * (len(text) + 1)),
    )
    s = EvalSet(name="own", task=task, problems=problems, samples=2, max_tokens=8, every=0, source="x")
    logged = []
    score_and_log(engine, [s], 40, logged.append)
    scores = logged[0]["scores"]
    assert scores["reward_step_reward"] == 40.0  # trainer_state.global_step
    assert scores["reward_long_reward"] == 3.0  # token ids from the engine's tokenizer: 2 characters + 1
    assert scores["avg@2"] == 1.0 and scores["reward_mean"] == 43.0


def test_none_and_nan_are_skipped_and_a_row_no_reward_applies_to_gets_zero(data):
    task = task_of(data, ("picky", {"weight": 2.0}))
    scores = task.score_rollout(task.eval_problems(3), ["x", "y", "z"], [[1], [1], [1]])
    assert [s.reward for s in scores] == [2.0, 0.0, 0.0]  # kind a: 2*1; b: None; c: NaN
    assert [s.components for s in scores] == [{"picky": 1.0}, {}, {}]
    assert [s.rewarded for s in scores] == [True, False, False]
    # with a second reward that applies everywhere: the weighted sum skips the missing one
    task = task_of(data, ("picky", {"weight": 2.0}), ("format_reward", {"weight": 0.5}))
    scores = task.score_rollout(task.eval_problems(3), ["<answer>1</answer>", "<answer>1</answer>", "x"])
    assert [s.reward for s in scores] == [2.5, 0.5, 0.0]
    assert [s.rewarded for s in scores] == [True, True, True]


def step_metrics(scores) -> dict:
    rewards_B = torch.tensor([s.reward for s in scores])
    n = len(scores)
    batch = SimpleNamespace(response_mask=torch.ones(n, 2), truncated=torch.zeros(n, dtype=torch.bool))
    stats = StepStats()
    record_batch(stats, batch, scores, rewards_B, torch.zeros(n, 2), group_size=2, lr=0.1)
    return stats.reduce(SimpleNamespace(enabled=False, world_size=1, is_main=True))


def test_step_metrics_per_reward_over_the_rows_it_applies_to(data):
    task = task_of(data, ("picky", {"weight": 2.0}), ("format_reward", {"weight": 0.5}))
    problems = task.eval_problems(3) + task.eval_problems(1)
    scores = task.score_rollout(problems, ["<answer>1</answer>", "x", "x", "x"])
    m = step_metrics(scores)
    assert m["reward/mean"] == pytest.approx((2.5 + 0 + 0 + 2.0) / 4)
    assert m["reward/picky"] == 1.0  # rows 0 and 3 (kind a); the None and NaN rows left out
    assert m["reward/format_reward"] == pytest.approx(0.25)
    assert m["reward/no_reward_frac"] == 0.0
    # evaluation reports the same means and spreads (sample std: format [1, 0, 0, 0] -> sqrt(0.75 / 3) = 0.5;
    # the sum [2.5, 0, 0, 2] -> sqrt(5.1875 / 3))
    ev = reward_means(scores)
    assert ev == {
        "reward_mean": pytest.approx(4.5 / 4),
        "reward_std": pytest.approx((5.1875 / 3) ** 0.5),
        "reward_picky": 1.0,
        "reward_picky_std": 0.0,
        "reward_format_reward": 0.25,
        "reward_format_reward_std": pytest.approx(0.5),
    }
    assert m["reward/format_reward_std"] == pytest.approx(ev["reward_format_reward_std"])
    assert m["reward/std"] == pytest.approx(ev["reward_std"])
    task = task_of(data, ("picky", {"weight": 2.0}))
    m = step_metrics(task.score_rollout(problems, ["x"] * 4))
    assert m["reward/mean"] == 1.0 and m["reward/no_reward_frac"] == 0.5  # rows 1 and 2: nothing applied


def test_zero_dimensional_tensors_are_numbers(data):
    task = task_of(data, ("tensors", {"weight": 2.0}))
    assert [s.reward for s in task.score_rollout(task.eval_problems(2), ["a", "b"])] == [1.0, 1.0]


@pytest.mark.parametrize(
    "name, message",
    [
        ("boom", "reward boom raised on the row whose prompt starts 'Second: 3+3?': ValueError: cannot judge this one"),
        ("short", "reward short returned 1 values for the 3 completions it was called on"),
        ("words", "reward words returned 'yes' (str), not a finite number or None, for the row whose prompt starts"),
        ("infinite", "reward infinite returned inf (float), not a finite number or None, for the row whose prompt"),
    ],
)
def test_a_reward_that_fails_is_one_line_naming_it_and_the_row(data, name, message):
    task = task_of(data, (name, {}))
    with pytest.raises(RunError) as err:
        task.score_rollout(task.eval_problems(3), ["a", "b", "c"])
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "function, found",
    [
        ("missing.py:f", "task.rewards[0].function: no such file /"),
        ("no_such_module_xyz:f", "task.rewards[0].function: no module 'no_such_module_xyz'"),
        ("{dir}/rewards.py:nope", "task.rewards[0].function: nope is not defined in"),
        ("{dir}/rewards.py:re", "task.rewards[0].function: re is not callable"),
        (
            "math_acuracy",
            "task.rewards[0].function: 'math_acuracy' is no shipped reward (math_accuracy, code_tests, env)",
        ),
        ("code_tests", "task.rewards: code_tests judges code problems; task.name is prompts"),
    ],
)
def test_an_unloadable_function_is_refused_naming_what_was_found(data, function, found):
    cfg = RewardConfig(function=function.format(dir=data))
    with pytest.raises(SpecError, match=None) as err:
        with_rewards(make_task("prompts", {"source": str(data / "train.jsonl")}), [cfg])
    assert found in str(err.value)


def test_spec_refuses_bad_reward_lists_at_load():
    def problems(rewards):
        with pytest.raises(SpecError) as err:
            spec_from_dict({"name": "x", "task": {"name": "prompts", "rewards": rewards}, "arms": [{"name": "a"}]})
        return str(err.value)

    assert "task.rewards[1].name: duplicate name 'f' (also rewards[0])" in problems(
        [{"function": "a.py:f"}, {"function": "b:f"}]
    )
    assert "task.rewards[1].correct: only one reward decides correctness" in problems(
        [{"function": "a:x", "correct": True}, {"function": "a:y", "correct": True}]
    )
    for reserved in ("mean", "std", "format", "correct", "no_reward_frac"):
        assert f"task.rewards[0].name: {reserved!r} is a metric gspo logs already" in problems(
            [{"function": f"m:{reserved}"}]
        )
    assert "task.rewards[0].name: 'a/b' cannot name a metric" in problems([{"function": "m:x", "name": "a/b"}])
    assert "task.rewards[0].nme: unknown key (did you mean 'name'?)" in problems([{"function": "m:x", "nme": "z"}])
    with pytest.raises(
        SpecError, match="task.reward_calls: chunks sends rows to the reward_workers; reward_workers is 0"
    ):
        task = {"name": "prompts", "rewards": [{"function": "m:x"}], "reward_workers": 0, "reward_calls": "chunks"}
        spec_from_dict({"name": "x", "task": task, "arms": [{"name": "a"}]})


def test_a_reward_file_is_stored_absolute_and_its_change_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = RewardConfig(function="sub/rewards.py:f")
    assert cfg.function == f"{tmp_path}/sub/rewards.py:f" and cfg.label == "f"
    assert RewardConfig(function="pkg.mod:g").function == "pkg.mod:g"
    stored = {"behaviour_version": 1, "model": "m", "data": {"train": {"fingerprint": "x"}, "eval": {}}}
    current = {**stored, "data": {"train": {"fingerprint": "x", "source": "s"}, "eval": {}}, "rewards": {"/r.py": "b"}}
    assert reward_changes({**stored, "rewards": {"/r.py": "a"}}, current) == ["another reward file (/r.py changed)"]
    assert identity_changes({**stored, "rewards": {"/r.py": "b"}}, current) == []


def test_math_with_rewards_uses_the_list_and_without_them_is_unchanged(data):
    assert isinstance(make_task("math", {}), MathTask)
    task = with_rewards(
        make_task("math", {}), [RewardConfig(function="math_accuracy", correct=True)] + rewards(data, ("short", {}))
    )
    assert [r.name for r in task.rewards] == ["math_accuracy", "short"]
    task = with_rewards(make_task("math", {}), [RewardConfig(function="math_accuracy", correct=True)])
    p = task.eval_problems(1)[0]
    right, wrong = task.score_rollout([p, p], [f"\\boxed{{{p.answer}}}", "\\boxed{x}"])
    assert (right.reward, right.correct, right.components) == (1.0, True, {"math_accuracy": 1.0})
    assert (wrong.reward, wrong.correct) == (0.0, False)


def test_code_with_rewards_keeps_its_tests_through_code_tests(data):
    cfg = [RewardConfig(function="code_tests", correct=True)] + rewards(data, ("format_reward", {"weight": 0.5}))
    task = with_rewards(make_task("code", {}), cfg)
    probs = task.train_problems(random.Random(0), 2)
    scores = task.score_rollout(probs * 2, [p.solution for p in probs] + ["print(1)", "<answer>x</answer>"])
    assert [s.components["code_tests"] for s in scores[:2]] == [1.0, 1.0]
    assert [s.correct for s in scores] == [True, True, False, False]
    assert scores[3].reward == 0.5 and set(scores[0].components) == {"code_tests", "format_reward"}


def test_prompts_task_reads_columns_and_refuses_what_it_cannot_train_on(data):
    task = task_of(data, ("format_reward", {}))
    p = task.eval_problems(1)[0]
    assert (p.prompt, p.solution, p.meta["columns"]["kind"]) == ("First: 2+2?", "<answer>4</answer>", "a")
    with pytest.raises(SpecError, match="task.rewards: the prompts task is scored by reward functions only"):
        spec_from_dict({"name": "x", "task": {"name": "prompts", "params": {"source": "x"}}, "arms": [{"name": "a"}]})
    (data / "chat.jsonl").write_text(json.dumps({"prompt": [{"role": "user", "content": 3}]}) + "\n")
    with pytest.raises(SpecError, match="row 0: prompt\\[0\\] is not a message with a string role and content"):
        with_rewards(make_task("prompts", {"source": str(data / "chat.jsonl")}), rewards(data, ("short", {})))
    (data / "none.jsonl").write_text(json.dumps({"question": "hi"}) + "\n")
    with pytest.raises(SpecError, match="no row with a `prompt` string .*columns found: question"):
        with_rewards(make_task("prompts", {"source": str(data / "none.jsonl")}), rewards(data, ("short", {})))


CHAT = [
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}], "answer": "4"},
    {"prompt": [{"role": "user", "content": "3+3?"}], "answer": "6"},
]
CHAT_REWARDS = '''
def chat_reward(prompts, completions, answer, **kwargs):
    # TRL's conversational form: prompts and completions are lists of messages
    return [float(c[0]["role"] == "assistant" and a in c[0]["content"]) + 0.5 * (p[-1]["role"] == "user")
            for p, c, a in zip(prompts, completions, answer)]
'''
# A chat template for the built-in character tokenizer: system turn in brackets, then turns.
TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}[{{ m['content'] }}]"
    "{% else %}{{ m['content'] }}\n{% endif %}{% endfor %}{% if add_generation_prompt %}A: {% endif %}"
)


@pytest.fixture
def chat(tmp_path):
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in CHAT))
    (tmp_path / "chat_rewards.py").write_text(CHAT_REWARDS)
    return tmp_path


def test_conversational_prompts_reach_rewards_and_the_template_as_messages(chat):
    cfg = [RewardConfig(function=f"{chat}/chat_rewards.py:chat_reward", correct=True)]
    task = with_rewards(make_task("prompts", {"source": str(chat / "chat.jsonl")}), cfg)
    problems = task.eval_problems(2)
    assert isinstance(problems[0].prompt, Conversation) and problems[0].prompt == "Be brief.\n2+2?"
    assert pickle.loads(pickle.dumps(problems[0].prompt)).messages == problems[0].prompt.messages
    scores = task.score_rollout(problems, ["it is 4", "it is 5"])
    assert [s.reward for s in scores] == [1.5, 0.5]
    # the formatter: a row's own system message kept; rollout.system_prompt for rows without one
    seen = []
    tok = SimpleNamespace(chat_template="x", apply_chat_template=lambda m, **kw: seen.append(m) or "text")
    PromptFormat(system_prompt="Think.").formatter(tok)([p.prompt for p in problems] + ["plain"])
    assert seen == [
        list(problems[0].prompt.messages),
        [{"role": "system", "content": "Think."}, {"role": "user", "content": "3+3?"}],
        [{"role": "system", "content": "Think."}, {"role": "user", "content": "plain"}],
    ]
    raw = SimpleNamespace(chat_template=None)
    with pytest.raises(SpecError, match="conversational prompts .* need a chat template"):
        PromptFormat().formatter(raw)([problems[0].prompt])


def test_conversational_prompts_refuse_the_builtin_model(chat):
    spec = {
        "name": "own",
        "model": {"name": "builtin:tiny-dense"},
        "task": {
            "name": "prompts",
            "params": {"source": str(chat / "chat.jsonl")},
            "eval_size": 1,
            "rewards": [{"function": f"{chat}/chat_rewards.py:chat_reward"}],
        },
        "arms": [{"name": "gspo", "preset": "paper-gspo"}],
    }
    (chat / "own.yaml").write_text(yaml.safe_dump(spec))
    res = CliRunner().invoke(app, ["train", str(chat / "own.yaml"), "-o", str(chat / "out")])
    assert res.exit_code == 2, res.output
    assert "model.name: builtin:tiny-dense has no chat template, and task.params.source holds conversational" in (
        " ".join(res.output.split())
    )


@pytest.mark.slow
def test_conversational_prompts_train_a_model_with_a_chat_template(chat):
    model = edited_model_copy(tiny_model_dir(), chat / "chat_model", tokenizer_config={"chat_template": TEMPLATE})
    spec = {
        **TINY,
        "model": {"name": str(model)},
        "task": {
            "name": "prompts",
            "params": {"source": str(chat / "chat.jsonl")},
            "eval_size": 1,
            "rewards": [{"function": f"{chat}/chat_rewards.py:chat_reward", "correct": True}],
        },
        "train": {"steps": 1},
        "arms": [{"name": "gspo", "preset": "paper-gspo"}],
    }
    (chat / "own.yaml").write_text(yaml.safe_dump(spec))
    res = CliRunner().invoke(app, ["train", str(chat / "own.yaml"), "-o", str(chat / "out")])
    assert res.exit_code == 0, res.output
    rd = RunDir(chat / "out/e2e/gspo/seed0")
    assert rd.status() == "completed" and "reward/chat_reward" in rd.metrics()[0]
    assert rd.metrics()[0]["reward/chat_reward"] >= 0.5  # the user-turn half, on every row
    assert {"reward_chat_reward", "avg@1"} <= set(rd.evals()[0]["scores"])
    assert {r["prompt"] for r in rd.samples()} == {"3+3?\nA: "}  # through the template (row 0 is held out)


def test_gspo_train_refuses_a_missing_reward_before_any_model_is_built(data):
    spec = {
        "name": "own",
        "model": {"name": "builtin:tiny-dense"},
        "task": {
            "name": "prompts",
            "params": {"source": str(data / "train.jsonl")},
            "eval_size": 1,
            "rewards": [{"function": f"{data}/rewards.py:absent"}],
        },
        "arms": [{"name": "gspo", "preset": "paper-gspo"}],
    }
    (data / "own.yaml").write_text(yaml.safe_dump(spec))
    res = CliRunner().invoke(app, ["train", str(data / "own.yaml"), "-o", str(data / "out")])
    assert res.exit_code == 2, res.output
    assert "task.rewards[0].function: absent is not defined in" in res.output
    assert "cold start" not in res.output and "Traceback" not in res.output
    assert not (data / "out").exists()


def test_a_builtin_model_needs_a_solution_column(data):
    (data / "bare.jsonl").write_text(
        "".join(json.dumps({"prompt": r["prompt"], "answer": r["answer"]}) + "\n" for r in ROWS)
    )
    spec = {
        "name": "own",
        "model": {"name": "builtin:tiny-dense"},
        "task": {
            "name": "prompts",
            "params": {"source": str(data / "bare.jsonl")},
            "eval_size": 1,
            "rewards": [{"function": f"{data}/rewards.py:format_reward"}],
        },
        "arms": [{"name": "gspo", "preset": "paper-gspo"}],
    }
    (data / "own.yaml").write_text(yaml.safe_dump(spec))
    res = CliRunner().invoke(app, ["train", str(data / "own.yaml"), "-o", str(data / "out")])
    assert res.exit_code == 2, res.output
    assert "model.name: builtin:tiny-dense is cold-started on reference completions and the training data of task" in (
        " ".join(res.output.split())
    )
    assert "add a `solution` (or `completion`) column" in " ".join(res.output.split())
    assert "cold start:" not in res.output and "Traceback" not in res.output


@pytest.mark.slow
def test_the_example_trains_and_logs_every_reward(tmp_path, monkeypatch):
    """experiments/own_rewards.yaml, tiny: reward/mean is the weighted sum of reward/<name>;
    then a reward that raises ends its run in one line, its checkpoint kept."""
    monkeypatch.chdir(ROOT)  # the example's paths are relative to the repository root
    tiny = [
        "--set", "train.steps=2", "--set", "model.cold_start.steps=10", "--set", "rollout.max_new_tokens=8",
        "--set", "rollout.prompts_per_step=2", "--set", "rollout.group_size=2", "--set", "task.eval_size=2",
        "--set", "train.eval_samples=1", "--set", "train.eval_every=0",
    ]  # fmt: skip
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["train", "experiments/own_rewards.yaml", "-o", str(out), "--arm", "gspo", *tiny])
    assert res.exit_code == 0, res.output
    rd = RunDir(out / "own_rewards/gspo/seed0")
    spec = load_spec(rd.spec_file)
    weights = {r.label: r.weight for r in spec.task.rewards}
    for m in rd.metrics():
        named = {k: m[f"reward/{k}"] for k in weights if f"reward/{k}" in m}
        assert {"format_reward", "accuracy_reward"} <= set(named)  # length: None before step 10
        assert m["reward/no_reward_frac"] == 0.0
        assert m["reward/mean"] == pytest.approx(sum(weights[k] * v for k, v in named.items()))
    evals = rd.evals()
    assert {"reward_mean", "reward_format_reward", "avg@1"} <= set(evals[-1]["scores"])
    assert json.loads(rd.info_file.read_text())["identity"]["rewards"]
    res = CliRunner().invoke(app, ["eval", str(rd.path), "-k", "1"])  # gspo eval RUN: the run's rewards
    assert res.exit_code == 0 and "reward_format_reward" in res.output, res.output
    # a reward that raises at step 2: one line, no traceback, step 1's checkpoint kept; fixed, the run resumes
    bad = tmp_path / "judge.py"
    bad.write_text(
        "def judge(completions, trainer_state, **kwargs):\n"
        "    if trainer_state.global_step == 2:\n        raise KeyError('answer')\n"
        "    return [0.0 for _ in completions]\n"
    )
    rewards = f'task.rewards=[{{"function": "{bad}:judge"}}]'
    args = ["train", "experiments/own_rewards.yaml", "-o", str(tmp_path / "bad"), "--arm", "gspo", *tiny]
    res = CliRunner().invoke(app, [*args, "--set", rewards, "--set", "train.checkpoint_every=1"])
    assert res.exit_code == 1, res.output
    assert "reward judge raised on the row whose prompt starts 'What is" in res.output
    assert "KeyError: 'answer'" in res.output and "Traceback" not in res.output
    run = RunDir(tmp_path / "bad/own_rewards/gspo/seed0")
    assert run.status() == "failed" and (run.checkpoints / "step_000001").is_dir()
    bad.write_text("def judge(completions, **kwargs):\n    return [1.0 for _ in completions]\n")
    res = CliRunner().invoke(app, ["train", "--resume", str(run.path)])
    assert res.exit_code == 0, res.output
    assert f"resuming with another reward file ({bad} changed)" in " ".join(res.output.split())
    assert run.status() == "completed" and [m["step"] for m in run.metrics()] == [1, 2]


def test_the_example_data_is_what_its_script_writes(tmp_path):
    """make_data.py, run as the docs show (on a copy), writes the committed train.jsonl."""
    shutil.copy(ROOT / "experiments/own_rewards/make_data.py", tmp_path / "make_data.py")
    subprocess.run([sys.executable, str(tmp_path / "make_data.py")], check=True, capture_output=True)
    committed = (ROOT / "experiments/own_rewards/train.jsonl").read_text()
    assert (tmp_path / "train.jsonl").read_text() == committed
    rows = [json.loads(line) for line in committed.splitlines()]
    assert len(rows) == 300 and set(rows[0]) == {"prompt", "answer", "solution"}
    assert rows[0]["solution"].endswith(f"\\boxed{{{rows[0]['answer']}}}")
