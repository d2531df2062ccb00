"""Named rewards (task.rewards) shown by every view: the spread the trainer logs beside each
reward's mean, and `gspo compare`, `gspo plot`, `gspo samples` and `gspo report` on hand-written
run directories whose values are known (no training)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from synthetic_runs import write_run
from typer.testing import CliRunner

from gspo_cli.analysis.figures.plot import build_plot, make_figures
from gspo_cli.analysis.report.build import write_report
from gspo_cli.analysis.report.rewards import reward_lines
from gspo_cli.analysis.rundata.runs import group_runs, load_runs
from gspo_cli.analysis.tables.compare import compare_runs, render
from gspo_cli.cli.app import app
from gspo_cli.metrics import describe, reward_std_key
from gspo_cli.spec.task import TaskConfig
from gspo_cli.tasks import Score
from gspo_cli.train.stats import StepStats, record_batch

runner = CliRunner()
STEPS = range(1, 7)
SEEDS = (0, 1)
NAMES = ("format_reward", "accuracy_reward", "length")


def fmt(arm: str, seed: int, t: int) -> float:
    return 0.5 + 0.1 * seed + (0.05 * t if arm == "gspo" else 0.0)


def acc(arm: str, seed: int, t: int) -> float:
    return 0.1 * t * (1.0 if arm == "gspo" else 0.5) + 0.01 * seed


def length(seed: int, t: int) -> float:
    return 20.0 + t + seed


def rewards_spec(correct: bool = True) -> dict:
    return {
        "name": "prompts",
        "params": {"source": "data/train.jsonl"},
        "rewards": [
            {"function": "/abs/rewards.py:format_reward", "weight": 0.2},
            {"function": "/abs/rewards.py:accuracy_reward", "weight": 1.0, "correct": correct},
            {"function": "mypkg.rewards:length_penalty", "weight": -0.01, "name": "length"},
        ],
    }


def make_reward_experiment(root, correct: bool = True):
    """root/exp/{grpo,gspo}/seed{0,1}, 6 steps each, three named rewards with known values;
    evaluation set `held` at steps 0 and 6. Returns root/exp."""
    for arm in ("grpo", "gspo"):
        for k in SEEDS:
            recs = []
            for t in STEPS:
                f, a, n = fmt(arm, k, t), acc(arm, k, t), length(k, t)
                recs.append(
                    {
                        "step": t,
                        "reward/mean": 0.2 * f + a - 0.01 * n,
                        "reward/std": 0.3,
                        "reward/format_reward": f,
                        "reward/format_reward_std": 0.1,
                        "reward/accuracy_reward": a,
                        "reward/accuracy_reward_std": 0.4,
                        "reward/length": n,
                        "reward/length_std": 2.0,
                        "time/step_s": 1.0,
                        "time/elapsed_s": float(t),
                    }
                )
            evals = [
                {
                    "step": s,
                    "set": "held",
                    "task": "prompts",
                    "n": 4,
                    "samples": 2,
                    "scores": {
                        "avg@2": acc(arm, k, max(s, 1)),
                        "reward_mean": 0.5,
                        "reward_format_reward": fmt(arm, k, s),
                        "reward_accuracy_reward": acc(arm, k, max(s, 1)),
                        "reward_length": length(k, s),
                    },
                }
                for s in (0, 6)
            ]
            samples = [
                {
                    "step": 6,
                    "arm": arm,
                    "seed": k,
                    "group": 0,
                    "index": 0,
                    "prompt": "What is 1+1?",
                    "completion": "<answer>2</answer>",
                    "reward": 1.0,
                    "correct": True,
                    "advantage": 0.5,
                    "length": 23,
                    "components": {"format_reward": 1.0, "accuracy_reward": 1.0, "length": 23.0},
                }
            ]
            task = rewards_spec(correct)
            write_run(root, arm, k, recs, evals=evals, task=task, samples=samples, clip_high=4e-4)
    return root / "exp"


@pytest.fixture
def exp(tmp_path):
    return make_reward_experiment(tmp_path)


# --------------------------------------------------------------------------- the metric


def test_step_logs_each_rewards_spread_beside_its_mean():
    comps = [{"a": 1.0, "b": 0.0}, {"a": 0.0}, {"a": 1.0, "b": 1.0}, {"a": 1.0}]
    scores = [Score(reward=sum(c.values()), correct=False, components=c, rewarded=True) for c in comps]
    n = len(scores)
    batch = SimpleNamespace(response_mask=torch.ones(n, 2), truncated=torch.zeros(n, dtype=torch.bool))
    stats = StepStats()
    record_batch(stats, batch, scores, torch.tensor([s.reward for s in scores]), torch.zeros(n, 2), 2, 0.1)
    m = stats.reduce(SimpleNamespace(enabled=False, world_size=1, is_main=True))
    assert m["reward/a"] == 0.75 and m["reward/b"] == 0.5
    # sample std (n - 1, as reward/std) over the rows each reward applies to: [1, 0, 1, 1] and [0, 1]
    assert m[reward_std_key("a")] == pytest.approx(0.5)
    assert m["reward/b_std"] == pytest.approx(math.sqrt(0.5))
    assert describe("reward/b_std") == ("standard deviation of reward b over the rows it applies to", "reward")
    assert describe("reward/b")[0].startswith("mean of reward b over the rows it applies to")


def test_a_reward_named_as_anothers_spread_is_refused():
    rewards = [{"function": "math_accuracy", "name": "acc"}, {"function": "math_accuracy", "name": "acc_std"}]
    with pytest.raises(ValueError, match=r"'acc_std' would be logged as reward/acc_std, the spread of reward 'acc'"):
        TaskConfig.model_validate({"name": "math", "rewards": rewards})
    TaskConfig.model_validate({"name": "math", "rewards": [rewards[1]]})  # alone it is a name like any


# --------------------------------------------------------------------------- compare


def test_compare_has_a_column_per_named_reward_with_its_mean(exp):
    comp = compare_runs([str(exp)], metrics=["reward", "rewards"], last=3)
    ids = [c.id for c in comp.columns]
    assert ids == [
        "reward",
        "reward:format_reward",
        "reward:accuracy_reward",
        "reward:length",
        "eval_reward:held:format_reward",
        "eval_reward:held:accuracy_reward",
        "eval_reward:held:length",
    ]
    gspo = next(r for r in comp.rows if r.group == "gspo")
    # last 3 steps (4, 5, 6): seed 0 format 0.70, 0.75, 0.80 -> 0.75; seed 1 -> 0.85; mean 0.80
    assert gspo.cells["reward:format_reward"].mean == pytest.approx(0.80)
    assert gspo.cells["reward:format_reward"].n == 2
    # accuracy 0.1 t + 0.01 seed: seeds 0.5 and 0.51
    assert gspo.cells["reward:accuracy_reward"].mean == pytest.approx(0.505)
    assert gspo.cells["reward:length"].mean == pytest.approx(25.5)  # 25 and 26
    # the final evaluation (step 6): format 0.8 and 0.9
    assert gspo.cells["eval_reward:held:format_reward"].mean == pytest.approx(0.85)
    grpo = next(r for r in comp.rows if r.group == "grpo")
    assert grpo.cells["reward:accuracy_reward"].mean == pytest.approx(0.255)  # 0.05 t over 4..6, + 0.005
    text = render(comp, "markdown")
    assert "format_reward (last 3)" in text and "held accuracy_reward final" in text
    assert any("Named rewards (task.rewards: format_reward, accuracy_reward, length)" in n for n in comp.notes)


def test_compare_default_shows_named_rewards_only_when_runs_have_them(exp, tmp_path):
    comp = compare_runs([str(exp)], last=3)
    assert {"reward:format_reward", "eval_reward:held:length"} <= {c.id for c in comp.columns}
    res = runner.invoke(app, ["compare", str(exp), "--format", "csv"])
    assert res.exit_code == 0, res.output
    assert "reward:length_mean" in res.output.splitlines()[0]
    other = tmp_path / "plain"
    write_run(other, "grpo", 0, [{"step": t, "reward/mean": 0.1} for t in STEPS])
    comp = compare_runs([str(other / "exp")])
    assert not [c.id for c in comp.columns if "reward:" in c.id]
    assert not any("Named rewards" in n for n in comp.notes)


# --------------------------------------------------------------------------- plot


def _ydata(fig, label):
    line = next(ln for ln in fig.axes[0].get_lines() if ln.get_label() == label)
    return list(line.get_ydata())


def test_plot_draws_a_figure_per_named_reward(exp, tmp_path):
    groups = group_runs(load_runs([str(exp)]))
    plot = build_plot(groups, smooth=0.0)
    names = [p.name for p in plot.panels]
    assert {"reward_format_reward", "reward_accuracy_reward", "reward_length"} <= set(names)
    assert "rewards" not in plot.skipped
    figs = make_figures(plot)
    # one line per arm: the mean over seeds at each step
    assert _ydata(figs["reward_length"], "gspo (n=2)") == pytest.approx([20.5 + t for t in STEPS])
    assert _ydata(figs["reward_format_reward"], "grpo (n=2)") == pytest.approx([0.55] * 6)
    assert figs["reward_length"].axes[0].get_title() == "Train reward: length"
    only = build_plot(groups, metrics=["rewards"])
    assert [p.name for p in only.panels] == ["reward_format_reward", "reward_accuracy_reward", "reward_length"]
    other = tmp_path / "plain"
    write_run(other, "grpo", 0, [{"step": t, "reward/mean": 0.1} for t in STEPS])
    plain = build_plot(group_runs(load_runs([str(other / "exp")])))
    assert "rewards" in plain.skipped and not [p for p in plain.panels if p.name.startswith("reward_")]


# --------------------------------------------------------------------------- samples


def test_samples_show_each_rows_reward_values(exp):
    run = exp / "gspo" / "seed0"
    res = runner.invoke(app, ["samples", str(run), "--plain"])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[1:3] == [
        "reward 1 (correct), advantage +0.500, 23 tokens, not clipped",
        "rewards: format_reward 1, accuracy_reward 1, length 23",
    ]
    res = runner.invoke(app, ["samples", str(run)])
    assert res.exit_code == 0 and "rewards: format_reward 1, accuracy_reward 1, length 23" in res.output


# --------------------------------------------------------------------------- report


def test_report_says_which_reward_its_findings_use(exp):
    text = write_report(exp).read_text()
    assert "`reward/mean` = 0.2 x format_reward + 1 x accuracy_reward - 0.01 x length" in text
    assert "Held-out correctness (avg@K, pass@k): reward `accuracy_reward` (`correct: true`" in text
    assert "figures/reward_length.png" in text


def test_report_without_a_correct_reward_says_no_pass_at_k(tmp_path):
    runs = load_runs([str(make_reward_experiment(tmp_path, correct=False))])
    lines = reward_lines(runs)
    assert lines[0].endswith("0.2 x format_reward + 1 x accuracy_reward - 0.01 x length")
    assert "No reward is marked `correct: true`" in lines[1] and "no pass@k" in lines[1]
    for r in runs:
        r.spec.pop("task")
    assert reward_lines(runs) == []
