"""The weight stream sends the engine's dtype: a bfloat16 engine under float32 master weights
receives bfloat16 tensors (half the bytes gathered and buffered by the engine's loader) whose
values are the float32 weights cast, as the engine's own loader would have cast them."""

import pytest
import torch
from vllm_tiny import PROMPTS, tiny_spec

from gspo_cli.models import load_model
from gspo_cli.rollout.vllm_engine import VLLMRolloutEngine


@pytest.fixture(scope="module")
def bf16_engine(tiny_source):
    lm = load_model(tiny_source, tiny_spec().model)  # float32 master weights, as the trainer's
    engine = VLLMRolloutEngine(
        lm.model, lm.tokenizer, model_dir=tiny_source, max_new_tokens=8, temperature=1.0, dtype="bfloat16"
    )
    yield lm, engine
    engine.close()


def test_a_bf16_engine_receives_the_weights_cast(bf16_engine, monkeypatch):
    import gspo_cli.rollout.vllm_engine as eng_mod

    lm, engine = bf16_engine
    assert engine.weight_dtype == torch.bfloat16
    sent = []
    real = eng_mod.checkpoint_weights

    def spy(model, dtype=None):
        for name, t in real(model, dtype):
            sent.append(t.dtype)
            yield name, t

    monkeypatch.setattr(eng_mod, "checkpoint_weights", spy)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in lm.model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    engine.generate(PROMPTS[:2])  # syncs: the weights changed
    assert sent and set(sent) == {torch.bfloat16}
    want = lm.model.model.embed_tokens.weight.detach().to(torch.bfloat16)
    got = engine.llm.apply_model(lambda m: m.model.embed_tokens.weight.detach().clone())[0]
    assert got.dtype == torch.bfloat16 and torch.equal(got[: want.shape[0]], want)
