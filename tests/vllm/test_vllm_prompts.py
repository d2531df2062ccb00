"""Conversational prompts (TRL's lists of messages, the `prompts` task) through the vLLM engines:
colocated, and a server sampled by the staleness-1 worker. Each engine gets the token ids of the
prompt as the chat template renders it (the same PromptFormatter as the hf engine's), so the
trainer's forward reads exactly the ids the engine continued; samples.jsonl decodes them."""

import copy
import json
import subprocess
import sys

import pytest
import yaml
from helpers import edited_model_copy, free_port
from vllm_tiny import TINY, running_server

from gspo_cli.runs import RunDir

# A chat template for the built-in character tokenizer: system turn in brackets, then turns.
TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}[{{ m['content'] }}]"
    "{% else %}{{ m['content'] }}\n{% endif %}{% endfor %}{% if add_generation_prompt %}A: {% endif %}"
)
CHAT = [
    {"prompt": [{"role": "user", "content": "2+2=?"}], "answer": "4"},  # held out (eval_size 1)
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "3+1=?"}], "answer": "4"},
    {"prompt": [{"role": "user", "content": "1+1=?"}], "answer": "2"},
]
# rollout.system_prompt reaches the row without a system message; a row's own one wins.
RENDERED = {"[Be brief.]3+1=?\nA: ", "[Think.]1+1=?\nA: "}
REWARDS = '''
def chat_reward(prompts, completions, answer, **kwargs):
    # TRL's conversational form: prompts and completions are lists of messages
    return [float(c[0]["role"] == "assistant" and a in c[0]["content"]) + 0.5 * (p[-1]["role"] == "user")
            for p, c, a in zip(prompts, completions, answer)]
'''


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory, tiny_source):
    """The tiny vLLM model with a chat template: a local Hugging Face model directory."""
    tmp = tmp_path_factory.mktemp("chat")
    return edited_model_copy(tiny_source, tmp / "model", tokenizer_config={"chat_template": TEMPLATE})


def _spec(tmp_path, model, name: str, **rollout) -> str:
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in CHAT))
    (tmp_path / "chat_rewards.py").write_text(REWARDS)
    raw = copy.deepcopy(TINY)
    raw["name"] = name
    raw["model"] = {"name": str(model)}
    raw["task"] = {
        "name": "prompts",
        "params": {"source": str(tmp_path / "chat.jsonl")},
        "eval_size": 1,
        "rewards": [{"function": f"{tmp_path}/chat_rewards.py:chat_reward", "correct": True}],
    }
    raw["rollout"] = {**raw["rollout"], "system_prompt": "Think.", "logprob_check_every": 1, **rollout}
    raw["train"] = {"steps": 2}
    raw["output_dir"] = str(tmp_path / "out")
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _train_and_check(spec: str, run) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "gspo_cli", "train", spec, "--quiet", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    rd = RunDir(run)
    assert rd.status() == "completed"
    metrics = rd.metrics()
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert m["reward/chat_reward"] >= 0.5  # every row's last prompt message is the user's
        # the trainer's forward of the engine's ids agrees with the engine's own log-probs
        assert m["rollout/logprob_diff_max"] < 1e-3, m
    # the prompt ids the engine continued, decoded: the chat template's rendering, system turns as documented
    assert {r["prompt"] for r in rd.samples()} == RENDERED
    evals = rd.evals()
    assert [e["step"] for e in evals] == [0, 2]
    assert {"reward_chat_reward", "reward_chat_reward_std", "avg@1"} <= set(evals[-1]["scores"])


def test_colocated_vllm_samples_conversational_prompts(tmp_path, chat_model):
    spec = _spec(tmp_path, chat_model, "colocated")
    _train_and_check(spec, tmp_path / "out" / "colocated" / "gspo" / "seed0")


def test_a_server_sampled_by_the_staleness_worker_gets_conversational_prompts(tmp_path, chat_model):
    """`gspo vllm-server SPEC` serves the chat model; the trainer's staleness-1 worker renders
    each conversation, pushes its weights to the server and sends the prompt's ids."""
    port = free_port()
    server = {"url": f"http://127.0.0.1:{port}", "weight_port": free_port()}
    spec = _spec(tmp_path, chat_model, "served", engine="vllm-server", server=server, staleness=1)
    with running_server(tmp_path, spec, port):
        _train_and_check(spec, tmp_path / "out" / "served" / "gspo" / "seed0")
