"""Evaluating on a `prompts` task: `gspo eval` of the built-in model (cold-started on
the rows it is not scored on), --reward, completion_ids from a real tokenizer (or refused in one
line), and evaluation sets that list their own rewards, with each reward's spread."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from helpers import TINY
from typer.testing import CliRunner

from gspo_cli.cli.app import app
from gspo_cli.errors import RunError, SpecError
from gspo_cli.eval.run import Sampling, Target, evaluate_completions, evaluate_model, resolve_task
from gspo_cli.eval.sets import plan_data, score_and_log
from gspo_cli.rewards import with_rewards
from gspo_cli.runs import reward_changes
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.tasks import make_task
from gspo_cli.train.resume import spec_identity

FIXTURES = Path(__file__).parent / "fixtures"

REWARDS = """
def format_reward(completions, **kwargs):
    return [1.0 if "<answer>" in c and "</answer>" in c else 0.0 for c in completions]

def accuracy_reward(completions, answer, **kwargs):
    return [1.0 if f"<answer>{a}</answer>" in c else 0.0 for c, a in zip(completions, answer)]

def first_id(completion_ids, **kwargs):
    return [float(ids[0]) if len(ids) else -1.0 for ids in completion_ids]
"""
SET_REWARDS = """
def long_reward(completion_ids, **kwargs):
    return [float(len(ids)) for ids in completion_ids]
"""
ROWS = [
    {"id": "a", "prompt": "First: 2+2?", "answer": "4", "solution": "<answer>4</answer>"},
    {"id": "b", "prompt": "Second: 3+3?", "answer": "6", "solution": "<answer>6</answer>"},
    {"id": "c", "prompt": "Third: 1+1?", "answer": "2", "solution": "<answer>2</answer>"},
    {"id": "d", "prompt": "Fourth: 2+1?", "answer": "3", "solution": "<answer>3</answer>"},
]


@pytest.fixture
def data(tmp_path):
    (tmp_path / "r.py").write_text(REWARDS)
    (tmp_path / "set_r.py").write_text(SET_REWARDS)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    bare = [{k: v for k, v in r.items() if k != "solution"} for r in ROWS]
    (tmp_path / "bare.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bare))
    return tmp_path


def gspo(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line(res, code=2) -> str:
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output
    return " ".join(res.output.split())


def spec_of(data, **task):
    raw = {
        **TINY,
        "model": {**TINY["model"], "cold_start": {"steps": 4, "batch_size": 4, "lr": 1e-2}},
        "task": {
            "name": "prompts",
            "params": {"source": str(data / "train.jsonl")},
            "eval_size": 1,
            "rewards": [
                {"function": f"{data}/r.py:format_reward", "weight": 0.5},
                {"function": f"{data}/r.py:accuracy_reward", "correct": True},
            ],
            **task,
        },
    }
    return spec_from_dict(raw)


# --- gspo eval of the built-in model on a prompts task --------------------------------


def test_eval_of_a_builtin_model_on_prompts_is_refused_in_one_line_where_it_cannot_work(data):
    base = ("eval", "builtin:tiny-dense", "--task", "prompts", "--dataset")
    reward = ("--reward", f"{data}/r.py:format_reward")
    out = one_line(gspo(*base, data / "train.jsonl"))
    assert "--reward: the prompts task is scored by reward functions only" in out
    out = one_line(gspo(*base, data / "bare.jsonl", *reward))
    assert "no row has a `solution` (or `completion`) column to learn from" in out and "cold start step" not in out
    out = one_line(gspo(*base, data / "train.jsonl", *reward))  # every row evaluated: none left to learn from
    assert "all 4 rows with a `solution` (or `completion`) are evaluated: evaluate fewer (--limit N)" in out
    out = one_line(gspo(*base, data / "train.jsonl", "--reward", f"{data}/r.py:absent"))
    assert "--reward[0].function: absent is not defined in" in out and "first_id" in out
    out = one_line(gspo(*base, data / "train.jsonl", *reward, *reward))
    assert "--reward[1].name: duplicate name 'format_reward'" in out
    out = one_line(gspo(*base, data / "train.jsonl", "--reward", "{function: r.py:x, wieght: 2}"))
    assert "--reward[0].wieght" in out
    out = one_line(gspo(*base, data / "train.jsonl", *reward, "--tokenizer", data))
    assert "--tokenizer: only with --completions" in out


def test_a_builtin_model_is_evaluated_on_prompts_after_a_cold_start_on_the_other_rows(data):
    spec = spec_of(data, rewards=[{"function": f"{data}/r.py:first_id"}, {"function": f"{data}/r.py:format_reward"}])
    task = resolve_task(spec, None, None)
    logged = []
    results, summary = evaluate_model(
        Target("builtin:tiny-dense", spec=spec), task, Sampling(samples=2, max_tokens=4), 1, log=logged.append
    )
    # scored on row a only; cold-started on b, c, d (the rows with a solution it is not scored on)
    assert [r.problem.id for r in results] == ["a"]
    assert summary["cold_start"]["train_problems"] == 3 and summary["cold_start"]["excluded_problems"] == 1
    assert any("cold start: prompts, the 3 rows of the dataset" in line for line in logged)
    # completion_ids are the model's own token ids (the built-in character tokenizer), not character codes
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(summary["model"])
    completions = results[0].completions
    want = [float(tok(c, add_special_tokens=False).input_ids[0]) if c else -1.0 for c in completions]
    assert [s.components["first_id"] for s in results[0].scores] == want
    assert any(c and ord(c[0]) != w for c, w in zip(completions, want))  # the ids differ from code points
    assert set(summary["scores"]) == {
        "reward_mean",
        "reward_std",
        "reward_first_id",
        "reward_first_id_std",
        "reward_format_reward",
        "reward_format_reward_std",
    }  # no reward marked correct: no pass@k


# --- completions made elsewhere: completion_ids ----------------------------------------


def test_completion_ids_come_from_a_tokenizer_or_are_refused_in_one_line(data):
    from gspo_cli.models.builtin import build_tokenizer

    tok_dir = data / "tok"
    build_tokenizer("").save_pretrained(tok_dir)
    comp = data / "c.jsonl"
    comp.write_text(json.dumps({"id": "a", "completions": ["0x", "<answer>4</answer>"]}) + "\n")
    base = ("eval", "-c", comp, "-t", "prompts", "-d", data / "train.jsonl", "-o", data / "out", "--reward")
    out = one_line(gspo(*base, f"{data}/r.py:first_id"), code=1)
    assert (
        "reward first_id raised on the row whose prompt starts 'First: 2+2?': UnknownTokenIds: completion_ids: "
        "no tokenizer is known" in out
    )
    assert "--tokenizer MODEL" in out
    # a reward that does not read them needs no tokenizer
    assert gspo(*base, f"{data}/r.py:format_reward").exit_code == 0
    assert json.loads((data / "out/eval_summary.json").read_text())["scores"]["reward_format_reward"] == 0.5
    # --tokenizer: its ids ('0' is id 22 of the character vocabulary: 4 specials, \t, \n, then ' ' to '0')
    res = gspo(*base, f"{data}/r.py:first_id", "--tokenizer", tok_dir)
    assert res.exit_code == 0, res.output
    summary = json.loads((data / "out/eval_summary.json").read_text())
    ids = build_tokenizer("")("0<", add_special_tokens=False).input_ids
    assert ids[0] == 22 and summary["scores"]["reward_first_id"] == (22 + ids[1]) / 2
    assert summary["tokenizer"] == str(tok_dir)
    assert "cannot load a tokenizer" in one_line(gspo(*base, f"{data}/r.py:first_id", "--tokenizer", data / "r.py"))
    # a run as TARGET: its latest checkpoint's tokenizer, and its rewards
    run = data / "run"
    build_tokenizer("").save_pretrained(run / "checkpoints" / "step_000002")
    spec = spec_of(data, rewards=[{"function": f"{data}/r.py:first_id"}])
    (run / "spec.yaml").write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    res = gspo("eval", run, "-c", comp, "-o", data / "out2")
    assert res.exit_code == 0, res.output
    assert json.loads((data / "out2/eval_summary.json").read_text())["scores"]["reward_first_id"] == (22 + ids[1]) / 2


@pytest.mark.filterwarnings("ignore:--completions")
def test_no_token_ids_are_refused_through_the_python_api_too(data):
    source = {"source": str(data / "train.jsonl")}
    task = with_rewards(make_task("prompts", source), spec_of(data).task.rewards[:1])
    comp = data / "c.jsonl"
    comp.write_text(json.dumps({"id": "b", "completion": "<answer>6</answer>"}) + "\n")
    results, summary = evaluate_completions(comp, task, None)  # format_reward never reads completion_ids
    assert summary["scores"]["reward_format_reward"] == 1.0 and "tokenizer" not in summary
    ids_task = with_rewards(
        make_task("prompts", source), spec_of(data, rewards=[{"function": f"{data}/r.py:first_id"}]).task.rewards
    )
    with pytest.raises(RunError, match="UnknownTokenIds: completion_ids: no tokenizer is known"):
        evaluate_completions(comp, ids_task, None)


# --- evaluation sets: their own rewards, and each reward's spread ------------------------

# One completion per sample, alternating: sample 0 answers (and boxes 54), sample 1 does not.
RESPONSES = ["<answer>4</answer> \\boxed{54}", "x"]


def fake_engine():
    return SimpleNamespace(
        generate=lambda prompts: SimpleNamespace(completions=[RESPONSES[i % 2] for i in range(len(prompts))]),
        tokenizer=lambda text, add_special_tokens: SimpleNamespace(input_ids=[7] * (len(text) + 1)),
    )


def sets_spec(data):
    h4 = str(FIXTURES / "aime_h4.jsonl")
    return spec_of(
        data,
        eval_sets=[
            {
                "name": "own",
                "task": "prompts",
                "params": {"source": str(data / "train.jsonl")},
                "size": 2,
                "samples": 2,
            },
            {
                "name": "lengths",
                "task": "prompts",
                "params": {"source": str(data / "train.jsonl")},
                "size": 2,
                "samples": 2,
                "rewards": [{"function": f"{data}/set_r.py:long_reward", "name": "length"}],
            },
            {
                "name": "aime",
                "task": "math",
                "params": {"source": h4},
                "size": 1,
                "samples": 2,
                "rewards": [
                    {"function": "math_accuracy", "correct": True},
                    {"function": f"{data}/r.py:format_reward", "weight": 0.1},
                ],
            },
            {"name": "aime_own", "task": "math", "params": {"source": h4}, "size": 1, "samples": 2, "rewards": []},
        ],
    )


@pytest.mark.filterwarnings("ignore:task.eval_sets")
@pytest.mark.filterwarnings("ignore:--completions")
def test_eval_sets_are_scored_by_their_own_rewards_else_the_training_ones(data):
    spec = sets_spec(data)
    task = with_rewards(make_task(spec.task.name, spec.task.params), spec.task.rewards)
    sets, info = plan_data(spec, task)
    assert info["eval_sets"]["lengths"]["rewards"] == ["length"] and "rewards" not in info["eval_sets"]["aime_own"]
    assert [[r.name for r in getattr(s.task, "rewards", [])] for s in sets] == [
        ["format_reward", "accuracy_reward"],  # a prompts set without rewards: the training ones
        ["length"],  # its own
        ["math_accuracy", "format_reward"],  # a math set with rewards: the list is the reward
        [],  # rewards: []: the math task's own verifier
    ]
    got = {}
    sinks = [SimpleNamespace(log=lambda m, step: got.update(m))]
    score_and_log(fake_engine(), sets, 3, lambda record: None, sinks)
    # own: rows answer 4 and 6, samples [answers 4, x]: format [1, 0, 1, 0], accuracy [1, 0, 0, 0],
    # sum 0.5 * format + accuracy = [1.5, 0, 0.5, 0]
    assert got["eval/own/reward_format_reward"] == 0.5
    assert got["eval/own/reward_format_reward_std"] == pytest.approx((1 / 3) ** 0.5)
    assert got["eval/own/reward_accuracy_reward"] == 0.25 and got["eval/own/reward_accuracy_reward_std"] == 0.5
    assert got["eval/own/reward_mean"] == 0.5 and got["eval/own/reward_std"] == pytest.approx(0.5**0.5)
    assert got["eval/own/avg@2"] == 0.25 and got["eval/own/pass@2"] == 0.5
    # lengths: the engine's token ids, len(text) + 1 = [30, 2, 30, 2]; no reward marked correct: no pass@k
    assert got["eval/lengths/reward_length"] == 16.0
    assert got["eval/lengths/reward_length_std"] == pytest.approx((4 * 14**2 / 3) ** 0.5)
    assert "eval/lengths/avg@2" not in got and "eval/lengths/reward_format_reward" not in got
    # aime (054): sample 0 boxes 54 (correct) with the format, sample 1 neither: sum [1 + 0.1, 0]
    assert got["eval/aime/avg@2"] == 0.5 and got["eval/aime/reward_math_accuracy"] == 0.5
    assert got["eval/aime/reward_mean"] == pytest.approx(0.55)
    assert got["eval/aime/reward_format_reward_std"] == pytest.approx(0.5**0.5)
    assert got["eval/aime_own/avg@2"] == 0.5 and "eval/aime_own/reward_mean" not in got
    # run.json's identity fingerprints the sets' reward files beside training's: a changed one is named
    before = spec_identity(spec)
    assert set(before["rewards"]) == {str(data / "r.py"), str(data / "set_r.py")}
    (data / "set_r.py").write_text(SET_REWARDS + "\n# fixed\n")
    assert reward_changes(before, spec_identity(spec)) == [f"another reward file ({data / 'set_r.py'} changed)"]


@pytest.mark.filterwarnings("ignore:task.eval_sets")
def test_an_eval_sets_bad_reward_is_refused_before_any_model(data):
    spec = sets_spec(data).model_dump(mode="json")
    spec["task"]["eval_sets"][1]["rewards"] = [{"function": f"{data}/set_r.py:absent"}]
    (data / "bad.yaml").write_text(yaml.safe_dump(spec))
    out = one_line(gspo("train", data / "bad.yaml", "-o", data / "out"))
    assert "task.eval_sets[1].rewards[0].function: absent is not defined in" in out and "long_reward" in out
    assert "cold start" not in out and not (data / "out").exists()
    spec["task"]["eval_sets"][1]["rewards"] = []  # a prompts set with no reward at all
    with pytest.raises(SpecError, match=r"task.eval_sets\[1\].rewards: a prompts set is scored by reward functions"):
        plan_data(spec_from_dict(spec), with_rewards(make_task("prompts", {"source": str(data / "train.jsonl")}), []))
