"""`gspo eval --engine vllm`: the same prompts, stop ids and sampling rules as the hf engine
(and as training), so at a near-greedy temperature both engines write the same completions."""

import json
import shutil
import sys

import pytest
from helpers import edited_model_copy
from typer.testing import CliRunner
from vllm_tiny import TINY, tiny_spec

from gspo_cli.cli.app import app
from gspo_cli.spec.loading import dump_spec

# Near-greedy: vLLM and the trainer's forward agree to ~1e-6 in log-prob (test_vllm_engine), so
# at T = 1e-3 only tokens within ~1e-2 of the top logit could ever be drawn; on the problems
# the tiny model was cold-started on, both engines then pick the argmax. Exact greedy (T = 0)
# is not an evaluation setting `gspo eval` accepts.
NEAR_GREEDY = "0.001"
TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}[{{ m['content'] }}]{% else %}"
    "Q: {{ m['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %}A: {% endif %}"
)


def _run_dir(path, model_dir, **rollout):
    """A run directory as `gspo train` leaves it: its spec (task, prompt fields, max_new_tokens)
    and one checkpoint, a copy of `model_dir`."""
    spec = tiny_spec(rollout={**TINY["rollout"], **rollout})
    shutil.copytree(model_dir, path / "checkpoints" / "step_000001")
    (path / "spec.yaml").write_text(dump_spec(spec))
    return path


def _eval(target, engine, *extra):
    res = CliRunner().invoke(
        app,
        [
            "eval",
            str(target),
            "--limit",
            "12",
            "--samples",
            "2",
            "--temperature",
            NEAR_GREEDY,
            "--out",
            str(target / engine),
            "--engine",
            engine,
            "--quiet",
            *extra,
        ],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads((target / engine / "eval_summary.json").read_text())
    rows = [json.loads(line) for line in (target / engine / "eval_problems.jsonl").read_text().splitlines()]
    return summary, {r["id"]: r["completions"] for r in rows}


@pytest.fixture(scope="module")
def chat_model(tiny_source, tmp_path_factory):
    """A chat checkpoint: prompts go through its template, and its generation_config.json
    adds a stop id ("{", which the tiny model writes after a few tokens with this template)
    and sampling defaults neither engine may apply."""
    from transformers import AutoTokenizer

    vocab = AutoTokenizer.from_pretrained(tiny_source).get_vocab()
    return edited_model_copy(
        tiny_source,
        tmp_path_factory.mktemp("chat") / "m",
        tokenizer_config={"chat_template": TEMPLATE},
        generation_config={"eos_token_id": [vocab["{"]], "temperature": 0.3, "top_k": 2, "max_new_tokens": 3},
    )


@pytest.mark.parametrize("model", ["plain", "chat"])
def test_vllm_and_hf_evaluate_alike(tmp_path, tiny_source, chat_model, model):
    """The run's spec sets the task, max_new_tokens (16) and, for the chat checkpoint, a system
    prompt: both engines follow it, and write the same completions."""
    if model == "plain":
        run = _run_dir(tmp_path / "run", tiny_source)
    else:
        run = _run_dir(tmp_path / "run", chat_model, system_prompt="be brief")
    hf, hf_completions = _eval(run, "hf")
    vl, vl_completions = _eval(run, "vllm", "--vllm-arg", "max_num_seqs=8")
    assert (vl["engine"], vl["vllm_args"], hf["engine"]) == ("vllm", {"max_num_seqs": 8}, "hf")
    assert (
        vl["sampling"]
        == hf["sampling"]
        == {"samples": 2, "temperature": 0.001, "top_p": 1.0, "max_tokens": 16, "seed": 0}
    )
    assert vl_completions == hf_completions
    assert vl["scores"] == hf["scores"]
    texts = [c for cs in vl_completions.values() for c in cs]
    assert len(texts) == 2 * vl["problems"] >= 8
    assert max(map(len, texts)) > 3  # the checkpoint's max_new_tokens 3 is not applied
    if model == "chat":  # ended at the stop id of generation_config.json, not the tokenizer's EOS
        assert all(t.endswith("{") for t in texts)
    else:  # the task's answer format, as the cold start taught it (raw prompts, no template)
        assert sum("\\boxed{" in t for t in texts) > len(texts) // 2


def test_missing_vllm_is_one_line(tiny_source, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now fails, as where it is not installed
    res = CliRunner().invoke(
        app, ["eval", tiny_source, "--task", "arithmetic", "--engine", "vllm", "--out", str(tmp_path)]
    )
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr.startswith("error: --engine: vllm is not installed") and res.stderr.count("\n") == 1
    assert not (tmp_path / "eval_summary.json").exists()
