"""samples.jsonl and `gspo samples`: unit tests on hand-written files, one short real run."""

from __future__ import annotations

import json
import random

import pytest
import torch
from helpers import TINY, edited_model_copy
from typer.testing import CliRunner

from gspo_cli.analysis.rundata.samples import load_samples, select_samples, verdict
from gspo_cli.cli.app import app
from gspo_cli.errors import SpecError
from gspo_cli.runs import RunDir
from gspo_cli.tasks import Score
from gspo_cli.train.samples import MAX_CHARS, chosen_rows, sample_records, samples_due

runner = CliRunner()


# --------------------------------------------------------------------------- writing


def test_samples_due_at_step_one_and_every_n():
    assert [s for s in range(1, 25) if samples_due(10, s)] == [1, 10, 20]
    assert not any(samples_due(0, s) for s in range(1, 25))


def test_chosen_rows_best_then_worst_of_the_first_four_groups():
    rewards_B = torch.tensor([0.0, 1.0, 0.5, 1.0] + [0.2] * 4 + [1, 0, 0, 0] * 3 + [0.0, 0.0, 0.0, 9.0])
    # group 1 is constant: one row; groups past the fourth are never logged
    assert chosen_rows(rewards_B, 4) == [1, 0, 4, 8, 9, 12, 13]
    assert chosen_rows(torch.tensor([3.0, 1.0]), 1) == [0, 1]  # groups of one: one row each


class _Tok:
    """Decodes ids as characters; 0 is a pad that must not appear in a decoded prompt."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


def _batch(prompts, completions, lengths, C=4):
    from gspo_cli.rollout import RolloutBatch

    P = max(map(len, prompts))
    rows, attn = [], []
    for p in prompts:
        pad = P - len(p)
        rows.append([0] * pad + [ord(c) for c in p] + [ord("x")] * C)
        attn.append([0] * pad + [1] * len(p) + [1] * C)
    mask = torch.tensor([[1.0 if j < n else 0.0 for j in range(C)] for n in lengths])
    return RolloutBatch(
        input_ids=torch.tensor(rows),
        attention_mask=torch.tensor(attn),
        response_mask=mask,
        prompt_len=P,
        completions=completions,
        truncated=torch.tensor([n == C for n in lengths]),
    )


def test_sample_records_hand_computed():
    batch = _batch(["ab", "ab", "long?", "long?"], ["1", "22", "y" * (MAX_CHARS + 5), ""], [2, 4, 1, 4])
    tests = {"tests": [{"status": "pass"}, {"status": "error", "stderr": "ZeroDivisionError"}]}
    scores = [Score(1.0, True, {"format": 1.0}), Score(0.0, False, detail=tests), Score(0.5, False), Score(0.0, False)]
    rewards_B = torch.tensor([s.reward for s in scores])
    adv_B = torch.tensor([0.7071, -0.7071, 0.7071, -0.7071])
    clipped_B = torch.tensor([0.0, 3.0, 1.0, 0.0])  # per update
    weights_BC = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0] * 4])
    recs = sample_records(batch, scores, rewards_B, adv_B, clipped_B, weights_BC, _Tok(), 2)
    assert [r["index"] for r in recs] == [0, 1, 2, 3] and [r["group"] for r in recs] == [0, 0, 1, 1]
    assert [r["prompt"] for r in recs] == ["ab", "ab", "long?", "long?"]  # left padding dropped
    assert [r["length"] for r in recs] == [2, 4, 1, 4]
    assert [r["clip_frac"] for r in recs] == [0.0, 0.75, 1.0, 0.0]
    assert [r["clipped"] for r in recs] == [False, True, True, False]
    assert [r["masked_frac"] for r in recs] == [0.5, 0.5, 1.0, 0.0]
    assert recs[0]["components"] == {"format": 1.0} and recs[0]["correct"] and recs[0]["advantage"] == 0.7071
    assert recs[2]["completion"] == "y" * MAX_CHARS + "…" and recs[2]["completion_chars"] == MAX_CHARS + 5
    assert [r["truncated"] for r in recs] == [False, True, False, True]
    assert recs[1]["detail"] == tests and all("detail" not in r for r in recs[::2])
    no_correction = sample_records(batch, scores, rewards_B, adv_B, clipped_B, None, _Tok(), 2)
    assert all(r["masked_frac"] is None for r in no_correction)


# --------------------------------------------------------------------------- reading


def _rec(step, index, reward, adv, **kw):
    return {
        "step": step,
        "arm": "gspo",
        "seed": 0,
        "group": index // 2,
        "index": index,
        "prompt": f"P{index}",
        "completion": f"C{index}",
        "reward": reward,
        "correct": reward == 1.0,
        "advantage": adv,
        "length": 3,
        "truncated": False,
        "clip_frac": 0.0,
        "clipped": False,
        "masked_frac": None,
        **kw,
    }


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "exp" / "gspo" / "seed0"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"status": "completed"}))
    recs = [_rec(1, 0, 0.0, -1.0), _rec(1, 1, 1.0, 1.0)]
    recs += [_rec(10, 0, 0.5, 0.2), _rec(10, 1, 0.0, -0.7, clip_frac=1.0, clipped=True), _rec(10, 2, 1.0, 0.9)]
    text = "".join(json.dumps(r) + "\n" for r in recs) + '{"step": 20, "prom'  # torn tail: skipped
    (d / "samples.jsonl").write_text(text)
    return d


def test_select_latest_step_by_default_and_sorted(run_dir):
    _, recs = load_samples(run_dir)
    assert [r["index"] for r in select_samples(recs)] == [0, 1, 2]  # step 10, batch order
    assert [r["index"] for r in select_samples(recs, order="worst")] == [1, 0, 2]
    assert [r["index"] for r in select_samples(recs, order="best", n=2)] == [2, 0]
    assert [r["index"] for r in select_samples(recs, step=1)] == [0, 1]
    with pytest.raises(SpecError, match=r"^--step: no samples at step 5 \(steps with samples: 1, 10\)$"):
        select_samples(recs, step=5)


def test_load_refuses_what_is_not_one_run(tmp_path, run_dir):
    with pytest.raises(SpecError, match="is not a run directory"):
        load_samples(tmp_path / "nowhere")
    other = tmp_path / "exp" / "grpo" / "seed0"
    other.mkdir(parents=True)
    (other / "run.json").write_text("{}")
    with pytest.raises(SpecError, match=r"holds 2 runs"):
        load_samples(tmp_path / "exp")
    with pytest.raises(SpecError, match=r"has no samples \(samples.jsonl missing or empty"):
        load_samples(other)


def test_cli_plain_json_and_errors(run_dir):
    res = runner.invoke(app, ["samples", str(run_dir), "--worst", "-n", "1", "--plain"])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[:6] == [
        "=== step 10, gspo/seed0, group 0, response 1",
        "reward 0, advantage -0.700, 3 tokens, clipped 100%",
        "--- prompt",
        "P1",
        "--- completion",
        "C1",
    ]
    res = runner.invoke(app, ["samples", str(run_dir), "--step", "1", "--json"])
    assert [json.loads(line)["index"] for line in res.output.splitlines()] == [0, 1]
    res = runner.invoke(app, ["samples", str(run_dir)])  # Rich panels
    assert res.exit_code == 0 and "step 10, gspo/seed0, group 1, response 2" in res.output
    assert "reward 1 (correct), advantage +0.900" in res.output
    res = runner.invoke(app, ["samples", str(run_dir), "--worst", "--best"])
    assert res.exit_code == 2 and res.output.strip() == "error: --worst, --best: choose one"
    res = runner.invoke(app, ["samples", str(run_dir), "--step", "3"])
    assert res.exit_code == 2 and "no samples at step 3" in res.output


@pytest.mark.parametrize("columns", [60, 160])
def test_piped_panels_take_their_width_from_columns(tmp_path, columns):
    """Piped (not a terminal), the panels were 120 columns whatever COLUMNS said."""
    d = tmp_path / "exp" / "gspo" / "seed0"
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"status": "completed"}))
    (d / "samples.jsonl").write_text(json.dumps(_rec(1, 0, 1.0, 0.5, completion="word " * 80)) + "\n")
    res = runner.invoke(app, ["samples", str(d)], env={"COLUMNS": str(columns)})
    assert res.exit_code == 0, res.output
    assert max(map(len, res.output.splitlines())) == columns


def test_cut_texts_say_so_in_both_views(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "run.json").write_text("{}")
    rec = _rec(1, 0, 0.0, 0.0, completion="z" * MAX_CHARS + "…", completion_chars=MAX_CHARS + 7)
    (d / "samples.jsonl").write_text(json.dumps(rec) + "\n")
    note = f"[cut: {MAX_CHARS} of {MAX_CHARS + 7} characters shown]"
    for view in ("--plain", None):
        res = runner.invoke(app, ["samples", str(d), *([view] if view else [])])
        assert res.exit_code == 0 and note in res.output, res.output


def test_verdict_names_masking_only_with_a_correction():
    assert verdict(_rec(1, 0, 0.5, 0.25, masked_frac=0.25, truncated=True)) == (
        "reward 0.5, advantage +0.250, 3 tokens, no stop token, not clipped, masked 25%"
    )


# --------------------------------------------------------------------------- a real run


@pytest.mark.slow
def test_training_writes_samples_users_can_read(tmp_path):
    from gspo_cli.spec.loading import spec_from_dict
    from gspo_cli.tasks import make_task
    from gspo_cli.train.loop import train_experiment
    from gspo_cli.train.reporting import quiet_reporter

    spec = spec_from_dict(
        {
            **TINY,
            "output_dir": str(tmp_path),
            "train": {"steps": 2, "log_samples_every": 2},
            "arms": [
                {"name": "gspo", "preset": "paper-gspo", "mini_batches": 2},
                # a mask window that only tokens the engine and trainer agree on exactly pass
                {
                    "name": "gspo_mask",  # a per-token mask needs a token-level loss (gspo is refused)
                    "preset": "paper-gspo-token",
                    "mini_batches": 2,
                    "mismatch": {"mode": "token_mask", "low": 1.0, "high": 1.0 + 1e-7},
                },
            ],
        }
    )
    results = train_experiment(spec, reporter=quiet_reporter())
    assert [r.status for r in results] == ["completed", "completed"]
    task = make_task(spec.task.name, spec.task.params)
    G = spec.rollout.group_size
    for r in results:
        recs = RunDir(r.path).samples()
        assert sorted({x["step"] for x in recs}) == [1, 2]  # step 1, then every 2nd
        for step in (1, 2):
            at = [x for x in recs if x["step"] == step]
            assert 1 <= len(at) <= 8 and all(x["arm"] == r.arm and x["seed"] == 0 for x in at)
        # The prompts the trainer drew (its problem RNG is random.Random(seed)), as the model saw
        # them: the built-in model has no chat template, so the task's prompt text itself.
        rng = random.Random(0)
        drawn = {t: task.train_problems(rng, spec.rollout.prompts_per_step) for t in (1, 2)}
        for x in recs:
            problem = drawn[x["step"]][x["group"]]
            assert x["prompt"] == problem.prompt
            assert task.score(problem, x["completion"]).reward == x["reward"]
            assert 0 <= x["clip_frac"] <= 1 and x["clipped"] == (x["clip_frac"] > 0)
            assert 1 <= x["length"] <= spec.rollout.max_new_tokens
        # within a group the logged best has at least the worst's reward and advantage
        for step in (1, 2):
            for g in {x["group"] for x in recs if x["step"] == step}:
                pair = [x for x in recs if x["step"] == step and x["group"] == g]
                assert pair[0]["reward"] >= pair[-1]["reward"] and pair[0]["advantage"] >= pair[-1]["advantage"]
                assert all(x["index"] // G == g for x in pair)
        if r.arm == "gspo":
            assert all(x["clip_frac"] in (0.0, 1.0) for x in recs)  # GSPO, one epoch: all tokens or none
            assert all(x["masked_frac"] is None for x in recs)
        else:  # gspo_token with a token mask: masked tokens are neither kept nor clipped
            assert all(0 <= x["clip_frac"] <= 1 and 0 <= x["masked_frac"] <= 1 for x in recs)
    res = runner.invoke(app, ["samples", results[0].path, "--best", "--plain"])
    assert res.exit_code == 0 and res.output.startswith("=== step 2, gspo/seed0, group ")

    # Evaluation rows keep the prompt as the model saw it: through a checkpoint's chat template.
    chat = edited_model_copy(
        RunDir(results[0].path).latest_checkpoint(), tmp_path / "chat", tokenizer_config={"chat_template": TEMPLATE}
    )
    out = tmp_path / "ev"
    res = runner.invoke(
        app, ["eval", str(chat), "-t", "arithmetic", "-k", "1", "-n", "2", "--max-tokens", "4", "-o", str(out), "-q"]
    )
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in (out / "eval_problems.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in rows] == [f"Q: {p.prompt}A: " for p in make_task("arithmetic", {}).eval_problems(2)]


TEMPLATE = "{% for m in messages %}Q: {{ m['content'] }}{% endfor %}{% if add_generation_prompt %}A: {% endif %}"
