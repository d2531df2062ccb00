"""R3 with a real vLLM on a GPU: the engine's routed experts, converted to the trainer's
layout, replayed in the trainer's forward, and a short r3 + mismatch-corrected training run.

vLLM returns routed experts only from its GPU model runner, so everything here is skipped
without CUDA (on CPU the refusal is tested in test_vllm_train.py). Run by `make gpu-check`.
"""

import math

import pytest
import torch
from vllm_tiny import PROMPTS, TINY, tiny_spec

from gspo_cli.models import load_model
from gspo_cli.models.routing import RoutingController, expert_change_frac, routes_from_BT
from gspo_cli.rollout import response_logprobs
from gspo_cli.rollout.vllm_engine import VLLMRolloutEngine
from gspo_cli.runs import RunDir
from gspo_cli.train.loop import train_experiment
from gspo_cli.train.reporting import quiet_reporter

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="vLLM returns routed experts only on a GPU")
GPU = {"gpu_memory_utilization": 0.3}


def test_engine_routes_replay_onto_the_trainer(tiny_source):
    model_cfg = tiny_spec(model={**TINY["model"], "device": "cuda"}).model
    lm = load_model(tiny_source, model_cfg)
    routing = RoutingController(lm.model)
    engine = VLLMRolloutEngine(
        lm.model,
        lm.tokenizer,
        model_dir=tiny_source,
        max_new_tokens=16,
        temperature=1.0,
        engine_kwargs=GPU,
        return_routes=True,
    )
    try:
        b = engine.generate(PROMPTS)
    finally:
        engine.close()
    B, T = b.input_ids.shape
    assert b.engine_routes.shape == (routing.num_layers, B, T, routing.top_k)
    P, mask = b.prompt_len, b.response_mask > 0
    with torch.no_grad(), routing.replaying(routes_from_BT(b.engine_routes)) as natural:
        logp = response_logprobs(lm.model, b, 1.0).logp
    # the positions that predict response tokens: the trainer's router mostly agrees with vLLM's
    pos = torch.zeros(B, T, dtype=torch.bool, device=mask.device)
    pos[:, P - 1 : -1] = mask
    diff = expert_change_frac(routes_from_BT(b.engine_routes), natural.routes, pos.reshape(-1).cpu())
    gap = (logp - b.engine_logp).abs()[mask]
    print(
        f"vLLM R3: engine/trainer route difference {diff:.4f}, |logp gap| mean {gap.mean():.2e} "
        f"max {gap.max():.2e} under replay"
    )
    assert diff < 0.05 and gap.mean() < 1e-3


def test_r3_training_with_a_mismatch_correction(tmp_path, tiny_source):
    arm = {**TINY["arms"][0], "routing_replay": "r3", "mismatch": {"mode": "token_tis", "high": 2.0}}
    spec = tiny_spec(
        output_dir=str(tmp_path),
        model={**TINY["model"], "device": "cuda"},
        rollout={**TINY["rollout"], "vllm": GPU},
        arms=[arm],
    )
    (res,) = train_experiment(spec, reporter=quiet_reporter())
    assert res.status == "completed", RunDir(res.path).info()
    for m in RunDir(res.path).metrics():
        print({k: v for k, v in m.items() if k.startswith(("mismatch/", "moe/", "rollout/"))})
        assert 0.0 <= m["moe/engine_route_diff_frac"] < 0.05
        assert m["mismatch/weight_mean"] == pytest.approx(1.0, abs=0.05) and math.isfinite(m["policy/loss"])
