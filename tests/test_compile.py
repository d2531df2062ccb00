"""Compiled updates (`train.compile`): the same log-probs, losses, routes and weights as the
eager update, and compiled code that a later process loads from disk instead of compiling."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import TINY, max_gap, models_in_float64

from gspo_cli.errors import SpecError
from gspo_cli.models import resolve_model_source
from gspo_cli.rollout import RolloutBatch, response_logprobs
from gspo_cli.spec.loading import spec_from_dict
from gspo_cli.tasks import make_task
from gspo_cli.train.compiled import CompiledUpdate, compile_cache_dir, unpad_routes
from gspo_cli.train.step import setup, train_step

REPO = Path(__file__).resolve().parents[1]


def _raw(arm: str, **train):
    return {**TINY, "train": {**TINY["train"], **train}, "arms": [a for a in TINY["arms"] if a["name"] == arm]}


def test_compile_is_refused_where_it_cannot_pay_or_is_untested():
    with pytest.raises(SpecError, match=r"train\.compile: not supported with model\.sharding: fsdp"):
        spec_from_dict({**_raw("gspo", compile=True), "model": {**TINY["model"], "sharding": "fsdp"}})
    with pytest.raises(SpecError, match=r"train\.compile: with train\.gradient_checkpointing"):
        spec_from_dict(_raw("gspo", compile=True, gradient_checkpointing=True))
    assert spec_from_dict(_raw("gspo")).train.compile is False  # off by default


def _batch(T: int = 5) -> RolloutBatch:
    ids = torch.arange(2 * T).reshape(2, T) + 3
    attn = torch.ones(2, T, dtype=torch.long)
    attn[0, 0] = 0  # left padding
    resp = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    return RolloutBatch(ids, attn, resp, T - 3, ["", ""], torch.zeros(2, dtype=torch.bool))


def test_padding_to_a_bucket_and_back(monkeypatch, tmp_path):
    """Widths round up to the bucket; padding columns are attention 0, response mask 0 and keep
    every real position's position id; routes repeat their last column and come back unchanged."""
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)  # the padding only: nothing compiled here
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "ind"))
    model = torch.nn.Module()
    model.get_decoder = lambda: torch.nn.Linear(2, 2)
    cu = CompiledUpdate(model, bucket=4)
    assert [cu.width(t) for t in (1, 4, 5, 8, 9)] == [4, 4, 8, 8, 12]
    b = _batch(T=5)
    routes_LbTk = torch.arange(2 * 2 * 5 * 2).reshape(2, 2, 5, 2)
    p, r = cu.pad(b, routes_LbTk)
    assert p.input_ids.shape == (2, 8) and p.response_mask.shape == (2, 6) and p.prompt_len == 2
    assert p.attention_mask[:, 5:].sum() == 0 and p.response_mask[:, 3:].sum() == 0
    assert torch.equal(p.position_ids[:, :5], b.position_ids)
    assert torch.equal(r[:, :, :5], routes_LbTk) and torch.equal(r[:, :, 7], routes_LbTk[:, :, 4])
    back = unpad_routes(r.reshape(2, 2 * 8, 2), rows=2, T=5)
    assert torch.equal(back, routes_LbTk.reshape(2, 10, 2))
    assert cu.widths == {8}
    assert cu.pad(_batch(T=8), None)[0].input_ids.shape == (2, 8)  # already a multiple: unchanged
    assert compile_cache_dir() == tmp_path / "ind"  # TORCHINDUCTOR_CACHE_DIR wins when set


def test_compile_cache_lives_beside_the_builtin_models(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("GSPO_CACHE_DIR", str(tmp_path))
    assert compile_cache_dir() == tmp_path / "torch-compile"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "torch-compile")  # what inductor reads


def _ctx(tmp_path, arm: str, **train):
    spec = spec_from_dict({**_raw(arm, **train), "output_dir": str(tmp_path)})
    task = make_task(spec.task.name, spec.task.params)
    return setup(spec, spec.arms[0], 0, task, resolve_model_source(spec.model, task, log=lambda m: None))


@pytest.mark.slow
def test_compiled_update_equals_eager_with_routing_replay(tmp_path, monkeypatch):
    """R2 arm, one width (bucket 64 > every width here): the compiled forward's log-probs equal
    eager's under replay (and the routers' own choices agree), and a training step gives the same
    losses, clip fractions, expert changes and weights as the eager step. Compiled code runs in
    float32 (that is the point), so every bound is 10x a floor measured here: the eager
    computation in float32 against the same one in float64 (metrics also within one unit of the
    6 significant digits a step reports)."""
    import torch._inductor.config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "ind"))
    monkeypatch.setattr(torch._inductor.config, "compile_threads", 1)  # no worker pool to start
    ctx = _ctx(tmp_path / "c", "grpo_rr", compile=True, compile_bucket=64)
    step_c = train_step(ctx, 1)
    ref = _ctx(tmp_path / "e", "grpo_rr")  # setup seeds torch: the same batch as ctx's step
    step_e = train_step(ref, 1)
    f64 = _ctx(tmp_path / "x", "grpo_rr")
    models_in_float64(f64.model)
    step_x = train_step(f64, 1)
    assert ctx.compiled is not None and ref.compiled is None
    assert ctx.compiled.widths == {64}
    keys = [k for k in step_e if k.startswith(("policy/", "ratio/", "moe/", "reward/"))]
    assert "moe/expert_change_frac" in keys and "policy/loss" in keys
    for k in keys:
        bound = 10 * abs(step_e[k] - step_x[k]) + 1e-5 * abs(step_e[k])
        assert abs(step_c[k] - step_e[k]) <= bound, (k, step_c[k], step_e[k], step_x[k])
    floor = max_gap(ref.model.state_dict(), f64.model.state_dict())
    gap = max_gap(ctx.model.state_dict(), ref.model.state_dict())
    assert 0 < floor < 1e-4 and gap <= 10 * floor, (gap, floor)

    # The log-probs themselves, on one padded mini-batch, replaying routes taken from an eager pass.
    batch = ctx.engine.generate(["1+2=", "3+4=", "2+2=", "4+1="] * 2)
    sub = batch.rows(torch.arange(8), sampler=False)
    with ctx.routing.recording() as rec, torch.no_grad():
        eager = response_logprobs(ctx.model, sub).logp
    routes = rec.routes.reshape(rec.routes.shape[0], 8, -1, rec.routes.shape[-1])
    fwd, fwd_routes = ctx.compiled.pad(sub, routes)
    L, b, Tp, k = fwd_routes.shape
    with ctx.routing.replaying(fwd_routes.reshape(L, b * Tp, k)) as nat, ctx.compiled.active():
        compiled = response_logprobs(ctx.model, fwd).logp[:, : sub.response_mask.shape[1]]
    mask = sub.response_mask > 0
    models_in_float64(ref.model)  # the floor: the same eager forward, these weights, in float64
    ref.model.load_state_dict(ctx.model.state_dict())
    with ref.routing.replaying(rec.routes), torch.no_grad():
        exact = response_logprobs(ref.model, sub).logp
    floor, gap = max_gap(eager[mask], exact[mask]), max_gap(compiled[mask], eager[mask])
    assert 0 < floor < 1e-5 and gap <= 10 * floor, (gap, floor)
    assert torch.equal(unpad_routes(nat.routes, 8, sub.input_ids.shape[1]), rec.routes)


PROBE = r"""
import json, torch, transformers as tf
from torch._dynamo.utils import counters
from gspo_cli.rollout import RolloutBatch, response_logprobs
from gspo_cli.models.routing import RoutingController
from gspo_cli.train.compiled import CompiledUpdate
torch.set_num_threads(1)
cfg = tf.Qwen3MoeConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
    num_key_value_heads=1, head_dim=8, intermediate_size=32, moe_intermediate_size=16, num_experts=4,
    num_experts_per_tok=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
torch.manual_seed(0)
import gspo_cli.models  # registers gspo_grouped_mm (the default)
model = tf.AutoModelForCausalLM.from_config(cfg, experts_implementation="gspo_grouped_mm").train()
ctl, cu = RoutingController(model), CompiledUpdate(model, bucket=16)
ids = torch.randint(3, 32, (2, 12), generator=torch.Generator().manual_seed(1))
attn, no = torch.ones(2, 12, dtype=torch.long), torch.zeros(2, dtype=torch.bool)
batch = RolloutBatch(ids, attn, torch.ones(2, 8), 4, ["", ""], no)
fwd, _ = cu.pad(batch, None)
with ctl.recording() as eager_routes:
    eager = response_logprobs(model, batch).logp
with ctl.recording() as routes, cu.active():
    logp = response_logprobs(model, fwd).logp[:, :8]
logp.sum().backward()
c = {k: v for g in ("inductor", "aot_autograd") for k, v in counters[g].items() if "cache" in k}
same_routes = torch.equal(routes.routes.reshape(1, 2, 16, 2)[:, :, :12], eager_routes.routes.reshape(1, 2, 12, 2))
exact = tf.AutoModelForCausalLM.from_config(cfg, experts_implementation="eager", dtype=torch.float64)
exact.load_state_dict(model.state_dict())
with torch.no_grad():
    floor = (eager.double() - response_logprobs(exact, batch).logp).abs().max().item()
print(json.dumps({"counters": c, "logp": logp.tolist(), "cache": str(cu.cache_dir),
    "gap": (logp - eager).abs().max().item(), "floor": floor, "same_routes": same_routes}))
"""


@pytest.mark.slow
def test_a_second_process_loads_the_compiled_update_from_disk(tmp_path):
    """Two fresh processes with one GSPO_CACHE_DIR: the first compiles (cache misses, entries
    written under <cache>/torch-compile), the second finds every graph on disk (hits, no miss)
    and computes the same log-probs. The compiled forward records the routes eager takes and
    gives eager's log-probs, within 10x float32's floor (eager in float32 against float64)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHINDUCTOR")}
    env.update(GSPO_CACHE_DIR=str(tmp_path), PYTHONPATH=str(REPO), TORCHINDUCTOR_COMPILE_THREADS="1")

    def run():
        out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    first = run()
    assert first["cache"] == str(tmp_path / "torch-compile")
    assert first["counters"].get("fxgraph_cache_miss", 0) >= 2  # forward and backward compiled
    assert first["counters"].get("autograd_cache_miss", 0) == 1
    assert any((tmp_path / "torch-compile" / "fxgraph").rglob("*"))
    assert 0 < first["floor"] < 1e-5 and first["gap"] <= 10 * first["floor"], (first["gap"], first["floor"])
    assert first["same_routes"]  # route recording under compile: eager's routes
    second = run()
    assert second["counters"].get("fxgraph_cache_miss", 0) == 0
    assert second["counters"].get("autograd_cache_miss", 0) == 0
    assert second["counters"].get("autograd_cache_hit", 0) == 1
    assert second["logp"] == first["logp"]
