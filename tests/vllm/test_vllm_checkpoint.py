"""The vLLM engine on a chat checkpoint that also ships sampling defaults: prompts through
its chat template, responses ending at the first of its stop ids (the hf engine's mask
rule), and none of its generation_config.json reaching the sampler."""

import pytest
import torch
from helpers import edited_model_copy
from vllm_tiny import PROMPTS, tiny_spec

from gspo_cli.models import load_model
from gspo_cli.rollout import make_engine, response_logprobs

TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}[{{ m['content'] }}]{% else %}"
    "Q: {{ m['content'] }}{% endif %}{% endfor %}{% if add_generation_prompt %}A: {% endif %}"
)
# What generate would apply from the checkpoint; vLLM must not (generation_config="vllm").
SAMPLING_DEFAULTS = {
    "do_sample": True,
    "temperature": 0.6,
    "top_k": 3,
    "top_p": 0.5,
    "min_p": 0.3,
    "repetition_penalty": 1.5,
    "max_new_tokens": 3,
    "min_new_tokens": 5,
}


@pytest.fixture(scope="module")
def chat(tiny_source, tmp_path_factory):
    spec = tiny_spec(rollout={**tiny_spec().rollout.model_dump(), "system_prompt": "be brief", "max_new_tokens": 24})
    vocab = load_model(tiny_source, spec.model).tokenizer.get_vocab()
    extra = [vocab["x"], vocab["{"]]  # written early in most of its answers to this template
    path = edited_model_copy(
        tiny_source,
        tmp_path_factory.mktemp("chat") / "m",
        tokenizer_config={"chat_template": TEMPLATE},
        generation_config={**SAMPLING_DEFAULTS, "eos_token_id": extra},
    )
    lm = load_model(str(path), spec.model)
    engine = make_engine(spec.rollout, lm.model, lm.tokenizer, model_dir=str(path), seed=0)
    yield lm, engine, extra
    engine.close()


def test_prompts_go_through_the_template_and_responses_end_at_the_first_stop(chat):
    lm, engine, extra = chat
    tok = lm.tokenizer
    assert engine.stop_ids == [tok.eos_token_id, *extra]
    batch = engine.generate(PROMPTS)
    P = batch.prompt_len
    for i, prompt in enumerate(PROMPTS):
        assert tok.decode(batch.input_ids[i, :P], skip_special_tokens=True) == f"[be brief]Q: {prompt}A: "
    ends = []
    for i in range(len(PROMPTS)):
        ids = batch.response_ids[i].tolist()
        n = int(batch.response_mask[i].sum())
        first = next((j for j, t in enumerate(ids[:n]) if t in engine.stop_ids), None)
        if first is None:
            assert batch.truncated[i] and n == 24
            continue
        assert not batch.truncated[i] and first == n - 1  # up to and including the first stop id
        assert batch.response_mask[i, n:].eq(0).all() and batch.engine_logp[i, n:].eq(0).all()
        ends.append(ids[first])
    assert set(ends) & set(extra), "no response ended at an extra stop id: the test would prove nothing"


def test_checkpoint_sampling_defaults_do_not_reach_vllm(chat):
    """Log-probs vLLM sampled with equal the policy's at temperature 1 (no top-k/top-p/min-p
    renormalisation), and responses end at a stop id before the checkpoint's min_new_tokens."""
    lm, engine, _ = chat
    batch = engine.generate(PROMPTS)
    with torch.no_grad():
        trainer = response_logprobs(lm.model, batch, 1.0).logp
    m = batch.response_mask > 0
    assert (batch.engine_logp - trainer).abs()[m].max() < 1e-4
    lengths = batch.response_mask.sum(-1)
    assert ((lengths < 5) & ~batch.truncated).any()
