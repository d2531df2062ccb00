"""Multi-turn rollouts with the `python` tool through the colocated vLLM engine
(rollout/vllm_turns.py) on the tools testbed's format, shrunk: the tiny MoE cold-started on
`style: tool` products (it writes ```python blocks), vLLM on CPU. Token-in-token-out (every id
the trainer sees is one the engine returned, or one of an inserted tool message), the masks,
the trainer's log-probs against the engine's on the model's tokens, and `gspo train` finishing,
colocated and against a server (`gspo vllm-server`, token ids in and out over HTTP)."""

import copy
import json
import random
import subprocess
import sys

import pytest
import torch
import yaml
from helpers import free_port
from vllm_tiny import TINY, running_server, tiny_spec

from gspo_cli.models import load_model, resolve_model_source
from gspo_cli.rollout import make_engine, response_logprobs, with_environment
from gspo_cli.runs import RunDir
from gspo_cli.tasks import make_task

TASK = {
    "name": "arithmetic",
    "params": {"num_operands": 2, "max_operand": 99, "operators": "*", "style": "tool", "format_weight": 0.1},
    "eval_size": 4,
    "environment": "python",
    "environment_params": {"timeout_s": 2},
}
ROLLOUT = {
    **TINY["rollout"],
    "max_new_tokens": 40,
    "max_total_tokens": 80,
    "max_turns": 3,
    "max_tool_calls": 2,
    "tool_output_tokens": 16,
}


@pytest.fixture(scope="module")
def tool_source() -> str:
    """The tiny vLLM model cold-started on worked tool calls (about 3 minutes on a loaded CPU)."""
    spec = tiny_spec(task=TASK, rollout=ROLLOUT)
    return resolve_model_source(spec.model, make_task(spec.task.name, spec.task.params), log=lambda m: None)


def _spans(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s."""
    out, start = [], None
    for j, v in enumerate([*mask, 0]):
        if v and start is None:
            start = j
        elif not v and start is not None:
            out.append((start, j))
            start = None
    return out


def test_token_in_token_out_masks_and_logprobs_with_the_python_tool(tool_source):
    spec = tiny_spec(task=TASK, rollout=ROLLOUT)
    task = make_task(spec.task.name, spec.task.params)
    lm = load_model(tool_source, spec.model)
    torch.manual_seed(0)
    engine = make_engine(spec.rollout, lm.model, lm.tokenizer, model_dir=tool_source, seed=0)
    rounds = []  # [(ids sent, ids returned)] of every round
    real = engine.sample_ids

    def recorded(prompt_ids, max_tokens, stop_ids, key=0):
        outs = real(prompt_ids, max_tokens, stop_ids, key)
        rounds.extend((list(p), list(ids)) for p, (ids, _) in zip(prompt_ids, outs))
        return outs

    engine.sample_ids = recorded
    problems = list({p.prompt: p for p in task.train_problems(random.Random(0), 12)}.values())[:8]
    try:
        turns = with_environment(engine, spec)
        batch = turns.generate([p.prompt for p in problems])
    finally:
        engine.close()
    tok, P = lm.tokenizer, batch.prompt_len
    assert type(turns).__name__ == "VLLMTurnEngine" and batch.engine_routes is None
    assert torch.equal(batch.model_mask, batch.response_mask * (1 - batch.tool_mask))
    calls = 0
    for i in range(len(problems)):
        prompt = batch.input_ids[i, :P][batch.attention_mask[i, :P] > 0].tolist()
        n = int(batch.response_mask[i].sum())
        resp, tool = batch.response_ids[i, :n].tolist(), [int(v) for v in batch.tool_mask[i, :n].tolist()]
        assert batch.response_mask[i, :n].all() and not batch.response_mask[i, n:].any()
        mine = [(sent, got) for sent, got in rounds if sent[: len(prompt)] == prompt]
        # Every round sent the trainer's ids so far; what it returned sits right after them, and
        # the model's tokens are exactly everything the engine returned, in order, none dropped.
        for sent, got in mine:
            k = len(sent) - len(prompt)
            assert sent == prompt + resp[:k] and resp[k : k + len(got)] == got
        assert [t for t, m in zip(resp, tool) if not m] == [t for _, got in mine for t in got]
        # Each tool span is the tool message as inserted: the wrapper around the observation's own ids.
        outs = [t["content"] for t in batch.turns[i] if t["role"] == "tool"]
        spans = _spans(tool)
        assert len(spans) == len(outs) == batch.tool_counts[i]["tool_calls"]
        for (a, b), out in zip(spans, outs):
            want = turns.wrap_ids[0] + tok(out, add_special_tokens=False).input_ids + turns.wrap_ids[1]
            assert resp[a:b] == want[: b - a] and (b - a == len(want) or (b == n and batch.truncated[i]))
        assert n - sum(tool) <= ROLLOUT["max_new_tokens"] and n <= ROLLOUT["max_total_tokens"]
        calls += len(outs)
    assert calls >= 2, batch.turns  # the cold-started model calls the tool
    assert batch.engine_logp[batch.tool_mask > 0].abs().sum() == 0
    with torch.no_grad():
        trainer = response_logprobs(lm.model, batch, spec.rollout.temperature).logp
    gap = (trainer - batch.engine_logp).abs()[batch.model_mask > 0]
    assert gap.max() < 1e-4 and gap.mean() < 1e-5, (gap.max(), gap.mean())


def _spec_file(tmp_path, name: str, **rollout) -> str:
    raw = copy.deepcopy(TINY)
    raw.update(name=name, task=TASK, rollout={**ROLLOUT, **rollout}, output_dir=str(tmp_path / "out"))
    raw["train"] = {"steps": 2}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _train_and_check(tmp_path, spec: str, name: str) -> None:
    """`gspo train SPEC` finishes its 2 steps, sampling in turns with the tool, the engine's
    log-probs of the model's tokens matching the trainer's."""
    res = subprocess.run(
        [sys.executable, "-m", "gspo_cli", "train", spec, "--quiet", "--json"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rd = RunDir(tmp_path / "out" / name / "gspo" / "seed0")
    assert rd.status() == "completed"
    metrics = rd.metrics()
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["rollout/logprob_diff_max"] < 1e-4, m  # the model's tokens: the engine's and the trainer's agree
        assert 0 < m["tools/env_token_frac"] < 1 and m["tools/tool_calls_mean"] > 0, m
    samples = rd.samples()
    assert samples and all(r["turns"][0]["role"] == "model" for r in samples)
    assert any(t["role"] == "tool" for r in samples for t in r["turns"])
    assert [e["step"] for e in rd.evals()] == [0, 2]  # in-run evaluation samples in turns too


def test_gspo_train_and_eval_with_tools_on_vllm(tmp_path, tool_source):
    _train_and_check(tmp_path, _spec_file(tmp_path, "tools"), "tools")
    # `gspo eval RUN --engine vllm` samples with the run's environment too
    run, out = tmp_path / "out" / "tools" / "gspo" / "seed0", tmp_path / "eval"
    res = subprocess.run(
        [sys.executable, "-m", "gspo_cli", "eval", str(run), "--engine", "vllm", "-n", "4", "--out", str(out), "-q"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "eval_problems.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["completions"] for r in rows)


def test_gspo_train_with_tools_on_a_vllm_server(tmp_path, tool_source):
    port = free_port()
    server = {"url": f"http://127.0.0.1:{port}", "weight_port": free_port()}
    spec = _spec_file(tmp_path, "served", engine="vllm-server", server=server)
    with running_server(tmp_path, spec, port):
        _train_and_check(tmp_path, spec, "served")
