"""Common random numbers: in-run evaluations sample from draws fixed by (run seed, step, set),
leave training's random state alone, and record every problem's result; arms at equal seed share
their cold start, training problems and step-0 evaluations."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import TINY
from transformers import AutoModelForCausalLM

from gspo_cli.eval.seeding import eval_seed
from gspo_cli.eval.sets import EvalSet, score_and_log
from gspo_cli.models.builtin import build_config, build_tokenizer
from gspo_cli.rollout import HFRolloutEngine
from gspo_cli.runs import RunDir
from gspo_cli.spec import BuiltinModelConfig
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.tasks import make_task
from gspo_cli.train.loop import train_experiment
from gspo_cli.train.reporting import quiet_reporter


def test_eval_seed_is_fixed_by_seed_step_and_set():
    assert eval_seed(0, 50, "math") == eval_seed(0, 50, "math")
    seeds = {eval_seed(s, t, n) for s in (0, 1) for t in (0, 50) for n in ("math", "aime")}
    assert len(seeds) == 8 and all(0 <= s < 2**63 for s in seeds)


class Recording(HFRolloutEngine):
    """The hf engine, keeping the completions of its last evaluation (a random model's are all
    wrong: the draws show in the texts, not in the verdicts)."""

    def generate(self, prompts, on_rows=None):
        batch = super().generate(prompts, on_rows)
        self.seen = [*getattr(self, "seen", []), *batch.completions]
        return batch


@pytest.fixture(scope="module")
def engine_and_set():
    torch.manual_seed(0)
    tok = build_tokenizer("0123456789+= What is?\\boxed{}.")
    size = BuiltinModelConfig(hidden_size=32, num_layers=1, num_heads=1, num_kv_heads=1, intermediate_size=32)
    model = AutoModelForCausalLM.from_config(build_config("tiny-dense", size, tok))
    engine = Recording(model, tok, max_new_tokens=6, temperature=1.0)
    task = make_task("arithmetic", {"num_operands": 2, "max_operand": 9})
    s = EvalSet(
        name="arithmetic", task=task, problems=task.eval_problems(6), samples=4, max_tokens=6, every=0, source="x"
    )
    return engine, s


def _evaluate_after(engine, s, consumed: int, seed: int | None) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """The eval.jsonl record of `s` at step 50 after training drew `consumed` numbers, and torch's
    generator state before and after the evaluation."""
    torch.manual_seed(123)
    torch.rand(consumed)
    before = torch.get_rng_state()
    logged: list[dict] = []
    engine.seen = []
    score_and_log(engine, [s], 50, logged.append, seed=seed)
    return {**logged[0], "completions": engine.seen}, before, torch.get_rng_state()


def test_evaluation_draws_do_not_depend_on_what_training_drew(engine_and_set):
    engine, s = engine_and_set
    records = [_evaluate_after(engine, s, consumed, seed=7) for consumed in (0, 1000, 12345)]
    completions = {json.dumps(r["completions"]) for r, _, _ in records}
    assert (
        len(completions) == 1 and len(records[0][0]["completions"]) == 24
    )  # same seed, same step, same set: same samples whatever came before
    for _, before, after in records:
        assert torch.equal(before, after)  # training's generator as if the evaluation had not happened
    # Without the run's seed (as every evaluation sampled before), the draws follow training's state.
    unseeded = [_evaluate_after(engine, s, consumed, seed=None) for consumed in (0, 1000, 12345)]
    assert len({json.dumps(r["completions"]) for r, _, _ in unseeded}) > 1
    assert not torch.equal(unseeded[0][1], unseeded[0][2])
    # Another run seed or another step: other draws.
    other = [_evaluate_after(engine, s, 0, seed=seed) for seed in (8, 9, 10)]
    assert (
        len({json.dumps(r["completions"]) for r, _, _ in other}) == 3
        and {json.dumps(r["completions"]) for r, _, _ in other} != completions
    )


def test_every_evaluation_records_each_problem(engine_and_set):
    engine, s = engine_and_set
    record, _, _ = _evaluate_after(engine, s, 0, seed=7)
    problems = record["problems"]
    assert set(problems) == {"id", "correct", "reward"}
    assert problems["id"] == [p.id for p in s.problems]
    assert all(isinstance(c, int) and 0 <= c <= s.samples for c in problems["correct"])
    assert len(problems["reward"]) == len(s.problems)
    # avg@K is the mean over problems of correct / K: the record carries everything it is made from
    assert record["scores"]["avg@4"] == pytest.approx(sum(problems["correct"]) / (4 * len(s.problems)))


def _problem_records_size(problems: int, samples: int) -> int:
    """Bytes of the `problems` key of one eval.jsonl line for `problems` held-out problems."""
    from gspo_cli.eval.scores import ProblemResult, problem_records
    from gspo_cli.tasks import Problem, Score

    results = [
        ProblemResult(
            problem=Problem(id=f"arith-{10000 + i}", prompt="", answer=""),
            completions=[""] * samples,
            scores=[Score(reward=(i * j % 7) / 7, correct=(i + j) % 3 == 0) for j in range(samples)],
        )
        for i in range(problems)
    ]
    return len(json.dumps(problem_records(results)))


def test_problem_records_stay_small():
    # 500 problems x 32 samples: 13.2 kB, about as much as at K = 4 (counts, not per-sample verdicts)
    size = _problem_records_size(500, 32)
    assert 12_000 < size < 15_000
    assert _problem_records_size(500, 4) <= size + 500 * 2


@pytest.mark.slow
def test_arms_at_equal_seed_share_step0_evaluation_and_training_problems(tmp_path):
    spec = spec_from_dict(
        {
            **TINY,
            "output_dir": str(tmp_path),
            "train": {"steps": 3, "eval_every": 1, "eval_samples": 2, "log_samples_every": 1},
            "arms": [
                {"name": "grpo", "preset": "paper-grpo", "mini_batches": 2},
                {"name": "gspo", "preset": "paper-gspo", "mini_batches": 2},
            ],
        }
    )
    results = train_experiment(spec, reporter=quiet_reporter())
    grpo, gspo = (RunDir(r.path) for r in results)
    assert grpo.info()["model_source"] == gspo.info()["model_source"]  # one cold start
    # Step 0: the same model, the same problems, the same draws: the same record, problem by problem.
    step0 = [rd.evals()[0] for rd in (grpo, gspo)]
    assert step0[0]["problems"] == step0[1]["problems"] and step0[0]["scores"] == step0[1]["scores"]
    # The training problems of every step are drawn from the run seed alone.
    for step in (1, 2, 3):
        prompts = [sorted({r["prompt"] for r in rd.samples() if r["step"] == step}) for rd in (grpo, gspo)]
        assert prompts[0] and prompts[0] == prompts[1]
    # Every evaluation, at every step, records each held-out problem.
    for rd in (grpo, gspo):
        assert [e["step"] for e in rd.evals()] == [0, 1, 2, 3]
        assert all(len(e["problems"]["id"]) == 4 for e in rd.evals())


def test_vllm_on_a_gpu_seeds_each_evaluation_row_and_training_rows_not(monkeypatch):
    """The vllm engine's request seeds, with a stand-in for vllm (not installed here): inside
    `fixed_draws` every row gets its own seed, counted on across generate calls; outside, none."""
    import sys
    import types

    from gspo_cli.eval.seeding import fixed_draws
    from gspo_cli.rollout.vllm_engine import VLLMRolloutEngine

    fake = types.ModuleType("vllm")
    fake.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = dict
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)

    class Sampled(Exception):
        pass

    seen = []

    def generate(prompts, params, use_tqdm):
        seen.append([p.seed for p in params] if isinstance(params, list) else params.seed)
        raise Sampled

    engine = VLLMRolloutEngine.__new__(VLLMRolloutEngine)
    engine.__dict__.update(
        sync_if_stale=lambda: None,
        tokenizer=lambda texts, add_special_tokens: types.SimpleNamespace(input_ids=[[1]] * len(texts)),
        format=lambda prompts: prompts,
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=4,
        stop_ids=[0],
        tp=1,
        shares_world=False,
        together=False,
        llm=types.SimpleNamespace(generate=generate),
        takes_request_seeds=True,
        _request_seed=None,
    )
    for rows in (["a", "b"], ["c"]):
        with pytest.raises(Sampled), fixed_draws(engine, 100):
            engine.generate(rows)
    with pytest.raises(Sampled):
        engine.generate(["d"])
    assert seen == [[100, 101], [100], None]  # each evaluation from its seed on; training rows unseeded
